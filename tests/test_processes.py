"""Processes: fork, pickling, sampler handles, spawn pools, interpreter exit
(docs/design/behavior.md#fork-detection, docs/design/behavior.md#drop-inherited-transport,
docs/design/behavior.md#inherited-futures-fail-fast, docs/design/behavior.md#forked-child-clients,
docs/design/behavior.md#credential-free-pickles, docs/design/behavior.md#fast-interpreter-exit),
plus handle interoperability with the official SDK.

Forked children report over a pipe and always leave with ``os._exit``; every wait on a child has a
hang guard that kills it and fails the test.
"""

from __future__ import annotations

import concurrent.futures
import faulthandler
import json
import multiprocessing
import os
import pickle
import random
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync.exceptions import ForkedProcessError, MissingCredentialsError
from tinker_sync.local import LocalServer
from tinker_sync.sampling_client import SEQ_STRIDE, SamplingClient

HANG = 60.0
KEY = "tml-processes-test-key-0123456789"
BASE = "Qwen/Qwen3-8B"
PROMPT = types.ModelInput.from_ints([1, 2, 3])
PARAMS = types.SamplingParams(max_tokens=3)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture
def srv() -> Iterator[LocalServer]:
    with LocalServer(backend="instant", api_key=KEY, long_poll_s=1.0) as server:
        yield server
    reset_limiters()


@pytest.fixture
def service(srv: LocalServer) -> Iterator[tinker_sync.ServiceClient]:
    client = tinker_sync.ServiceClient(base_url=srv.url, api_key=KEY)
    yield client
    client.close()


@pytest.fixture
def held_srv() -> Iterator[LocalServer]:
    """A second server whose sample results are held (futures stay pending)."""
    with LocalServer(backend="instant", api_key=KEY, long_poll_s=1.0) as server:
        hold(server)
        yield server
        server.resume()
    reset_limiters()


def hold(srv: LocalServer) -> None:
    """Hold sample results without a paused queue state (which would also back off)."""
    assert srv.app is not None
    srv.app.pause("active", None, "sampling")


# ------------------------------------------------------------------------------ fork helpers


def start_fork(child: Callable[[], dict[str, Any]]) -> tuple[int, int]:
    """Fork; the child runs ``child()`` and writes its JSON result to a pipe."""
    read_fd, write_fd = os.pipe()
    # SIGUSR1 makes a hung child dump its threads into the pipe, even from inside the
    # at-fork hooks (registered before the fork, so the child inherits the handler).
    faulthandler.register(signal.SIGUSR1, file=write_fd, all_threads=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            os.close(read_fd)
            payload = child()
        except BaseException:
            payload = {"error": traceback.format_exc()}
            code = 1
        try:
            os.write(write_fd, json.dumps(payload).encode())
        finally:
            os._exit(code)
    faulthandler.unregister(signal.SIGUSR1)
    os.close(write_fd)
    return pid, read_fd


def collect_fork(pid: int, read_fd: int, timeout: float = HANG) -> dict[str, Any]:
    """Read the child's result; kill it and fail if it does not finish in time."""
    deadline = time.monotonic() + timeout
    chunks = []
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.kill(pid, signal.SIGUSR1)
                dump = b""
                if select.select([read_fd], [], [], 5.0)[0]:
                    dump = os.read(read_fd, 1 << 20)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"forked child {pid} hung:\n{dump.decode(errors='replace')}")
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if ready:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(b"".join(chunks) or b'{"error": "no output"}')
    assert "error" not in result, result["error"]
    assert os.waitstatus_to_exitcode(status) == 0
    return result


def run_in_fork(child: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    return collect_fork(*start_fork(child))


def elapsed_raising(fut: concurrent.futures.Future[Any], exc_type: type[BaseException]) -> float:
    started = time.monotonic()
    try:
        fut.result(HANG)
    except exc_type:
        return time.monotonic() - started
    raise AssertionError(f"{fut!r} did not raise {exc_type.__name__}")


def datum() -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]},
    )


