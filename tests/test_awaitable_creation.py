"""Creation results are awaitable, against the real local server.

``await service.create_lora_training_client(...)`` (the official SDK's and the cookbook's way)
gives the client and never blocks the event loop: inside a loop the creation runs on an SDK
thread (a per-client hook records which thread sent each request) and a loop heartbeat keeps
ticking while a paused server holds it. Sync code keeps getting the client itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync._transport import HookEvent
from tinker_sync.exceptions import BadRequestError
from tinker_sync.sampling_client import PendingSamplingClient
from tinker_sync.training_client import PendingTrainingClient

HANG = 60.0
T = TypeVar("T")


def datum(n: int = 4) -> types.Datum:
    tokens = np.arange(n + 1, dtype=np.int64) % 200
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
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


async def awaited(value: Awaitable[T]) -> T:
    return await value


def test_every_creation_method_is_awaitable_in_async_code_and_sends_off_the_loop(server) -> None:
    recorder = ThreadRecorder()
    service = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, hooks=[recorder]
    )

    async def main() -> tuple[int, dict[str, Any]]:
        loop_thread = threading.get_ident()
        out: dict[str, Any] = {}
        training = await service.create_lora_training_client("base", rank=4)
        out["create_lora_training_client"] = training
        state = await training.save_state("ckpt")
        weights = await training.save_weights_for_sampler("sw")
        out["create_training_client_from_state"] = await service.create_training_client_from_state(
            state.path
        )
        out[
            "create_training_client_from_state_with_optimizer"
        ] = await service.create_training_client_from_state_with_optimizer(state.path)
        out["create_sampling_client"] = await service.create_sampling_client(base_model="base")
        out[
            "tc.save_weights_and_get_sampling_client"
        ] = await training.save_weights_and_get_sampling_client()
        out["tc.create_sampling_client"] = await training.create_sampling_client(weights.path)
        return loop_thread, out

    try:
        loop_thread, out = asyncio.run(main())
        sent_from_loop = recorder.paths_sent_from(loop_thread)
    finally:
        service.close()
    assert sent_from_loop == []
    for name, client in out.items():
        expected = "TrainingClient" if "training" in name else "SamplingClient"
        # await gives the created client itself, never the pending stand-in
        assert type(client).__name__ == expected, (name, client)


def test_a_held_creation_returns_at_once_and_leaves_the_loop_running(server, service) -> None:
    """The call itself returns a pending client while the paused server holds the creation."""
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
        pending = service.create_lora_training_client("base", rank=4)
        assert isinstance(pending, PendingTrainingClient)
        assert isinstance(pending, tinker_sync.TrainingClient)
        assert not pending.done()
        await asyncio.to_thread(server.requests.wait_for, "retrieve_future", 1, HANG)
        before = ticks
        await asyncio.to_thread(server.requests.wait_for, "retrieve_future", 2, HANG)
        assert not pending.done()
        assert ticks > before
        server.resume()
        training = await asyncio.wait_for(awaited(pending), HANG)
        beat.cancel()
        return pending, training

    try:
        pending, training = asyncio.run(main())
    finally:
        timer.cancel()
    assert not watchdog_fired.is_set()
    assert type(training) is tinker_sync.TrainingClient
    assert pending.result() is training
    assert pending.model_id == training.model_id
    assert "TrainingClient" in repr(pending)


def test_sync_code_gets_the_client_itself_and_await_gives_it_back(server, service) -> None:
    training = service.create_lora_training_client("base", rank=4)
    sampler = service.create_sampling_client(base_model="base")
    saved = training.save_weights_and_get_sampling_client()
    assert type(training) is tinker_sync.TrainingClient
    assert type(sampler) is tinker_sync.SamplingClient
    assert type(saved) is tinker_sync.SamplingClient
    for client in (training, sampler, saved):
        assert asyncio.run(awaited(client)) is client
        assert asyncio.run(client.result_async()) is client
        assert client.result() is client


def test_a_pending_client_used_directly_waits_for_its_creation(server, service) -> None:
    """Code that skips ``await`` inside a loop still works: reads wait for the creation."""

    async def main() -> tuple[Any, Any]:
        training = service.create_lora_training_client("base", rank=4)
        fwd = training.forward_backward([datum()], "cross_entropy")
        sampler = training.save_weights_and_get_sampling_client()
        assert isinstance(sampler, PendingSamplingClient)
        assert isinstance(sampler, tinker_sync.SamplingClient)
        return fwd, sampler.get_base_model()

    fwd, base_model = asyncio.run(main())
    assert fwd.result(HANG).metrics
    assert base_model == "base"
    assert server.requests.count("forward_backward") == 1


def test_creation_errors_surface_at_await_and_argument_errors_at_the_call(server, service) -> None:
    async def main() -> None:
        pending = service.create_training_client_from_state("tinker://nope/weights/missing")
        with pytest.raises(BadRequestError):
            await pending
        with pytest.raises(BadRequestError):
            pending.result()
        with pytest.raises(ValueError):
            service.create_lora_training_client(
                "base", train_mlp=False, train_attn=False, train_unembed=False
            )
        with pytest.raises(ValueError):
            service.create_sampling_client(model_path="http://not-tinker")
        with pytest.raises(ValueError):
            service.create_training_client_from_state("not-a-tinker-path")

    asyncio.run(main())
    assert server.requests.count("create_model") == 0
    assert server.requests.count("create_sampling_session") == 0


def test_saving_in_async_code_keeps_call_order(server, service) -> None:
    """The save takes its place in the queue at the call, not when the pending client resolves."""

    async def main() -> None:
        training = await service.create_lora_training_client("base", rank=4)
        first = training.forward_backward([datum()], "cross_entropy")
        sampler = training.save_weights_and_get_sampling_client()
        second = training.forward_backward([datum()], "cross_entropy")
        await first
        await sampler
        await second

    asyncio.run(main())
    order = [
        r.endpoint
        for r in server.requests.all()
        if r.endpoint in ("forward_backward", "save_weights_for_sampler")
    ]
    assert order == ["forward_backward", "save_weights_for_sampler", "forward_backward"]
