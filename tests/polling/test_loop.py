"""The poll loop against the real local server (docs/design/behavior.md#poll-request,
docs/design/behavior.md#poll-answer-order, docs/design/behavior.md#poll-error-table,
docs/design/behavior.md#poll-bounded-by-time, docs/design/behavior.md#proto-result-decoding).

Every delay is asserted on an injected FakeClock (the poll loop's sleeps carry the reason
``poll:<why>``); faults are scripted per future kind with ``match.request_type``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._polling.decide import Decision
from tinker_sync._polling.loop import Poll
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._transport import Pool, RequestSpec
from tinker_sync.exceptions import (
    APIResponseValidationError,
    FutureExpiredError,
    FuturePollError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    RequestErrorCategory,
    RequestFailedError,
)
from tinker_sync.local import LocalServer

HANG = 60.0
FULL_RESPONSE_BUDGET = 50 * 1024 * 1024


def datum(n: int = 6) -> types.Datum:
    tokens = np.arange(n + 1, dtype=np.int64) % 200
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(n, np.float32)},
    )


def poll_sleeps(clock: FakeClock) -> list[float]:
    return [s for s, reason in clock.sleeps if reason.startswith("poll:")]


class Rig:
    """A server, a FakeClock ServiceClient and one training client (created before faults)."""

    def __init__(self, **server_kwargs: Any) -> None:
        server_kwargs.setdefault("long_poll_s", 2.0)
        self.server = LocalServer(**server_kwargs).start()
        self.clock = FakeClock(rng=lambda: 0.0)  # 5xx jitter factor at its low end, 0.75
        self.service = tinker_sync.ServiceClient(
            base_url=self.server.url, api_key=self.server.api_key, _clock=self.clock
        )
        self.training = self.service.create_lora_training_client("base", rank=4)
        self.clock.clear()

    def polls(self, request_id: str | None) -> list[Any]:
        return [
            r
            for r in self.server.requests.filter(endpoint="retrieve_future")
            if r.json and r.json.get("request_id") == request_id
        ]

    def close(self) -> None:
        self.service.close()
        self.server.stop()
        from tinker_sync._flow.limiter import reset_limiters

        reset_limiters()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.close()


# ------------------------------------------------------- poll errors and their sleeps

OK = None


@pytest.mark.parametrize(
    ("faults", "expected_sleeps", "error"),
    [
        pytest.param(["408 x2"], [], OK, id="408 re-polls at once"),
        pytest.param(["503 x3"], [0.075, 0.15, 0.3], OK, id="5xx jittered backoff"),
        pytest.param(["429 x3"], [1.0, 2.0, 4.0], OK, id="429 2^n"),
        pytest.param(["drop-before x3"], [0.075, 0.15, 0.3], OK, id="lost reply 0.1*2^m"),
        pytest.param(["429 x2", "drop-before"], [1.0, 2.0, 0.075], OK, id="lost reply apart"),
        pytest.param(["429", "503", "429"], [1.0, 0.075, 1.0], OK, id="a 5xx resets the 429 n"),
        pytest.param(["expire"], [], FutureExpiredError, id="410 expired"),
        pytest.param(["400 x3"], [], OK, id="400 x3 within budget"),
        pytest.param(["400 x4"], [], FuturePollError, id="400 x4 fails"),
        pytest.param(["402 x2"], [5.0, 5.0], OK, id="402 billing pause"),
        pytest.param(["404"], [], FuturePollError, id="404 fails"),
        pytest.param(["paused_capacity x3"], [0.05, 0.1, 0.2], OK, id="fast try_again"),
    ],
)
def test_poll_error_table_sleeps(rig: Rig, faults: list[str], expected_sleeps, error) -> None:
    """The recorded sleeps of each poll-error row, against the server
    (docs/design/behavior.md#poll-error-table)."""
    for spec in faults:
        rig.server.faults.add(f"retrieve_future {spec} match.request_type=OptimStep")
    fut = rig.training.optim_step(types.AdamParams())
    exc = fut.exception(HANG)
    assert poll_sleeps(rig.clock) == pytest.approx(expected_sleeps)
    if error is OK:
        assert exc is None
        assert isinstance(fut.result(), types.OptimStepResponse)
    else:
        assert isinstance(exc, error), exc
    polls = rig.polls(fut.request_id)
    assert [int(p.headers["x-tinker-request-iteration"]) for p in polls] == list(range(len(polls)))
    if faults == ["400 x4"]:
        assert isinstance(exc, FuturePollError) and exc.status_code == 400
        assert [p.status for p in polls] == [400] * 4  # three re-polls, then the failure
    if faults == ["404"]:
        assert isinstance(exc, FuturePollError) and exc.status_code == 404
        assert isinstance(exc.__cause__, NotFoundError)
        assert isinstance(exc, ValueError)  # parity with code that catches ValueError
    if faults == ["408 x2"]:
        assert [p.status for p in polls] == [408, 408, 200]


def test_402_fails_once_the_billing_window_has_passed() -> None:
    """5 s pauses inside the server's window, then FuturePollError(402)
    (docs/design/behavior.md#poll-error-table, docs/design/behavior.md#submission-loop)."""
    rig = Rig(client_config={"billing_exception_max_pause_duration_sec": 12})
    try:
        rig.server.faults.add("retrieve_future 402 x* match.request_type=OptimStep")
        fut = rig.training.optim_step(types.AdamParams())
        exc = fut.exception(HANG)
        assert isinstance(exc, FuturePollError) and exc.status_code == 402
        assert poll_sleeps(rig.clock) == [5.0, 5.0, 5.0]  # t = 0, 5, 10 < 12; t = 15 fails
    finally:
        rig.close()


def test_poll_headers_follow_b20(rig: Rig) -> None:
    """Iteration from 0, request type, roundtrip time on iteration 0 only, Accept proto
    (docs/design/behavior.md#poll-request)."""
    rig.server.faults.add("retrieve_future paused_capacity x2 match.request_type=Forward")
    fut = rig.training.forward([datum()], "cross_entropy")
    fut.result(HANG)
    polls = rig.polls(fut.request_id)
    assert len(polls) == 3
    for i, p in enumerate(polls):
        assert p.headers["x-tinker-request-iteration"] == str(i)
        assert p.headers["x-tinker-request-type"] == "Forward"
        assert p.headers["accept"] == "application/x-protobuf"
        assert ("x-tinker-create-promise-roundtrip-time" in p.headers) == (i == 0)
        assert p.json == {"request_id": fut.request_id, "allow_metadata_only": True}
    opt = rig.training.optim_step(types.AdamParams())
    opt.result(HANG)
    (opt_poll,) = rig.polls(opt.request_id)
    assert opt_poll.headers["accept"] == "application/json"
    assert opt_poll.headers["x-tinker-request-type"] == "OptimStep"


# -------------------------------------------------------------- metadata-only answers


def test_metadata_flow_reserves_and_releases_response_bytes() -> None:
    """Step 3 of the answer order: complete_metadata reserves the size, re-polls with the flag false,
    and releases the bytes after decoding.

    See docs/design/behavior.md#poll-answer-order.
    """
    rig = Rig(metadata_threshold_bytes=64)
    try:
        limiter = rig.service._session.limiter
        assert limiter.snapshot()["response_bytes"] == FULL_RESPONSE_BUDGET
        during: list[int] = []
        rig.clock.on_sleep = lambda s, reason: during.append(limiter.snapshot()["response_bytes"])
        # One 503 on the payload fetch: the loop sleeps while the bytes are reserved.
        rig.server.faults.add("retrieve_future 503 match.allow_metadata_only=false")
        fut = rig.training.forward([datum(40)], "cross_entropy")
        out = fut.result(HANG)
        assert len(out.loss_fn_outputs) == 1
        polls = rig.polls(fut.request_id)
        assert [p.json["allow_metadata_only"] for p in polls] == [True, False, False]
        assert [p.status for p in polls] == [200, 503, 200]
        assert len(during) == 1
        reserved = FULL_RESPONSE_BUDGET - during[0]
        assert reserved > 64  # the announced payload size, bigger than the threshold
        assert limiter.snapshot()["response_bytes"] == FULL_RESPONSE_BUDGET
    finally:
        rig.close()


def test_a_second_complete_metadata_is_a_protocol_error(rig: Rig) -> None:
    """A duplicate complete_metadata fails the future; the bytes are released
    (docs/design/behavior.md#poll-answer-order)."""
    rig.server.faults.add(
        {
            "endpoint": "retrieve_future",
            "status": 200,
            "times": 2,
            "body": {"status": "complete_metadata", "response_payload_size": 1000},
            "match": {"request_type": "OptimStep"},
        }
    )
    fut = rig.training.optim_step(types.AdamParams())
    exc = fut.exception(HANG)
    assert isinstance(exc, APIResponseValidationError)
    assert "second complete_metadata" in str(exc)
    assert [p.json["allow_metadata_only"] for p in rig.polls(fut.request_id)] == [True, False]
    assert rig.service._session.limiter.snapshot()["response_bytes"] == FULL_RESPONSE_BUDGET
    # the client stays usable
    assert rig.training.optim_step(types.AdamParams()).result(HANG) is not None


# ------------------------------------------------------------------- error categories


@pytest.mark.parametrize(
    ("fault", "category"),
    [
        ("retrieve_future fail:user match.request_type=OptimStep", RequestErrorCategory.User),
        ("retrieve_future fail:server match.request_type=OptimStep", RequestErrorCategory.Server),
        ({"error": "bad input", "category": "User"}, RequestErrorCategory.User),
        ({"error": "oops", "category": "SERVER"}, RequestErrorCategory.Server),
        ({"error": "what", "category": "junk"}, RequestErrorCategory.Unknown),
        ({"error": "no category"}, RequestErrorCategory.Unknown),
        ({"error": "number", "category": 7}, RequestErrorCategory.Unknown),
    ],
)
def test_failed_request_categories(rig: Rig, fault: Any, category: RequestErrorCategory) -> None:
    """Step 4 of the answer order: categories parse case-insensitively; junk maps to unknown
    (docs/design/behavior.md#poll-answer-order)."""
    if isinstance(fault, dict):
        rig.server.faults.add(
            {
                "endpoint": "retrieve_future",
                "status": 200,
                "body": fault,
                "match": {"request_type": "OptimStep"},
            }
        )
    else:
        rig.server.faults.add(fault)
    fut = rig.training.optim_step(types.AdamParams())
    exc = fut.exception(HANG)
    assert isinstance(exc, RequestFailedError), exc
    assert exc.category is category
    assert exc.request_id == fut.request_id
    assert len(rig.polls(fut.request_id)) == 1  # never retried
    assert poll_sleeps(rig.clock) == []


# ------------------------------------------------------------------------ time bounds


@pytest.mark.slow
def test_10000_try_again_answers_then_success(rig: Rig) -> None:
    """No iteration cap and no recursion; fast answers back off up to 1 s
    (docs/design/behavior.md#poll-bounded-by-time)."""
    n = 10_000
    rig.server.faults.add(f"retrieve_future paused_capacity x{n} match.request_type=OptimStep")
    fut = rig.training.optim_step(types.AdamParams())
    assert isinstance(fut.result(600), types.OptimStepResponse)
    sleeps = poll_sleeps(rig.clock)
    assert len(sleeps) == n
    assert sleeps[:5] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8])
    assert set(sleeps[5:]) == {1.0}
    polls = rig.server.requests.count("retrieve_future")
    assert polls >= n + 1
    assert rig.clock.monotonic() == pytest.approx(sum(sleeps))


