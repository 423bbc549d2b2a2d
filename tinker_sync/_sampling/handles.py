"""Shared sessions of unpickled and handle-built SamplingClients, and their clone ids.

Usage (inside SamplingClient's unpickling)::

    session, key = shadow_session(state)          # one per (base URL, session id), ref-counted
    clone_id = new_clone_id(join=server.sample_join_sampling_session)
    ...
    release_shadow(key, session, os.getpid())      # the last client stops its loops

A shadow session heartbeats the original session but never finishes it (that belongs to its
creator) (docs/design/behavior.md#credential-free-pickles).

Thread safety: the registry is guarded by one lock. A release that finds the lock taken (the
garbage collector can run a client's finalizer on the very thread that holds it, in the middle
of :func:`shadow_session`) never waits for it: it is queued and applied by the holder as it lets
go. Fork safety: emptied in a forked child.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import threading
from typing import TYPE_CHECKING, Any

from tinker_sync._runtime.fork import make_lock, register_after_fork

if TYPE_CHECKING:
    from tinker_sync._session.state import Session

#: Seq-id stride between clones: clone n samples under seq_ids [n * SEQ_STRIDE, (n + 1) * SEQ_STRIDE).
SEQ_STRIDE = 1_000_000_000

__all__ = ["SEQ_STRIDE", "new_clone_id", "release_shadow", "shadow_session"]


def new_clone_id(join: bool) -> int | None:
    """None (ask ``join_sampling_session``) when the server allows it, else random in [1, 1e9]."""
    return None if join else random.SystemRandom().randint(1, SEQ_STRIDE)


#: key -> [shadow session, number of live clients using it]
_shadow_sessions: dict[str, list[Any]] = {}


_shadow_lock = make_lock()

#: (key, session) releases that found ``_shadow_lock`` taken; applied when it is let go.
_deferred: collections.deque[tuple[str, Session]] = collections.deque()


def shadow_session(state: dict[str, Any]) -> tuple[Session, str]:
    """One shadow session per (session id, holder snapshot) in this process
    (docs/design/behavior.md#credential-free-pickles).

    Every client unpickled from the same sampler shares its transport and heartbeat thread;
    the session's background threads stop once the last of those clients is closed or
    collected (:func:`release_shadow`).
    """
    from tinker_sync._config import ClientConfig, DynamicConfig, ServerConfig
    from tinker_sync._session.state import Session

    holder = state["holder"]
    api_key = holder.get("api_key")
    key_material = {
        **holder,
        "api_key": None if api_key is None else hashlib.sha256(str(api_key).encode()).hexdigest(),
        "session_id": state["session_id"],
    }
    key = json.dumps(key_material, sort_keys=True, default=str)
    try:
        with _shadow_lock:
            entry = _shadow_sessions.get(key)
            if entry is not None and not entry[0].closed:
                entry[1] += 1
                return entry[0], key
            # Building the session allocates a lot: the garbage collector may run here and
            # finalize an earlier client, whose release is then queued, not waited for.
            config = ClientConfig.from_env(
                base_url=holder["base_url"],
                api_key=api_key,
                default_headers_overrides=holder.get("default_headers_overrides") or None,
            )
            session = Session.shadow(
                config,
                session_id=state["session_id"],
                server=ServerConfig.from_dict(holder.get("client_config") or {}),
                dynamic=DynamicConfig.from_dict(holder.get("client_dynamic_config") or {}),
            )
            _shadow_sessions[key] = [session, 1]
            return session, key
    finally:
        _apply_deferred()


def release_shadow(key: str | None, session: Session, pid: int) -> None:
    """A client of a shadow session is gone; stop the session's threads with the last one.

    Called by a client's ``close()`` or by its finalizer, which the garbage collector may run
    on any thread at any allocation, including one holding ``_shadow_lock``: so this never
    blocks on that lock (a release that finds it taken is applied by the holder).
    """
    if os.getpid() != pid:  # never touch a parent's threads from a forked child
        return
    if key is None:
        _stop(session)
        return
    _deferred.append((key, session))
    _apply_deferred()


def _apply_deferred() -> None:
    """Apply the queued releases, unless the lock is taken: its holder calls this after it."""
    while _deferred:
        got: list[bool] = []
        stopped: list[Session] = []
        try:
            _shadow_lock.try_acquire_into(got)  # signal-safe: see ForkSafeLock.try_acquire_into
            if not got[0]:
                return
            while _deferred:
                key, session = _deferred.popleft()
                entry = _shadow_sessions.get(key)
                if entry is not None and entry[0] is session:
                    entry[1] -= 1
                    if entry[1] > 0:
                        continue
                    del _shadow_sessions[key]
                stopped.append(session)
        finally:
            if got and got[0]:
                _shadow_lock.release()
        for session in stopped:
            _stop(session)


def _stop(session: Session) -> None:
    # A shadow must never *finish* the original session (that belongs to its creator), so
    # only its heartbeat and timer loops are stopped.
    stop = getattr(session, "_stop", None)
    if isinstance(stop, threading.Event) and not stop.is_set():
        stop.set()


def _after_fork_in_child() -> None:
    _shadow_sessions.clear()
    _deferred.clear()


register_after_fork(_after_fork_in_child)
