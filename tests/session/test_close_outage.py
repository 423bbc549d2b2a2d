"""close() during an outage ends within a small bound (docs/health.md#close-during-an-outage):
its session-finish request gets at most CLOSE_ATTEMPTS attempts within CLOSE_BUDGET_S (one
while the tenant's circuit is open or the interpreter exits), never parks behind the circuit
nor retries for stall_timeout; the close future fails with the server's error, one WARNING
names the URL; a healthy server still gets the close.

Before: close() retried its finish request in the submission loop until stall_timeout (600 s)
during a 503 storm. Each close runs on a worker thread under a real-time hang guard; what is
asserted is what the server saw and the close's sleeps on the injected clock.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from waiting import until  # tests/waiting.py

import tinker_sync
from tinker_sync import HealthPolicy, types
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._session.state import CLOSE_ATTEMPTS, CLOSE_BUDGET_S
from tinker_sync.exceptions import ClientClosedError, InternalServerError
from tinker_sync.local import Fault, LocalServer

HANG = 60.0
GUARD = 20.0  # real seconds a close may take before the test calls it a hang
KEY = "tml-close-outage-test-key-0123456789abc"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = "Qwen/Qwen3-8B"
PROMPT = types.ModelInput.from_ints([1, 2, 3])
PARAMS = types.SamplingParams(max_tokens=2)
FAST = HealthPolicy(probe_initial_s=0.05, probe_max_s=0.2, probe_jitter=0.5)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer(backend="instant", long_poll_s=1.0, api_key=KEY) as srv:
        yield srv
    reset_limiters()


def close_within_guard(client: tinker_sync.ServiceClient) -> tinker_sync.APIFuture[None]:
    """``client.close()`` on a worker thread; a close still running after GUARD fails."""
    done: list[tinker_sync.APIFuture[None]] = []
    worker = threading.Thread(target=lambda: done.append(client.close()), daemon=True)
    worker.start()
    worker.join(GUARD)
    assert done, f"close() still running after {GUARD:g} s"
    return done[0]


def finishes(server: LocalServer) -> int:
    return server.requests.count("sessions/*/finish")


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tinker_sync.session" and r.levelno >= logging.WARNING
    ]


def test_a_finish_answered_503_gets_3_attempts_within_the_budget(server, caplog):
    clock = FakeClock(wall=time.time(), rng=lambda: 0.0)
    client = tinker_sync.ServiceClient(base_url=server.url, api_key=KEY, _clock=clock)
    client.create_sampling_client(base_model=BASE).sample(PROMPT, 1, PARAMS).result(HANG)
    server.faults.add(Fault(endpoint="sessions/*/finish", status=503, times=None))
    with caplog.at_level(logging.INFO, logger="tinker_sync"):
        closed = close_within_guard(client)
    error = closed.exception(0)
    assert isinstance(error, InternalServerError) and error.status_code == 503
    assert finishes(server) == CLOSE_ATTEMPTS
    waits = clock.sleeps_for("close-retry")
    assert waits == [0.5, 1.0] and sum(waits) < CLOSE_BUDGET_S
    assert not clock.sleeps_for("submission-retry")  # not the submission loop
    (said,) = warnings_of(caplog)
    assert server.url in said and "HTTP 503" in said and KEY not in said
    keys = {r.headers.get("x-idempotency-key") for r in server.requests.filter("sessions/*/finish")}
    assert len(keys) == 1  # one request, retried


def test_a_finish_whose_retry_after_passes_the_budget_gets_one_attempt(server):
    clock = FakeClock(wall=time.time())
    client = tinker_sync.ServiceClient(base_url=server.url, api_key=KEY, _clock=clock)
    client.create_sampling_client(base_model=BASE)
    server.faults.add(
        Fault(
            endpoint="sessions/*/finish",
            status=503,
            times=None,
            headers={"Retry-After": str(int(CLOSE_BUDGET_S) + 1)},
        )
    )
    closed = close_within_guard(client)
    assert isinstance(closed.exception(0), InternalServerError)
    assert finishes(server) == 1 and not clock.sleeps_for("close-retry")


def test_a_healthy_server_that_sheds_one_finish_still_gets_the_close(server, caplog):
    clock = FakeClock(wall=time.time(), rng=lambda: 0.0)
    client = tinker_sync.ServiceClient(base_url=server.url, api_key=KEY, _clock=clock)
    client.create_sampling_client(base_model=BASE)
    server.faults.add("sessions/*/finish 503 x1")
    with caplog.at_level(logging.INFO, logger="tinker_sync"):
        closed = close_within_guard(client)
    assert closed.result(0) is None
    assert [r.status for r in server.requests.filter("sessions/*/finish")] == [503, 200]
    assert not warnings_of(caplog)
    assert not [r for r in caplog.records if "cannot reach" in r.getMessage()]


@pytest.mark.parametrize("shared", ["1", "0"])
def test_close_while_the_circuit_is_open_sends_one_finish_and_returns(
    server, monkeypatch, caplog, shared
):
    """The reported hang: every request answered 503, samples parked behind the open circuit,
    close() on the real clock (both with the circuit shared across processes and not)."""
    monkeypatch.setenv("TINKER_SYNC_SHARED_BACKOFF", shared)
    reset_limiters()
    client = tinker_sync.ServiceClient(base_url=server.url, api_key=KEY, health=FAST)
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    tenant = client._session.limiter.tenant
    server.faults.add(Fault(endpoint="**", status=503, times=None))
    parked = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(20)]
    until(lambda: tenant.is_open() and tenant.waiting + tenant.snapshot()["failed_probes"] >= 1)
    with caplog.at_level(logging.INFO, logger="tinker_sync"):
        closed = close_within_guard(client)
    assert isinstance(closed.exception(0), InternalServerError)
    assert finishes(server) == 1
    for f in parked:
        with pytest.raises(ClientClosedError):
            f.result(HANG)
    (said,) = warnings_of(caplog)
    assert server.url in said and KEY not in said


@pytest.mark.parametrize("raised", [None, ValueError("boom"), KeyboardInterrupt()])
def test_the_with_block_takes_the_same_bound(server, raised):
    """__exit__: a finished block raises the close's error (as the official SDK does); a block
    that raised, Ctrl-C included, goes on with its own exception."""
    clock = FakeClock(wall=time.time(), rng=lambda: 0.0)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            with tinker_sync.ServiceClient(base_url=server.url, api_key=KEY, _clock=clock) as c:
                c.create_sampling_client(base_model=BASE)
                server.faults.add(Fault(endpoint="**", status=503, times=None))
                if raised is not None:
                    raise raised
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(GUARD)
    assert outcome, f"the with block's exit still running after {GUARD:g} s"
    if raised is None:
        assert isinstance(outcome[0], InternalServerError)
    else:
        assert outcome[0] is raised
    assert finishes(server) == CLOSE_ATTEMPTS
    (finish, *_) = server.requests.filter("sessions/*/finish")
    expected = {None: "success", ValueError: "errored", KeyboardInterrupt: "interrupted"}
    assert finish.json["reason"]["type"] == expected[type(raised) if raised else None]


_CHILD = r"""
import atexit, contextlib, sys, threading
import tinker_sync
from tinker_sync import HealthPolicy, types
url, key, how = sys.argv[1], sys.argv[2], sys.argv[3]
policy = HealthPolicy(probe_initial_s=0.05, probe_max_s=0.2, probe_jitter=0.5)
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
service = tinker_sync.ServiceClient(base_url=url, api_key=key, health=policy)
if how == "atexit":
    atexit.register(service.close)  # closed at interpreter exit, after the main thread ends
