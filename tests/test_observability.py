"""Logging, queue-state reporting and hooks against the real local server
(docs/design/behavior.md#logging, docs/design/behavior.md#queue-state-reports,
docs/design/behavior.md#hooks, docs/design/behavior.md#request-headers).

Tests never touch a global logger in this process: ``TINKER_LOG`` is exercised in
subprocesses, and in-process checks only read records through pytest's ``caplog``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._transport import HookEvent

HANG = 60.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def datum(n: int = 4) -> types.Datum:
    tokens = np.arange(n + 1, dtype=np.int64)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:]},
    )


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "CLOUDFLARE_ACCESS_"))
    }
    full_env.update(env)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("TINKER_TELEMETRY", "0")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=HANG * 2,
        check=False,
    )


# ------------------------------------------------------------------------------

_LOGGER_STATE = """
import logging, json
def state():
    out = {"root": [logging.root.level, [type(h).__name__ for h in logging.root.handlers]]}
    for name, lg in sorted(logging.root.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger):
            out[name] = [lg.level, [type(h).__name__ for h in lg.handlers], lg.propagate,
                         lg.disabled]
    return out
"""


def test_importing_and_constructing_change_no_logger() -> None:
    """Import and a constructed client change no existing logger; the package's
    own loggers carry at most a NullHandler.

    See docs/design/behavior.md#logging.
    """
    proc = run_python(
        _LOGGER_STATE
        + """
import urllib3, requests  # loggers of the libraries the SDK uses, configured by them
before = state()
import tinker_sync
after_import = state()
client = tinker_sync.ServiceClient(base_url="http://127.0.0.1:9", api_key="tml-" + "x" * 30)
tinker_sync.types.Datum
after_client = state()
print(json.dumps([before, after_import, after_client]))
"""
    )
    assert proc.returncode == 0, proc.stderr
    before, after_import, after_client = json.loads(proc.stdout)
    for after in (after_import, after_client):
        for name, value in before.items():
            assert after[name] == value, name
        for name, value in after.items():
            if name not in before:
                assert name.startswith("tinker_sync") or not value[1], name
                assert set(value[1]) <= {"NullHandler"}, (name, value)
                assert value[0] == logging.NOTSET, name
    assert proc.stderr == ""


def test_tinker_log_debug_enables_output_with_context_ids() -> None:
    """TINKER_LOG=debug attaches a handler to tinker_sync and urllib3 (not root);
    records carry session_id / model_id / request_id.

    See docs/design/behavior.md#logging.
    """
    proc = run_python(
        _LOGGER_STATE
        + """
import numpy as np
import tinker_sync
from tinker_sync import types
from tinker_sync.local import LocalServer
root_before = state()["root"]
with LocalServer(long_poll_s=1.0) as server:
    with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
        training = service.create_lora_training_client("base", rank=4)
        t = np.arange(5)
        d = types.Datum(model_input=types.ModelInput.from_ints(t[:-1]),
                        loss_fn_inputs={"target_tokens": t[1:]})
        training.forward_backward([d], "cross_entropy").result(60)
        print(json.dumps({"model_id": training.model_id,
                          "session_id": service._session.session_id}))
after = state()
print(json.dumps({"root": [root_before, after["root"]],
                  "tinker_sync": after["tinker_sync"], "urllib3": after["urllib3"]}))
