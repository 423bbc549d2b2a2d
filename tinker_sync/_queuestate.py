"""Debounced queue-state reporting (B62).

Usage::

    reporter = QueueStateReporter(kind="training", clock=clock)
    reporter(state, reason)        # called by poll loops with each try_again queue state

The observer acts only when ``(state, reason)`` changes. Training and model-creation futures
warn only after 15 minutes in a paused state, then at most every 60 s; sampling warns at once,
then at most every 60 s per client. Completion reports ``active``. Observer errors are logged
by the poll loop, never raised.

Thread safety: lock-guarded. Fork safety: plain state.
"""

from __future__ import annotations

import logging
import threading

from tinker_sync._clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("tinker_sync.queue")

TRAINING_WARN_AFTER_S = 15 * 60.0
WARN_EVERY_S = 60.0
_DEFAULT_REASONS = {
    ("training", "paused_rate_limit"): "concurrent training clients rate limit hit",
    ("sampling", "paused_rate_limit"): "concurrent sampler weights limit hit",
    ("training", "paused_capacity"): "Tinker backend is running short on capacity, please wait",
    ("sampling", "paused_capacity"): "Tinker backend is running short on capacity, please wait",
}


class QueueStateReporter:
    """Turns a stream of queue states into rate-limited warnings. Thread-safe."""

    def __init__(self, kind: str, clock: Clock = SYSTEM_CLOCK) -> None:
        if kind not in ("training", "sampling"):
            raise ValueError(f"kind must be 'training' or 'sampling', got {kind!r}")
        self.kind = kind
        self.clock = clock
        self._lock = threading.Lock()
        self._last: tuple[str, str | None] = ("active", None)
        self._paused_since: float | None = None
        self._last_warned: float | None = None
        self.warnings = 0

    def __call__(self, state: str, reason: str | None) -> None:
        now = self.clock.monotonic()
        paused = state.startswith("paused")
        with self._lock:
            self._last = (state, reason)
            if not paused:
                self._paused_since = None
                return
            if self._paused_since is None:
                self._paused_since = now
            if self.kind == "training" and now - self._paused_since < TRAINING_WARN_AFTER_S:
                return
            if self._last_warned is not None and now - self._last_warned < WARN_EVERY_S:
                return
            self._last_warned = now
            self.warnings += 1
        text = reason or _DEFAULT_REASONS.get((self.kind, state), state)
        what = "Training" if self.kind == "training" else "Sampling"
        log.warning("%s is paused (%s): %s", what, state, text)
