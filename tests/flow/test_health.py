"""Bounded, visible waits: unreachable servers, stalls, the warning, pending(), server words.

Time is virtual (FakeClock): a 60 s retry window or a 600 s stall costs no real time. The
server is the real local server over loopback, or a closed port on 127.0.0.1.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._flow.health import Health, StallWatch
from tinker_sync._flow.retry import SubmissionRetry, submission_loop
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._transport import HookEvent
from tinker_sync.exceptions import (
    APIConnectError,
    FuturePollError,
    InternalServerError,
    ResponseSnapshot,
    StalledError,
)
from tinker_sync.local import LocalServer

HANG = 60.0


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def datum(n: int = 6) -> types.Datum:
    tokens = np.arange(n + 1, dtype=np.int64) % 200
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(n, np.float32)},
    )


def retry_sleeps(clock: FakeClock) -> list[float]:
    return [s for s, reason in clock.sleeps if reason in ("http-retry", "submission-retry")]


# ---------------------------------------------------------------- unreachable servers


def test_unreachable_server_fails_within_the_timeout_window() -> None:
    """Defaults: retries of a refused connection stop before 60 s; no 300 s outer loop."""
    clock = FakeClock(rng=lambda: 0.0)  # no jitter: the longest possible delays
    url = f"http://127.0.0.1:{closed_port()}"
    service = tinker_sync.ServiceClient(base_url=url, api_key="tml-x", _clock=clock)
    with pytest.raises(APIConnectError) as info:
        service.create_lora_training_client("base", rank=4)
    service.close()
    sleeps = retry_sleeps(clock)
    # the last delay is trimmed so that the last attempt comes at the 60 s deadline
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0, 10.0, 4.5]
    assert clock.monotonic() == 60.0
    message = str(info.value)
    assert f"{url}/api/v1/client/config" in message and "11 attempts" in message


def test_timeout_knob_shortens_the_retry_window() -> None:
    clock = FakeClock(rng=lambda: 0.0)
    url = f"http://127.0.0.1:{closed_port()}"
    service = tinker_sync.ServiceClient(base_url=url, api_key="tml-x", timeout=5, _clock=clock)
    with pytest.raises(APIConnectError):
        service.create_lora_training_client("base", rank=4)
    service.close()
    assert retry_sleeps(clock) == [0.5, 1.0, 2.0, 1.5]  # 4.0 trimmed to end at 5 s
    assert clock.monotonic() == 5.0


def test_max_retries_zero_means_one_attempt() -> None:
    clock = FakeClock()
    server = LocalServer().start()
    try:
        port = server.port
        server.refuse_connections(30.0)
        service = tinker_sync.ServiceClient(
            base_url=f"http://127.0.0.1:{port}", api_key="tml-x", max_retries=0, _clock=clock
        )
        with pytest.raises(APIConnectError, match="1 attempt"):
            service.create_lora_training_client("base", rank=4)
        service.close()
        assert retry_sleeps(clock) == []
    finally:
        server.stop()


def test_dns_failure_fails_at_once() -> None:
    clock = FakeClock()
    service = tinker_sync.ServiceClient(
        base_url="http://tinker-sync-no-such-host.invalid:8000", api_key="tml-x", _clock=clock
    )
    with pytest.raises(APIConnectError, match="does not resolve"):
        service.create_lora_training_client("base", rank=4)
    service.close()
    assert retry_sleeps(clock) == []


def test_https_to_the_plain_local_server_fails_at_once_with_a_hint() -> None:
    clock = FakeClock()
    with LocalServer() as server:
        url = server.url.replace("http://", "https://")
        service = tinker_sync.ServiceClient(base_url=url, api_key="tml-x", _clock=clock)
        with pytest.raises(APIConnectError, match="did you mean http://"):
            service.create_lora_training_client("base", rank=4)
        service.close()
    assert retry_sleeps(clock) == []


# ---------------------------------------------------------------- the submission loop


def _always(exc: Exception) -> Any:
    def fn() -> Any:
        raise exc

    return fn


def _server_error(words: str) -> InternalServerError:
    body = f'{{"detail": "{words}"}}'.encode()
    return InternalServerError(
        f"Error code: 500 - {words}", response=ResponseSnapshot(500, {}, body)
    )


def test_submission_loop_stalls_after_stall_timeout_with_the_servers_words() -> None:
    clock = FakeClock()
    err = _server_error("token id 151999 is out of vocabulary")
    with pytest.raises(StalledError) as info:
        submission_loop(
            _always(err),
            SubmissionRetry(clock=clock, stall_timeout=100.0, reached=lambda: True, what="asample"),
        )
    assert clock.monotonic() == pytest.approx(100.0)
    text = str(info.value)
    assert "asample" in text and "HTTP 500" in text and "out of vocabulary" in text
    assert info.value.__cause__ is err


def test_submission_loop_does_not_retry_when_the_server_never_answered() -> None:
    clock = FakeClock()
    with pytest.raises(APIConnectError):
        submission_loop(
            _always(APIConnectError("refused")), SubmissionRetry(clock=clock, reached=lambda: False)
        )
    assert clock.sleeps == []


def test_submission_loop_honours_max_retries_zero() -> None:
    clock = FakeClock()
    with pytest.raises(InternalServerError):
        submission_loop(
            _always(_server_error("x")),
            SubmissionRetry(clock=clock, max_retries=0, reached=lambda: True),
        )
    assert clock.sleeps == []


# ---------------------------------------------------------------- the warning


def _event(status: int | None, error: str | None = None) -> HookEvent:
    return HookEvent("request", {"status": status, "error": error, "path": "/api/v1/x"})


def test_warning_at_first_failure_then_once_a_minute_then_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    health = Health("http://host.test:8000", clock)
    health.describe_pending = lambda: "2 ForwardBackward"
    caplog.set_level(logging.INFO, logger="tinker_sync.health")

    def lines() -> list[tuple[int, str]]:
        out = [(r.levelno, r.getMessage()) for r in caplog.records]
        caplog.clear()
        return out

    health.observe(_event(None, "APITimeoutError"))  # one lost reply: no alarm yet
    health.observe(_event(200))
    assert lines() == []
    health.observe(_event(None, "APIConnectError"))  # a failed connect warns at once
    [(level, text)] = lines()
    assert level == logging.WARNING
    assert "http://host.test:8000" in text and "APIConnectError" in text
    assert "2 ForwardBackward" in text
    for _ in range(5):  # failures within the minute stay quiet
        clock.advance(10.0)
        health.observe(_event(503))
    assert lines() == []
    clock.advance(11.0)  # 61 s after the first warning
    health.observe(_event(None, "APITimeoutError"))
    [(level, text)] = lines()
    assert level == logging.WARNING and "unreachable for 61 s" in text
    assert health.reached  # the 503s were answers
    health.observe(_event(200))
    [(level, text)] = lines()
    assert level == logging.INFO and "answers again" in text
    health.observe(_event(200))
    assert lines() == []
    clock.advance(60.0)  # a minute after the last warning
    health.observe(_event(503))  # lost replies warn at the second in a row
    assert lines() == []
    health.observe(_event(502))
    [(level, text)] = lines()
    assert level == logging.WARNING and "HTTP 502" in text


def test_a_flapping_network_warns_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    health = Health("http://host.test:8000", clock)
    caplog.set_level(logging.INFO, logger="tinker_sync.health")
    warnings = lambda: [r for r in caplog.records if r.levelno == logging.WARNING]  # noqa: E731
    for _ in range(12):  # a new streak every 5 s: fail, fail, recover
        health.observe(_event(None, "APITimeoutError"))
        health.observe(_event(502))
        health.observe(_event(200))
        clock.advance(5.0)
    assert len(warnings()) == 1  # the first streak's, at t=0
    health.observe(_event(None, "APIConnectError"))  # t=60: the minute is up
    assert len(warnings()) == 2
    assert "cannot reach the Tinker server at http://host.test:8000" in warnings()[-1].getMessage()


def test_warning_never_shows_user_info_of_the_url(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tinker_sync.health")
    url = f"http://user:hunter2-secret@127.0.0.1:{closed_port()}"
    service = tinker_sync.ServiceClient(
        base_url=url, api_key="tml-x", max_retries=0, _clock=FakeClock()
    )
    with pytest.raises(APIConnectError) as info:
        service.create_lora_training_client("base", rank=4)
    service.close()
    assert "hunter2" not in caplog.text and "hunter2" not in str(info.value)
    assert "cannot reach the Tinker server at http://127.0.0.1:" in caplog.text


def test_stall_watch_resets_on_a_useful_answer() -> None:
    clock = FakeClock()
    watch = StallWatch(clock, 10.0, "Sample")
    err = _server_error("busy")
    assert watch.unhealthy(err) is None
    clock.advance(9.0)
    watch.useful()
    clock.advance(5.0)
    assert watch.unhealthy(err) is None  # a new streak starts here
    clock.advance(10.0)
    stalled = watch.unhealthy(err, request_id="r-1")
    assert isinstance(stalled, StalledError) and stalled.request_id == "r-1"
    assert stalled.status_code == 500 and "busy" in str(stalled)


# ---------------------------------------------------------------- futures against the server


class Rig:
    def __init__(self, stall_timeout: float | None = None, **server_kwargs: Any) -> None:
        server_kwargs.setdefault("long_poll_s", 2.0)
        self.server = LocalServer(**server_kwargs).start()
        self.clock = FakeClock(rng=lambda: 0.0)
        self.service = tinker_sync.ServiceClient(
            base_url=self.server.url,
            api_key=self.server.api_key,
            stall_timeout=stall_timeout,
            _clock=self.clock,
        )
        self.training = self.service.create_lora_training_client("base", rank=4)

    def close(self) -> None:
        self.service.close()
        self.server.stop()
        from tinker_sync._flow.limiter import reset_limiters

        reset_limiters()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig(stall_timeout=120.0)
    yield r
    r.close()


def test_a_future_answered_500_forever_stalls_with_the_servers_words(rig: Rig) -> None:
    rig.server.faults.add(
        "retrieve_future 500 x* match.request_type=ForwardBackward "
        "body='token id 151999 is out of vocabulary'"
    )
    fut = rig.training.forward_backward([datum()], "cross_entropy")
    exc = fut.exception(HANG)
    assert isinstance(exc, StalledError), exc
    assert exc.request_id == fut.request_id and exc.status_code == 500
    text = str(exc)
    assert "ForwardBackward" in text and "HTTP 500" in text
    assert "token id 151999 is out of vocabulary" in text
    assert 120.0 <= rig.clock.monotonic() < 130.0


def test_a_400_on_a_future_poll_keeps_the_servers_words(rig: Rig) -> None:
    rig.server.faults.add(
        "retrieve_future 400 x* match.request_type=OptimStep "
        'body={"detail":"LoRA rank 1000 must be between 1 and 32"}'
    )
    fut = rig.training.optim_step(types.AdamParams())
    exc = fut.exception(HANG)
    assert isinstance(exc, FuturePollError)
    assert "LoRA rank 1000 must be between 1 and 32" in str(exc)
    assert "HTTP 400" in str(exc) and str(fut.request_id) in str(exc)


def test_pending_lists_each_future_with_its_queue_state(rig: Rig) -> None:
    rig.server.pause("paused_rate_limit", "too many requests", kind="training")
    try:
        fut = rig.training.forward_backward([datum()], "cross_entropy")
        deadline = 200
        entries = rig.service.pending()
        while deadline and not (entries and entries[0].queue_state == "paused_rate_limit"):
            time.sleep(0.01)  # polls run on SDK threads: wait (bounded) for the first answer
            deadline -= 1
            entries = rig.service.pending()
        [entry] = entries
        assert entry.kind == "ForwardBackward"
        assert entry.request_id == fut.request_id
        assert entry.queue_state == "paused_rate_limit" and entry.attempts >= 1
        assert entry.age >= 0.0
    finally:
        rig.server.resume()
    fut.result(HANG)
    assert rig.service.pending() == []


def test_result_timeout_says_what_is_still_pending(rig: Rig) -> None:
    rig.server.pause("paused_capacity", None, kind="training")
    try:
        fut = rig.training.optim_step(types.AdamParams())
        with pytest.raises(TimeoutError) as info:
            fut.result(timeout=0.01)
        text = str(info.value)
        assert "result(timeout=0.01)" in text and "call result() again" in text
    finally:
        rig.server.resume()
    fut.result(HANG)


@pytest.mark.parametrize("poller", [False, True], ids=["retrieve_future", "retrieve_futures"])
def test_a_sample_answered_503_forever_stalls(poller: bool) -> None:
    """Both sample paths (per-future polls and the session futures poller) end in a stall."""
    endpoint = "retrieve_futures" if poller else "retrieve_future"
    server = LocalServer(
        client_config={"sample_use_retrieve_futures": poller},
        faults=[f"{endpoint} 503 x* body='sampler restarting'"],
        long_poll_s=2.0,
    ).start()
    clock = FakeClock(rng=lambda: 0.0)
    service = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, stall_timeout=60.0, _clock=clock
    )
    try:
        sampler = service.create_sampling_client(base_model="tinker-sync/tiny")
        fut = sampler.sample(
            types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)
        )
        exc = fut.exception(HANG)
        assert isinstance(exc, StalledError), repr(exc)
        assert "HTTP 503" in str(exc) and "sampler restarting" in str(exc)
        assert server.requests.count("asample") == 1  # never resubmitted: a stall is final
    finally:
        service.close()
        server.stop()
