"""Admission, backoff, retries, hedging and health of requests (docs/limiter.md).

Job: the shared sampling limiter and dispatcher (``limiter``), the backoff deadline shared across
processes (``sharedbackoff``), the tenant's circuit breaker (``breaker``) and its record shared
across processes (``sharedcircuit``), hedged second copies (``hedge``), the HTTP retry policy and the
submission loop (``retry``), and bounded, visible waits and stall deadlines (``health``).
Invariants: waits are parked or slept on the injected clock, never spun; a backoff deadline only
moves forward; a request is retried only when it is safe to repeat. Imports: ``_runtime``,
``_transport``, ``_config``, ``_lazynp`` and ``exceptions``; not the clients, ``_session`` or ``_polling``;
this ``__init__`` imports nothing.
"""
