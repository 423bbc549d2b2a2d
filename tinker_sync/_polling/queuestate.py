"""Debounced queue-state reporting (docs/design/behavior.md#queue-state-reports).

Usage::

    reporter = QueueStateReporter("training", clock, identifier=model_id)
    reporter(state, reason)        # called by poll loops with each try_again queue state

Training and model-creation futures warn only after 15 minutes in one paused state (a change
of state restarts that wait, as in the official SDK), then at most every 60 s; sampling warns
at once, then at most every 60 s per client. Poll loops report ``active`` on completion, which
ends the pause. Observer errors are logged by the poll loop, never raised. Each client keeps
its own reporter, so debounce state never leaks between clients.

Thread safety: lock-guarded. Fork safety: plain state.
"""

from __future__ import annotations

import logging
import threading

from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock

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

    def __init__(
        self,
        kind: str,
        clock: Clock = SYSTEM_CLOCK,
        *,
        identifier: str | None = None,
        prefix: str | None = None,
    ) -> None:
        """:param kind: ``"training"`` (also model creation) or ``"sampling"``.
        :param clock: monotonic time source (the session's Clock).
        :param identifier: what is queued (a model id, a base model, a sampler id).
        :param prefix: message prefix, e.g. ``"Model creation"`` (default by kind).
        """
        if kind not in ("training", "sampling"):
            raise ValueError(f"kind must be 'training' or 'sampling', got {kind!r}")
        self.kind = kind
        self.clock = clock
        self.identifier = identifier
        self.prefix = prefix or ("Training" if kind == "training" else "Sampling")
        self._lock = threading.Lock()
        self._last: tuple[str, str | None] = ("active", None)
        self._state_since: float | None = None
        self._last_warned: float | None = None
        self.warnings = 0

    def __call__(self, state: str, reason: str | None) -> None:
        now = self.clock.monotonic()
        paused = state.startswith("paused")
        with self._lock:
            if state != self._last[0] or self._state_since is None:
                self._state_since = now
            self._last = (state, reason)
            if not paused:
                return
            if self.kind == "training" and now - self._state_since < TRAINING_WARN_AFTER_S:
                return
            if self._last_warned is not None and now - self._last_warned < WARN_EVERY_S:
                return
            self._last_warned = now
            self.warnings += 1
        text = reason or _DEFAULT_REASONS.get((self.kind, state), "unknown")
        what = f"{self.prefix} for {self.identifier}" if self.identifier else self.prefix
        log.warning("%s is paused (%s). Reason: %s", what, state, text)

    @property
    def state(self) -> tuple[str, str | None]:
        """The last reported ``(state, reason)``."""
        with self._lock:
            return self._last
