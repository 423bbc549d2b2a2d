"""Process-wide pools of daemon worker threads, one per role.

Usage::

    from tinker_sync._executor import pool
    pool("sample-poll").submit(fetch_result, future)

Why not ``ThreadPoolExecutor``: since Python 3.9 its workers are joined at interpreter exit, so a
45 s long poll in flight would hold a finished script open (B55). These workers are daemon
threads: they grow lazily up to ``max_workers``, park when idle, and never delay exit. Overflow
queues FIFO. Jobs must never wait on a job of their own pool (B54).

Thread safety: every method may be called from any thread. Fork safety: in a forked child the
pools are forgotten (their threads did not survive) and rebuilt on first use.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from tinker_sync._fork import register_after_fork

log = logging.getLogger("tinker_sync.executor")

#: Default sizes per role (BEHAVIOR B54); change them with :func:`configure_threads`.
DEFAULT_SIZES: dict[str, int] = {
    "sample-submit": 48,
    "sample-poll": 400,
    "train-submit": 32,
    "train-poll": 64,
    "rest": 16,
    "async": 32,
}
_IDLE_EXIT_S = 30.0


class DaemonPool:
    """A lazily growing pool of daemon threads running ``fn(*args)`` jobs in FIFO order."""

    def __init__(self, role: str, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers for {role!r} must be >= 1, got {max_workers}")
        self.role = role
        self.max_workers = max_workers
        self._lock = threading.Lock()
        self._jobs: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._wakeup = threading.Condition(self._lock)
        self._threads = 0
        self._idle = 0
        self._counter = 0
        self._peak = 0

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def peak_threads(self) -> int:
        return self._peak

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; start a worker if none is idle and the pool is not full."""
        with self._lock:
            self._jobs.append((fn, args))
            if self._idle > len(self._jobs) - 1:
                self._wakeup.notify()
                return
            if self._threads < self.max_workers:
                self._threads += 1
                self._counter += 1
                self._peak = max(self._peak, self._threads)
                name = f"tinker_sync-{self.role}-{self._counter}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
            else:
                self._wakeup.notify()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._idle += 1
                    woke = self._wakeup.wait(_IDLE_EXIT_S)
                    self._idle -= 1
                    if not woke and not self._jobs:
                        self._threads -= 1
                        return
                fn, args = self._jobs.popleft()
            try:
                fn(*args)
            except BaseException:  # jobs own their errors; this is a last resort
                log.exception("unhandled error in %s job %r", self.role, fn)


_pools: dict[str, DaemonPool] = {}
_sizes: dict[str, int] = dict(DEFAULT_SIZES)
_pools_lock = threading.Lock()


def pool(role: str) -> DaemonPool:
    """Return the process-wide pool for ``role``, creating it on first use."""
    p = _pools.get(role)
    if p is not None:
        return p
    with _pools_lock:
        p = _pools.get(role)
        if p is None:
            p = DaemonPool(role, _sizes.get(role, 16))
            _pools[role] = p
        return p


def configure_threads(**sizes: int) -> None:
    """Set pool sizes by role (``sample_submit=64`` or ``**{"sample-submit": 64}``).

    Takes effect for pools created afterwards; call it before the first request.
    """
    with _pools_lock:
        for key, value in sizes.items():
            role = key.replace("_", "-")
            if role not in DEFAULT_SIZES:
                raise ValueError(f"unknown thread role {key!r}; known: {sorted(DEFAULT_SIZES)}")
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
            _sizes[role] = value


def thread_counts() -> dict[str, int]:
    """Current worker threads per role (for tests and benchmarks)."""
    return {role: p.threads for role, p in _pools.items()}


def _after_fork_in_child() -> None:
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


register_after_fork(_after_fork_in_child)