def _submit_raw_optim_step(rig: Rig) -> str:
    """Send an optim_step outside the TrainingClient so only our Poll polls it."""
    session = rig.service._session
    seq = rig.training._sequencer._next_seq_id
    rig.training._sequencer._next_seq_id += 1
    reply = session.request(
        RequestSpec(
            method="POST",
            path="/api/v1/optim_step",
            pool=Pool.TRAIN,
            json={
                "model_id": rig.training.model_id,
                "seq_id": seq,
                "type": "optim_step",
                "adam_params": {"learning_rate": 1e-4},
            },
        )
    )
    request_id = reply.json()["request_id"]
    assert isinstance(request_id, str)
    return request_id


@pytest.mark.parametrize(
    ("fault", "cause", "sleeps"),
    [
        ("503 x*", InternalServerError, [0.075, 0.15, 0.3, 0.6, 1.2, 2.4, 3.75]),
        ("429 x*", RateLimitError, [1.0, 2.0, 4.0]),
    ],
)
def test_poll_timeout_expiry_chains_the_last_error(rig: Rig, fault: str, cause, sleeps) -> None:
    """``poll_timeout`` runs on the Clock; expiry raises TimeoutError from the
    last error, checked before each sleep (never sleeping past the deadline).

    See docs/design/behavior.md#poll-bounded-by-time.
    """
    request_id = _submit_raw_optim_step(rig)
    rig.server.faults.add(f"retrieve_future {fault} match.request_type=OptimStep")
    outcome: list[Any] = []
    poll = Poll(
        rig.service._session,
        request_id,
        "OptimStep",
        decode=lambda d: d.body,
        on_done=lambda value, error: outcome.append((value, error)),
        created_at=rig.clock.monotonic(),
        poll_timeout=10.0,
    )
    poll.run()
    ((value, error),) = outcome
    assert value is None
    assert isinstance(error, TimeoutError)
    assert isinstance(error.__cause__, cause)
    assert poll_sleeps(rig.clock) == pytest.approx(sleeps)
    assert rig.clock.monotonic() < 10.0


