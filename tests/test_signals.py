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
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from tinker_sync._flow.limiter import reset_limiters
from tinker_sync._runtime import fork as _fork
from tinker_sync._runtime.fork import make_condition, make_lock
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
    started = time.monotonic()
    try:
        code: int | None = proc.wait(10.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    took = time.monotonic() - started
    # Read on through the same buffered file: readline() may already hold the threads' lines.
    assert proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    assert code is not None, f"still alive 10 s after {how}:\n{err}"
    assert code == (-signal.SIGINT if how == "sigint" else 3), err
    assert took < 2.0
    assert out.splitlines() == ["ClientClosedError True"] * 64, err
    assert "cannot reach" not in err, err  # the server is healthy: only the exit cut the polls


_WITH_POOL_CHILD = r"""
import concurrent.futures, os, sys, threading
import tinker_sync
from tinker_sync import types
url, key = sys.argv[1], sys.argv[2]
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
        line = type(exc).__name__
    os.write(1, f"{line}\n".encode())
with concurrent.futures.ThreadPoolExecutor(64) as pool:
    for i in range(64):
        pool.submit(work, i)
    for _ in range(64):
        accepted.acquire()
    try:
        print("ready", flush=True)
        threading.Event().wait()  # Ctrl-C arrives here
    except KeyboardInterrupt:
        service.close()  # the documented fix: pending futures fail, the workers return
        raise
"""


@pytest.mark.parametrize("held_server", [False], ids=["per-future"], indirect=True)
def test_ctrl_c_inside_a_with_thread_pool_exits_when_the_program_closes_the_service(
    held_server: LocalServer,
) -> None:
    """Inside ``with ThreadPoolExecutor()`` the block's own ``shutdown(wait=True)`` joins the
    workers before the interpreter exits: the fix docs/guarantees.md#signals-and-exit gives
    (``service.close()`` in ``except KeyboardInterrupt``) fails the 64 pending futures with
    ClientClosedError, so the process ends within 2 s of Ctrl-C."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITH_POOL_CHILD, held_server.url, KEY],
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
    proc.send_signal(signal.SIGINT)
    code, took, out, err = finish(proc, 10.0)
    assert code == -signal.SIGINT, err
    assert took < 2.0
    assert out.splitlines() == ["ClientClosedError"] * 64, err


# ------------------------------------------------------------------------ tinker-sync exec

_HANDLER_PROGRAM = r"""
import os, signal, sys, threading
def handler(signum, frame):
    os.write(1, f"got {signum} alias={os.environ.get('TINKER_SYNC_ALIAS')}\n".encode())
    os._exit(100 + signum)
for name in sys.argv[1:]:
    if name.startswith("default:"):
        # Python's own default: a shell's `nohup` or `&` may have started us with it ignored
        name = name.removeprefix("default:")
        default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
        signal.signal(getattr(signal, name), default)
    else:
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
    proc = start_exec(f"default:{name}")
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
        [
            "timeout",
            "--foreground",
            "-s",
            "TERM",
            "1",
            sys.executable,
            "-m",
            "tinker_sync",
            "exec",
            "--",
        ]
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


# ------------------------------------------------------------------------ signal handlers

# The handler raises a TimeoutError subclass, as alarm-based timeouts do: the hardest case,
# since a TimeoutError is also what a socket read timeout looks like (and sampling retries it).
_STORM_PRELUDE = r"""
import collections, json, signal, sys, time
class Alarm(TimeoutError):
    pass
armed = False
fired = 0
def on_alarm(signum, frame):
    global fired
    fired += 1
    if armed:
        raise Alarm("alarm")
signal.signal(signal.SIGALRM, on_alarm)
# An alarm landing in a weakref or GC callback is printed as "Exception ignored": not ours.
sys.unraisablehook = lambda unraisable: None
outcomes = collections.Counter()
def guarded(op):
    # armed only inside op(): the harness's own bookkeeping never sees an Alarm
    global armed
    try:
        try:
            armed = True
            op()
        finally:
            armed = False
    except Alarm:
        outcomes["Alarm"] += 1
    except BaseException as exc:
        outcomes[f"{type(exc).__name__}: {exc}"[:200]] += 1
    else:
        outcomes["ok"] += 1
def storm(ops, seconds, intervals):
    # a timer every interval (cycled per call): alarms land in every phase of every call
    end, i, current = time.monotonic() + seconds, 0, None
    while time.monotonic() < end:
        interval = intervals[i % len(intervals)]
        if interval != current:  # re-arming restarts the timer: only when it changes
            signal.setitimer(signal.ITIMER_REAL, interval, interval)
            current = interval
        guarded(ops[i % len(ops)])
        i += 1
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
"""

_STORM_CHILD = (
    _STORM_PRELUDE
    + r"""
import tinker_sync
from tinker_sync import types
url, key, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
service = tinker_sync.ServiceClient(base_url=url, api_key=key)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
training = service.create_lora_training_client("Qwen/Qwen3-8B", rank=4)
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=3)
datum = types.Datum(
    model_input=types.ModelInput.from_ints([1, 2, 3]),
    loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]},
)
ops = [
    lambda: sampler.sample(prompt, 1, params).result(),
    lambda: training.forward_backward([datum], "cross_entropy").result(),
    lambda: sampler.sample(prompt, 2, params).result(),
    lambda: training.optim_step(types.AdamParams(learning_rate=1e-4)).result(),
    lambda: service.get_server_capabilities(),
]
storm(ops, seconds, [0.0003, 0.001, 0.0003, 0.003, 0.0005, 0.01])
# Afterwards the SDK still works: every lock is free, every slot was given back.
after = {
    "sample": len(sampler.sample(prompt, 2, params).result(timeout=30).sequences),
    "fwdbwd": type(training.forward_backward([datum], "cross_entropy").result(timeout=30)).__name__,
    "optim": type(training.optim_step(types.AdamParams()).result(timeout=30)).__name__,
    "capabilities": bool(service.get_server_capabilities().supported_models),
}
print(json.dumps({"fired": fired, "outcomes": outcomes, "after": after}), flush=True)
"""
)


def _seq_key(record: object) -> tuple[str, object] | None:
    body = getattr(record, "json", None) or getattr(record, "proto", None) or {}
    seq = body.get("seq_id")
    owner = body.get("sampling_session_id") or body.get("model_id")
    return None if seq is None else (f"{record.endpoint}:{owner}", seq)  # type: ignore[attr-defined]


def test_an_alarm_storm_during_sampling_and_training_leaves_the_sdk_working() -> None:
    """Thousands of SIGALRM timers whose handler raises (a TimeoutError subclass) while the main
    thread samples, trains and waits in result(): each alarm reaches the caller as itself (never
    a protocol error, never retried away), no SDK lock or slot is left held (the SDK works
    afterwards, within the hard time limit), and the server saw no seq_id twice."""
    with LocalServer(backend="instant", api_key=KEY) as server:
        proc = subprocess.Popen(
            [sys.executable, "-c", _STORM_CHILD, server.url, KEY, "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        code, _, out, err = finish(proc, 120.0)
        assert code == 0, f"exit {code} (None: wedged, killed at the hard limit)\n{err[-3000:]}"
        report = json.loads(out)
        seen: dict[tuple[str, object], int] = {}
        keys: dict[tuple[str, object], set[object]] = {}
        for record in server.requests.all():
            key = _seq_key(record)
            if key is not None and record.endpoint in ("asample", "forward_backward", "optim_step"):
                seen[key] = seen.get(key, 0) + 1
                keys.setdefault(key, set()).add(record.headers.get("x-idempotency-key"))
    reset_limiters()
    assert report["after"] == {
        "sample": 2,
        "fwdbwd": "ForwardBackwardOutput",
        "optim": "OptimStepResponse",
        "capabilities": True,
    }
    outcomes = report["outcomes"]
    assert report["fired"] >= 1000
    assert outcomes.get("Alarm", 0) >= 100 and outcomes.get("ok", 0) >= 10
    assert set(outcomes) <= {"Alarm", "ok"}, outcomes  # nothing else: no protocol error
    # The server saw every request exactly once: no seq_id twice, not even a resend of the same
    # sample (a main-thread sample() admits inline: an alarm inside the limiter's admission
    # used to start one ticket twice; docs/limiter.md#signals).
    twice = [k for k, n in seen.items() if n > 1]
    assert seen and not twice, [(k, keys[k]) for k in twice[:5]]


_DECODE_CHILD = (
    _STORM_PRELUDE
    + r"""
from tinker_sync import types
row = {"session_id": "s", "created_at": "2024-01-01T00:00:00Z", "owner": "o", "project_id": "p",
       "checkpoints_count": 3}
data = {"sessions": [row] * 30}
types.SessionSearchResponse.model_validate(data)
storm([lambda: types.SessionSearchResponse.model_validate(data)], 1.5, [0.0003])
print(json.dumps({"fired": fired, "outcomes": outcomes}), flush=True)
"""
)


def test_a_signal_handlers_exception_is_never_a_validation_error() -> None:
    """Alarms landing while the JSON decoder validates a valid reply come out as the handler's
    own exception, never as a WireValidationError (the decoder collects field errors)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _DECODE_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    code, _, out, err = finish(proc, 60.0)
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["outcomes"].get("Alarm", 0) >= 100
    assert set(report["outcomes"]) <= {"Alarm", "ok"}, report["outcomes"]


def test_with_on_sdk_locks_runs_no_python_while_the_lock_is_held() -> None:
    """``with lock:`` / ``with cond:`` on the SDK's fork-safe lock run no Python frame between
    taking the lock and the body, or between the body and letting it go: a signal handler's
    exception cannot land there and leave the lock held (it used to, in __enter__)."""
    lock = make_lock()
    cond = make_condition(lock)
    held_in_python: list[str] = []

    def local(frame: FrameType, event: str, arg: object) -> object:
        if lock.locked():
            held_in_python.append(f"{frame.f_code.co_name}:{event}")
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> object:
        if frame.f_code.co_filename in (_fork.__file__, threading.__file__):
            return local(frame, event, arg)
        return None

    sys.settrace(tracer)
    try:
        with lock:
            pass
        with cond:
            pass
    finally:
        sys.settrace(None)
    assert held_in_python == []
    assert not lock.locked()