with contextlib.nullcontext() if how == "atexit" else service:
    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    sampler.sample(prompt, 1, params).result(60)
    print("ready", flush=True)
    sys.stdin.readline()  # the parent has started the storm
    futures = [sampler.sample(prompt, 1, params) for _ in range(10)]
    tenant = service._session.limiter.tenant
    while not tenant.is_open():
        threading.Event().wait(0.01)
    print("open", flush=True)
    if how == "ctrl-c":
        futures[0].result()  # parked behind the circuit: Ctrl-C arrives here
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize(("how", "shared"), [("ctrl-c", "0"), ("ctrl-c", "1"), ("atexit", "1")])
def test_a_child_process_ends_at_once_during_a_503_storm(server, how, shared):
    """A spawned process (the reported case): Ctrl-C in a with block whose work is parked
    behind the open circuit, or exit with close() registered with atexit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, server.url, KEY, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO, "TINKER_SYNC_SHARED_BACKOFF": shared},
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        server.faults.add(Fault(endpoint="**", status=503, times=None))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "open"
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert finishes(server) == 1
    warned = [line for line in err.splitlines() if "could not tell the Tinker server" in line]
    assert len(warned) == 1 and server.url in warned[0] and KEY not in err
    if how == "ctrl-c":
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        assert "InternalServerError" not in err  # Ctrl-C's own exception, not the close's
    else:
        assert proc.returncode == 0, err
