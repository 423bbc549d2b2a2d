"""Lost requests (docs/polling.md#lost-requests) against a real LocalServer whose ``lose``
fault accepts a request and then never completes it (404 when polled alone).

Every wait that decides when to probe runs on the injected FakeClock: nothing is probed until
the test moves virtual time past LOST_PROBE_AFTER_S, so the counts below are exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from waiting import until  # tests/waiting.py

import tinker_sync
from tinker_sync import types
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync._polling.poller import LOST_PROBE_AFTER_S, SessionFuturesPoller
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._sampling.retry import LOST_RESUBMITS
from tinker_sync._transport import Pool, RequestSpec
from tinker_sync.exceptions import RequestLostError
from tinker_sync.local import LocalServer

HANG = 60.0
PROMPT = types.ModelInput.from_ints([1, 2, 3])
PARAMS = types.SamplingParams(max_tokens=3)


class Rig:
    """A server with the session futures poller on, a FakeClock'd client and its sampler."""

    def __init__(self, faults: list[str], **server: Any) -> None:
        self.clock = FakeClock(rng=lambda: 0.0)
        self.srv = LocalServer(
            backend="instant",
            client_config={"sample_use_retrieve_futures": True},
            long_poll_s=0.1,
            faults=faults,
            **server,
        ).start()
        self.service = tinker_sync.ServiceClient(
            base_url=self.srv.url, api_key=self.srv.api_key, _clock=self.clock
        )
        self.sampler = self.service.create_sampling_client(base_model="base")

    @property
    def poller(self) -> SessionFuturesPoller:
        poller = self.sampler._poller
        assert poller is not None
        return poller

    def sent(self, endpoint: str) -> list[Any]:
        return [r.json for r in self.srv.requests.filter(endpoint)]

    def probes(self) -> list[tuple[str, int | None]]:
        """The lost-request probes: single polls asking for no hold (payload fetches ask for
        the usual hold)."""
        return [
            (r.json["request_id"], r.status)
            for r in self.srv.requests.filter("retrieve_future")
            if r.headers.get("x-tinker-poll-hold") == "0"
        ]

    def wait_registered(self, submissions: int) -> None:
        """Until the ``submissions``-th asample was accepted and waits on the poller, and the
        poller has had answered polls since (so it is healthy and checked its waiters)."""
        until(
            lambda: (
                len(self.sent("asample")) == submissions
                and self.sampler._poller is not None  # made when the first sample is accepted
                and self.sampler._poller.waiting == 1
            )
        )
        polls = self.poller.polls
        until(lambda: self.poller.polls >= polls + 2)

    def close(self) -> None:
        self.service.close()
        self.srv.stop()


@pytest.fixture
def make_rig() -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(faults: list[str], **server: Any) -> Rig:
        rig = Rig(faults, **server)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()
    reset_limiters()


def test_a_lost_sample_is_probed_once_then_resubmitted_under_a_new_seq_id(make_rig):
    rig = make_rig(["asample lose"])
    fut = rig.sampler.sample(PROMPT, 1, PARAMS)
    settled: list[Any] = []
    fut.add_done_callback(settled.append)
    rig.wait_registered(1)
    assert rig.probes() == []  # answered polls alone probe nothing before LOST_PROBE_AFTER_S
    rig.clock.advance(LOST_PROBE_AFTER_S - 0.1)
    polls = rig.poller.polls
    until(lambda: rig.poller.polls >= polls + 2)
    assert rig.probes() == []
    lost_id = fut.request_id
    rig.clock.advance(0.1)
    result = fut.result(HANG)
    assert result.sequences[0].tokens
    submissions = rig.sent("asample")
    assert len(submissions) == 2
    assert submissions[0]["seq_id"] != submissions[1]["seq_id"]
    assert rig.probes() == [(lost_id, 404)]  # one probe, of the lost request only
    assert rig.poller.probes == 1
    assert fut.request_id != lost_id
    until(lambda: len(settled) == 1)
    assert settled == [fut]  # completed once


def test_a_sample_lost_every_time_fails_with_request_lost_error_naming_each_id(make_rig):
    rig = make_rig(["asample lose x*"])
    fut = rig.sampler.sample(PROMPT, 1, PARAMS)
    for attempt in range(1, LOST_RESUBMITS + 2):
        rig.wait_registered(attempt)
        rig.clock.advance(LOST_PROBE_AFTER_S)
        until(lambda attempt=attempt: len(rig.probes()) == attempt)
    with pytest.raises(RequestLostError) as info:
        fut.result(HANG)
    probes = rig.probes()
    assert [status for _, status in probes] == [404] * (LOST_RESUBMITS + 1)
    assert len(rig.sent("asample")) == LOST_RESUBMITS + 1
    assert len({body["seq_id"] for body in rig.sent("asample")}) == LOST_RESUBMITS + 1
    err = info.value
    assert err.op == "Sample" and err.status_code == 404
    assert err.request_id == probes[-1][0]
    for request_id, _ in probes:
        assert request_id in str(err)


