"""Fork storm: ``os.fork()`` at random moments from a busy parent
(docs/design/behavior.md#fork-detection, docs/design/behavior.md#drop-inherited-transport,
docs/design/behavior.md#inherited-futures-fail-fast, docs/design/behavior.md#forked-child-clients).

The parent keeps ~200 samples in flight, runs a training loop and, for every other fork, has a
helper thread hold SDK locks (the sampler's seq lock, the transport pool registry, the limiter
registry, the executor pool registry) across the fork. Each child runs under a hard
``signal.alarm`` deadline and reports over a pipe; the parent reaps every child with a
deadline and kills stragglers (a killed child fails the test). In each child:

* every future inherited from the parent is either already finished or fails *at once* with
  ``ForkedProcessError`` naming the parent pid -- no inherited future can hang;
* a training op on the inherited TrainingClient raises ``ForkedProcessError``;
* the inherited SamplingClient samples successfully with the child's own credential
  (``TINKER_API_KEY`` in the environment; the parent used a different explicit key), and so
  does a new ``ServiceClient``; both answers equal the backend's answer for the child's own
  prompt (a seq_id collision with the parent would return the parent's answer instead).

Afterwards the parent itself must have lost nothing: every parent sample succeeded and the
training ops were applied exactly once, in order.

Size: ``TINKER_SYNC_FORKS`` (default 20, the CI size; the full storm is 100).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import faulthandler
import json
import os
import random
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from reliability_helpers import HANG, datum, wait_all

import tinker_sync
from tinker_sync import types
from tinker_sync.exceptions import ForkedProcessError
from tinker_sync.local import LocalServer
from tinker_sync.local.backends.base import SampleOptions
from tinker_sync.local.backends.instant import InstantBackend

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD_DEADLINE_S = 40  # signal.alarm in the child
INHERITED_FAIL_FAST_S = 2.0  # all inherited futures must settle within this in the child
MAX_LIVE_CHILDREN = 6
IN_FLIGHT = 200
SEED = int(os.environ.get("TINKER_SYNC_FORK_SEED", "20240611"))


def fork_count() -> int:
    value = os.environ.get("TINKER_SYNC_FORKS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 20


#: Read at import: the suite's autouse fixture clears TINKER_* variables before each test.
FORKS = fork_count()
ORACLE = InstantBackend(seed=0).sampler("base", None)
PARAMS = types.SamplingParams(max_tokens=4, seed=5)


def child_prompt(i: int, which: int) -> list[int]:
    return [200 + which, i % 250, (i // 250) % 250 + 1]


def oracle_tokens(tokens: list[int]) -> list[int]:
    out = ORACLE.sample(np.asarray(tokens, np.int64), SampleOptions(max_tokens=4, seed=5))
    return [int(t) for t in out.sequences[0].tokens]


# ---------------------------------------------------------------------------------------------
# child side


def child_checks(
    index: int,
    parent_pid: int,
    inherited: list[Any],
    sampler: Any,
    training: Any,
    server_url: str,
) -> dict[str, Any]:
    report: dict[str, Any] = {"index": index, "stage": "inherited futures"}
    try:
        _child_checks(report, index, parent_pid, inherited, sampler, training, server_url)
    except BaseException as exc:
        report["error"] = f"{type(exc).__name__} at stage {report['stage']!r}: {exc}"
        raise ChildFailed(report) from exc
    return report


class ChildFailed(Exception):
    def __init__(self, report: dict[str, Any]) -> None:
        super().__init__(report["error"])
        self.report = report


def _child_checks(
    report: dict[str, Any],
    index: int,
    parent_pid: int,
    inherited: list[Any],
    sampler: Any,
    training: Any,
    server_url: str,
) -> None:
    start = time.monotonic()
    forked = finished = 0
    wrong: list[str] = []
    for fut in inherited:
        try:
            fut.result(timeout=INHERITED_FAIL_FAST_S)
            finished += 1
        except ForkedProcessError as exc:
            forked += 1
            if str(parent_pid) not in str(exc):
                wrong.append(f"ForkedProcessError without the parent pid: {exc}")
        except BaseException as exc:
            wrong.append(f"{type(exc).__name__}: {exc}")
    report["inherited"] = {"forked": forked, "finished": finished, "wrong": wrong[:3]}
    report["inherited_s"] = time.monotonic() - start

    report["stage"] = "training refused"
    try:
        fut = training.optim_step(types.AdamParams())
        fut.result(timeout=INHERITED_FAIL_FAST_S)
        report["training"] = "succeeded in the child"
    except ForkedProcessError:
        report["training"] = "forked"
    except BaseException as exc:
        report["training"] = f"{type(exc).__name__}: {exc}"

    report["stage"] = "inherited sampler"
    mine = child_prompt(index, 0)
    got = sampler.sample(types.ModelInput.from_ints(mine), 1, PARAMS).result(timeout=20)
    report["inherited_sampler"] = list(got.sequences[0].tokens) == oracle_tokens(mine)

    report["stage"] = "new client"
    fresh = child_prompt(index, 1)
    with tinker_sync.ServiceClient(base_url=server_url) as service:  # credential from the env
        new_sampler = service.create_sampling_client(base_model="base")
        got = new_sampler.sample(types.ModelInput.from_ints(fresh), 1, PARAMS).result(timeout=20)
        report["new_client"] = list(got.sequences[0].tokens) == oracle_tokens(fresh)
    report["stage"] = "done"


@dataclasses.dataclass
class Child:
    pid: int
    read_fd: int
    #: Where the child's thread stacks go: at its own failure, or on SIGUSR1 from the parent
    #: (``faulthandler.register`` is inherited over fork, so even a child stuck inside an
    #: at-fork hook, before its alarm was armed, can be asked for its stacks).
    stacks: Any


def fork_child(body: Callable[[], dict[str, Any]]) -> Child:
    """Fork; the child runs ``body`` under a hard alarm and writes its report to a pipe."""
    read_fd, write_fd = os.pipe()
    stacks = tempfile.TemporaryFile()
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(read_fd)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(CHILD_DEADLINE_S)
            try:
                report = body()
                code = 0
            except BaseException as exc:
                report = getattr(exc, "report", {"error": f"{type(exc).__name__}: {exc}"})
                faulthandler.dump_traceback(stacks, all_threads=True)
            os.write(write_fd, json.dumps(report).encode()[:60_000])
        finally:
            os._exit(code)
    faulthandler.unregister(signal.SIGUSR1)
    os.close(write_fd)
    return Child(pid, read_fd, stacks)


def _stacks(child: Child) -> str:
    child.stacks.seek(0)
    text = child.stacks.read().decode("utf-8", "replace")
    child.stacks.close()
    return text[-6000:]


def reap(child: Child, timeout: float = HANG) -> dict[str, Any]:
    """Wait for a child with a deadline (dump its stacks, kill it and fail on expiry)."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    pid, read_fd = child.pid, child.read_fd
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGUSR1)
            tick.wait(1.0)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            return {"error": f"child {pid} hung past {timeout}s", "stacks": _stacks(child)}
        tick.wait(0.02)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return {"error": f"child {pid} died by {sig} (SIGALRM: it hung past its deadline)"}
    report: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    if os.WEXITSTATUS(status) != 0 and "error" not in report:
        report["error"] = f"exit status {os.WEXITSTATUS(status)}"
    if "error" in report:
        report["stacks"] = _stacks(child)
    else:
        child.stacks.close()
    return report