# ------------------------------------------------------------------------------ fork


def test_forked_child_samples_calls_rest_refuses_training(srv, service, held_srv):
    """The child samples and calls REST; training raises; futures fail fast
    (docs/design/behavior.md#inherited-futures-fail-fast,
    docs/design/behavior.md#forked-child-clients)."""
    sampler = service.create_sampling_client(base_model=BASE)
    training = service.create_lora_training_client(BASE, rank=4)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    held_service = tinker_sync.ServiceClient(base_url=held_srv.url, api_key=KEY)
    held_sample = held_service.create_sampling_client(base_model=BASE).sample(PROMPT, 1, PARAMS)
    held_srv.requests.wait_for("retrieve_future", 1, timeout=HANG)
    srv.pause(kind="training")
    held_training = training.forward_backward([datum()], "cross_entropy")
    srv.requests.wait_for("forward_backward", 1, timeout=HANG)

    def child() -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["inherited_sample_s"] = elapsed_raising(held_sample, ForkedProcessError)
        out["inherited_training_s"] = elapsed_raising(held_training, ForkedProcessError)
        response = sampler.sample(PROMPT, 2, PARAMS).result(HANG)
        out["sequences"] = len(response.sequences)
        out["clone"] = sampler._clone_id
        out["seq_ids"] = [s.sequence_id for s in response.sequences]
        out["capabilities"] = bool(service.get_server_capabilities().supported_models)
        rest = service.create_rest_client()
        out["runs"] = type(rest.list_training_runs().result(HANG)).__name__
        try:
            training.forward_backward([datum()], "cross_entropy")
        except ForkedProcessError:
            out["training"] = "ForkedProcessError"
        return out

    result = run_in_fork(child)
    assert result["inherited_sample_s"] < 1.0 and result["inherited_training_s"] < 1.0
    assert result["sequences"] == 2 and result["capabilities"] and result["runs"]
    assert result["training"] == "ForkedProcessError"
    assert 1 <= result["clone"] <= SEQ_STRIDE
    child_seqs = [
        r.json["seq_id"] for r in srv.requests.filter("asample") if r.json["seq_id"] >= SEQ_STRIDE
    ]
    assert child_seqs == [result["clone"] * SEQ_STRIDE]
    srv.resume()
    held_training.result(HANG)
    held_srv.resume()
    assert held_sample.result(HANG).sequences  # the parent is unaffected
    assert sampler.sample(PROMPT, 1, PARAMS).result(HANG).sequences
    held_service.close()


def test_fork_errors_say_what_to_do(srv, service):
    """A TrainingClient made before a fork (gunicorn --preload) fails in the child with a
    ForkedProcessError that names the remedy and the exact call, and the remedy works there;
    the pickling refusals name what to do instead."""
    training = service.create_lora_training_client(BASE, rank=4)

    def child() -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            training.forward_backward([datum()], "cross_entropy")
            out["training"] = "no error"
        except ForkedProcessError as exc:
            out["training"] = str(exc)
        mine = tinker_sync.ServiceClient(base_url=srv.url, api_key=KEY)
        remedy = mine.create_lora_training_client(BASE, rank=4)
        out["remedy"] = type(remedy.forward_backward([datum()], "cross_entropy").result(HANG))
        out["remedy"] = out["remedy"].__name__
        mine.close()
        return out

    result = run_in_fork(child)
    assert "after the fork" in result["training"]
    assert "post_fork(server, worker)" in result["training"]
    assert "create_lora_training_client(base_model, rank=...)" in result["training"]
    assert "create_training_client_from_state(path)" in result["training"]
    assert result["remedy"] == "ForwardBackwardOutput"
    refusals = {}
    for obj in (training, service, service.create_rest_client()):
        with pytest.raises(TypeError) as info:
            pickle.dumps(obj)
        refusals[type(obj).__name__] = str(info.value)
    assert "create_training_client_from_state(path)" in refusals["TrainingClient"]
    assert "tinker_sync.ServiceClient()" in refusals["ServiceClient"]
    assert "create_rest_client()" in refusals["RestClient"]