""",
        TINKER_LOG="debug",
    )
    assert proc.returncode == 0, proc.stderr
    ids_line, state_line = proc.stdout.strip().splitlines()[-2:]
    ids = json.loads(ids_line)
    st = json.loads(state_line)
    assert st["root"][0] == st["root"][1]  # the root logger is untouched
    assert st["tinker_sync"][0] == logging.DEBUG and st["tinker_sync"][1] == ["StreamHandler"]
    assert st["urllib3"][0] == logging.DEBUG and "StreamHandler" in st["urllib3"][1]
    err = proc.stderr
    assert "HTTP POST /api/v1/client/config" in err  # tinker_sync.transport DEBUG
    assert "new connection to 127.0.0.1:" in err  # the direct path's DEBUG (docs/transport.md)
    assert f"session_id={ids['session_id']}" in err
    assert f"model_id={ids['model_id']}" in err
    assert "request_id=" in err
    assert "tml-local" not in err  # headers are redacted in debug dumps


def test_tinker_log_info_is_quieter() -> None:
    """TINKER_LOG=info logs INFO (session creation) but no DEBUG dumps
    (docs/design/behavior.md#logging)."""
    proc = run_python(
        """
import tinker_sync
from tinker_sync.local import LocalServer
with LocalServer(long_poll_s=1.0) as server:
    with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
        service.create_sampling_client(base_model="base")
""",
        TINKER_LOG="info",
    )
    assert proc.returncode == 0, proc.stderr
    assert "created" in proc.stderr and "session_id=" in proc.stderr
    assert "HTTP POST" not in proc.stderr
    assert "Starting new HTTP connection" not in proc.stderr


def test_log_records_carry_context_ids(server, service, caplog) -> None:
    """In-process, records of a training op carry the ids as attributes
    (docs/design/behavior.md#logging)."""
    training = service.create_lora_training_client("base", rank=4)
    with caplog.at_level(logging.DEBUG, logger="tinker_sync"):
        fut = training.forward_backward([datum()], "cross_entropy")
        fut.result(HANG)
        fut.add_done_callback(lambda f: None)
    with_ids = [r for r in caplog.records if getattr(r, "request_id", None) == fut.request_id]
    assert with_ids
    for record in with_ids:
        assert record.model_id == training.model_id  # type: ignore[attr-defined]
        assert record.session_id == service._session.session_id  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------


class ClockHandler(logging.Handler):
    """Records the FakeClock reading of each queue-state warning."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(logging.WARNING)
        self.clock = clock
        self.times: list[float] = []
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.times.append(self.clock.monotonic())
        self.messages.append(record.getMessage())


def every_poll_takes(clock: FakeClock, seconds: float) -> None:
    """Make each poll iteration advance virtual time by exactly ``seconds``."""

    def on_sleep(slept: float, reason: str) -> None:
        if reason.startswith("poll:"):
            clock.advance(seconds - slept)

    clock.on_sleep = on_sleep


@pytest.fixture
def clocked(server):  # type: ignore[no-untyped-def]
    clock = FakeClock(rng=lambda: 0.0)
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key, _clock=clock)
    handler = ClockHandler(clock)
    queue_logger = logging.getLogger("tinker_sync.queue")
    queue_logger.addHandler(handler)
    try:
        yield server, service, clock, handler
    finally:
        queue_logger.removeHandler(handler)
        service.close()


def test_training_pauses_warn_after_15_minutes_then_every_60_s(clocked) -> None:
    """Polls 30 s apart on the fake clock; first warning at 900 s, then 60 s
    (docs/design/behavior.md#queue-state-reports)."""
    server, service, clock, handler = clocked
    training = service.create_lora_training_client("base", rank=4)
    every_poll_takes(clock, 30.0)
    server.faults.add("retrieve_future paused_capacity x40 match.request_type=OptimStep")
    t0 = clock.monotonic()
    assert training.optim_step(types.AdamParams()).result(HANG) is not None
    assert [t - t0 for t in handler.times] == [900.0, 960.0, 1020.0, 1080.0, 1140.0]
    assert all(training.model_id in m for m in handler.messages)
    assert "running short on capacity" in handler.messages[0]
    # completion reported "active": a new pause starts the 15 minutes again
    handler.times.clear()
    server.faults.add(
        "retrieve_future paused_rate_limit x20 reason='queue full' match.request_type=OptimStep"
    )
    assert training.optim_step(types.AdamParams()).result(HANG) is not None
    assert handler.times == []  # 20 polls x 30 s = 600 s < 15 min


def test_sampling_pauses_warn_at_once_then_every_60_s(clocked) -> None:
    """A sampling pause warns on the first paused answer, then at most every 60 s
    (docs/design/behavior.md#queue-state-reports)."""
    server, service, clock, handler = clocked
    sampler = service.create_sampling_client(base_model="base")
    every_poll_takes(clock, 30.0)
    server.faults.add("retrieve_future paused_capacity x5 match.request_type=Sample")
    prompt = types.ModelInput.from_ints([1, 2, 3])
    t0 = clock.monotonic()
    sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result(HANG)
    assert len(handler.times) == 3, handler.messages  # paused answers at 0, 30, 60, 90, 120 s
    assert handler.times[0] - t0 < 30.0  # at once
    assert handler.times[1] - handler.times[0] >= 60.0
    assert handler.times[2] - handler.times[1] >= 60.0


def test_observer_errors_are_swallowed(clocked, caplog) -> None:
    """A raising queue-state observer is logged, never raised
    (docs/design/behavior.md#queue-state-reports)."""
    server, service, clock, handler = clocked
    sampler = service.create_sampling_client(base_model="base")
    calls: list[tuple[str, Any]] = []

    def raising(state: str, reason: Any) -> None:
        calls.append((state, reason))
        raise RuntimeError("observer bug")

    sampler.on_queue_state_change = raising  # type: ignore[method-assign]
    server.faults.add("retrieve_future paused_rate_limit x2 match.request_type=Sample")
    with caplog.at_level(logging.ERROR, logger="tinker_sync.polling"):
        out = sampler.sample(
            types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)
        ).result(HANG)
    assert out.sequences
    assert calls[:2] == [("paused_rate_limit", None)] * 2
    assert calls[-1] == ("active", None)
    assert sum("observer failed" in r.getMessage() for r in caplog.records) == len(calls)


# ------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[HookEvent] = []

    def __call__(self, event: HookEvent) -> None:
        with self.lock:
            self.events.append(event)

    def of(self, kind: str) -> list[HookEvent]:
        with self.lock:
            return [e for e in self.events if e.kind == kind]


def test_retry_and_backoff_hook_events_are_per_client(server) -> None:
    """``retry_scheduled`` (both layers) and ``backoff_set`` reach only the hooks of the
    client whose request caused them; hooks never see secrets.

    See docs/design/behavior.md#hooks.
    """
    a_hook, b_hook = Recorder(), Recorder()
    clock = FakeClock(rng=lambda: 0.0)
    a = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, hooks=[a_hook], _clock=clock
    )
    b = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, hooks=(b_hook,), _clock=clock
    )
    try:
        ta = a.create_lora_training_client("base", rank=4)
        tb = b.create_lora_training_client("base", rank=4)
        sa = a.create_sampling_client(base_model="base")
        server.faults.add(f"optim_step 503 x11 match.model_id={ta.model_id}")
        ta.optim_step(types.AdamParams()).result(HANG)
        server.faults.add("asample 429 retry_after_ms=750")
        sa.sample(types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)).result(
            HANG
        )
        tb.optim_step(types.AdamParams()).result(HANG)
    finally:
        a.close()
        b.close()
    retries = a_hook.of("retry_scheduled")
    http = [e for e in retries if e["layer"] == "http"]
    loop = [e for e in retries if e["layer"] == "submission"]
    assert len(http) == 10 and all(e["path"] == "/api/v1/optim_step" for e in http)
    assert [e["attempt"] for e in http] == list(range(1, 11))
    assert [e["delay"] for e in http[:3]] == [0.5, 1.0, 2.0]  # min(0.5 * 2^k, 10) * (1 - 0.25r)
    assert len(loop) == 1 and loop[0]["delay"] == 1.0 and loop[0]["reason"] == "status 503"
    (backoff,) = a_hook.of("backoff_set")
    assert backoff["seconds"] == 0.75 and "429" in backoff["cause"]
    assert backoff["until"] > 0 and isinstance(backoff["limiter_key"], str)
    assert b_hook.of("retry_scheduled") == [] and b_hook.of("backoff_set") == []
    assert any(e["path"] == "/api/v1/optim_step" for e in b_hook.of("request"))
    a_paths = {e["path"] for e in a_hook.of("request")}
    assert "/api/v1/asample" in a_paths
    done = a_hook.of("future_done")
    assert {e["request_type"] for e in done} >= {"CreateModel", "OptimStep", "Sample"}
    assert all(e["ok"] for e in done)
    request = a_hook.of("request")[0]
    assert set(request.data) >= {"method", "path", "pool", "status", "duration", "attempt"}
    everything = repr([e.data for e in a_hook.events + b_hook.events])
    assert server.api_key not in everything


