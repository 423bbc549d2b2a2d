"""Session start, close and background loops against the local server (area H)."""

from __future__ import annotations

import json
import logging
import threading

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._runtime.clock import FakeClock
from tinker_sync.exceptions import ClientClosedError
from tinker_sync.local import LocalServer

HANG = 60.0


def datum() -> types.Datum:
    t = np.arange(5)
    return types.Datum(
        model_input=types.ModelInput.from_ints(t[:-1]), loss_fn_inputs={"target_tokens": t[1:]}
    )


def test_constructor_sends_nothing_and_starts_no_thread(server):
    """Pins docs/design/behavior.md#lazy-single-init."""
    before = threading.active_count()
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
    assert threading.active_count() == before
    assert len(server.requests) == 0
    service.close()
    assert len(server.requests) == 0  # an unused client sends nothing, even on close


def test_50_racing_first_uses_make_one_config_and_one_session(server):
    """Pins docs/design/behavior.md#lazy-single-init."""
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
    """Pins docs/design/behavior.md#close."""
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
    """First reason wins; pending futures fail; later use raises (docs/design/behavior.md#close)."""
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
    """Pins docs/design/behavior.md#lazy-single-init."""
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
    """A failing telemetry endpoint costs nothing but a dropped batch
    (docs/design/behavior.md#telemetry)."""
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
    """Overflow drops new events with one warning (docs/design/behavior.md#telemetry)."""
    monkeypatch.setattr("tinker_sync._session.telemetry.MAX_QUEUE", 50)
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
    """Exact body, every 10 s, a warning once 120 s have failed (at most once a minute), quiet
    stop on 410
    (docs/design/behavior.md#heartbeat)."""
    from tinker_sync._config import ClientConfig
    from tinker_sync._session.state import Session

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
        # failures start at t=30; last success t=20; a warning once t - 20 > 120 (t=150), then
        # at most once a minute: t=160 stays quiet
        assert len(warnings) == 1
        session.close()


def test_held_sample_requests_do_not_starve_heartbeats_or_get_info():
    """With 400 SAMPLE-pool requests held open by the server, a heartbeat
    (SESSION pool) and get_info (TRAIN pool) still complete: the pools are separate.

    See docs/design/behavior.md#connection-pools.
    """
    import time

    from tinker_sync._config import Timeout
    from tinker_sync._transport import Pool, RequestSpec

    server = LocalServer(long_poll_s=1.0).start()
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key, max_retries=0)
    threads: list[threading.Thread] = []
    try:
        training = service.create_lora_training_client("base", rank=4)
        session = service._session
        transport = session.transport
        server.faults.add("asample delay=30 x*")
        barrier = threading.Barrier(400)

        def held_sample() -> None:
            barrier.wait(HANG)
            try:
                transport.send_once(
                    RequestSpec(
                        method="POST",
                        path="/api/v1/asample",
                        pool=Pool.SAMPLE,
                        json={"sampling_session_id": "held", "seq_id": 1, "type": "sample"},
                        timeout=Timeout(HANG, connect=5.0),
                        max_retries=0,
                    )
                )
            except Exception:
                pass  # released by the server's shutdown at the end

        threads = [threading.Thread(target=held_sample, daemon=True) for _ in range(400)]
        for t in threads:
            t.start()
        pools = transport.pools()
        deadline = time.monotonic() + HANG
        while pools.inflight(Pool.SAMPLE) < 400:  # wait-until (bounded), not a fixed sleep
            assert time.monotonic() < deadline, pools.inflight(Pool.SAMPLE)
            time.sleep(0.01)
        beat = transport.send_once(
            RequestSpec(
                method="POST",
                path="/api/v1/session_heartbeat",
                pool=Pool.SESSION,
                json={"session_id": session.session_id, "type": "session_heartbeat"},
                max_retries=0,
            )
        )
        assert beat.status == 200
        info = service._get_info(training.model_id)
        assert info.model_id == training.model_id
        assert pools.inflight(Pool.SAMPLE) == 400  # still held while those completed
        assert server.requests.count("asample") == 0
    finally:
        service.close()  # while the server is up (a finish against a dead server retries)
        server.stop()  # drops the held requests
        for t in threads:
            t.join(HANG)
        from tinker_sync._flow.limiter import reset_limiters

        reset_limiters()


def _telemetry_events(server) -> list[dict]:  # type: ignore[no-untyped-def]
    return [e for r in server.requests.filter(endpoint="telemetry") for e in r.json["events"]]


