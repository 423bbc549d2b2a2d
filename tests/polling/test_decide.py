"""The poll decision table (docs/design/behavior.md#poll-answer-order,
docs/design/behavior.md#poll-error-table), asserted delay by delay."""

from __future__ import annotations

import json

import pytest

from tinker_sync._polling.decide import Action, PollCounters, decide_reply, decide_transport_error
from tinker_sync.exceptions import (
    APIConnectError,
    APIConnectionError,
    APIResponseValidationError,
    APITimeoutError,
    FutureExpiredError,
    FuturePollError,
    RequestErrorCategory,
    RequestFailedError,
    RequestLostError,
)

JSON = {"content-type": "application/json"}


def reply(
    status: int,
    body: object = None,
    *,
    headers=None,
    counters=None,
    elapsed=5.0,
    jitter=0.0,
    now=0.0,
    window=3600.0,
):
    content = b"" if body is None else json.dumps(body).encode()
    return decide_reply(
        status,
        headers or JSON,
        content,
        counters or PollCounters(),
        request_id="r1",
        now=now,
        elapsed=elapsed,
        jitter=jitter,
        billing_window_s=window,
    )


def test_protobuf_content_type_is_a_result_whatever_the_body():
    d = reply(200, headers={"content-type": "application/x-protobuf"})
    assert d.action is Action.RESULT and d.protobuf


def test_json_result_is_accepted():
    d = reply(200, {"model_id": "m"})
    assert d.action is Action.RESULT and not d.protobuf and d.body == {"model_id": "m"}


def test_try_again_reports_queue_state_and_a_held_poll_repolls_at_once():
    d = reply(
        200,
        {
            "type": "try_again",
            "request_id": "r1",
            "queue_state": "paused_capacity",
            "queue_state_reason": "busy",
        },
    )
    assert d.action is Action.PENDING and d.delay == 0.0
    assert (d.queue_state, d.queue_state_reason) == ("paused_capacity", "busy")


def test_fast_try_again_answers_back_off_from_50ms_to_1s_and_reset():
    c = PollCounters()
    delays = [reply(200, {"type": "try_again"}, counters=c, elapsed=0.01).delay for _ in range(7)]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert reply(200, {"type": "try_again"}, counters=c, elapsed=2.0).delay == 0.0
    assert reply(200, {"type": "try_again"}, counters=c, elapsed=0.0).delay == pytest.approx(0.05)


def test_metadata_then_duplicate_metadata_is_a_protocol_error():
    c = PollCounters()
    d = reply(200, {"status": "complete_metadata", "response_payload_size": 1234}, counters=c)
    assert d.action is Action.METADATA and d.payload_size == 1234
    d2 = reply(200, {"status": "complete_metadata", "response_payload_size": 1}, counters=c)
    assert d2.action is Action.FAIL and isinstance(d2.exc, APIResponseValidationError)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("user", RequestErrorCategory.User),
        ("User", RequestErrorCategory.User),
        ("SERVER", RequestErrorCategory.Server),
        ("junk", RequestErrorCategory.Unknown),
        (None, RequestErrorCategory.Unknown),
    ],
)
def test_error_categories_parse_case_insensitively(raw, expected):
    d = reply(200, {"error": "bad input", "category": raw})
    assert d.action is Action.FAIL and isinstance(d.exc, RequestFailedError)
    assert d.exc.category is expected and d.exc.request_id == "r1"


def test_408_repolls_at_once_reports_state_and_json_body_resets_400_budget():
    c = PollCounters()
    for _ in range(3):
        assert reply(400, {"detail": "x"}, counters=c).action is Action.RETRY
    d = reply(408, {"queue_state": "paused_rate_limit"}, counters=c)
    assert d.action is Action.PENDING and d.delay == 0 and d.queue_state == "paused_rate_limit"
    assert c.bad_400 == 0
    for _ in range(3):
        assert reply(400, {"detail": "x"}, counters=c).action is Action.RETRY


def test_5xx_backoff_is_jittered_from_100ms_capped_at_5s_and_reset_by_other_replies():
    c = PollCounters()
    low = [reply(503, {"detail": "x"}, counters=c, jitter=0.0).delay for _ in range(8)]
    assert low == pytest.approx([0.075, 0.15, 0.3, 0.6, 1.2, 2.4, 3.75, 3.75])
    c = PollCounters()
    high = [reply(500, {"detail": "x"}, counters=c, jitter=1.0).delay for _ in range(8)]
    assert high == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    reply(200, {"type": "try_again"}, counters=c)
    assert reply(500, {"detail": "x"}, counters=c, jitter=1.0).delay == pytest.approx(0.1)