def test_queue_state_change_events_only_on_changes(server) -> None:
    """``queue_state_change`` fires when (state, reason) changes, then ``active`` at the end
    (docs/design/behavior.md#hooks)."""
    hook = Recorder()
    clock = FakeClock(rng=lambda: 0.0)
    with tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, hooks=[hook], _clock=clock
    ) as service:
        training = service.create_lora_training_client("base", rank=4)
        server.faults.add("retrieve_future paused_capacity x3 match.request_type=OptimStep")
        server.faults.add("retrieve_future paused_rate_limit x2 match.request_type=OptimStep")
        fut = training.optim_step(types.AdamParams())
        fut.result(HANG)
    changes = [
        (e["state"], e["reason"])
        for e in hook.of("queue_state_change")
        if e["request_id"] == fut.request_id
    ]
    assert changes == [("paused_capacity", None), ("paused_rate_limit", None), ("active", None)]


class _BeatClock(FakeClock):
    """A virtual timer clock: only the heartbeat loop's waits are virtual (``beats`` of them)."""

    def __init__(self, beats: int) -> None:
        super().__init__()
        self.beats = beats

    def wait(self, cond, timeout):  # type: ignore[no-untyped-def]
        if "heartbeat" not in threading.current_thread().name:
            return cond.wait(timeout)
        if isinstance(cond, threading.Event) and timeout is not None:
            self.beats -= 1
            if self.beats < 0:
                cond.set()
                return True
        return super().wait(cond, timeout)


