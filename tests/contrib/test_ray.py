"""Ray: sampling clients in Ray tasks and actors, and RayExecutor (tinker_sync.contrib.ray).

One local Ray cluster per module (``num_cpus=2``, no dashboard, no usage stats, every node
address on loopback), credentials stripped from the environment it inherits. Each test talks to
a LocalServer that accepts only ``KEY``, so a sample only succeeds when the key reached the
worker the way the test says (``runtime_env`` or the ``pickle_credentials=True`` opt-in).
CI installs Ray through the test extra: there, a missing Ray fails this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync.exceptions import MissingCredentialsError
from tinker_sync.local import LocalServer
from tinker_sync.sampling_client import SEQ_STRIDE, SamplingClient

if os.environ.get("CI"):
    import ray  # CI installs the test extra, which has Ray: never skip there
else:
    ray = pytest.importorskip("ray")

from tinker_sync.contrib.ray import RayExecutor

HANG = 120.0  # bounded, with room for Ray starting workers on a loaded 2-core machine
KEY = "tml-ray-test-key-0123456789abcdef"
BASE = "Qwen/Qwen3-8B"
PROMPT = types.ModelInput.from_ints([1, 2, 3])
PARAMS = types.SamplingParams(max_tokens=3)
WITH_KEY = {"env_vars": {"TINKER_API_KEY": KEY}}
#: No usage reports; no killing of workers when the shared machine's memory runs high for a
#: moment (Ray would retry the task forever and the test would only time out).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0"}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """A 2-CPU local cluster; its processes inherit no Tinker credential from this one."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TINKER_")}
    saved_ray = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
            # this directory holds the task and actor code the workers import
            job_config=ray.job_config.JobConfig(code_search_path=[os.path.dirname(__file__)]),
            runtime_env={"env_vars": {"TINKER_TELEMETRY": "0"}},
        )
        yield
    finally:
        ray.shutdown()
        os.environ.update(saved)
        for name, value in saved_ray.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def srv() -> Iterator[LocalServer]:
    with LocalServer(backend="instant", api_key=KEY, long_poll_s=1.0) as server:
        yield server
    reset_limiters()


@pytest.fixture
def service(srv: LocalServer) -> Iterator[tinker_sync.ServiceClient]:
    with tinker_sync.ServiceClient(base_url=srv.url, api_key=KEY) as client:
        yield client


# ------------------------------------------------------------------------------ worker code


def sample_once(sampler: SamplingClient, n: int = 1) -> dict[str, Any]:
    """Task / executor body: one sample through a client that arrived pickled."""
    try:
        response = sampler.sample(PROMPT, n, PARAMS).result(HANG)
    except MissingCredentialsError as exc:
        return {"pid": os.getpid(), "missing": str(exc)}
    return {
        "pid": os.getpid(),
        "clone": sampler._clone_id,
        "sampler": sampler._sampler_id,
        "sequences": len(response.sequences),
    }


sample_task = ray.remote(sample_once)


@ray.remote
class RolloutActor:
    """Keeps one sampler between calls; the driver swaps it when the weights change."""

    def __init__(self, handle: str) -> None:
        self.sampler = SamplingClient.from_sampler_handle(handle)

    def set_handle(self, handle: str) -> None:
        self.sampler.close()
        self.sampler = SamplingClient.from_sampler_handle(handle)

    def rollout(self, n: int) -> dict[str, Any]:
        return sample_once(self.sampler, n)