def test_escaped_exceptions_are_reported_once_with_session_end(monkeypatch):
    """A failure escaping result() or a public call is reported once (user_error for
    user errors, UNHANDLED_EXCEPTION otherwise) plus SESSION_END, flushed synchronously.

    See docs/design/behavior.md#telemetry.
    """
    from tinker_sync.exceptions import NotFoundError, RequestFailedError

    monkeypatch.setenv("TINKER_TELEMETRY", "1")
    with LocalServer(long_poll_s=1.0) as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            training = service.create_lora_training_client("base", rank=4)
            ok = training.forward_backward([datum()], "cross_entropy")
            ok.result(HANG)
            assert _telemetry_events(server) == []  # nothing flushed on the success path

            server.faults.add("retrieve_future fail:user match.request_type=OptimStep")
            user_fut = training.optim_step(types.AdamParams())
            with pytest.raises(RequestFailedError) as user_exc:
                user_fut.result(HANG)
            events = _telemetry_events(server)  # already sent: the flush is synchronous
            names = [(e["event"], e.get("event_name")) for e in events]
            assert ("GENERIC_EVENT", "user_error") in names
            assert ("SESSION_END", None) in names
            (user_event,) = [e for e in events if e.get("event_name") == "user_error"]
            assert user_event["severity"] == "WARNING"
            assert user_event["event_data"]["error_type"] == "RequestFailedError"

            with pytest.raises(RequestFailedError) as again:
                user_fut.result(HANG)  # the same exception again: not reported twice
            assert again.value is user_exc.value
            assert len(_telemetry_events(server)) == len(events)

            server.faults.add("retrieve_future fail:server match.request_type=OptimStep")
            with pytest.raises(RequestFailedError):
                training.optim_step(types.AdamParams()).result(HANG)
            unhandled = [
                e for e in _telemetry_events(server) if e["event"] == "UNHANDLED_EXCEPTION"
            ]
            assert len(unhandled) == 1
            assert unhandled[0]["error_type"] == "RequestFailedError"
            assert "Traceback" in unhandled[0]["traceback"]

            count = len(_telemetry_events(server))
            with pytest.raises(NotFoundError):  # a blocking public call (404: user error)
                service.create_sampling_client(model_path="tinker://no-such-run/sampler_weights/x")
            new = _telemetry_events(server)[count:]
            assert [e.get("event_name") or e["event"] for e in new] == ["user_error", "SESSION_END"]
            assert new[0]["event_data"]["status_code"] == 404
        ends = [e for e in _telemetry_events(server) if e["event"] == "SESSION_END"]
        assert len(ends) == 3  # one per reported exception; a normal close adds none
        assert server.api_key not in json.dumps(_telemetry_events(server))


def test_telemetry_flushes_when_100_events_are_queued(monkeypatch):
    """A full batch wakes the timer thread at once (not after 10 s)
    (docs/design/behavior.md#telemetry)."""
    monkeypatch.setenv("TINKER_TELEMETRY", "1")
    with LocalServer() as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            service.create_sampling_client(base_model="base")
            telemetry = service._session.telemetry
            assert telemetry is not None
            for i in range(150):
                telemetry.generic("x", {"i": i})
            batches = server.requests.wait_for("telemetry", 1, timeout=HANG)
            first = batches[0].json["events"]  # the timer thread may drain the rest as well
            assert len(first) == 100
            assert first[0]["event"] == "SESSION_START"
            assert [e["event_session_index"] for e in first] == list(range(100))


def test_timer_thread_drives_the_jwt_background_refresh():
    """With JWT auth on, the session timer refreshes the token at 45-55 % of its life
    (docs/design/behavior.md#jwt-auth)."""
    clock = FakeClock(rng=lambda: 0.5)  # refresh at exactly 50 % of the 3600 s lifetime
    config = {"pjwt_auth_enabled": True}
    with LocalServer(client_config=config, long_poll_s=1.0) as server:
        service = tinker_sync.ServiceClient(
            base_url=server.url, api_key=server.api_key, _clock=clock
        )
        try:
            service.create_sampling_client(base_model="base")
            auth = service._session.transport.auth
            assert type(auth).__name__ == "JwtAuth"
            assert server.requests.count("auth/token") == 1
            first = auth.token()
            assert auth.next_refresh_in() == pytest.approx(1800.0)
            clock.advance(1799.0)
            service._session.wake_timer()
            assert server.requests.count("auth/token") == 1  # not yet due
            clock.advance(2.0)
            service._session.wake_timer()
            server.requests.wait_for("auth/token", 2, timeout=HANG)
            assert auth.exchanges == 2
            service.create_sampling_client(base_model="base")  # the new token works
            assert auth.token() != first or auth.exchanges == 2
            assert auth.next_refresh_in() == pytest.approx(1800.0, abs=5.0)
        finally:
            service.close()