def test_sdk_method_header_on_pool_thread_polls_not_on_background_loops(server) -> None:
    """Polls made on pool threads carry the public method that caused them;
    heartbeats, config, session creation and telemetry carry none.

    See docs/design/behavior.md#request-headers.
    """
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
    service._session.timer_clock = _BeatClock(beats=2)
    try:
        training = service.create_lora_training_client("base", rank=4)
        fwd = training.forward_backward([datum()], "cross_entropy")
        fwd.result(HANG)
        sampler = training.save_weights_and_get_sampling_client()
        sample = sampler.sample(
            types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)
        )
        sample.result(HANG)
        hb = next(t for t in service._session._threads if "heartbeat" in t.name)
        hb.join(HANG)
    finally:
        service.close()

    def methods(endpoint: str, request_id: str | None = None) -> set[str | None]:
        return {
            r.headers.get("x-sdk-method")
            for r in server.requests.filter(endpoint=endpoint)
            if request_id is None or (r.json or {}).get("request_id") == request_id
        }

    assert methods("retrieve_future", fwd.request_id) == {"TrainingClient.forward_backward"}
    assert methods("retrieve_future", sample.request_id) == {"SamplingClient.sample"}
    assert methods("forward_backward") == {"TrainingClient.forward_backward"}
    assert methods("create_model") == {"ServiceClient.create_lora_training_client"}
    assert server.requests.count("session_heartbeat") >= 1
    for endpoint in ("session_heartbeat", "client/config", "client/dynamic_config"):
        assert methods(endpoint) == {None}, endpoint
    assert methods("create_session") == {None}
    for r in server.requests.filter(endpoint="retrieve_future"):
        if r.headers.get("x-sdk-method"):
            assert r.headers.get("x-sdk-version") == "0.38.0"