def test_a_pending_sample_is_probed_and_left_waiting(make_rig):
    rig = make_rig([])
    rig.srv.pause("paused_capacity", kind="sampling")
    fut = rig.sampler.sample(PROMPT, 1, PARAMS)
    rig.wait_registered(1)
    rig.clock.advance(LOST_PROBE_AFTER_S)
    until(lambda: len(rig.probes()) == 1)
    polls = rig.poller.polls
    until(lambda: rig.poller.polls >= polls + 2)
    assert rig.poller.waiting == 1 and not fut.done()
    assert rig.probes() == [(fut.request_id, 200)]  # try_again: nothing else changes
    rig.srv.resume()
    assert fut.result(HANG).sequences[0].tokens
    assert len(rig.sent("asample")) == 1
    assert rig.poller.probes == 1


def test_a_finished_sample_whose_completion_never_came_is_fetched(make_rig):
    """The probe finds the future done: the waiter gets a size-less completion and fetches."""
    rig = make_rig([])
    session = rig.service._session
    rig.sampler._ensure_clone()
    body = rig.sampler._sample_body(PROMPT, 1, PARAMS, False, 0, 0, None, 0, None)
    body["seq_id"] = 0
    accepted = session.request(
        RequestSpec(method="POST", path="/api/v1/asample", pool=Pool.SAMPLE, json=body)
    ).json()
    request_id = accepted["request_id"]
    target = {
        "type": "sampling_session",
        "sampling_session_id": rig.sampler.sampler_id,
        "cloned_sampler_id": 0,
    }
    poll = {"target": target, "prev_cursor": 0, "retrieved_request_ids": []}

    def retrieve(body: dict[str, Any]) -> dict[str, Any]:
        spec = RequestSpec(
            method="POST", path="/api/v1/retrieve_futures", pool=Pool.RETRIEVE_FUTURES, json=body
        )
        reply: dict[str, Any] = session.request(spec).json()
        return reply

    completions: list[dict[str, Any]] = []
    while not completions:
        answer = retrieve(poll)
        completions = answer["completions"]
    assert [c["request_id"] for c in completions] == [request_id]
    # acknowledging the cursor drops the completion event: the poller below never sees it
    retrieve(dict(poll, prev_cursor=answer["cursor"], timeout=0.0))

    poller = SessionFuturesPoller(session, rig.sampler.sampler_id, 0)
    got: list[dict[str, Any]] = []
    done = threading.Event()

    class Waiter:
        def on_completion(self, completion: dict[str, Any]) -> None:
            got.append(completion)
            done.set()

        def on_failure(self, exc: BaseException) -> None:
            raise AssertionError(f"unexpected failure {exc!r}")

        def abandoned(self) -> BaseException | None:
            return None

    try:
        poller.wait(request_id, Waiter())
        polls = poller.polls
        until(lambda: poller.polls >= polls + 2)
        assert not done.is_set()
        rig.clock.advance(LOST_PROBE_AFTER_S)
        assert done.wait(HANG)
        assert got == [{"state": "finished", "request_id": request_id}]
        assert poller.probes == 1 and poller.waiting == 0
    finally:
        poller.close()


def datum(n: int = 4) -> types.Datum:
    tokens = np.arange(n + 1, dtype=np.int64)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(n, np.float32)},
    )


def test_a_lost_training_op_fails_with_request_lost_error_and_later_ops_keep_their_order():
    """Never resubmitted (it may have been applied); later ops keep their turns and seq order
    (docs/sequencer.md#failure-rules)."""
    clock = FakeClock(rng=lambda: 0.0)
    with LocalServer(backend="instant", faults=["forward_backward lose"]) as srv:
        with tinker_sync.ServiceClient(
            base_url=srv.url, api_key=srv.api_key, _clock=clock
        ) as service:
            training = service.create_lora_training_client("base", rank=4)
            lost = training.forward_backward([datum()], "cross_entropy")
            step = training.optim_step(types.AdamParams())
            after = training.forward_backward([datum()], "cross_entropy")
            with pytest.raises(RequestLostError) as info:
                lost.result(HANG)
            step.result(HANG)
            after.result(HANG)
            err = info.value
            assert err.op == "ForwardBackward" and err.request_id == lost.request_id
            assert "ForwardBackward" in str(err) and lost.request_id in str(err)
            assert len(srv.requests.filter("forward_backward")) == 2  # never resubmitted
            assert [tuple(x) for x in srv.app.applied(training.model_id)] == [
                (0, "CreateModel"),
                (2, "OptimStep"),
                (3, "ForwardBackward"),
            ]
