"""Which public SDK method caused a request (the ``x-sdk-method`` header).

Usage::

    with sdk_method_scope("TrainingClient.forward_backward"):
        ...  # RequestSpecs built here carry the name into pool threads

Thread safety: a context variable; each thread and task has its own value.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from tinker_sync._runtime.governor import main_sdk_done, main_sdk_start

current_sdk_method: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tinker_sync_sdk_method", default=None
)
"""The outermost public SDK method running in this context (``"TrainingClient.forward_backward"``)."""


@contextlib.contextmanager
def sdk_method_scope(name: str) -> Iterator[None]:
    """Mark requests made inside as caused by public method ``name``; the outermost call wins."""
    if current_sdk_method.get() is not None:
        yield
        return
    token = current_sdk_method.set(name)
    entered = main_sdk_start()  # the main thread's CPU in here is not its own work
    try:
        yield
    finally:
        current_sdk_method.reset(token)
        main_sdk_done(entered)


def context_without_sdk_method() -> contextvars.Context:
    """A copy of the current context without the method name (for loops that outlive a call)."""
    ctx = contextvars.copy_context()
    ctx.run(current_sdk_method.set, None)
    return ctx
