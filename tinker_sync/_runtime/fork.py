"""Fork safety: pid tracking, at-fork hooks and the one lock factory of the SDK.

Usage::

    from tinker_sync._runtime.fork import make_lock, make_condition, register_after_fork, ForkGuard

    _lock = make_lock()                    # every SDK lock comes from here
    _cond = make_condition(_lock)          # a threading.Condition over a fork-safe lock
    register_after_fork(_registry.clear)   # runs in a forked child, after locks are fresh

    guard = ForkGuard()
    if guard.check():                      # True once in each new process
        rebuild()

A lock held by another thread at ``fork()`` time would stay locked forever in the child, because
that thread does not exist there. Every lock made here is tracked in a WeakSet and replaced by a
fresh, unlocked one in the child (``os.register_at_fork(after_in_child=...)``); conditions also
forget waiters that belonged to the parent's threads. Then the callbacks given to
:func:`register_after_fork` run, in registration order; an exception in one is logged and the
others still run.

Signals: ``with lock:`` and ``with cond:`` run the wrapped C lock's own ``__enter__`` and
``__exit__`` (no Python frame between acquiring and the body), so an exception raised by a
signal handler in the thread entering or leaving the block (an alarm timeout, Ctrl-C) cannot
leave the lock held: CPython (3.10+) checks for signals only after calls and on loop edges, never
between a C ``__enter__`` and the ``with`` body. SDK critical sections therefore use ``with``,
never ``acquire()`` then ``try``.

Limitation: a lock held by the *forking* thread itself is also replaced, so releasing it after
the fork raises ``RuntimeError``. The SDK never forks while holding one of its locks.

Thread safety: all functions may be called from any thread. Fork safety: this module is the
mechanism; its own registry lock is recreated first in the child.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import weakref
from collections.abc import Callable
from types import TracebackType

_TRY_ACQUIRE = operator.methodcaller("acquire", False)
_ExitMethod = Callable[
    [type[BaseException] | None, BaseException | None, TracebackType | None], None
]

__all__ = [
    "ForkGuard",
    "ForkSafeCondition",
    "ForkSafeLock",
    "SignalSafeCondition",
    "current_pid",
    "fork_generation",
    "make_condition",
    "make_lock",
    "register_after_fork",
]

logger = logging.getLogger("tinker_sync.fork")


class ForkSafeLock:
    """A ``threading.Lock`` that is replaced by a fresh one in a forked child.

    Use it exactly like the lock it wraps (``with lock:``, ``acquire``, ``release``). There is
    no reentrant variant: every SDK lock is a plain lock, so a ``threading.Condition`` over one
    needs only the lock's public methods.
    Thread safety: as the wrapped lock. Fork safety: unlocked and usable in a child.
    """

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def try_acquire_into(self, got: list[bool]) -> None:
        """Take the lock if free, without blocking, and append whether it was taken to ``got``.

        Usage (where ``with`` cannot be used: a non-blocking take)::

            got: list[bool] = []
            try:
                lock.try_acquire_into(got)
                if not got[0]:
                    return
                ...
            finally:
                if got and got[0]:
                    lock.release()

        The outcome is stored by the same C call that takes the lock, so an exception raised by a
        signal handler right after it still finds the lock recorded as held.
        """
        got.extend(map(_TRY_ACQUIRE, (self._lock,)))

    # ``with lock:`` calls the C lock's own methods, looked up through these properties: no
    # Python frame runs between acquiring and the body, so a signal handler's exception cannot
    # leave the lock held (see the module docstring).
    @property
    def __enter__(self) -> Callable[[], bool]:
        return self._lock.__enter__

    @property
    def __exit__(self) -> _ExitMethod:  # noqa: PLE0302 (a property handing out the C method)
        return self._lock.__exit__

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<ForkSafeLock Lock locked={self.locked()}>"


class SignalSafeCondition(threading.Condition):
    """A ``threading.Condition`` whose ``with`` statement calls its lock's C methods directly.

    ``threading.Condition``'s ``__enter__``/``__exit__`` are Python functions around the lock's:
    a signal handler's exception (an alarm timeout on the main thread) could land between
    acquiring and the body and leave the lock held. ``concurrent.futures.Future`` waits on
    one in ``result()``; the SDK's futures use this one (docs/limiter.md#signals).
    """

    def __init__(self) -> None:
        self._ss_lock = threading.RLock()  # what Condition() makes by default
        super().__init__(self._ss_lock)

    @property
    def __enter__(self) -> Callable[[], bool]:
        return self._ss_lock.__enter__

    @property
    def __exit__(self) -> _ExitMethod:  # noqa: PLE0302 (a property handing out the C method)
        return self._ss_lock.__exit__


class ForkSafeCondition(threading.Condition):
    """A ``threading.Condition`` whose lock and waiter list are reset in a forked child.

    It *is* a ``threading.Condition`` (``wait``, ``wait_for``, ``notify``, ``notify_all``), so it
    can be passed to :meth:`tinker_sync._runtime.clock.Clock.wait`.
    Thread safety: as ``threading.Condition``. Fork safety: no inherited waiters, unlocked.
    """

    def __init__(self, lock: ForkSafeLock) -> None:
        self._fs_lock = lock
        super().__init__(self._fs_lock)  # type: ignore[arg-type]

    # threading.Condition's __enter__/__exit__ are Python functions around the lock's: a signal
    # handler could raise between acquiring and the body. These hand out the C lock's own.
    @property
    def __enter__(self) -> Callable[[], bool]:
        return self._fs_lock._lock.__enter__

    @property
    def __exit__(self) -> _ExitMethod:  # noqa: PLE0302 (a property handing out the C method)
        return self._fs_lock._lock.__exit__

    def _after_fork(self) -> None:
        # The lock itself was already replaced (locks are reset before conditions); running
        # __init__ again drops the parent's waiters, which would otherwise swallow notify().
        threading.Condition.__init__(self, self._fs_lock)  # type: ignore[arg-type]


_registry_lock = threading.Lock()
_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()
_conditions: weakref.WeakSet[ForkSafeCondition] = weakref.WeakSet()
_callbacks: list[Callable[[], object]] = []
_generation = 0


def make_lock() -> ForkSafeLock:
    """Return a new lock that is recreated (unlocked) in a forked child."""
    lock = ForkSafeLock()
    with _registry_lock:
        _locks.add(lock)
    return lock


def make_condition(lock: ForkSafeLock | None = None) -> ForkSafeCondition:
    """Return a Condition over ``lock`` (a new :func:`make_lock` lock when None).

    ``lock`` must come from :func:`make_lock` so that both are reset together in a child.
    """
    if lock is None:
        lock = make_lock()
    elif not isinstance(lock, ForkSafeLock):
        raise TypeError("make_condition() needs a lock from make_lock()")
    cond = ForkSafeCondition(lock)
    with _registry_lock:
        _conditions.add(cond)
    return cond


def register_after_fork(callback: Callable[[], object], *, weak: bool = False) -> None:
    """Run ``callback()`` in every forked child, after all SDK locks were recreated.

    Callbacks run in registration order, in the thread that called ``fork()``; they must be fast
    and must not touch the network. With ``weak=True`` a bound method is held through a
    ``WeakMethod`` and silently dropped once its object is gone (for per-object hooks).
    """
    if weak and hasattr(callback, "__self__"):
        ref = weakref.WeakMethod(callback)

        def _weak_call() -> None:
            method = ref()
            if method is not None:
                method()

        entry: Callable[[], object] = _weak_call
    else:
        entry = callback
    with _registry_lock:
        _callbacks.append(entry)


def current_pid() -> int:
    """Return ``os.getpid()`` (not cached, so it is right even after a raw C-level fork)."""
    return os.getpid()


def fork_generation() -> int:
    """Return how many at-fork resets this process lineage went through (0 in the original)."""
    return _generation


class ForkGuard:
    """Remembers the pid it was made in; ``check()`` is True once per new process.

    Usage::

        guard = ForkGuard()
        def _entry(self):
            if guard.check():        # first call in a forked child
                self._rebuild()

    Thread safety: ``check()`` returns True to exactly one caller per new pid.
    Fork safety: designed for it.
    """

    __slots__ = ("_lock", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = make_lock()

    def changed(self) -> bool:
        """True when the current pid differs from the recorded one (does not update it)."""
        return os.getpid() != self.pid

    def check(self) -> bool:
        """Return True (once) when running in a different process than recorded, then update."""
        pid = os.getpid()
        if pid == self.pid:
            return False
        with self._lock:
            if pid == self.pid:
                return False
            self.pid = pid
            return True

    def __repr__(self) -> str:
        return f"<ForkGuard pid={self.pid}>"


def _after_fork_in_child() -> None:
    global _registry_lock, _generation
    _registry_lock = threading.Lock()
    _generation += 1
    for lock in list(_locks):
        lock._after_fork()
    for cond in list(_conditions):
        cond._after_fork()
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:
            logger.exception("after-fork callback %r failed", callback)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
