"""Bridge blocking SDK calls into asyncio without blocking the event loop (B17).

Usage::

    client = await run_blocking(service.create_lora_training_client, "base-model")

Thread safety: the call runs on the SDK's ``async`` daemon pool. Fork safety: as the pools.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from tinker_sync._executor import pool

T = TypeVar("T")


async def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` on an SDK worker thread and await its result."""
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