def test_poll_without_timeout_returns_the_decoded_value(rig: Rig) -> None:
    """Poll used directly: ``decode`` sees the Decision; ``on_done`` is called exactly once."""
    request_id = _submit_raw_optim_step(rig)
    outcome: list[Any] = []

    def decode(decision: Decision) -> Any:
        assert not decision.protobuf
        return decision.body

    Poll(
        rig.service._session,
        request_id,
        "OptimStep",
        decode=decode,
        on_done=lambda value, error: outcome.append((value, error)),
        created_at=rig.clock.monotonic(),
    ).run()
    ((value, error),) = outcome
    assert error is None and isinstance(value, dict)


# --------------------------------------------------- content types: protobuf and JSON


def _forward_outputs(server: LocalServer) -> types.ForwardBackwardOutput:
    with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
        training = service.create_lora_training_client("base", rank=4)
        fut = training.forward([datum(), datum(3)], "cross_entropy")
        return fut.result(HANG)


def test_proto_and_json_results_are_both_decoded_by_content_type() -> None:
    """The current server answers protobuf, the legacy one JSON; same values
    (docs/design/behavior.md#poll-answer-order, docs/design/behavior.md#proto-result-decoding)."""
    with LocalServer(long_poll_s=2.0) as current:
        proto_out = _forward_outputs(current)
        (poll,) = [
            p
            for p in current.requests.filter(endpoint="retrieve_future")
            if p.headers.get("x-tinker-request-type") == "Forward"
        ]
        assert poll.headers["accept"] == "application/x-protobuf"
    with LocalServer(long_poll_s=2.0, protocol="legacy") as legacy:
        json_out = _forward_outputs(legacy)
    assert len(proto_out.loss_fn_outputs) == len(json_out.loss_fn_outputs) == 2
    for a, b in zip(proto_out.loss_fn_outputs, json_out.loss_fn_outputs, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key].to_numpy(), b[key].to_numpy(), rtol=1e-6)
    assert "loss:sum" in proto_out.metrics
    # A legacy server sends no metrics (docs/design/behavior.md#older-servers): empty, no crash.
    assert json_out.metrics == {}


