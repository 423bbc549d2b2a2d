"""Signals and interpreter exit: Ctrl-C and exit with threads blocked in ``result()``, signal
handlers that raise on the caller's thread, and ``tinker-sync exec`` under a supervisor
(docs/guarantees.md#signals-and-exit, docs/design/behavior.md#fast-interpreter-exit).

Every scenario runs in a child process with a hard time limit, so a hang fails the test instead
of wedging the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tinker_sync._ratelimit import reset_limiters
from tinker_sync.local import LocalServer

KEY = "tml-signals-test-key-0123456789abc"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG = 60.0

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1"}


def finish(proc: subprocess.Popen[str], limit: float) -> tuple[int | None, float, str, str]:
    """Wait up to ``limit`` s for ``proc``; kill it if it is still alive (code None)."""
    started = time.monotonic()
    try:
        out, err = proc.communicate(timeout=limit)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        try:  # a grandchild that outlived it may still hold the pipes open
            out, err = proc.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:
            out, err = "", "(pipes held open by a surviving grandchild)"
        code = None
    return code, time.monotonic() - started, out, err


# ------------------------------------------------------------------------ exit with waiters

_WAITERS_CHILD = r"""
import concurrent.futures, os, signal, sys, threading
import tinker_sync
from tinker_sync import types
url, key, how = sys.argv[1], sys.argv[2], sys.argv[3]
service = tinker_sync.ServiceClient(base_url=url, api_key=key)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
accepted = threading.Semaphore(0)
def work(i):
    fut = sampler.sample(prompt, 1, params)
    while fut.request_id is None:
        threading.Event().wait(0.01)
    accepted.release()
    try:
        fut.result()
        line = "result"
    except BaseException as exc:
        line = f"{type(exc).__name__} {'interpreter is exiting' in str(exc)}"
    os.write(1, f"{line}\n".encode())  # one write per line: threads do not interleave
pool = concurrent.futures.ThreadPoolExecutor(64)
for i in range(64):
    pool.submit(work, i)
for _ in range(64):
    accepted.acquire()
print("ready", flush=True)
if how == "exit":
    sys.exit(3)
threading.Event().wait()  # Ctrl-C arrives here
"""


@pytest.fixture
def held_server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    with LocalServer(
        backend="instant",
        api_key=KEY,
        long_poll_s=30.0,
        client_config={"sample_use_retrieve_futures": request.param},
    ) as server:
        assert server.app is not None
        server.app.pause("active", None, "sampling")  # polls are held, never answered
        yield server
        server.resume()
    reset_limiters()


@pytest.mark.parametrize("held_server", [False, True], ids=["per-future", "poller"], indirect=True)
@pytest.mark.parametrize("how", ["sigint", "exit"])
def test_exit_with_64_threads_blocked_in_result(held_server: LocalServer, how: str) -> None:
    """Ctrl-C (or sys.exit) with 64 ThreadPoolExecutor threads blocked in ``sample().result()``
    on polls the server never answers: the process exits within 2 s and every thread's
    ``result()`` raised ClientClosedError saying the interpreter is exiting."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WAITERS_CHILD, held_server.url, KEY, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        code, _, out, err = finish(proc, HANG)
        pytest.fail(f"child failed before the test started: {line}{out}{err}")
    if how == "sigint":
        proc.send_signal(signal.SIGINT)
    code, took, out, err = finish(proc, 10.0)
    assert code is not None, f"still alive 10 s after {how}:\n{err}"
    assert code == (-signal.SIGINT if how == "sigint" else 3), err
    assert took < 2.0
    assert out.splitlines() == ["ClientClosedError True"] * 64, err


# ------------------------------------------------------------------------ tinker-sync exec

_HANDLER_PROGRAM = r"""
import os, signal, sys, threading
def handler(signum, frame):
    os.write(1, f"got {signum} alias={os.environ.get('TINKER_SYNC_ALIAS')}\n".encode())
    os._exit(100 + signum)
for name in sys.argv[1:]:
    signal.signal(getattr(signal, name), handler)
os.write(1, b"ready\n")
threading.Event().wait(30)
os._exit(1)
"""

_EXEC_SIGNALS = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"]


def start_exec(*program_args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinker_sync", "exec", "--", sys.executable, "-c", _HANDLER_PROGRAM]
        + list(program_args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("name", _EXEC_SIGNALS)
def test_exec_delivers_every_signal_to_the_program(name: str) -> None:
    """A supervisor's signal sent to the pid it started reaches the program, which handles it
    and exits; its exit status comes back unchanged."""
    signum = getattr(signal, name)
    proc = start_exec(*_EXEC_SIGNALS)
    proc.send_signal(signum)
    code, _, out, err = finish(proc, 10.0)
    assert out == f"got {signum} alias=1\n", err
    assert code == 100 + signum


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"])
def test_exec_passes_death_by_signal_through(name: str) -> None:
    """A program killed by a signal (default handler) looks killed by it to the supervisor."""
    signum = getattr(signal, name)
    proc = start_exec()
    proc.send_signal(signum)
    code, _, _, err = finish(proc, 10.0)
    assert code == -signum, err


def test_exec_under_timeout_stops_the_program(tmp_path: object) -> None:
    """``timeout --foreground 1 tinker-sync exec -- prog`` (signals only the pid it started, as
    docker, Kubernetes and systemd's main-pid stop do): the program gets the SIGTERM (it used to
    run on after the wrapper died) and timeout reports 124."""
    import shutil

    if shutil.which("timeout") is None:
        pytest.skip("no timeout(1)")
    proc = subprocess.Popen(
        ["timeout", "--foreground", "-s", "TERM", "1", sys.executable, "-m", "tinker_sync", "exec", "--"]
        + [sys.executable, "-c", _HANDLER_PROGRAM, "SIGTERM"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    code, took, out, err = finish(proc, 20.0)
    assert out == f"ready\ngot {signal.SIGTERM} alias=1\n", err
    assert code == 124
    assert took < 10.0
