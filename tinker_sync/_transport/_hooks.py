"""Observation hooks: callables that see one :class:`HookEvent` per request or retry.

Usage::

    transport = Transport(config, hooks=(print,))   # per client
    add_global_hook(my_hook)                         # every client of the process

Thread safety: hooks run on whichever SDK thread made the request; registration is locked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from tinker_sync._runtime.fork import make_lock

logger = logging.getLogger("tinker_sync.transport")


@attrs.frozen
class HookEvent:
    """One observation for hooks: ``kind`` (``"request"``, ``"retry_scheduled"``, ...) + fields.

    ``request`` fields: method, path, pool, status (None on a transport error), started (the
    transport clock's monotonic reading when the attempt began), duration, attempt, error
    (exception class name or None). ``retry_scheduled``: delay, reason, attempt, method, path.
    Values never contain secrets.
    """

    kind: str
    data: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


Hook = Callable[[HookEvent], object]
_global_hooks: tuple[Hook, ...] = ()
_global_hooks_lock = make_lock()


def add_global_hook(hook: Hook) -> None:
    """Register a process-wide hook (runs after the per-client ones)."""
    global _global_hooks
    with _global_hooks_lock:
        _global_hooks = (*_global_hooks, hook)


def remove_global_hook(hook: Hook) -> None:
    """Unregister a process-wide hook (no error when absent)."""
    global _global_hooks
    with _global_hooks_lock:
        _global_hooks = tuple(h for h in _global_hooks if h is not hook)


def emit_hook(hooks: Sequence[Hook], kind: str, **data: Any) -> None:
    """Call each hook (then the global ones) with a :class:`HookEvent`; exceptions are logged."""
    emit_event(hooks, kind, data)


def emit_event(hooks: Sequence[Hook], kind: str, data: dict[str, Any]) -> None:
    """:func:`emit_hook` with the fields already in a dict (which the event keeps: pass a new
    one)."""
    shared = _global_hooks
    everything = (*hooks, *shared) if shared else hooks
    if not everything:
        return
    event = HookEvent(kind, data)
    for hook in everything:
        try:
            hook(event)
        except Exception:
            logger.warning("hook %r failed on %s event", hook, kind, exc_info=True)


def has_global_hooks() -> bool:
    """Whether any process-wide hook is registered (a cheap check before building events)."""
    return bool(_global_hooks)