# ---------------------------------------------------------------------------------------------
# parent side


class Load:
    """Parent activity during the storm: samples in flight, a training loop, held locks."""

    def __init__(self, sampler: Any, training: Any) -> None:
        self.sampler = sampler
        self.training = training
        self.stop = threading.Event()
        self.samples: list[tuple[list[int], Any]] = []
        self.train_ops: list[tuple[str, Any]] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._guard(self._feed), name="storm-feed", daemon=True),
            threading.Thread(target=self._guard(self._train), name="storm-train", daemon=True),
        ]

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                self.errors.append(exc)

        return run

    def _feed(self) -> None:
        # Bounded in-flight by polling done(); callbacks registered in the parent and held
        # locks are test_a_done_callback_cannot_deadlock_the_forked_child's subject.
        i = 0
        inflight: collections.deque[Any] = collections.deque()
        while not self.stop.is_set():
            while inflight and inflight[0].done():
                inflight.popleft()
            if len(inflight) >= IN_FLIGHT:
                with contextlib.suppress(Exception):
                    inflight[0].result(timeout=0.5)  # errors are checked at the end
                continue
            tokens = [1 + i % 199, 1 + (i // 199) % 199, 9]
            fut = self.sampler.sample(types.ModelInput.from_ints(tokens), 1, PARAMS)
            inflight.append(fut)
            with self._lock:
                self.samples.append((tokens, fut))
            i += 1

    def _train(self) -> None:
        step = 0
        while not self.stop.is_set():
            fwd = self.training.forward_backward([datum(step)], "cross_entropy")
            opt = self.training.optim_step(types.AdamParams(learning_rate=1e-4))
            with self._lock:
                self.train_ops += [("ForwardBackward", fwd), ("OptimStep", opt)]

            opt.result(HANG)
            step += 1

    def pending_futures(self) -> list[Any]:
        with self._lock:
            return [f for _, f in self.samples] + [f for _, f in self.train_ops]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(HANG)


@contextlib.contextmanager
def held_by_another_thread(locks: list[Any]) -> Iterator[None]:
    """Hold ``locks`` in a helper thread for the duration of the block (fork inside it)."""
    held, release = threading.Event(), threading.Event()

    def hold(rest: list[Any] = locks) -> None:
        # nested `with` statements (the SDK locks hand `with` their C lock's own methods,
        # which contextlib.ExitStack, looking them up on the type, does not take)
        if not rest:
            held.set()
            release.wait(HANG)
            return
        with rest[0]:
            hold(rest[1:])

    holder = threading.Thread(target=hold, name="storm-lock-holder", daemon=True)
    holder.start()
    assert held.wait(HANG), "could not take the SDK locks in the parent"
    try:
        yield
    finally:
        release.set()
        holder.join(HANG)


def sdk_locks(sampler: Any) -> list[Any]:
    from tinker_sync._flow import limiter
    from tinker_sync._runtime import executor
    from tinker_sync._transport import _pools

    return [
        sampler._seq_lock,
        _pools._registry_lock,
        limiter._registry_lock,
        executor._pools_lock,
    ]


def test_fork_storm(monkeypatch: pytest.MonkeyPatch) -> None:
    forks = FORKS
    rng = random.Random(SEED)
    child_key = "tml-" + secrets.token_hex(20)
    monkeypatch.setenv("TINKER_API_KEY", child_key)  # the children's own credential
    parent_pid = os.getpid()
    reports: list[dict[str, Any]] = []
    with LocalServer(long_poll_s=1.0, api_key=None, in_subprocess=True) as server:
        service = tinker_sync.ServiceClient(
            base_url=server.url, api_key="tml-" + secrets.token_hex(20)
        )
        try:
            training = service.create_lora_training_client("base", rank=4)
            sampler = service.create_sampling_client(base_model="base")
            # One warm-up round trip first, so the SDK's lazy imports are done: forking while
            # another thread is importing is test_fork_during_a_lazy_import_in_a_worker's case.
            sampler.sample(types.ModelInput.from_ints([1, 2]), 1, PARAMS).result(HANG)
            training.forward_backward([datum(0)], "cross_entropy").result(HANG)
            live: list[Child] = []
            with Load(sampler, training) as load:
                for i in range(forks):
                    threading.Event().wait(rng.uniform(0.0, 0.05))  # a random moment

                    def body(i: int = i) -> dict[str, Any]:
                        return child_checks(i, parent_pid, inherited, sampler, training, server.url)

                    inherited = load.pending_futures()
                    if i % 2:
                        with held_by_another_thread(sdk_locks(sampler)):
                            live.append(fork_child(body))
                    else:
                        live.append(fork_child(body))
                    while len(live) >= MAX_LIVE_CHILDREN:
                        reports.append(reap(live.pop(0)))
                while live:
                    reports.append(reap(live.pop(0)))
            assert not load.errors, load.errors
            parent_samples = list(load.samples)
            train_ops = list(load.train_ops)
            wait_all([f for _, f in parent_samples] + [f for _, f in train_ops], HANG)
            model = server.state()["models"][training.model_id]
        finally:
            service.close()

    failures = [r for r in reports if "error" in r]
    for f in failures[:3]:
        print(f"--- failed child {f.get('index')}: {f['error']}\n{f.get('stacks', '')}")
    assert not failures, (
        f"{len(failures)} of {forks} children failed: {[f['error'] for f in failures]}"
    )
    for r in reports:
        assert r["inherited"]["wrong"] == [], r
        assert r["inherited_s"] < INHERITED_FAIL_FAST_S * 2, r
        assert r["training"] == "forked", r
        assert r["inherited_sampler"] is True, r
        assert r["new_client"] is True, r
    forked_total = sum(r["inherited"]["forked"] for r in reports)
    assert forked_total > 0, "no child saw an inherited pending future (the load was idle?)"

    # the parent lost nothing
    for tokens, fut in parent_samples:
        assert list(fut.result(0).sequences[0].tokens) == oracle_tokens(tokens)
    for _, fut in train_ops:
        assert fut.exception(0) is None
    assert model["applied"] == [[0, "CreateModel"], [1, "ForwardBackward"]] + [
        [k + 2, kind] for k, (kind, _) in enumerate(train_ops)
    ]
    print(
        f"fork storm: {forks} children, {forked_total} inherited futures failed fast, "
        f"{len(parent_samples)} parent samples, {len(train_ops)} training ops"
    )


def test_child_survives_the_secret_registry_lock_held_at_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lock held by another parent thread at fork must not block the child.

    ``tinker_sync._runtime.redact._lock`` guards ``register_secret``, which runs whenever a
    credential is resolved (every ``Secret``), when a JWT is refreshed and on ``copy_weights``
    with a token, so a parent thread can hold it at any moment. It is a plain ``threading.RLock`` with
    no after-fork reset, unlike the SDK's other locks.

    See docs/design/behavior.md#fork-detection.
    """
    from tinker_sync._runtime import redact

    monkeypatch.setenv("TINKER_API_KEY", "tml-" + secrets.token_hex(20))
    with LocalServer(long_poll_s=1.0, api_key=None, in_subprocess=True) as server:

        def body() -> dict[str, Any]:
            signal.alarm(10)
            with tinker_sync.ServiceClient(base_url=server.url) as service:
                sampler = service.create_sampling_client(base_model="base")
                prompt = child_prompt(7, 0)
                got = sampler.sample(types.ModelInput.from_ints(prompt), 1, PARAMS).result(20)
            return {"ok": list(got.sequences[0].tokens) == oracle_tokens(prompt)}

        with held_by_another_thread([redact._lock]):
            child = fork_child(body)
        report = reap(child, timeout=30)
    assert report == {"ok": True}


def test_a_done_callback_cannot_deadlock_the_forked_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inherited futures fail fast in the child, whatever callbacks they carry.

    A done-callback that takes a lock (a semaphore bounding in-flight samples is the usual
    case) must not run inside the child's at-fork hook: that lock may be held by a parent
    thread that does not exist in the child, and ``fork()`` would then never return there.

    See docs/design/behavior.md#inherited-futures-fail-fast.
    """
    monkeypatch.setenv("TINKER_API_KEY", "tml-" + secrets.token_hex(20))
    with LocalServer(long_poll_s=1.0, api_key=None, in_subprocess=True) as server:
        with tinker_sync.ServiceClient(base_url=server.url) as service:
            sampler = service.create_sampling_client(base_model="base")
            sampler.sample(types.ModelInput.from_ints([1, 2]), 1, PARAMS).result(HANG)  # warm
            server.pause("paused_capacity", kind="sampling")
            fut = sampler.sample(types.ModelInput.from_ints([3, 4]), 1, PARAMS)
            user_lock = threading.Lock()

            def callback(_: Any) -> None:
                with user_lock:
                    pass

            fut.add_done_callback(callback)

            def body() -> dict[str, Any]:
                exc = fut.exception(timeout=INHERITED_FAIL_FAST_S)
                return {"forked": isinstance(exc, ForkedProcessError)}

            with held_by_another_thread([user_lock]):
                child = fork_child(body)
            report = reap(child, timeout=20)
            server.resume()
            fut.result(HANG)  # the parent's future is unaffected
    report.pop("stacks", None)
    assert report == {"forked": True}


LAZY_IMPORT_SCRIPT = r"""
import importlib, importlib.abc, importlib.machinery, json, os, signal, sys, threading
import numpy as np
first_in_worker = []
blocked, release = threading.Event(), threading.Event()
report = {}

class Recorder(importlib.abc.MetaPathFinder):
    # Records modules first imported on SDK worker threads; holds the first one inside its
    # module body (module lock taken, global import lock free: where a real import spends its
    # time), so that the fork below happens mid-import.

    def find_spec(self, name, path, target=None):
        if not threading.current_thread().name.startswith("tinker_sync-") or name in sys.modules:
            return None
        first_in_worker.append(name)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or blocked.is_set():
            return spec
        real = spec.loader

        class Holding(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                blocked.set()
                release.wait(30)
                real.exec_module(module)

        spec.loader = Holding()
        return spec

def fork_while_held():
    blocked.wait()
    if not first_in_worker:
        return  # the workload finished without a worker-thread import
    name = first_in_worker[0]
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)
        importlib.import_module(name)
        os._exit(0)
    release.set()
    _, status = os.waitpid(pid, 0)
    report["child"] = "ok" if os.WIFEXITED(status) else "hung importing " + name

import tinker_sync
from tinker_sync import types
from tinker_sync.local import LocalServer
with LocalServer(long_poll_s=1.0, in_subprocess=True) as server:
    sys.meta_path.insert(0, Recorder())
    watcher = threading.Thread(target=fork_while_held)
    watcher.start()
    with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
        sampler = service.create_sampling_client(base_model="base")
        sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1,
                       types.SamplingParams(max_tokens=3)).result(60)
        training = service.create_lora_training_client("base", rank=4)
        tokens = np.arange(5, dtype=np.int64)
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(4, np.float32)},
        )
        training.forward_backward([datum], "cross_entropy").result(60)
        training.optim_step(types.AdamParams()).result(60)
        training.save_state("lazy").result(60)
        service.create_rest_client().list_checkpoints(training.model_id).result(60)
        sampler.compute_logprobs(types.ModelInput.from_ints([1, 2, 3])).result(60)
    blocked.set()
    watcher.join(60)
    report["worker_imports"] = list(first_in_worker)
print(json.dumps(report))
"""


def test_fork_during_a_lazy_import_in_a_worker() -> None:
    """Fork at any moment must not hang the child -- including the moment an SDK worker
    thread is importing a module for the first time (its module lock stays held forever in
    the child). Run in a fresh interpreter, so nothing is imported yet.

    See docs/design/behavior.md#fork-detection.
    """
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", LAZY_IMPORT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "child" not in report, report
    assert report["worker_imports"] == [], report
