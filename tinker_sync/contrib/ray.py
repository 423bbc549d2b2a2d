"""A ``concurrent.futures.Executor`` that runs each submitted call as a Ray task.

Usage::

    import ray
    from tinker_sync.contrib.ray import RayExecutor

    ray.init()
    with RayExecutor(runtime_env={"env_vars": {"TINKER_API_KEY": key}}) as executor:
        rewards = list(executor.map(rollout, [sampler] * 8, prompts))

    # the tinker cookbook's RL loop: each group rollout becomes a Ray task
    set_rollout_executor(RayExecutor(num_cpus=1))

Ray 2.x has actors, tasks, ``ActorPool`` and a ``multiprocessing.Pool`` look-alike, but no
``concurrent.futures.Executor``; code written against executors (``loop.run_in_executor``,
``executor.map``) gets one here. Each ``submit`` is one ``ray.remote`` task with the options
given to the constructor (``num_cpus``, ``runtime_env``, ``max_retries``, ...; see
``ray.remote``). Arguments are serialized by Ray, so a :class:`~tinker_sync.SamplingClient`
travels as its credential-free pickle; the worker finds its key in its environment (use the
``runtime_env`` above) or in the pickle when the ``ServiceClient`` was built with
``pickle_credentials=True``.

Futures behave like a process pool's, with two differences that come from Ray: ``running()``
stays ``False`` until the result is in, and ``cancel()`` succeeds until then and cancels the
Ray task (``ray.cancel``: a queued task never starts, a running one is interrupted). A failed
call raises Ray's ``RayTaskError`` subclass of the original exception: ``except
RateLimitError`` and the exception's attributes work, and its text holds the remote traceback.
``ray.init()`` must have been called (or an address configured) before the first ``submit``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["RayExecutor"]

T = TypeVar("T")


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The Ray task body: one submitted call."""
    return fn(*args, **kwargs)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "RayExecutor needs Ray: pip install 'tinker-sync[ray]' (or pip install ray)"
        ) from exc
    return ray


class RayExecutor(concurrent.futures.Executor):
    """Run each ``submit(fn, *args, **kwargs)`` as one Ray task; see the module docstring.

    :param options: passed to ``ray.remote(...).options(**options)`` for every task, e.g.
        ``num_cpus=1``, ``runtime_env={"env_vars": {...}}``, ``max_retries=0``.
    """

    def __init__(self, **options: Any) -> None:
        ray = _import_ray()
        self._ray = ray
        remote = ray.remote(_call)
        self._remote = remote.options(**options) if options else remote
        self._lock = threading.Lock()
        self._pending: dict[concurrent.futures.Future[Any], Any] = {}  # future -> ObjectRef
        self._shutdown = False

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Start ``fn(*args, **kwargs)`` as a Ray task; returns its future at once."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        out: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            ref = self._remote.remote(fn, args, kwargs)
            self._pending[out] = ref
        ray_future: concurrent.futures.Future[T] = ref.future()
        held = [ref]  # the task's ObjectRef until its result is in (for cancel)

        def settle(done: concurrent.futures.Future[T]) -> None:
            with self._lock:
                self._pending.pop(out, None)
            held.clear()  # the result is in: let Ray free its copy while `out` lives on
            if not out.set_running_or_notify_cancel():
                return  # cancelled by the caller; the task was cancelled in Ray too
            exc = done.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(done.result())

        def forward_cancel(fut: concurrent.futures.Future[T]) -> None:
            if fut.cancelled():
                with self._lock:
                    self._pending.pop(out, None)
                for task in list(held):
                    self._ray.cancel(task)

        out.add_done_callback(forward_cancel)
        ray_future.add_done_callback(settle)
        return out

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new tasks; ``cancel_futures`` cancels the unfinished ones; ``wait`` waits for the rest.

        Ray itself keeps running (``ray.shutdown()`` is the caller's).
        """
        with self._lock:
            self._shutdown = True
            pending = list(self._pending)
        if cancel_futures:
            for fut in pending:
                fut.cancel()
        if wait:
            concurrent.futures.wait(pending)
