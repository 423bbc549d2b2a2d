"""Batched background telemetry that never raises into user code
(docs/design/behavior.md#telemetry).

Usage (inside the session)::

    telemetry = Telemetry(session, enabled=config.telemetry)
    telemetry.generic("APIFuture.result.connection_error", {"request_id": rid})
    report_escaped(exc, session)         # once per exception: UNHANDLED_EXCEPTION or
                                         # user_error, then SESSION_END and a synchronous flush

    @captures_exceptions                 # on public client methods (``self._session``)
    def create_lora_training_client(self, ...): ...

Events queue (at most 10,000; overflow drops new events with one warning) and are flushed by the
session timer thread every 10 s, or as soon as 100 are queued, in batches of at most 100. A reply
other than exactly ``{"status": "accepted"}`` drops the batch. Opt out with ``TINKER_TELEMETRY=0``.
An exception escaping a public call or ``APIFuture.result()`` is reported once
(docs/design/behavior.md#telemetry): the wrapper costs one frame on the success path and nothing
else.

Thread safety: all methods are thread-safe. Fork safety: ``process_uuid`` is new in a child.
"""

from __future__ import annotations

import collections
import datetime as _dt
import functools
import logging
import platform
import threading
import traceback
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tinker_sync._config import PROTOCOL_VERSION, Timeout
from tinker_sync._runtime.causes import related
from tinker_sync._runtime.fork import register_after_fork
from tinker_sync._runtime.redact import scrub
from tinker_sync._transport import Pool, RequestSpec

if TYPE_CHECKING:
    from tinker_sync._session.state import Session

log = logging.getLogger("tinker_sync.telemetry")

F = TypeVar("F", bound=Callable[..., Any])
_REPORTED = "_tinker_sync_reported"

MAX_QUEUE = 10_000
BATCH = 100
FLUSH_EVERY_S = 10.0
_TIMEOUT = Timeout(5.0, connect=5.0)
_process_uuid = str(uuid.uuid4())


def _new_process_uuid() -> None:
    global _process_uuid
    _process_uuid = str(uuid.uuid4())


