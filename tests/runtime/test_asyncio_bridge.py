"""The ``*_async`` aliases: built once by ``_runtime.asyncio_bridge`` from their sync methods."""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest

import tinker_sync
from tinker_sync._futures import APIFuture
from tinker_sync._runtime.asyncio_bridge import awaiting_alias, blocking_alias, direct_alias

CLIENTS = [
    tinker_sync.ServiceClient,
    tinker_sync.TrainingClient,
    tinker_sync.SamplingClient,
    tinker_sync.RestClient,
]


def _aliases() -> list[tuple[type, str]]:
    return [
        (cls, name)
        for cls in CLIENTS
        for name in dir(cls)
        if name.endswith("_async") and not name.startswith("_") and name != "result_async"
    ]


def test_every_client_has_aliases() -> None:
    assert len(_aliases()) >= 40


@pytest.mark.parametrize(("cls", "name"), _aliases(), ids=lambda v: getattr(v, "__name__", v))
def test_each_alias_is_a_coroutine_function_with_its_sync_twins_parameters(
    cls: type, name: str
) -> None:
    alias = getattr(cls, name)
    sync = getattr(cls, name[: -len("_async")])
    assert inspect.iscoroutinefunction(alias), name
    assert inspect.signature(alias).parameters == inspect.signature(sync).parameters
    assert alias.__name__ == name


class _Thing:
    def __init__(self) -> None:
        self.threads: list[int] = []

    def submit(self, x: int, *, scale: int = 1) -> APIFuture[int]:
        fut: APIFuture[int] = APIFuture()
        fut.set_result(x * scale)
        return fut

    def blocking(self, x: int) -> int:
        self.threads.append(threading.get_ident())
        return x + 1

    submit_async = direct_alias(submit)
    result_of_async = awaiting_alias(submit)
    blocking_async = blocking_alias(blocking)


class _Override(_Thing):
    def blocking(self, x: int) -> int:
        return -x


def test_the_three_shapes() -> None:
    async def main() -> tuple[APIFuture[int], int, int, int]:
        thing = _Thing()
        fut = await thing.submit_async(2, scale=3)
        value = await thing.result_of_async(2, scale=3)
        blocked = await thing.blocking_async(1)
        assert thing.threads and thing.threads[0] != threading.get_ident()  # off the loop
        overridden = await _Override().blocking_async(5)  # called by name: overrides count
        return fut, value, blocked, overridden

    fut, value, blocked, overridden = asyncio.run(main())
    assert isinstance(fut, APIFuture) and fut.result() == 6
    assert (value, blocked, overridden) == (6, 2, -5)