def test_a_json_payload_on_a_proto_kind_is_accepted(rig: Rig) -> None:
    """Step 5 of the answer order: JSON is decoded when the content-type says JSON (a deliberate
    difference: docs/design/behavior.md#poll-answer-order)."""
    body = {
        "loss_fn_output_type": "ArrayRecord",
        "loss_fn_outputs": [{"logprobs": {"data": [-1.5, -0.25], "dtype": "float32"}}],
        "metrics": {"loss:sum": 1.75},
    }
    rig.server.faults.add(
        {
            "endpoint": "retrieve_future",
            "status": 200,
            "body": body,
            "match": {"request_type": "Forward"},
        }
    )
    out = rig.training.forward([datum(2)], "cross_entropy").result(HANG)
    assert out.loss_fn_outputs[0]["logprobs"].to_numpy().tolist() == [-1.5, -0.25]
    assert out.metrics == {"loss:sum": 1.75}


@pytest.mark.parametrize("kind", ["OptimStep", "Forward"])
def test_an_undecodable_payload_is_a_validation_error(rig: Rig, kind: str) -> None:
    """Protobuf content-type on a JSON kind, or garbage protobuf, fails validation
    (docs/design/behavior.md#poll-answer-order, docs/design/behavior.md#proto-result-decoding)."""
    rig.server.faults.add(
        {
            "endpoint": "retrieve_future",
            "status": 200,
            "body": "\x08\xff\xff garbage",
            "headers": {"content-type": "application/x-protobuf"},
            "match": {"request_type": kind},
        }
    )
    fut = (
        rig.training.optim_step(types.AdamParams())
        if kind == "OptimStep"
        else rig.training.forward([datum(2)], "cross_entropy")
    )
    exc = fut.exception(HANG)
    assert isinstance(exc, APIResponseValidationError), exc
    assert exc.__cause__ is not None