register_after_fork(_new_process_uuid)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Telemetry:
    """One reporter per session. Thread-safe; never raises."""

    def __init__(self, session: Session, *, enabled: bool) -> None:
        self.session = session
        self.enabled = enabled
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._index = 0
        self._dropped_warned = False
        self._last_flush = session.timer_clock.monotonic()
        self._started = session.timer_clock.monotonic()
        self._session_id = session.session_id or f"sessionless-{uuid.uuid4()}"
        self._sessionless = session.session_id is None
        self.sent_batches = 0
        self.reported = 0
        self._event("SESSION_START", "INFO", {})

    def _event(self, kind: str, severity: str, fields: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self._lock:
            if len(self._queue) >= MAX_QUEUE:
                if not self._dropped_warned:
                    self._dropped_warned = True
                    log.warning(
                        "telemetry queue is full (%d events); dropping new events", MAX_QUEUE
                    )
                return
            event = {
                "event": kind,
                "event_id": str(uuid.uuid4()),
                "event_session_index": self._index,
                "severity": severity,
                "timestamp": _now(),
                **fields,
            }
            self._index += 1
            self._queue.append(event)
            full = len(self._queue) >= BATCH
        if full:
            wake = getattr(self.session, "wake_timer", None)
            if wake is not None:
                wake()

    def generic(self, name: str, data: dict[str, Any], severity: str = "INFO") -> None:
        self._event("GENERIC_EVENT", severity, {"event_name": name, "event_data": data})

    def report_exception(self, exc: BaseException, *, user_error: bool) -> None:
        """Report an exception that escaped a public call, then SESSION_END, then flush.

        Use :func:`report_escaped` (it reports each exception object once).
        """
        if not self.enabled:
            return
        with self._lock:
            self.reported += 1
        message = scrub(str(exc))
        if user_error:
            data: dict[str, Any] = {"error_type": type(exc).__name__}
            if message:
                data["message"] = message
            status = _user_status(exc)
            if status is not None:
                data["status_code"] = status
            self.generic("user_error", data, "WARNING")
        else:
            self._event(
                "UNHANDLED_EXCEPTION",
                "ERROR",
                {
                    "error_type": type(exc).__name__,
                    "error_message": message,
                    "traceback": scrub("".join(traceback.format_exception(exc))[-8000:]),
                },
            )
        if not self._sessionless:
            duration = _dt.timedelta(seconds=self.session.timer_clock.monotonic() - self._started)
            self._event("SESSION_END", "INFO", {"duration": str(duration)})
        self.flush()

    def next_flush_in(self) -> float:
        """Seconds until the timer thread should flush (never 0 while disabled or idle)."""
        if not self.enabled:
            return FLUSH_EVERY_S
        if len(self._queue) >= BATCH:
            return 0.0
        return max(0.0, self._last_flush + FLUSH_EVERY_S - self.session.timer_clock.monotonic())

    def flush(self) -> None:
        """Send queued events in batches of at most 100; failures only log."""
        self._last_flush = self.session.timer_clock.monotonic()
        if not self.enabled:
            return
        with self._flush_lock:
            while True:
                with self._lock:
                    batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                if not batch:
                    return
                self._send(batch)

    def _send(self, batch: list[dict[str, Any]]) -> None:
        transport = self.session._transport
        if transport is None or transport.closed:
            return
        body = {
            "events": batch,
            "platform": platform.system(),
            "sdk_version": PROTOCOL_VERSION,
            "session_id": self._session_id,
            "process_uuid": _process_uuid,
        }
        spec = RequestSpec(
            method="POST",
            path="/api/v1/telemetry",
            pool=Pool.TELEMETRY,
            json=body,
            timeout=_TIMEOUT,
            max_retries=0,
            sdk_method=None,
        )
        try:
            reply = transport.send_once(spec)
            accepted = reply.status < 400 and reply.json() == {"status": "accepted"}
        except Exception as exc:
            log.debug("telemetry batch dropped: %s", exc)
            return
        if accepted:
            self.sent_batches += 1
        else:
            log.debug("telemetry batch dropped: server answered %d", reply.status)

    def close(self) -> None:
        try:
            self.flush()
        except Exception:
            log.debug("final telemetry flush failed", exc_info=True)


def _user_status(exc: BaseException) -> int | None:
    from tinker_sync._flow.retry import is_user_status

    for e in related(exc):
        status = getattr(e, "status_code", None)
        if isinstance(status, int) and is_user_status(status):
            return status
    return None


def report_escaped(exc: BaseException, session: object) -> None:
    """Report ``exc`` (escaping a public call or ``result()``) once to ``session``'s telemetry.

    ``session`` is a Session (or any object with a ``telemetry`` attribute, or a ``_session``
    holding one). User errors (``_flow.retry.is_user_error``) become a ``user_error`` event, the
    rest UNHANDLED_EXCEPTION; SESSION_END follows and the batch is flushed synchronously.
    Never raises.
    """
    try:
        if getattr(exc, _REPORTED, False):
            return
        telemetry = getattr(session, "telemetry", None)
        if telemetry is None and hasattr(session, "_session"):
            telemetry = getattr(session._session, "telemetry", None)
        if not isinstance(telemetry, Telemetry) or not telemetry.enabled:
            return
        try:
            setattr(exc, _REPORTED, True)
        except Exception:  # an exception type without __dict__: report anyway
            pass
        from tinker_sync._flow.retry import is_user_error

        telemetry.report_exception(exc, user_error=is_user_error(exc))
    except Exception:
        log.debug("could not report an exception to telemetry", exc_info=True)


def captures_exceptions(fn: F) -> F:
    """Decorate a public client method: an escaping ``Exception`` is reported
    (docs/design/behavior.md#telemetry), re-raised.

    The instance must have a ``_session`` attribute.
    """

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            report_escaped(exc, getattr(self, "_session", None))
            raise

    return wrapper  # type: ignore[return-value]
