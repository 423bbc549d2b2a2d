"""Bridge blocking SDK calls into asyncio without blocking the event loop, and build every
``*_async`` alias of the clients from its sync method
(``docs/design/behavior.md#official-names-and-async-aliases``).

Usage::

    client = await run_blocking(service.create_lora_training_client, "base-model")

    class RestClient:
        def get_training_run(self, run_id: str) -> APIFuture[TrainingRun]: ...
        get_training_run_async = awaiting_alias(get_training_run)   # -> TrainingRun

The aliases keep the sync method's parameters (so signatures match the official client's) and
call the method by name, so subclasses that override it are honoured. Three shapes, one per kind
of method: :func:`awaiting_alias` awaits the returned ``APIFuture`` (REST calls, ``sample``);
:func:`direct_alias` gives what the method returns at once (training ops: their future, the 0.2x
"await twice" pattern; local getters: their value); :func:`blocking_alias` runs a blocking call
on an SDK thread (creation methods).

Thread safety: the call runs on the SDK's ``async`` daemon pool. Fork safety: as the pools.

This module does not import :mod:`asyncio`: building the aliases needs none of it, and a program
that never awaits (a spawned rollout worker, say) should not pay for importing it. The only code
that uses it runs inside a running event loop, where it is already imported.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from tinker_sync._runtime.executor import pool

__all__ = ["awaiting_alias", "blocking_alias", "direct_alias", "run_blocking"]

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")


async def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` on an SDK worker thread and await its result."""
    import asyncio  # already loaded: this coroutine runs in an event loop (never a new import)

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, fn, *args, **kwargs)

    def settle_ok(value: T) -> None:
        if not fut.done():
            fut.set_result(value)

    def settle_err(exc: BaseException) -> None:
        if not fut.done():
            fut.set_exception(exc)

    def job() -> None:
        try:
            value = call()
        except BaseException as exc:
            try:
                loop.call_soon_threadsafe(settle_err, exc)
            except RuntimeError:  # loop closed
                pass
            return
        try:
            loop.call_soon_threadsafe(settle_ok, value)
        except RuntimeError:
            pass

    pool("async").submit(job)
    return await fut


def _named(alias: Callable[..., Any], method: Callable[..., Any], how: str) -> None:
    name = method.__name__
    alias.__name__ = f"{name}_async"
    alias.__qualname__ = f"{method.__qualname__}_async"
    alias.__doc__ = f"Awaitable :meth:`{name}`: {how}."


def awaiting_alias(
    method: Callable[Concatenate[S, P], Awaitable[T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """``<method>_async`` that awaits the future ``method`` returns and gives its result."""
    name = method.__name__

    @functools.wraps(method)
    async def alias(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        value: T = await getattr(self, name)(*args, **kwargs)
        return value

    _named(alias, method, "the result of the returned future")
    return alias


def direct_alias(
    method: Callable[Concatenate[S, P], T],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """``<method>_async`` that calls ``method`` in the awaiting thread and gives what it returns.

    For methods that return at once: training ops give their future (the 0.2x "await twice"
    pattern), local getters their value.
    """
    name = method.__name__

    @functools.wraps(method)
    async def alias(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        value: T = getattr(self, name)(*args, **kwargs)
        return value

    _named(alias, method, "returns at once (a training op gives its future: await it again)")
    return alias


def blocking_alias(
    method: Callable[Concatenate[S, P], T],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """``<method>_async`` that runs the blocking ``method`` on an SDK thread."""
    name = method.__name__

    @functools.wraps(method)
    async def alias(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        value: T = await run_blocking(getattr(self, name), *args, **kwargs)
        return value

    _named(alias, method, "runs on an SDK thread, so the event loop never blocks")
    return alias
