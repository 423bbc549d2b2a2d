"""Session start, close and background loops against the local server (area H)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._clock import FakeClock
from tinker_sync.exceptions import ClientClosedError
from tinker_sync.local import LocalServer

HANG = 60.0


def datum() -> types.Datum:
    t = np.arange(5)
    return types.Datum(
        model_input=types.ModelInput.from_ints(t[:-1]), loss_fn_inputs={"target_tokens": t[1:]}
    )


def test_constructor_sends_nothing_and_starts_no_thread(server):
    """T-H1 (B45)."""
    before = threading.active_count()
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
    assert threading.active_count() == before
    assert len(server.requests) == 0
    service.close()
    assert len(server.requests) == 0  # an unused client sends nothing, even on close


def test_50_racing_first_uses_make_one_config_and_one_session(server):
    """T-H1 (B45)."""
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
    barrier = threading.Barrier(50)
    errors: list[BaseException] = []

    def first_use() -> None:
        barrier.wait(HANG)
        try:
            service.create_sampling_client(base_model="base")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert not errors
    assert server.requests.count("client/config") == 1
    assert server.requests.count("client/dynamic_config") == 1
    assert server.requests.count("create_session") == 1
    seqs = sorted(
        r.json["sampling_session_seq_id"]
        for r in server.requests.filter(endpoint="create_sampling_session")
    )
    assert seqs == list(range(50))
    order = [r.endpoint for r in server.requests.filter()][:3]
    assert order == ["client/config", "client/dynamic_config", "create_session"]
    service.close()


@pytest.mark.parametrize(
    ("raise_", "reason"),
    [(None, "success"), (ValueError("boom"), "errored"), (KeyboardInterrupt(), "interrupted")],
)
def test_context_manager_finishes_with_the_right_reason(server, raise_, reason):
    """T-H3 (B47)."""
    with pytest.raises(type(raise_)) if raise_ is not None else _nullcontext():
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            service.create_sampling_client(base_model="base")
            if raise_ is not None:
                raise raise_
    (finish,) = server.requests.filter(endpoint="sessions/*/finish")
    assert finish.json["reason"] == {"type": reason}
    assert ("detail" in finish.json) and (finish.json["detail"] is None) == (raise_ is None)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_close_is_idempotent_fails_pending_futures_and_refuses_later_use():
    """T-H3 (B47): first reason wins; pending futures fail; later use raises."""
    with LocalServer(long_poll_s=1.0) as server:
        service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        training = service.create_lora_training_client("base", rank=4)
        server.pause("paused_capacity", kind="training")
        pending = training.forward_backward([datum()], "cross_entropy")
        server.requests.wait_for("retrieve_future", 1, timeout=HANG)
        service.close("errored", "first").result(HANG)
        service.close("success", "second").result(HANG)
        assert isinstance(pending.exception(HANG), ClientClosedError)
        with pytest.raises(ClientClosedError):
            training.optim_step(types.AdamParams())
        with pytest.raises(ClientClosedError):
            service.create_sampling_client(base_model="base")
        finishes = server.requests.filter(endpoint="sessions/*/finish")
        assert len(finishes) == 1
        assert finishes[0].json == {"reason": {"type": "errored"}, "detail": "first"}


def test_dynamic_config_404_means_defaults():
    """T-H5 (B45)."""
    with LocalServer(faults=["client/dynamic_config 404"]) as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            service.create_sampling_client(base_model="base")
            assert service._session.dynamic.refresh_interval_sec == 300
            assert server.requests.count("create_session") == 1


def test_a_failed_start_is_not_cached(server):
    """A first use that fails (server refusing connections) is retried by the next call."""
    server.faults.add("client/config 401 x1")
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
    with pytest.raises(tinker_sync.AuthenticationError):
        service.create_sampling_client(base_model="base")
    assert service.create_sampling_client(base_model="base").sampler_id
    service.close()


def test_telemetry_failures_never_reach_user_calls(monkeypatch):
    """T-H4 (B48): a failing telemetry endpoint costs nothing but a dropped batch."""
    monkeypatch.setenv("TINKER_TELEMETRY", "1")
    with LocalServer(faults=["telemetry 500 x*"]) as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            training = service.create_lora_training_client("base", rank=4)
            training.forward_backward([datum()], "cross_entropy").result(HANG)
            telemetry = service._session.telemetry
            assert telemetry is not None and telemetry.enabled
            telemetry.flush()
        assert server.requests.count("telemetry") >= 1
        batch = server.requests.filter(endpoint="telemetry")[0].json
        assert batch["events"][0]["event"] == "SESSION_START"
        assert set(batch) == {"events", "platform", "sdk_version", "session_id", "process_uuid"}


def test_telemetry_queue_is_capped(monkeypatch, caplog):
    """T-H4 (B48): overflow drops new events with one warning."""
    from tinker_sync import _telemetry

    monkeypatch.setattr(_telemetry, "MAX_QUEUE", 50)
    with LocalServer() as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            service.create_sampling_client(base_model="base")
            telemetry = service._session.telemetry
            assert telemetry is not None
            telemetry.enabled = True
            with caplog.at_level(logging.WARNING, logger="tinker_sync.telemetry"):
                for i in range(200):
                    telemetry.generic("x", {"i": i})
            assert len(telemetry._queue) == 50
            assert sum("queue is full" in r.getMessage() for r in caplog.records) == 1
            telemetry.enabled = False


class _BeatClock(FakeClock):
    """A virtual timer clock that stops the heartbeat loop after ``beats`` waits."""

    def __init__(self, beats: int) -> None:
        super().__init__()
        self.beats = beats

    def wait(self, cond, timeout):  # type: ignore[no-untyped-def]
        if "heartbeat" not in threading.current_thread().name:
            return cond.wait(timeout)  # other loops wait for real: only the beat is virtual
        if isinstance(cond, threading.Event) and timeout is not None:
            self.beats -= 1
            if self.beats < 0:
                cond.set()
                return True
        return super().wait(cond, timeout)


def test_heartbeat_cadence_warning_and_stop_on_410(caplog):
    """T-H2 (B46): exact body, every 10 s, a warning once 120 s have failed, quiet stop on 410."""
    from tinker_sync._config import ClientConfig
    from tinker_sync._session import Session

    with LocalServer() as server:
        server.faults.add("session_heartbeat 500 after=2 x14")
        server.faults.add("session_heartbeat 410 after=2")  # counts only requests it sees
        config = ClientConfig.from_env(base_url=server.url, api_key=server.api_key)
        clock = _BeatClock(beats=100)
        session = Session(config, timer_clock=clock)
        with caplog.at_level(logging.WARNING, logger="tinker_sync.session"):
            session.ensure_started()
            hb = next(t for t in session._threads if "heartbeat" in t.name)
            hb.join(HANG)
        beats = server.requests.filter(endpoint="session_heartbeat")
        assert [r.status for r in beats] == [200, 200] + [500] * 14 + [410]
        assert beats[0].json == {"session_id": session.session_id, "type": "session_heartbeat"}
        warnings = [r for r in caplog.records if "heartbeats have failed" in r.getMessage()]
        # failures start at t=30; last success t=20; warnings once t - 20 > 120, i.e. t=150,160
        assert len(warnings) == 2
        session.close()
