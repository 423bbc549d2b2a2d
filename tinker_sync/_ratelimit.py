"""The shared sampling limiter: one per (normalized base_url, credential identity).

Usage::

    limiter = limiter_for(base_url, credential_identity, clock)
    with limiter.dispatch(prompt_bytes, should_stop):   # B12 gates, in order
        limiter.wait_backoff(should_stop)               # B13 shared deadline
        reply = send_asample()                          # gates held until accepted
    limiter.set_backoff(1.0, cause="429")               # any caller; every caller obeys

**Scope (a deliberate difference from the official SDK).** The official SDK keeps one backoff
per ServiceClient. Here every client in the process that talks to the same normalized base URL
with the same credential shares one deadline and one set of dispatch gates, so one caller's
429 slows every caller of that tenant, and a second ServiceClient cannot dodge it.

Invariants the tests check (notes/limiter.md): get-or-create never splits a key; the deadline
only moves forward (a later success never shortens it); waiters block on a Condition (no
polling loops); the gates are acquired in the order count(400) -> count(10, only while
recently backed off) -> bytes, released in reverse in ``finally``, and held only until the
server accepts the request.

Thread safety: all methods are thread-safe. Fork safety: the registry is emptied in a forked
child (limiters hold locks that may have been held at fork time).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from tinker_sync._fork import make_condition, make_lock, register_after_fork

log = logging.getLogger("tinker_sync.ratelimit")

DISPATCH_COUNT = 400
BACKED_OFF_COUNT = 10
RECENT_BACKOFF_S = 10.0
BACKED_OFF_BYTE_PENALTY = 20
DEFAULT_SAMPLE_DISPATCH_BYTES = 10 * 1024 * 1024
DEFAULT_FWDBWD_DISPATCH_BYTES = 50_000_000
DEFAULT_INFLIGHT_RESPONSE_BYTES = 50 * 1024 * 1024
LARGE_PROMPT_BYTES = 128 * 1024


class _Clock(Protocol):
    def monotonic(self) -> float: ...

    def wait(self, cond: threading.Condition, timeout: float | None) -> bool: ...


class Stopped(Exception):
    """Raised out of a limiter wait when the caller's ``should_stop`` returns an exception."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


#: Returns None to keep waiting, or the exception to stop with (cancelled, closed...).
ShouldStop = Callable[[], BaseException | None]


