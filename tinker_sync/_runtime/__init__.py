"""Process-level services every other part of the SDK stands on.

Job: the one clock (``clock``), the daemon thread pools and delay timer (``executor``), fork
safety and the one lock factory (``fork``), the exception-chain walker (``causes``), first
imports a signal cannot cut (``imports``), the sampling threads' CPU share while the main
thread is busy (``governor``), secret redaction (``redact``) and the sync-to-asyncio bridge
with the ``*_async`` aliases (``asyncio_bridge``). Invariants: process-wide state here is
fork-safe (reset or rebuilt in a forked child) and nothing sleeps except through the injected
clock. Imports: the standard library, its own modules and
``tinker_sync.exceptions`` only; this ``__init__`` imports nothing, so importing one module
does not load the others.
"""
