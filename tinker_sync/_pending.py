"""Client-creation results that are also awaitable.

Usage::

    training = service.create_lora_training_client("base-model")          # sync code: the client
    training = await service.create_lora_training_client("base-model")    # async code: the client

Outside an event loop a creation method blocks and returns the client; ``await client`` then
gives the same client back at once. Called from a thread that runs an event loop, the method
returns at once a *pending* client (an instance of the client's class) while the creation runs
on an SDK thread: ``await`` it to get the real client without blocking the loop. Using the
pending client directly (a method or attribute) first waits for the creation, blocking the
caller like any sync call made from async code; a creation error is raised there, or by
``await``.

Thread safety: a pending client may be shared; every read waits on one future. Fork safety: a
creation still running at fork time fails in the child with ForkedProcessError.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from tinker_sync._futures import APIFuture
from tinker_sync._runtime.executor import pool

C = TypeVar("C")

#: Names a pending client answers itself; everything else is read from the created client.
_OWN = frozenset(
    {
        "_pending_future",
        "result",
        "result_async",
        "done",
        "__await__",
        "__class__",
        "__repr__",
        "__dict__",
    }
)


def in_event_loop() -> bool:
    """True when the calling thread is running an asyncio event loop."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def ready(client: C) -> Generator[Any, None, C]:
    """The ``__await__`` of a created client: gives the client back without suspending."""
    if False:  # pragma: no cover - makes this function a generator
        yield None
    return client


def create(
    pending_cls: Callable[[APIFuture[C]], C],
    description: str,
    owner: object,
    fn: Callable[..., C],
    *args: Any,
) -> C:
    """``fn(*args)`` now outside an event loop; inside one, a pending client of ``fn``'s result.

    ``owner`` is the session whose close fails a creation still running.
    """
    if not in_event_loop():
        return fn(*args)
    fut: APIFuture[C] = APIFuture(cancellable=False, description=description)
    fut._owner = owner  # type: ignore[attr-defined]
    ctx = contextvars.copy_context()

    def job() -> None:
        try:
            value = ctx.run(fn, *args)
        except BaseException as exc:
            fut._fail(exc)
        else:
            fut._resolve(value)

    pool("async").submit(job)
    return pending_cls(fut)


class PendingClient:
    """Mixin: a client whose creation is still running; reads wait for it (see module docs).

    Combined with a client class (``class PendingTrainingClient(PendingClient,
    TrainingClient)``) so ``isinstance`` checks hold before the creation finishes.
    """

    _pending_future: APIFuture[Any]

    def __init__(self, future: APIFuture[Any]) -> None:
        object.__setattr__(self, "_pending_future", future)

    def __getattribute__(self, name: str) -> Any:
        if name in _OWN:
            return object.__getattribute__(self, name)
        future: APIFuture[Any] = object.__getattribute__(self, "_pending_future")
        return getattr(future.result(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        future: APIFuture[Any] = object.__getattribute__(self, "_pending_future")
        setattr(future.result(), name, value)

    def done(self) -> bool:
        """True once the creation has finished (successfully or not)."""
        return self._pending_future.done()

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the creation and return the client (raises the creation's error)."""
        return self._pending_future.result(timeout)

    async def result_async(self, timeout: float | None = None) -> Any:
        """Await the creation without blocking the loop and return the client."""
        return await self._pending_future.result_async(timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        return self._pending_future.result_async().__await__()

    def __repr__(self) -> str:
        future = self._pending_future
        if not future.done():
            state = "pending"
        elif future.exception() is not None:
            state = f"failed: {future.exception()!r}"
        else:
            state = repr(future.result())
        return f"<{type(self).__name__}: {state}>"