@ray.remote
class Gate:
    """Counts arrivals and holds them until opened (synchronisation without sleeps)."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.arrived: list[str] = []
        self.changed = asyncio.Condition()

    async def enter(self, name: str) -> None:
        async with self.changed:
            self.arrived.append(name)
            self.changed.notify_all()
        await self.opened.wait()

    async def wait_arrived(self, count: int) -> list[str]:
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.arrived) >= count)
            return list(self.arrived)

    def open(self) -> None:
        self.opened.set()

    def names(self) -> list[str]:
        return list(self.arrived)


def pass_gate(gate: Any, name: str) -> str:
    ray.get(gate.enter.remote(name), timeout=HANG)
    return name


def fail_with(message: str) -> None:
    raise ValueError(message)


# ------------------------------------------------------------------------------ tasks


def test_ray_tasks_sample_with_pickled_clients_and_keys_from_runtime_env(srv, service):
    """Credential-free pickles: tasks with the key in runtime_env sample; one without cannot."""
    sampler = service.create_sampling_client(base_model=BASE)
    assert KEY.encode() not in ray.cloudpickle.dumps(sampler)  # what Ray ships to workers
    ref = ray.put(sampler)
    keyed = sample_task.options(runtime_env=WITH_KEY)
    results = ray.get([keyed.remote(ref, 2) for _ in range(6)], timeout=HANG)
    missing = ray.get(sample_task.remote(ref), timeout=HANG)

    assert [r["sequences"] for r in results] == [2] * 6
    assert all(r["sampler"] == sampler._sampler_id for r in results)
    assert all(1 <= r["clone"] <= SEQ_STRIDE for r in results)
    seqs = [r.json["seq_id"] for r in srv.requests.filter("asample")]
    assert len(seqs) == 6 and len(set(seqs)) == 6, "no sample sent twice or under one seq_id"
    if os.path.exists(os.path.expanduser("~/.tinker/credentials.json")):
        return  # Ray workers keep this HOME (Ray's own token lives there): they would use it
    assert "pickle_credentials=True" in missing["missing"] and KEY not in missing["missing"]


def test_pickle_credentials_opt_in_carries_the_key_to_ray_workers(srv):
    """``pickle_credentials=True``: a worker with no key in its environment samples."""
    with tinker_sync.ServiceClient(base_url=srv.url, api_key=KEY, pickle_credentials=True) as svc:
        sampler = svc.create_sampling_client(base_model=BASE)
        assert KEY.encode() in ray.cloudpickle.dumps(sampler)
        results = ray.get([sample_task.remote(sampler) for _ in range(3)], timeout=HANG)
    assert [r.get("sequences") for r in results] == [1, 1, 1], results


# ------------------------------------------------------------------------------ actors


def test_actors_sample_and_get_new_weights_as_new_sampler_handles(srv, service):
    """The TrainingClient stays in the driver; each new checkpoint reaches actors as a handle."""
    training = service.create_lora_training_client(BASE, rank=4)
    first = training.save_weights_and_get_sampling_client()
    actors = [RolloutActor.options(runtime_env=WITH_KEY).remote(first.get_sampler_handle())]
    actors.append(RolloutActor.options(runtime_env=WITH_KEY).remote(first.get_sampler_handle()))
    before = ray.get([a.rollout.remote(1) for a in actors], timeout=HANG)

    training.forward_backward(
        [
            types.Datum(
                model_input=types.ModelInput.from_ints([1, 2, 3]),
                loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]},
            )
        ],
        "cross_entropy",
    )
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(HANG)
    second = training.save_weights_and_get_sampling_client()
    ray.get([a.set_handle.remote(second.get_sampler_handle()) for a in actors], timeout=HANG)
    after = ray.get([a.rollout.remote(2) for a in actors], timeout=HANG)
    for actor in actors:
        ray.kill(actor)

    assert second._sampler_id != first._sampler_id
    assert [r["sampler"] for r in before] == [first._sampler_id] * 2
    assert [r["sampler"] for r in after] == [second._sampler_id] * 2
    assert [r["sequences"] for r in after] == [2, 2]
    sent = [r.json["sampling_session_id"] for r in srv.requests.filter("asample")]
    assert sent == [first._sampler_id] * 2 + [second._sampler_id] * 2


# ------------------------------------------------------------------------------ RayExecutor


def test_ray_executor_runs_calls_as_tasks_and_keeps_errors(srv, service):
    sampler = service.create_sampling_client(base_model=BASE)
    with RayExecutor(runtime_env=WITH_KEY) as executor:
        results = list(executor.map(sample_once, [sampler] * 4, [1, 2, 3, 4], timeout=HANG))
        failed = executor.submit(fail_with, "the words of the failure")
        with pytest.raises(ValueError, match="the words of the failure"):
            failed.result(HANG)
    assert [r["sequences"] for r in results] == [1, 2, 3, 4]
    assert isinstance(failed.exception(), ray.exceptions.RayTaskError)
    assert len(srv.requests.filter("asample")) == 4
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(sample_once, sampler)
    with pytest.raises(TypeError, match="callable"):
        RayExecutor().submit("not a function")  # type: ignore[arg-type]


def test_ray_executor_cancel_stops_a_queued_task_and_shutdown_waits():
    """Both CPUs held by gated tasks: a third, queued, is cancelled and never runs."""
    gate = Gate.remote()
    executor = RayExecutor(num_cpus=1)
    held = [executor.submit(pass_gate, gate, name) for name in ("a", "b")]
    assert sorted(ray.get(gate.wait_arrived.remote(2), timeout=HANG)) == ["a", "b"]
    queued = executor.submit(pass_gate, gate, "c")
    assert not queued.running()
    assert queued.cancel() and queued.cancelled()
    gate.open.remote()
    executor.shutdown(wait=True)
    assert all(f.done() for f in held)
    assert sorted(f.result() for f in held) == ["a", "b"]
    # one more task through the same gate proves "c" would have been seen by now if it ran
    assert ray.get(ray.remote(pass_gate).remote(gate, "d"), timeout=HANG) == "d"
    assert sorted(ray.get(gate.names.remote(), timeout=HANG)) == ["a", "b", "d"]
    ray.kill(gate)


def test_ray_executor_shutdown_cancel_futures():
    gate = Gate.remote()
    executor = RayExecutor(num_cpus=1)
    held = [executor.submit(pass_gate, gate, name) for name in ("a", "b")]
    ray.get(gate.wait_arrived.remote(2), timeout=HANG)
    queued = [executor.submit(pass_gate, gate, f"q{i}") for i in range(3)]
    executor.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    # running tasks are cancelled too (Ray interrupts them); none of them hangs
    done, not_done = concurrent.futures.wait(held, timeout=HANG)
    assert not not_done
    gate.open.remote()
    assert sorted(ray.get(gate.names.remote(), timeout=HANG)) == ["a", "b"]
    ray.kill(gate)


def test_pickle_of_a_training_client_is_refused_before_ray_ships_it(service):
    training = service.create_lora_training_client(BASE, rank=4)
    with pytest.raises(TypeError):
        pickle.dumps(training)