def test_fork_50_times_at_random_moments_no_child_hangs():
    """200 samples in flight, a trainer busy and SDK locks held at fork
    (docs/design/behavior.md#fork-detection, docs/design/behavior.md#inherited-futures-fail-fast).
    """
    with LocalServer(backend="instant", api_key=KEY, long_poll_s=1.0, work_delay_s=0.3) as srv:
        service = tinker_sync.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            _fork_50_times(srv, service)
        finally:
            service.close()
    reset_limiters()


def _fork_50_times(srv: LocalServer, service: tinker_sync.ServiceClient) -> None:
    sampler = service.create_sampling_client(base_model=BASE)
    training = service.create_lora_training_client(BASE, rank=4)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    limiter = service._session.limiter
    stop = threading.Event()
    in_flight: list[concurrent.futures.Future[Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def keep_200_in_flight() -> None:
        while not stop.is_set():
            with lock:
                in_flight[:] = [f for f in in_flight if not f.done()]
                need = 200 - len(in_flight)
            fresh = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(need)]
            with lock:
                in_flight.extend(fresh)
            for fut in fresh:
                fut.add_done_callback(lambda f: f.exception() and errors.append(f.exception()))
            if fresh:
                concurrent.futures.wait(fresh[:1], timeout=HANG)

    def keep_training() -> None:
        while not stop.is_set():
            training.forward_backward([datum()], "cross_entropy").result(HANG)

    holding = threading.Event()
    release = threading.Event()

    def hold_locks() -> None:  # SDK locks held by another thread at fork time
        with sampler._seq_lock, limiter._lock:
            holding.set()
            release.wait(HANG)

    workers = [threading.Thread(target=f) for f in (keep_200_in_flight, keep_training)]
    for t in workers:
        t.start()
    rng = random.Random(1234)
    children = []
    locker = threading.Thread(target=hold_locks)
    try:
        for i in range(50):
            if i == 25:
                locker.start()
                assert holding.wait(HANG)
            time.sleep(rng.uniform(0.0, 0.02))  # randomise the fork moment (not a sync)
            with lock:
                inherited = [f for f in in_flight if not f.done()][:3]

            def child(inherited: list[Any] = inherited) -> dict[str, Any]:
                slow, forked = 0.0, 0
                for fut in inherited:  # each one finished before the fork, or fails at once
                    started = time.monotonic()
                    try:
                        fut.result(HANG)
                    except ForkedProcessError:
                        forked += 1
                    slow = max(slow, time.monotonic() - started)
                response = sampler.sample(PROMPT, 1, PARAMS).result(HANG)
                try:
                    training.forward_backward([datum()], "cross_entropy")
                    refused = False
                except ForkedProcessError:
                    refused = True
                return {
                    "slowest": slow,
                    "forked": forked,
                    "ok": bool(response.sequences),
                    "refused": refused,
                }

            children.append(start_fork(child))
        release.set()
        results = [collect_fork(pid, fd) for pid, fd in children]
    finally:
        release.set()
        if locker.is_alive():
            locker.join(HANG)
        stop.set()
        for t in workers:
            t.join(HANG)
    assert len(results) == 50
    assert all(r["ok"] and r["refused"] and r["slowest"] < 1.0 for r in results), results
    assert sum(r["forked"] for r in results) > 0, results  # pending futures were inherited
    with lock:
        pending = list(in_flight)
    concurrent.futures.wait(pending, timeout=HANG)
    assert not errors
    # children never reused the parent's seq_ids: one logical request per seq_id (a retry or a
    # hedged copy of a slow send repeats both its seq_id and its idempotency key)
    keys: dict[int, set[str]] = {}
    for r in srv.requests.filter("asample", status=200):
        keys.setdefault(r.json["seq_id"], set()).add(r.headers["x-idempotency-key"])
    assert all(len(k) == 1 for k in keys.values()), {s: k for s, k in keys.items() if len(k) > 1}


def _open_socket_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                fds.add(fd)
        except OSError:
            continue
    return fds


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_child_closes_no_inherited_socket(srv, service, held_srv):
    """A socket spy sees the child close or shut down no inherited socket
    (docs/design/behavior.md#drop-inherited-transport)."""
    sampler = service.create_sampling_client(base_model=BASE)
    rest = service.create_rest_client()
    for _ in range(5):
        sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    rest.list_training_runs().result(HANG)
    held_service = tinker_sync.ServiceClient(base_url=held_srv.url, api_key=KEY)
    held_sampler = held_service.create_sampling_client(base_model=BASE)
    pending = [held_sampler.sample(PROMPT, 1, PARAMS) for _ in range(20)]
    held_srv.requests.wait_for("asample", 20, timeout=HANG)
    held_srv.requests.wait_for("retrieve_future", 20, timeout=HANG)  # polls in flight

    def child() -> dict[str, Any]:
        import gc

        from tinker_sync._runtime.clock import _on_exit

        inherited = _open_socket_fds()
        touched: list[int] = []
        original_close, original_shutdown = socket.socket.close, socket.socket.shutdown
        original_os_close = os.close

        def spy_close(self: socket.socket) -> None:
            if self.fileno() in inherited:
                touched.append(self.fileno())
            original_close(self)

        def spy_shutdown(self: socket.socket, how: int) -> None:
            if self.fileno() in inherited:
                touched.append(self.fileno())
            original_shutdown(self, how)

        def spy_os_close(fd: int) -> None:
            if fd in inherited:
                touched.append(fd)
            original_os_close(fd)

        socket.socket.close = spy_close  # type: ignore[method-assign]
        socket.socket.shutdown = spy_shutdown  # type: ignore[method-assign]
        os.close = spy_os_close
        try:
            failed = sum(isinstance(f.exception(HANG), ForkedProcessError) for f in pending)
            for _ in range(3):
                sampler.sample(PROMPT, 1, PARAMS).result(HANG)
            rest.list_training_runs().result(HANG)
            sampler.close()
            gc.collect()
            _on_exit()  # the SDK's interpreter-exit hooks (abort in-flight sockets)
            still_open = inherited <= _open_socket_fds()
        finally:
            socket.socket.close = original_close  # type: ignore[method-assign]
            socket.socket.shutdown = original_shutdown  # type: ignore[method-assign]
            os.close = original_os_close
        return {
            "inherited": len(inherited),
            "touched": touched,
            "still_open": still_open,
            "failed": failed,
        }

    result = run_in_fork(child)
    assert result["inherited"] > 0
    assert result["touched"] == [] and result["still_open"]
    assert result["failed"] == 20
    held_srv.resume()  # the parent finishes its work without errors
    done, not_done = concurrent.futures.wait(pending, timeout=HANG)
    assert not not_done and all(f.exception() is None for f in done)
    assert sampler.sample(PROMPT, 1, PARAMS).result(HANG).sequences
    held_service.close()


# ------------------------------------------------------------------------------ pickles


def _spawn_probe(payloads: list[bytes]) -> list[str]:
    """Spawn target: unpickle each client and sample once; report the outcome."""
    outcomes = []
    for payload in payloads:
        client = pickle.loads(payload)
        try:
            response = client.sample(PROMPT, 1, PARAMS).result(HANG)
            outcomes.append(f"ok:{len(response.sequences)}")
        except MissingCredentialsError as exc:
            outcomes.append(f"missing:{exc}")
    return outcomes


def test_pickles_hold_no_key_and_spawn_child_needs_credentials(srv):
    """The default pickle is credential-free; the opt-in carries the key
    (docs/design/behavior.md#credential-free-pickles)."""
    plain = tinker_sync.ServiceClient(base_url=srv.url, api_key=KEY)
    opted = tinker_sync.ServiceClient(base_url=srv.url, api_key=KEY, pickle_credentials=True)
    try:
        free = pickle.dumps(plain.create_sampling_client(base_model=BASE))
        keyed = pickle.dumps(opted.create_sampling_client(base_model=BASE))
        assert KEY.encode() not in free and KEY.encode() in keyed
        assert "TINKER_API_KEY" not in os.environ
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            outcomes = pool.submit(_spawn_probe, [free, keyed]).result(HANG * 2)
    finally:
        plain.close()
        opted.close()
    assert outcomes[0].startswith("missing:") and "pickle_credentials=True" in outcomes[0]
    assert outcomes[1] == "ok:1"


def _pool_worker(payload: bytes | str) -> tuple[int, int, str]:
    """Pool target: sample through a pickled client or a handle in a worker process."""
    client = (
        SamplingClient.from_sampler_handle(payload)
        if isinstance(payload, str)
        else pickle.loads(payload)
    )
    response = client.sample(PROMPT, 2, PARAMS).result(HANG)
    return os.getpid(), client._clone_id or 0, ",".join(str(s.tokens) for s in response.sequences)


def _sample_in_pool(method: str, workers: int, srv: LocalServer, monkeypatch: Any) -> None:
    monkeypatch.setenv("TINKER_API_KEY", KEY)  # workers resolve their own credential
    service = tinker_sync.ServiceClient(base_url=srv.url)
    try:
        sampler = service.create_sampling_client(base_model=BASE)
        handle = sampler.get_sampler_handle()
        payload = pickle.dumps(sampler)
        assert KEY.encode() not in payload and KEY not in handle
        tasks: list[bytes | str] = [payload if i % 2 else handle for i in range(workers)]
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":  # import once in the server, not in each worker
            ctx.set_forkserver_preload(
                [
                    __name__,
                    "tinker_sync.sampling_client",
                    "tinker_sync._session.state",
                    "tinker_sync._polling.loop",
                    "tinker_sync._wire._proto",
                    "tinker_sync.types",
                ]
            )
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(_pool_worker, tasks, timeout=HANG * 3))
    finally:
        service.close()
    assert len(results) == len(tasks)
    clones = [clone for _, clone, _ in results]
    assert all(1 <= c <= SEQ_STRIDE for c in clones) and len(set(clones)) == len(clones)
    seqs = [r.json["seq_id"] for r in srv.requests.filter("asample")]
    assert len(seqs) == len(tasks) and len(set(seqs)) == len(seqs)


