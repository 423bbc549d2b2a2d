"""The sampling retry layer: ``RetryConfig`` and one retry handler per (sampling session, config).

Usage::

    handler = handler_for(sampler_id, retry_config, session)
    taken = []
    handler.admit(start, taken)       # a concurrency slot (server sample_max_concurrent_requests)
    if taken:
        start()
    delay = retry_config.delay(attempt, clock.random())

It retries a whole sample under a new seq_id after timeouts, connection errors,
408/409/429/5xx and expired futures (and, at most :data:`LOST_RESUBMITS` times, a request the
server lost), with exponential backoff and jitter, and fails calls that
see no progress for ``progress_timeout`` (docs/design/behavior.md#sampling-retry-layer).

Thread safety: handlers are shared by every thread sampling on one session; one lock each.
Fork safety: the handler registry is emptied in a forked child.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from tinker_sync._runtime.clock import Clock
from tinker_sync._runtime.executor import pool
from tinker_sync._runtime.fork import make_lock, register_after_fork
from tinker_sync.exceptions import (
    APIConnectionError,
    APIStatusError,
    FutureExpiredError,
    PersistentServerError,
    RequestFailedError,
    SamplingStuckError,
)

if TYPE_CHECKING:
    from tinker_sync._session.state import Session

__all__ = ["LOST_RESUBMITS", "RetryConfig", "RetryHandler", "handler_for"]

#: A sample the server accepted and then lost (404 when polled alone) is resubmitted under a
#: new seq_id at most this many times; the next loss fails it with RequestLostError
#: (docs/polling.md#lost-requests).
LOST_RESUBMITS = 2


def _positive_or_none(_inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value <= 0):
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class RetryConfig:
    """How ``sample()`` retries whole requests (frozen, hashable).

    Usage: ``service.create_sampling_client(base_model=..., retry_config=RetryConfig(...))``.

    ``max_connections``: cap on concurrent in-flight samples (None = the server's
    ``sample_max_concurrent_requests``; an explicit value is capped by it; no cap while the
    session futures poller is in use). ``progress_timeout``: seconds with no completed request
    before SamplingStuckError. ``retry_delay_base`` / ``retry_delay_max`` / ``jitter_factor``:
    the delay before retry ``a`` is ``min(base * 2^a, max)`` times ``1 +- jitter``, clamped to
    [0, max]. ``enable_retry_logic=False`` fails a sample on its first error.
    ``retryable_exceptions``: plus the status errors every retry layer repeats (408/409/429/5xx,
    ``_flow.retry.is_retryable_status``).

    Thread safety: immutable. Fork safety: plain data.
    """

    max_connections: int | None = attrs.field(default=None, validator=_positive_or_none)
    progress_timeout: float = 7200.0
    retry_delay_base: float = 0.5
    retry_delay_max: float = 10.0
    jitter_factor: float = 0.25
    enable_retry_logic: bool = True
    enable_stuck_detection: bool = True
    retryable_exceptions: tuple[type[BaseException], ...] = (
        APIConnectionError,
        TimeoutError,
        FutureExpiredError,
    )

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether the sampling layer retries ``exc`` (never RequestFailedError, nor
        PersistentServerError)."""
        if isinstance(exc, (RequestFailedError, SamplingStuckError, PersistentServerError)):
            return False
        if isinstance(exc, self.retryable_exceptions):
            return True
        if isinstance(exc, APIStatusError):
            from tinker_sync._flow.retry import is_retryable_status  # loads urllib3: deferred

            return is_retryable_status(exc.status_code)
        return False

    def delay(self, attempt: int, draw: float) -> float:
        """The delay before retry number ``attempt`` (0-based); ``draw`` is U[0, 1)."""
        try:
            base = min(float(self.retry_delay_base) * 2.0**attempt, float(self.retry_delay_max))
        except OverflowError:
            base = float(self.retry_delay_max)
        jittered = base + base * float(self.jitter_factor) * (2.0 * draw - 1.0)
        return max(0.0, min(jittered, float(self.retry_delay_max)))


class RetryHandler:
    """Concurrency slots and progress tracking for one (sampler, RetryConfig)
    (docs/design/behavior.md#sampling-retry-layer).

    A job that finds no free slot is parked (no thread waits); ``release`` hands the slot to
    the oldest parked job. Thread-safe; the registry is emptied in a forked child.
    """

    def __init__(
        self, config: RetryConfig, capacity: int | None, clock: Clock, *, stuck_detection: bool
    ) -> None:
        self.config = config
        self.capacity = None if capacity is None else max(1, capacity)
        self.clock = clock
        self.stuck_detection = stuck_detection and config.enable_stuck_detection
        self._lock = make_lock()
        self._parked: deque[Callable[[], None]] = deque()
        self.in_flight = 0
        self.last_progress = clock.monotonic()

    @property
    def unlimited(self) -> bool:
        return self.capacity is None

    @property
    def parked(self) -> int:
        return len(self._parked)

    def admit(self, start: Callable[[], None], taken: list[bool]) -> None:
        """Take a slot (appends True to ``taken``), or park ``start`` to run on
        ``sample-submit`` later.

        The slot is recorded in ``taken`` in the same step that takes it, so a caller cut short
        by a signal handler's exception (on the main thread) still knows it holds one.
        """
        with self._lock:
            if self.capacity is not None and self.in_flight >= self.capacity:
                self._parked.append(start)
                return
            if self.in_flight == 0:
                self.last_progress = self.clock.monotonic()
            # One step: no call between taking the slot and recording it.
            self.in_flight += 1
            taken.append(True)

    def _take(self) -> None:
        if self.in_flight == 0:
            self.last_progress = self.clock.monotonic()
        self.in_flight += 1

    def release(self, *, progressed: bool) -> None:
        with self._lock:
            self.in_flight -= 1
            if progressed:
                self.last_progress = self.clock.monotonic()
            start = None
            if self._parked and (self.capacity is None or self.in_flight < self.capacity):
                start = self._parked.popleft()
                self._take()
        if start is not None:
            pool("sample-submit").submit(start)

    def stuck(self) -> bool:
        return (
            self.stuck_detection
            and self.clock.monotonic() - self.last_progress > self.config.progress_timeout
        )


_handlers: dict[tuple[Any, ...], RetryHandler] = {}


_MAX_IDLE_HANDLERS = 256


_handlers_lock = make_lock()


def handler_for(sampler_id: str, config: RetryConfig, session: Session) -> RetryHandler:
    """One handler per (sampling session, RetryConfig, server limits) in this process."""
    server = session.server
    if server.sample_use_retrieve_futures:
        capacity: int | None = None
    elif config.max_connections is None:
        capacity = server.sample_max_concurrent_requests
    else:
        capacity = min(config.max_connections, server.sample_max_concurrent_requests)
    key = (sampler_id, config, capacity, server.sample_enable_stuck_detection, id(session.clock))
    with _handlers_lock:
        handler = _handlers.get(key)
        if handler is None:
            if len(_handlers) >= _MAX_IDLE_HANDLERS:  # e.g. a new sampler per RL step
                for stale in [k for k, h in _handlers.items() if h.in_flight == 0]:
                    del _handlers[stale]
            handler = _handlers[key] = RetryHandler(
                config,
                capacity,
                session.clock,
                stuck_detection=server.sample_enable_stuck_detection,
            )
        return handler


def _after_fork_in_child() -> None:
    _handlers.clear()


register_after_fork(_after_fork_in_child)
