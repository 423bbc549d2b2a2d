"""ServiceClient and the future surface against the real local server
(docs/design/behavior.md#official-names-and-async-aliases,
docs/design/behavior.md#apifuture-is-a-future).

The ``*_async`` aliases must never block the event loop: every request they cause is sent
from an SDK thread (a per-client hook records the sending thread), and a loop heartbeat keeps
ticking while a creation alias is held by a paused server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._futures import APIFuture
from tinker_sync._transport import HookEvent

HANG = 60.0


def datum(n: int = 4, offset: int = 0) -> types.Datum:
    tokens = (np.arange(n + 1, dtype=np.int64) + offset) % 200
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(n, np.float32)},
    )


class ThreadRecorder:
    """A per-client hook remembering which thread sent each request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.senders: list[tuple[str, int]] = []

    def __call__(self, event: HookEvent) -> None:
        if event.kind == "request":
            with self.lock:
                self.senders.append((event["path"], threading.get_ident()))

    def paths_sent_from(self, ident: int) -> list[str]:
        with self.lock:
            return [path for path, t in self.senders if t == ident]


def test_wait_as_completed_callbacks_and_result_timeout(server, service) -> None:
    """Stdlib helpers work on server futures; result(timeout) cancels nothing
    (docs/design/behavior.md#apifuture-is-a-future)."""
    training = service.create_lora_training_client("base", rank=4)
    futs = [training.forward_backward([datum(offset=i)], "cross_entropy") for i in range(5)]
    futs.append(training.optim_step(types.AdamParams()))
    seen: list[Any] = []
    for f in futs:
        f.add_done_callback(lambda f: seen.append(f.result()))
    done, not_done = concurrent.futures.wait(futs, timeout=HANG)
    assert not not_done
    assert len(list(concurrent.futures.as_completed(futs, timeout=HANG))) == len(futs)
    assert len(seen) == len(futs)
    late: list[Any] = []
    futs[0].add_done_callback(late.append)  # already done: runs at once, in this thread
    assert late == [futs[0]]
    assert all(isinstance(f, concurrent.futures.Future) for f in futs)
    assert futs[0].future() is futs[0]
    requests_before = len(server.requests)
    assert futs[0].result() is futs[0].result()  # cached: no new request
    assert len(server.requests) == requests_before

    server.pause("paused_capacity", kind="training")
    held = training.optim_step(types.AdamParams())
    with pytest.raises(concurrent.futures.TimeoutError):
        held.result(timeout=0.2)
    assert not held.done() and not held.cancelled()
    assert held.cancel() is False
    server.resume()
    assert isinstance(held.result(HANG), types.OptimStepResponse)


def test_await_result_async_and_coroutine(server, service) -> None:
    """``await fut``, ``result_async``, ``coroutine()`` on server futures
    (docs/design/behavior.md#apifuture-is-a-future)."""
    training = service.create_lora_training_client("base", rank=4)

    async def main() -> list[Any]:
        a = training.forward_backward([datum()], "cross_entropy")
        b = training.optim_step(types.AdamParams())
        c = training.forward([datum()], "cross_entropy")
        return [
            await a,
            await b.result_async(HANG),
            await asyncio.wait_for(asyncio.create_task(c.coroutine()), HANG),
        ]

    fwd, opt, fwd_only = asyncio.run(main())
    assert isinstance(fwd, types.ForwardBackwardOutput)
    assert isinstance(opt, types.OptimStepResponse)
    assert isinstance(fwd_only, types.ForwardBackwardOutput)


def test_blocking_result_inside_a_loop_warns_once(server, service, caplog) -> None:
    """A blocking result() inside a running loop logs one WARNING and still blocks
    (docs/design/behavior.md#apifuture-is-a-future)."""
    training = service.create_lora_training_client("base", rank=4)

    async def main() -> Any:
        fut = training.optim_step(types.AdamParams())
        first = fut.result(HANG)
        return first, fut.result(HANG)

    with caplog.at_level(logging.WARNING, logger="tinker_sync.futures"):
        first, second = asyncio.run(main())
    assert first is second
    assert sum("running event loop" in r.getMessage() for r in caplog.records) <= 1