def test_forkserver_pool_of_8_workers_samples_through_pickles_and_handles(srv, monkeypatch):
    """Forkserver workers sample; pickles and handles carry no secret
    (docs/design/behavior.md#credential-free-pickles)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver")
    _sample_in_pool("forkserver", 8, srv, monkeypatch)


def test_spawn_pool_samples_through_pickles_and_handles(srv, monkeypatch):
    """A spawn pool of 2 workers (reduced) (docs/design/behavior.md#credential-free-pickles)."""
    _sample_in_pool("spawn", 2, srv, monkeypatch)


@pytest.mark.full
def test_spawn_pool_of_8_workers_samples_through_pickles_and_handles(srv, monkeypatch):
    """A spawn pool of 8 workers (full size; the spawn pool of 2 and the forkserver pool of 8
    always run) (docs/design/behavior.md#credential-free-pickles)."""
    _sample_in_pool("spawn", 8, srv, monkeypatch)


WORKER_MODULES_SCRIPT = r"""
import json, pickle, sys
from tinker_sync import types
client = pickle.loads(sys.stdin.buffer.read())
client.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=3)).result(60)
print(json.dumps(sorted(sys.modules)))
"""


def test_spawned_worker_sampling_over_http_skips_modules_it_does_not_need(srv, service):
    """A fresh worker that unpickles a sampling client and samples once over plain http
    imports neither asyncio (no event loop runs), requests, the local server, the REST types
    nor the protocol request types (JSON decoders are built on first use), nor cattrs (the
    submit reply is read without the converter) nor the training types of ``_datum``: each
    costs start-up time in every spawned rollout worker (docs/scale-out.md#start-up)."""
    payload = pickle.dumps(service.create_sampling_client(base_model=BASE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    env["TINKER_API_KEY"] = KEY
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", WORKER_MODULES_SCRIPT],
        input=payload,
        capture_output=True,
        env=env,
        timeout=HANG * 2,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    loaded = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert "tinker_sync.sampling_client" in loaded  # the check below would be vacuous otherwise
    tops = {name.split(".")[0] for name in loaded}
    assert not {"asyncio", "requests"} & tops, sorted({"asyncio", "requests"} & tops)
    assert not [name for name in loaded if name.startswith("tinker_sync.local")]
    assert "tinker_sync.types._rest" not in loaded
    assert "tinker_sync.types._protocol" not in loaded  # ~45 request/reply classes to build
    assert "tinker_sync.types._results" in loaded  # the sample's own types (not vacuous)
    assert "cattrs" not in tops  # the JSON converter is built on the first typed parse
    assert "tinker_sync.types._datum" not in loaded  # Datum & co.: training only
    assert "tinker_sync.types._trainparams" not in loaded  # optimizer and LoRA parameters
    assert "tinker_sync.types._opresults" not in loaded  # results of the other operations


FIRST_SAMPLE_SCRIPT = r"""
import json, os, pickle, sys
from tinker_sync import types
if sys.argv[1] == "pickle":
    client = pickle.loads(sys.stdin.buffer.read())
else:
    import tinker_sync
    service = tinker_sync.ServiceClient(base_url=sys.argv[2], api_key=os.environ["TINKER_API_KEY"])
    client = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
response = client.sample(
    types.ModelInput.from_ints([1, 2, 3]), 2, types.SamplingParams(max_tokens=3)
).result(60)
seq = response.sequences[0]
maps = "/proc/self/maps"
before = {
    "numpy": "numpy" in sys.modules,
    "modules": sorted(sys.modules),
    "libraries": open(maps).read() if os.path.exists(maps) else None,
    "tokens": seq.tokens,
}
array = seq.tokens_np  # a numpy accessor imports numpy on first use
after = {"numpy": "numpy" in sys.modules, "dtype": str(array.dtype), "list": array.tolist()}
print(json.dumps({"before": before, "after": after}))
"""


#: What a first sample over plain http on the direct path must not import
#: (docs/scale-out.md#start-up): numpy (and so no BLAS), urllib3 (the other request path; its
#: pools are built on first use), requests and urllib.request (urllib3's exception classes are
#: checked without importing it; proxies are looked up without urllib.request when no
#: ``*_proxy`` variable is set; http.client, with email and ssl, is imported: see _direct.py),
#: decimal (a Decimal is recognised without
#: it), and the types of the other operations (protocol requests, REST, training parameters and
#: results): a ServiceClient builds them on first use.
FIRST_SAMPLE_SKIPS = (
    "numpy",
    "decimal",
    "tinker_sync.types._protocol",
    "tinker_sync.types._rest",
    "tinker_sync.types._trainparams",
    "tinker_sync.types._opresults",
    "urllib3",
    "requests",
    "urllib.request",
)


@pytest.mark.parametrize("start", ["pickle", "service"])
def test_first_sample_in_a_fresh_interpreter_imports_no_numpy(srv, service, start):
    """A worker's first sample (from a pickled client or from a ServiceClient) on the direct
    path imports none of :data:`FIRST_SAMPLE_SKIPS`, so no BLAS library is loaded and no BLAS
    thread starts; the results keep their API: ``tokens`` is a list and ``tokens_np`` an int32
    array, numpy imported on first use (docs/scale-out.md#start-up)."""
    payload = pickle.dumps(service.create_sampling_client(base_model=BASE))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TINKER_") and not k.lower().endswith("_proxy")
    }
    env["TINKER_API_KEY"] = KEY
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", FIRST_SAMPLE_SCRIPT, start, srv.url],
        input=payload if start == "pickle" else b"",
        capture_output=True,
        env=env,
        timeout=HANG * 2,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    report = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    before, after = report["before"], report["after"]
    assert before["numpy"] is False
    assert "tinker_sync._transport._direct" in before["modules"]  # not vacuous
    loaded = [m for m in FIRST_SAMPLE_SKIPS if m in before["modules"]]
    assert not loaded, loaded
    if before["libraries"] is not None:  # Linux: no BLAS library mapped, so no BLAS threads
        assert not re.findall(r"\S*(?:blas|lapack|libgomp|mkl)\S*", before["libraries"])
    assert before["tokens"] and all(type(t) is int for t in before["tokens"])
    assert after == {"numpy": True, "dtype": "int32", "list": before["tokens"]}


# ------------------------------------------------------------------------------ official SDK


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_handles_interoperate_with_the_official_sdk(srv, service):
    """Our handles work in the official SDK and the other way round
    (docs/design/surface.md#sampling-client)."""
    tinker = pytest.importorskip("tinker")
    ours = service.create_sampling_client(base_model=BASE)
    official_service = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
    try:
        theirs = official_service.create_sampling_client(base_model=BASE).result()
        rebuilt = tinker.SamplingClient.from_sampler_handle(ours.get_sampler_handle(), api_key=KEY)
        official_result = rebuilt.sample(
            prompt=tinker.types.ModelInput.from_ints([1, 2, 3]),
            num_samples=1,
            sampling_params=tinker.types.SamplingParams(max_tokens=3),
        ).result(HANG)
        assert len(official_result.sequences) == 1
        mine = SamplingClient.from_sampler_handle(theirs.get_sampler_handle(), api_key=KEY)
        assert mine.sampler_id == theirs._sampling_session_id
        assert len(mine.sample(PROMPT, 2, PARAMS).result(HANG).sequences) == 2
    finally:
        closing = official_service.close("success")
        if hasattr(closing, "result"):
            closing.result()
    by_sampler: dict[str, list[int]] = {}
    for r in srv.requests.filter("asample"):
        by_sampler.setdefault(r.json["sampling_session_id"], []).append(r.json["seq_id"])
    assert all(s >= SEQ_STRIDE for s in by_sampler[ours.sampler_id])  # the official clone
    assert all(s >= SEQ_STRIDE for s in by_sampler[mine.sampler_id])  # our clone


# ------------------------------------------------------------------------------ exit

_T_I6_CHILD = r"""
import sys, threading
import tinker_sync
from tinker_sync import types
url, key = sys.argv[1], sys.argv[2]
service = tinker_sync.ServiceClient(base_url=url, api_key=key)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
fut = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2))
pause = threading.Event()
def polling():  # a thread in a poll loop (the sender's, after its send) or the session poller
    names = [t.name for t in threading.enumerate()]
    if any(n.startswith("tinker_sync-futures-poller") for n in names):
        return True
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_filename.endswith("_polling/loop.py"):
                return True
            frame = frame.f_back
    return False
while fut.request_id is None or not polling():
    pause.wait(0.01)
print("ready", flush=True)
# the script ends here; the future is held forever by the server
"""


@pytest.mark.parametrize("poller", [False, True])
def test_script_exits_promptly_while_a_future_is_held(poller):
    """A subprocess with a held future exits within 3 s after its last line
    (docs/design/behavior.md#fast-interpreter-exit)."""
    with LocalServer(
        backend="instant",
        api_key=KEY,
        long_poll_s=30.0,
        client_config={"sample_use_retrieve_futures": poller},
    ) as server:
        hold(server)
        proc = subprocess.Popen(
            [sys.executable, "-c", _T_I6_CHILD, server.url, KEY],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            ready_at = time.monotonic()
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else ""
            code = proc.wait(HANG)
            took = time.monotonic() - ready_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0
        assert took < 3.0
        server.resume()