class ByteBudget:
    """A byte budget that admits a request while the remaining budget is >= 0.

    The request is then subtracted, so one request may overshoot and a huge request cannot
    deadlock (B12). Waiters block on the limiter's condition.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.remaining = size


class Limiter:
    """Shared backoff deadline and dispatch gates for one (base_url, credential) key.

    Thread-safe; obtain it with :func:`limiter_for`, never construct it directly.
    """

    def __init__(self, key: tuple[str, str], clock: _Clock) -> None:
        self.key = key
        self.clock = clock
        # Fork-safe: a child may still reach a parent's limiter through an inherited object.
        self._lock = make_lock()
        self._deadline_changed = make_condition(self._lock)
        self._gates_changed = make_condition(self._lock)
        self.backoff_until = float("-inf")  # never backed off
        self._count = DISPATCH_COUNT
        self._backed_off_count = BACKED_OFF_COUNT
        self._sample_bytes: ByteBudget | None = None
        self._fwdbwd_bytes: ByteBudget | None = None
        self._response_bytes: ByteBudget | None = None

    # ---------------------------------------------------------------- sizing

    def configure(
        self,
        *,
        sample_dispatch_bytes: int,
        fwdbwd_dispatch_bytes: int,
        inflight_response_bytes: int,
    ) -> None:
        """Size the byte budgets from the first server config seen; later calls are ignored."""
        with self._lock:
            if self._sample_bytes is None:
                self._sample_bytes = ByteBudget(sample_dispatch_bytes)
                self._fwdbwd_bytes = ByteBudget(fwdbwd_dispatch_bytes)
                self._response_bytes = ByteBudget(inflight_response_bytes)

    def _budgets(self) -> tuple[ByteBudget, ByteBudget, ByteBudget]:
        if self._sample_bytes is None:
            self.configure(
                sample_dispatch_bytes=DEFAULT_SAMPLE_DISPATCH_BYTES,
                fwdbwd_dispatch_bytes=DEFAULT_FWDBWD_DISPATCH_BYTES,
                inflight_response_bytes=DEFAULT_INFLIGHT_RESPONSE_BYTES,
            )
        assert self._sample_bytes and self._fwdbwd_bytes and self._response_bytes
        return self._sample_bytes, self._fwdbwd_bytes, self._response_bytes

    # ---------------------------------------------------------------- deadline (B13, B14)

    def set_backoff(
        self, seconds: float, cause: str, hooks: tuple[Callable[[Any], object], ...] = ()
    ) -> float:
        """Move the shared deadline to ``now + seconds`` unless it is already later.

        ``hooks`` (the calling client's) receive a ``backoff_set`` event when it moved.
        """
        now = self.clock.monotonic()
        with self._lock:
            until = now + seconds
            if until > self.backoff_until:
                self.backoff_until = until
                self._deadline_changed.notify_all()
                moved = True
            else:
                moved = False
            result = self.backoff_until
        if moved:
            log.info("sampling backoff for %.3f s (%s)", seconds, cause)
            from tinker_sync._transport import emit_hook

            emit_hook(
                hooks,
                "backoff_set",
                limiter_key=self.key[1][:12],
                until=result,
                seconds=seconds,
                cause=cause,
            )
        return result

    def recently_backed_off(self) -> bool:
        return self.clock.monotonic() < self.backoff_until + RECENT_BACKOFF_S

    def wait_backoff(self, should_stop: ShouldStop) -> None:
        """Block until the shared deadline has passed (re-reading it after every wake)."""
        with self._lock:
            while True:
                stop = should_stop()
                if stop is not None:
                    raise Stopped(stop)
                remaining = self.backoff_until - self.clock.monotonic()
                if remaining <= 0:
                    return
                self.clock.wait(self._deadline_changed, remaining)

    # ---------------------------------------------------------------- gates (B12)

    @contextmanager
    def dispatch(self, estimated_bytes: int, should_stop: ShouldStop) -> Iterator[None]:
        """Hold the sampling dispatch gates for one submission (count, count, bytes)."""
        sample_bytes, _, _ = self._budgets()
        held_count = held_backed_off = False
        charged = 0
        try:
            with self._lock:
                self._wait_gate(lambda: self._count > 0, should_stop)
                self._count -= 1
                held_count = True
                if self.clock.monotonic() < self.backoff_until + RECENT_BACKOFF_S:
                    self._wait_gate(lambda: self._backed_off_count > 0, should_stop)
                    self._backed_off_count -= 1
                    held_backed_off = True
                    cost = estimated_bytes * BACKED_OFF_BYTE_PENALTY
                else:
                    cost = estimated_bytes
                self._wait_gate(lambda: sample_bytes.remaining >= 0, should_stop)
                sample_bytes.remaining -= cost
                charged = cost
            yield
        finally:
            with self._lock:
                sample_bytes.remaining += charged
                if held_backed_off:
                    self._backed_off_count += 1
                if held_count:
                    self._count += 1
                if held_count or charged:
                    self._gates_changed.notify_all()

    @contextmanager
    def fwdbwd_bytes(self, estimated_bytes: int) -> Iterator[None]:
        """Hold forward/backward dispatch bytes for one chunk's send (B27)."""
        _, budget, _ = self._budgets()
        with self._lock:
            self._wait_gate(lambda: budget.remaining >= 0, lambda: None)
            budget.remaining -= estimated_bytes
        try:
            yield
        finally:
            with self._lock:
                budget.remaining += estimated_bytes
                self._gates_changed.notify_all()

    def reserve_response_bytes(self, nbytes: int, should_stop: ShouldStop) -> None:
        """Reserve in-flight response bytes for a metadata-only result (B21)."""
        _, _, budget = self._budgets()
        with self._lock:
            self._wait_gate(lambda: budget.remaining >= 0, should_stop)
            budget.remaining -= nbytes

    def release_response_bytes(self, nbytes: int) -> None:
        _, _, budget = self._budgets()
        with self._lock:
            budget.remaining += nbytes
            self._gates_changed.notify_all()

    def wake(self) -> None:
        """Wake every waiter so it re-checks ``should_stop`` (after a cancel or close)."""
        with self._lock:
            self._gates_changed.notify_all()
            self._deadline_changed.notify_all()

    def _wait_gate(self, admitted: Callable[[], bool], should_stop: ShouldStop) -> None:
        # Called with self._lock held.
        while True:
            stop = should_stop()
            if stop is not None:
                raise Stopped(stop)
            if admitted():
                return
            self.clock.wait(self._gates_changed, None)

    def snapshot(self) -> dict[str, Any]:
        """Gate levels, for tests and debugging."""
        sample_bytes, fwdbwd, response = self._budgets()
        with self._lock:
            return {
                "count": self._count,
                "backed_off_count": self._backed_off_count,
                "sample_bytes": sample_bytes.remaining,
                "fwdbwd_bytes": fwdbwd.remaining,
                "response_bytes": response.remaining,
                "backoff_until": self.backoff_until,
            }


_registry: dict[tuple[str, str], Limiter] = {}
_registry_lock = threading.Lock()


def limiter_for(normalized_base_url: str, credential_identity: str, clock: _Clock) -> Limiter:
    """Get or create the limiter of a key; never replaces an entry (B11)."""
    key = (normalized_base_url, credential_identity)
    with _registry_lock:
        limiter = _registry.get(key)
        if limiter is None:
            limiter = Limiter(key, clock)
            _registry[key] = limiter
        return limiter


def reset_limiters() -> None:
    """Forget every limiter (tests, and in a forked child)."""
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


register_after_fork(reset_limiters)
