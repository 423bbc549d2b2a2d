"""Per-ServiceClient state shared by the clients it creates.

Job: the session itself, its single-flight start-up, heartbeat, timers and close (``state``), JWT
exchange and refresh (``jwt``) and batched background telemetry (``telemetry``). Invariants:
start-up runs once however many threads race; telemetry never raises into user code; secrets
stay in ``Secret`` objects. Imports: ``_runtime``, ``_flow``, ``_transport``, ``_config``,
``_credentials``, ``_logging``, ``exceptions`` and ``_polling.hold`` (the session's long-poll
hold); this ``__init__`` imports nothing.
"""
