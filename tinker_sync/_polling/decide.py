"""What to do with one ``retrieve_future`` answer: a pure function
(docs/design/behavior.md#poll-answer-order, docs/design/behavior.md#poll-error-table).

Usage::

    counters = PollCounters()
    d = decide_reply(status, headers, content, counters, request_id=rid, now=clock.monotonic(),
                     elapsed=0.4, jitter=clock.random())
    if d.action is Action.RETRY: clock.sleep(d.delay, d.reason)

The poll loop (``_polling.loop``) owns the I/O; everything it decides comes from here, so every
delay of the table in docs/design/behavior.md#poll-error-table is asserted exactly by
``tests/polling/test_decide.py``.

Thread safety: pure functions; ``PollCounters`` belongs to one poll loop.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tinker_sync._flow.retry import BILLING_PAUSE_S  # one billing pause for every layer
from tinker_sync.exceptions import (
    APIConnectError,
    APIResponseValidationError,
    FutureExpiredError,
    FuturePollError,
    RequestErrorCategory,
    RequestFailedError,
    RequestLostError,
    ResponseSnapshot,
    server_words,
    status_error_class,
)

PROTOBUF = "application/x-protobuf"
MAX_BAD_400 = 3
#: Caps of the poll delays (docs/polling.md#delays): after a 429 or no connection, after a
#: 5xx, after a reply lost on an open connection, after a ``try_again`` answered too fast
#: (one that came back sooner than FAST_TRY_AGAIN_S).
BACKOFF_MAX_S = 30.0
SERVER_ERROR_MAX_S = 5.0
LOST_REPLY_MAX_S = 2.0
FAST_TRY_AGAIN_S = 1.0
#: Exponents are capped so counters can grow without bound
#: (docs/design/behavior.md#poll-bounded-by-time: no iteration cap) while the
#: delays stay at their caps (2**1024 would overflow a float).
_MAX_EXP = 16


class Action(enum.Enum):
    RESULT = "result"  # payload ready (proto or JSON)
    PENDING = "pending"  # try_again / 408: poll again after ``delay``
    METADATA = "metadata"  # reserve ``payload_size`` bytes, poll again with the flag false
    RETRY = "retry"  # an error worth another poll after ``delay``
    FAIL = "fail"  # stop with ``exc``


@dataclass
class PollCounters:
    iteration: int = 0
    backoff_n: int = 0  # consecutive 429 / failed connects
    lost_replies: int = 0  # consecutive polls whose reply was lost (reset, cut, read timeout)
    server_errors: int = 0  # consecutive 5xx
    bad_400: int = 0
    fast_answers: int = 0  # consecutive try_again answers faster than 1 s
    metadata_seen: bool = False
    billing_since: float | None = None
    last_error: BaseException | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float = 0.0
    reason: str = ""
    exc: BaseException | None = None
    queue_state: str | None = None
    queue_state_reason: str | None = None
    payload_size: int = 0
    protobuf: bool = False
    body: Any = None


def _json_or_none(content: bytes) -> Any:
    try:
        return json.loads(content) if content else None
    except ValueError:
        return None


def _backoff(counters: PollCounters, reason: str, exc: BaseException | None) -> Decision:
    delay = float(min(2 ** min(counters.backoff_n, _MAX_EXP), BACKOFF_MAX_S))
    counters.backoff_n += 1
    counters.server_errors = 0
    counters.last_error = exc
    return Decision(Action.RETRY, delay, reason, exc)


def decide_transport_error(
    exc: BaseException, counters: PollCounters, *, jitter: float = 1.0
) -> Decision:
    """A poll that got no HTTP answer. ``jitter`` is a uniform draw in [0, 1).

    No connection (refused, connect timeout: the server may be down): back off ``2^n`` s, as
    for 429. A reply lost on an open connection (reset, cut short, read timeout): the server
    was reachable a moment ago and a poll is safe to repeat, so poll again after
    ``min(0.1 * 2^m, 2) * U[0.75, 1]`` s (m-th lost reply in a row).
    """
    if isinstance(exc, APIConnectError):
        counters.lost_replies = 0
        return _backoff(counters, "connection error while polling", exc)
    delay = min(0.1 * 2 ** min(counters.lost_replies, _MAX_EXP), LOST_REPLY_MAX_S) * (
        0.75 + 0.25 * jitter
    )
    counters.lost_replies += 1
    counters.last_error = exc
    return Decision(Action.RETRY, delay, "reply lost while polling", exc)


def decide_reply(
    status: int,
    headers: Mapping[str, str],
    content: bytes,
    counters: PollCounters,
    *,
    request_id: str,
    now: float,
    elapsed: float,
    jitter: float,
    billing_window_s: float = 3600.0,
    op: str | None = None,
) -> Decision:
    """Map one HTTP answer to the next step. ``jitter`` is a uniform draw in [0, 1);
    ``op`` (the request type) names the operation in a :class:`RequestLostError`."""
    counters.lost_replies = 0
    if status != 429:
        counters.backoff_n = 0
    if not 500 <= status < 600:
        counters.server_errors = 0
    if status != 402:
        counters.billing_since = None

    if 200 <= status < 300:
        counters.last_error = None
        if PROTOBUF in headers.get("content-type", ""):
            return Decision(Action.RESULT, protobuf=True, body=content)
        body = _json_or_none(content)
        if not isinstance(body, dict):
            return Decision(
                Action.FAIL,
                exc=APIResponseValidationError(
                    f"retrieve_future for {request_id} answered a non-JSON, non-protobuf body",
                    response=ResponseSnapshot(status, headers, content),
                ),
            )
        if body.get("type") == "try_again":
            if elapsed < FAST_TRY_AGAIN_S:
                delay = min(0.05 * 2 ** min(counters.fast_answers, _MAX_EXP), FAST_TRY_AGAIN_S)
                counters.fast_answers += 1
            else:
                delay = 0.0
                counters.fast_answers = 0
            return Decision(
                Action.PENDING,
                delay,
                "try_again",
                queue_state=body.get("queue_state"),
                queue_state_reason=body.get("queue_state_reason"),
            )
        counters.fast_answers = 0
        if body.get("status") == "complete_metadata":
            if counters.metadata_seen:
                return Decision(
                    Action.FAIL,
                    exc=APIResponseValidationError(
                        f"protocol error: a second complete_metadata answer for {request_id}",
                        response=ResponseSnapshot(status, headers, content),
                    ),
                )
            counters.metadata_seen = True
            size = body.get("response_payload_size")
            return Decision(Action.METADATA, payload_size=size if isinstance(size, int) else 0)
        if "error" in body:
            category = RequestErrorCategory(body.get("category") or "unknown")
            return Decision(
                Action.FAIL,
                exc=RequestFailedError(
                    str(body.get("error")), request_id=request_id, category=category
                ),
            )
        return Decision(Action.RESULT, body=body)

    snapshot = ResponseSnapshot(status, headers, content)
    words = server_words(snapshot.content)
    error = status_error_class(status)(
        f"HTTP {status}{': ' + words if words else ''} "
        f"(retrieve_future for request_id={request_id})",
        response=snapshot,
    )
    counters.last_error = error
    if status == 408:
        body = _json_or_none(content)
        if isinstance(body, dict):
            counters.bad_400 = 0
            return Decision(
                Action.PENDING,
                0.0,
                "408",
                queue_state=body.get("queue_state"),
                queue_state_reason=body.get("queue_state_reason"),
            )
        return Decision(Action.PENDING, 0.0, "408")
    if 500 <= status < 600:
        delay = min(0.1 * 2 ** min(counters.server_errors, _MAX_EXP), SERVER_ERROR_MAX_S) * (
            0.75 + 0.25 * jitter
        )
        counters.server_errors += 1
        return Decision(Action.RETRY, delay, f"HTTP {status} while polling", error)
    if status == 429:
        return _backoff(counters, "HTTP 429 while polling", error)
    if status == 410:
        exc = FutureExpiredError(f"request {request_id} expired on the server (HTTP 410)")
        exc.__cause__ = error
        return Decision(Action.FAIL, exc=exc)
    if status == 404:
        return lost_decision(request_id, op, error)
    if status == 400:
        counters.bad_400 += 1
        if counters.bad_400 <= MAX_BAD_400:
            return Decision(Action.RETRY, 0.0, "HTTP 400 while polling", error)
        return _poll_failed(
            request_id, status, error, f"{MAX_BAD_400 + 1} HTTP 400 answers in a row"
        )
    if status == 402:
        if counters.billing_since is None:
            counters.billing_since = now
        if now - counters.billing_since < billing_window_s:
            return Decision(Action.RETRY, BILLING_PAUSE_S, "billing pause (HTTP 402)", error)
        return _poll_failed(request_id, status, error, "the billing pause window passed")
    return _poll_failed(request_id, status, error, f"HTTP {status}")


def lost_decision(request_id: str, op: str | None, cause: BaseException) -> Decision:
    """A 404 for a request polled by its own id: the server accepted it, then lost it
    (docs/polling.md#lost-requests)."""
    snapshot = getattr(cause, "response", None)
    words = server_words(snapshot.content) if snapshot is not None else ""
    said = f": {words}" if words else ""
    exc = RequestLostError(
        f"{op or 'request'} request_id={request_id} was accepted, then lost by the server "
        f"(HTTP 404 when polled by its request id{said})",
        op=op,
        request_id=request_id,
    )
    exc.__cause__ = cause
    return Decision(Action.FAIL, exc=exc)


def _poll_failed(request_id: str, status: int, cause: BaseException, why: str) -> Decision:
    snapshot = getattr(cause, "response", None)
    words = server_words(snapshot.content) if snapshot is not None else ""
    said = f": {words}" if words else " (the server gave no reason)"
    exc = FuturePollError(
        f"HTTP {status}{said} (polling request_id={request_id} failed after {why})",
        status_code=status,
        request_id=request_id,
    )
    exc.__cause__ = cause
    return Decision(Action.FAIL, exc=exc)
