"""How one accepted request's result is awaited (docs/polling.md).

Job: the per-future poll loop (``loop``), its pure decision table (``decide``), the long-poll
hold and read timeout (``hold``), the session futures poller for samples (``poller``) and
debounced queue-state reports (``queuestate``). Invariants: every delay and verdict comes from
``decide`` (pure, asserted delay by delay), polling is bounded by time, never by an iteration
count, and no lock is held across I/O. Imports: ``_runtime``, ``_flow``, ``_transport``,
``_config``, ``exceptions``, ``_wire._headers`` (the hold header names) and ``_session`` (the
session a loop polls for); this ``__init__`` imports nothing.
"""