def test_every_async_alias_resolves_to_its_official_shape_off_the_loop(server) -> None:
    """Training aliases resolve to the APIFuture ("await twice"), creation aliases
    to clients, value aliases to values; no request is ever sent from the loop's thread.

    See docs/design/behavior.md#official-names-and-async-aliases.
    """
    pytest.importorskip("torch")
    recorder = ThreadRecorder()
    service = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, hooks=[recorder]
    )

    def custom_loss(data: list[types.Datum], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
        total = sum(lp.sum() for lp in logprobs)
        return -total, {"custom:sum": 1.0}

    async def main() -> tuple[int, dict[str, Any]]:
        loop_thread = threading.get_ident()
        out: dict[str, Any] = {}
        training = await service.create_lora_training_client_async("base", rank=4)
        out["create_lora_training_client_async"] = training
        out["get_server_capabilities_async"] = await service.get_server_capabilities_async()
        out["get_info_async"] = await training.get_info_async()
        for name, coro in [
            ("forward_async", training.forward_async([datum()], "cross_entropy")),
            ("forward_backward_async", training.forward_backward_async([datum()], "cross_entropy")),
            (
                "forward_backward_custom_async",
                training.forward_backward_custom_async([datum()], custom_loss),
            ),
            ("optim_step_async", training.optim_step_async(types.AdamParams())),
            ("save_state_async", training.save_state_async("ckpt")),
            ("save_weights_for_sampler_async", training.save_weights_for_sampler_async("sw")),
            ("save_weights_external_async", training.save_weights_external_async("ext")),
        ]:
            fut = await coro
            assert isinstance(fut, APIFuture), name
            out[name] = await fut  # the 0.2x "await twice" pattern
        path = out["save_state_async"].path
        for name, coro in [
            ("load_state_async", training.load_state_async(path)),
            ("load_state_with_optimizer_async", training.load_state_with_optimizer_async(path)),
        ]:
            fut = await coro
            assert isinstance(fut, APIFuture), name
            out[name] = await fut
        out[
            "create_training_client_from_state_async"
        ] = await service.create_training_client_from_state_async(path)
        out[
            "create_training_client_from_state_with_optimizer_async"
        ] = await service.create_training_client_from_state_with_optimizer_async(path)
        out["create_sampling_client_async"] = await service.create_sampling_client_async(
            base_model="base"
        )
        out[
            "tc.save_weights_and_get_sampling_client_async"
        ] = await training.save_weights_and_get_sampling_client_async()
        sampler_path = out["save_weights_for_sampler_async"].path
        out["tc.create_sampling_client_async"] = await training.create_sampling_client_async(
            sampler_path
        )
        return loop_thread, out

    try:
        loop_thread, out = asyncio.run(main())
        sent_from_loop = recorder.paths_sent_from(loop_thread)
    finally:
        service.close()
    assert sent_from_loop == []
    assert len(recorder.senders) > 20
    expected = {
        "create_lora_training_client_async": tinker_sync.TrainingClient,
        "create_training_client_from_state_async": tinker_sync.TrainingClient,
        "create_training_client_from_state_with_optimizer_async": tinker_sync.TrainingClient,
        "create_sampling_client_async": tinker_sync.SamplingClient,
        "tc.save_weights_and_get_sampling_client_async": tinker_sync.SamplingClient,
        "tc.create_sampling_client_async": tinker_sync.SamplingClient,
        "get_server_capabilities_async": types.GetServerCapabilitiesResponse,
        "get_info_async": types.GetInfoResponse,
        "forward_async": types.ForwardBackwardOutput,
        "forward_backward_async": types.ForwardBackwardOutput,
        "forward_backward_custom_async": types.ForwardBackwardOutput,
        "optim_step_async": types.OptimStepResponse,
        "save_state_async": types.SaveWeightsResponse,
        "load_state_async": types.LoadWeightsResponse,
        "load_state_with_optimizer_async": types.LoadWeightsResponse,
        "save_weights_for_sampler_async": types.SaveWeightsForSamplerResponse,
        "save_weights_external_async": types.SaveWeightsExternalResponse,
    }
    assert set(out) == set(expected)
    for name, cls in expected.items():
        assert isinstance(out[name], cls), (name, out[name])
    assert out["forward_backward_custom_async"].metrics["custom:sum"] == 1.0


def test_a_held_creation_alias_leaves_the_loop_running(server, service) -> None:
    """While create_lora_training_client_async waits on a paused server, a loop
    heartbeat keeps ticking; resuming the server completes the alias.

    See docs/design/behavior.md#official-names-and-async-aliases.
    """
    watchdog_fired = threading.Event()

    def watchdog() -> None:
        watchdog_fired.set()
        server.resume()

    timer = threading.Timer(HANG, watchdog)
    timer.start()

    async def main() -> Any:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        beat = asyncio.create_task(heartbeat())
        server.pause("paused_capacity", kind="training")
        task = asyncio.create_task(service.create_lora_training_client_async("base", rank=4))
        await asyncio.to_thread(server.requests.wait_for, "retrieve_future", 1, HANG)
        before = ticks
        # a second paused answer: the alias is still waiting, the loop kept running meanwhile
        await asyncio.to_thread(server.requests.wait_for, "retrieve_future", 2, HANG)
        assert not task.done()
        assert ticks > before
        server.resume()
        training = await asyncio.wait_for(task, HANG)
        beat.cancel()
        return training

    try:
        training = asyncio.run(main())
    finally:
        timer.cancel()
    assert not watchdog_fired.is_set()
    assert isinstance(training, tinker_sync.TrainingClient)


def test_creation_methods_return_clients_with_a_result_noop(server, service) -> None:
    """Creation blocks and returns the client; ``.result()`` returns it at once
    (docs/design/surface.md#running-official-scripts)."""
    training = service.create_lora_training_client("base", rank=4)
    assert training.result() is training
    sampler = service.create_sampling_client(base_model="base")
    assert sampler.result() is sampler
    assert training.model_id.startswith(f"{service._session.session_id}:train:")


def test_argument_errors_are_synchronous_and_send_nothing(server, service) -> None:
    """ValueError/TypeError at call time, before anything is queued
    (docs/design/surface.md#clients)."""
    with pytest.raises(ValueError):
        service.create_lora_training_client(
            "base", train_mlp=False, train_attn=False, train_unembed=False
        )
    with pytest.raises(ValueError):
        service.create_sampling_client()
    with pytest.raises(ValueError):
        service.create_sampling_client(model_path="http://not-tinker")
    assert server.requests.count("create_model") == 0
    assert server.requests.count("create_sampling_session") == 0


def test_unknown_kwargs_warn_and_are_ignored(server) -> None:
    """Unknown constructor kwargs give a FutureWarning naming them
    (docs/design/behavior.md#constructor-knobs)."""
    with pytest.warns(FutureWarning, match="frobnicate"):
        service = tinker_sync.ServiceClient(
            base_url=server.url, api_key=server.api_key, frobnicate=True
        )
    service.close()


def test_console_urls(server, service) -> None:
    """Sessions list before a session exists, then the session's page
    (docs/design/surface.md#service-client)."""
    assert service.get_console_url().endswith("/sessions")
    training = service.create_lora_training_client("base", rank=4)
    assert service.get_console_url().endswith(f"/sessions/{service._session.session_id}")
    assert training.model_id in training.get_console_url()


def test_two_service_clients_get_separate_sessions(server) -> None:
    """Each ServiceClient owns its session and counters
    (docs/design/behavior.md#blocking-creation-and-session-counters)."""
    with (
        tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as a,
        tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as b,
    ):
        ta = a.create_lora_training_client("base", rank=4)
        tb = b.create_lora_training_client("base", rank=4)
        assert ta.model_id.endswith(":train:0") and tb.model_id.endswith(":train:0")
        assert a._session.session_id != b._session.session_id
    assert server.requests.count("create_session") == 2