def test_429_and_failed_connects_share_one_exponential_counter():
    c = PollCounters()
    delays = [reply(429, {"detail": "x"}, counters=c).delay for _ in range(3)]
    delays.append(decide_transport_error(APIConnectError("refused"), c).delay)
    delays += [reply(429, {"detail": "x"}, counters=c).delay for _ in range(3)]
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    reply(503, {"detail": "x"}, counters=c)  # any non-429 answer resets the counter
    assert reply(429, {"detail": "x"}, counters=c).delay == 1


def test_a_lost_reply_repolls_after_a_short_jittered_backoff_capped_at_2s():
    """A reset, a reply cut short or a read timeout: the server was reachable, a poll is safe
    to repeat, so no 2^n wait (which made one lost reply cost seconds under packet loss)."""
    c = PollCounters()
    for exc in (APIConnectionError("reset"), APITimeoutError("read timed out")):
        c = PollCounters()
        low = [decide_transport_error(exc, c, jitter=0.0) for _ in range(7)]
        assert [d.delay for d in low] == pytest.approx([0.075, 0.15, 0.3, 0.6, 1.2, 1.5, 1.5])
        assert all(d.action is Action.RETRY and d.exc is exc for d in low)
    high = decide_transport_error(APIConnectionError("reset"), PollCounters(), jitter=1.0)
    assert high.delay == pytest.approx(0.1)
    reply(200, {"type": "try_again"}, counters=c, elapsed=2.0)  # any answer resets m
    assert decide_transport_error(APIConnectionError("x"), c, jitter=1.0).delay == 0.1
    # failed connects back off 2^n, and do not count as lost replies
    assert decide_transport_error(APIConnectError("refused"), c).delay == 1
    assert decide_transport_error(APIConnectError("refused"), c).delay == 2
    assert decide_transport_error(APIConnectionError("x"), c, jitter=1.0).delay == 0.1
    assert c.last_error is not None


def test_410_is_future_expired():
    d = reply(410, {"detail": "gone"})
    assert d.action is Action.FAIL and isinstance(d.exc, FutureExpiredError)


def test_fourth_400_fails_with_future_poll_error():
    c = PollCounters()
    assert [reply(400, {"detail": "x"}, counters=c).action for _ in range(3)] == [Action.RETRY] * 3
    d = reply(400, {"detail": "x"}, counters=c)
    assert d.action is Action.FAIL and isinstance(d.exc, FuturePollError)
    assert isinstance(d.exc, ValueError) and d.exc.status_code == 400


def test_402_pauses_5s_inside_the_billing_window_then_fails():
    c = PollCounters()
    assert reply(402, {"detail": "pay"}, counters=c, now=100.0).delay == 5.0
    assert reply(402, {"detail": "pay"}, counters=c, now=3699.0).delay == 5.0
    d = reply(402, {"detail": "pay"}, counters=c, now=3700.0)
    assert d.action is Action.FAIL and isinstance(d.exc, FuturePollError)


@pytest.mark.parametrize("status", [401, 403, 404, 409, 422])
def test_other_4xx_fail_with_future_poll_error_chained_to_the_status_error(status):
    d = reply(status, {"detail": "no"})
    assert d.action is Action.FAIL and isinstance(d.exc, FuturePollError)
    assert d.exc.status_code == status and d.exc.__cause__ is not None


def test_a_404_means_the_server_lost_the_request_and_names_the_op():
    """docs/polling.md#lost-requests: a request polled by its own id answered 404."""
    d = decide_reply(
        404,
        JSON,
        json.dumps({"detail": "future r1 not found"}).encode(),
        PollCounters(),
        request_id="r1",
        now=0,
        elapsed=1,
        jitter=0,
        op="OptimStep",
    )
    assert d.action is Action.FAIL and isinstance(d.exc, RequestLostError)
    assert d.exc.op == "OptimStep" and d.exc.request_id == "r1" and d.exc.status_code == 404
    assert str(d.exc).startswith("OptimStep request_id=r1 was accepted, then lost by the server")
    assert "future r1 not found" in str(d.exc)


def test_non_json_2xx_is_a_validation_error():
    d = decide_reply(
        200, JSON, b"<html>", PollCounters(), request_id="r", now=0, elapsed=1, jitter=0
    )
    assert d.action is Action.FAIL and isinstance(d.exc, APIResponseValidationError)
