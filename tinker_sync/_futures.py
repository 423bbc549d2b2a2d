"""``APIFuture``: the handle every server-side operation returns.

Usage::

    fut = training_client.forward_backward(data, "cross_entropy")
    out = fut.result()                      # blocks; result(timeout) never cancels server work
    concurrent.futures.wait([fut, fut2])    # a real concurrent.futures.Future
    out = await fut                         # also awaitable
    live = fut.liveness()                   # while pending: attempts, queue state, last answer

Thread safety: safe to share between threads; completion happens on SDK threads, outside every
SDK lock, and callbacks run on the completing thread. Exit: when the interpreter starts to exit,
futures still pending fail with :class:`ClientClosedError`, so threads blocked in ``result()``
return (docs/design/behavior.md#fast-interpreter-exit). Fork safety: a future still pending when
the process forks fails at once in the child with :class:`ForkedProcessError`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tinker_sync._flow.health import Health, PendingFuture, pending_entry, tenant_state
from tinker_sync._runtime.causes import signal_exception
from tinker_sync._runtime.clock import register_exit_callback
from tinker_sync._runtime.fork import SignalSafeCondition, register_after_fork
from tinker_sync.exceptions import ClientClosedError, ForkedProcessError, RequestOutcome

if TYPE_CHECKING:
    from tinker_sync._runtime.executor import Claimable

T = TypeVar("T")
log = logging.getLogger("tinker_sync.futures")

#: The main thread waits in ``result()`` in slices this long: a signal (Ctrl-C) that arrives
#: just before its wait blocks, or is taken by another thread, interrupts no system call, and
#: its handler runs only when the main thread next runs Python code (docs/guarantees.md).
MAIN_WAIT_SLICE_S = 0.25

_pending: weakref.WeakSet[APIFuture[Any]] = weakref.WeakSet()
_pending_lock = threading.Lock()


def _in_running_loop() -> bool:
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class APIFuture(concurrent.futures.Future[T], Generic[T]):
    """A ``concurrent.futures.Future`` for one SDK operation, also awaitable.

    ``request_id`` / ``request_ids`` name the server request(s) once accepted. Training
    futures are not cancellable (``cancel()`` returns False and the request is still sent);
    sampling futures can be cancelled before or while waiting (best effort on the server).

    Thread-safe; in a forked child, futures pending at fork time fail with ForkedProcessError.
    """

    def __init__(
        self,
        *,
        cancellable: bool = True,
        on_cancel: Callable[[], None] | None = None,
        description: str = "",
    ) -> None:
        super().__init__()
        # result() waits on it, maybe on the main thread: its with must not leak the lock when
        # a signal handler raises right after acquiring (docs/limiter.md#signals).
        self._condition = SignalSafeCondition()
        self._request_ids: tuple[str, ...] = ()
        self._on_cancel = on_cancel
        self._description = description
        self._created = time.monotonic()
        self._pid = os.getpid()
        self._warned_loop = False
        self._inline: Claimable | None = None
        self._inline_thread: int | None = None
        self._callbacks_added = False
        if not cancellable:
            # RUNNING futures cannot be cancelled: a skipped training request would leave a seq_id
            # gap that the server waits on (docs/design/behavior.md#training-not-cancellable).
            self.set_running_or_notify_cancel()
        with _pending_lock:
            _pending.add(self)

    # ---------------------------------------------------------------- identity

    @property
    def request_id(self) -> str | None:
        """The server request id (the first chunk's, for chunked operations)."""
        ids = self._request_ids
        return ids[0] if ids else None

    @property
    def request_ids(self) -> tuple[str, ...]:
        """All server request ids of this operation, in seq_id order."""
        return self._request_ids

    def _add_request_id(self, request_id: str) -> None:
        self._request_ids = (*self._request_ids, request_id)

    def _set_request_ids(self, request_ids: tuple[str, ...]) -> None:
        self._request_ids = request_ids

    # ---------------------------------------------------------------- liveness

    def liveness(self) -> PendingFuture | None:
        """What this call last heard from the server while it is pending; None once done.

        Usage::

            live = fut.liveness()
            if live is not None and live.last_answer_age is not None:
                print(live.attempts, live.queue_state, live.last_answer,
                      f"{live.last_answer_age:.0f} s ago", live.tenant.state)

        The same :class:`~tinker_sync.PendingFuture` as this call's entry in
        ``ServiceClient.pending()``: attempts, last status, queue state, the server's last
        answer and its time, and the tenant's health (docs/health.md#liveness).
        """
        if self.done():
            return None
        kind = self._description or "call"
        rid = self.request_id
        age = time.monotonic() - self._created
        owner = getattr(self, "_owner", None)
        health = getattr(getattr(owner, "_session", owner), "health", None)  # REST: the client
        if not isinstance(health, Health):
            return PendingFuture(kind, rid, age, 0, None if rid else "submitting", None)
        ids = self._request_ids
        records = {p.request_id: p for p in health.tracked() if p.request_id in ids}
        found = [records[r] for r in ids if r in records]
        tenant = tenant_state(health.tenant, health.url)
        return pending_entry(kind, rid, age, found, health.clock, tenant, submitting=rid is None)

    def __repr__(self) -> str:
        state = self._state.lower()
        what = f" {self._description}" if self._description else ""
        rid = f" request_id={self.request_id}" if self._request_ids else ""
        return f"<APIFuture{what} {state}{rid}>"

    # ---------------------------------------------------------------- completion (SDK side)

    def _resolve(self, value: T) -> bool:
        """Set the result unless the future is already done (cancelled). Never raises."""
        try:
            self.set_result(value)
        except concurrent.futures.InvalidStateError:
            return False
        return True

    def set_result(self, result: T) -> None:
        super().set_result(result)
        self._let_go()

    def set_exception(self, exception: BaseException | None) -> None:
        super().set_exception(exception)
        self._let_go()

    def _let_go(self) -> None:
        """Done: keep the outcome, not the SDK work that produced it. A program that keeps its
        futures would otherwise keep every job, retry ladder and lock behind them alive, and the
        garbage collector would walk them all again in each full collection."""
        self._on_cancel = None
        self._inline = None

    def _fail(self, exc: BaseException) -> bool:
        """Set the exception unless the future is already done. Never raises."""
        try:
            self.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            return False
        return True

    # ---------------------------------------------------------------- user side

    def cancel(self) -> bool:
        ok = super().cancel()
        if ok and self._on_cancel is not None:
            try:
                self._on_cancel()
            except Exception:
                log.exception("error while cancelling %r", self)
        if ok:
            self._let_go()
        return ok

    def result(self, timeout: float | None = None) -> T:
        """Block until the result is ready; ``TimeoutError`` after ``timeout`` seconds.

        A timeout cancels nothing: call ``result()`` again to keep waiting. Without a timeout,
        SDK work for this future that no SDK thread has started yet may run in the calling
        thread instead (never once a done-callback is registered, and never in the main thread,
        where signal handlers run: an exception such a handler raises, Ctrl-C or an alarm
        timeout, then interrupts only this wait and reaches the caller as itself, while the
        operation goes on; docs/guarantees.md#signals-and-exit).
        """
        if not self._warned_loop and not self.done() and _in_running_loop():
            self._warned_loop = True
            log.warning(
                "APIFuture.result() called inside a running event loop: it blocks the loop; "
                "use `await future` instead"
            )
        if (
            timeout is None
            and self._inline is not None
            and threading.current_thread() is not threading.main_thread()  # runs signal handlers
        ):
            self._run_inline()
        try:
            if timeout is None and threading.current_thread() is threading.main_thread():
                self._wait_in_slices()
            return super().result(timeout)
        except concurrent.futures.TimeoutError as exc:
            if exc is self._exception:
                self._report(exc)
                raise
            if timeout is None or signal_exception(exc) is not None:
                raise  # a signal handler's (an alarm timeout), not this wait's: as it is
            raise TimeoutError(self._timeout_message(timeout)) from None
        except BaseException as exc:
            if exc is self._exception:  # the operation's failure, not the wait's timeout
                self._report(exc)
                raise
            # A signal handler raising inside threading.Condition.wait can make the wait's own
            # cleanup fail (RuntimeError: cannot release un-acquired lock) over the handler's
            # exception: the caller gets the handler's, as it is.
            raised = signal_exception(exc)
            if raised is not None and raised is not exc:
                raise raised  # noqa: B904 (unchanged: it is the caller's own)
            raise

    def _wait_in_slices(self) -> None:
        """Until done, wait at most :data:`MAIN_WAIT_SLICE_S` at a time (main thread only)."""
        condition = self._condition
        with condition:
            while not self.done():
                condition.wait(MAIN_WAIT_SLICE_S)

    def _timeout_message(self, timeout: float | None) -> str:
        what = self._description or "the operation"
        rid = f" (request_id={self.request_id})" if self._request_ids else ""
        age = time.monotonic() - self._created
        return (
            f"{what}{rid} is still pending after result(timeout={float(timeout or 0):g}) "
            f"({age:.1f} s since it started); the request goes on: call result() again to "
            "keep waiting, and see ServiceClient.pending() for its last status"
        )

    # ---------------------------------------------------------------- inlining

    def _offer(self, step: Claimable) -> None:
        """SDK side: ``step`` (queued on a pool) may be run by a thread waiting in result()."""
        self._inline = step
        if self.done():  # completed meanwhile (cancelled): a done future holds no work
            self._inline = None

    def _run_inline(self) -> None:
        """Run this future's queued steps in the waiting thread while no worker has taken them.

        Only for an unbounded ``result()``: a step may block (a long poll), which a timeout
        could not interrupt. Never once a done-callback is registered: callbacks run on the
        completing thread, and the waiting thread may hold a lock such a callback needs.
        """
        self._inline_thread = threading.get_ident()
        try:
            while True:
                step = self._inline
                if step is None or self._callbacks_added or self.done():
                    return
                self._inline = None
                if not step.run():
                    return
        finally:
            self._inline_thread = None

    def _waited_on_here(self) -> bool:
        """SDK side: this thread is running this future's steps from inside ``result()``."""
        return self._inline_thread == threading.get_ident() and not self._callbacks_added

    def _report(self, exc: BaseException) -> None:
        """Report a failure escaping ``result()`` to the owner's telemetry, once
        (docs/design/behavior.md#telemetry)."""
        owner = getattr(self, "_owner", None)
        if owner is not None and isinstance(exc, Exception):
            from tinker_sync._session.telemetry import report_escaped

            report_escaped(exc, owner)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[T]], object]) -> None:
        """Run ``fn(future)`` when done, on the completing thread (or now if already done).

        Exceptions raised by ``fn`` are logged under ``tinker_sync.futures``, never raised.
        """

        self._callbacks_added = True

        def isolated(fut: concurrent.futures.Future[T]) -> None:
            try:
                fn(fut)
            except Exception:
                log.exception("exception in done-callback %r of %r", fn, fut)

        super().add_done_callback(isolated)

    def future(self) -> APIFuture[T]:
        """0.38 compatibility: this object already is a ``concurrent.futures.Future``."""
        return self

    async def result_async(self, timeout: float | None = None) -> T:
        """Await the result; on timeout raise ``TimeoutError`` and request ``cancel()``."""
        import asyncio

        try:
            return await asyncio.wait_for(asyncio.wrap_future(self), timeout)
        except BaseException as exc:
            if exc is self._exception:
                self._report(exc)
            raise

    def coroutine(self) -> Coroutine[Any, Any, T]:
        """A coroutine resolving to the result, for ``asyncio.create_task``."""
        return self.result_async()

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()

    def __reduce__(self) -> Any:
        raise TypeError("APIFuture cannot be pickled; pickle its result instead (future.result())")


class AwaitableConcurrentFuture(APIFuture[T]):
    """``AwaitableConcurrentFuture(future)``: an ``APIFuture`` that follows another future.

    Usage: ``AwaitableConcurrentFuture(executor.submit(fn)).result()`` or ``await`` it. The
    wrapper completes (or fails, or is cancelled) when ``future`` does; cancelling the wrapper
    cancels ``future``. The official SDK's import path is
    ``tinker.lib.public_interfaces.api_future``.

    Thread-safe, like every ``APIFuture``.
    """

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._wrapped = future
        super().__init__(on_cancel=self._cancel_wrapped, description="wrapped future")
        future.add_done_callback(self._follow)

    def _cancel_wrapped(self) -> None:
        self._wrapped.cancel()

    def _follow(self, future: concurrent.futures.Future[T]) -> None:
        if future.cancelled():
            super().cancel()
            return
        exc = future.exception()
        if exc is not None:
            self._fail(exc)
        else:
            self._resolve(future.result())


BackcompatClientFuture = AwaitableConcurrentFuture
"""The official SDK's future-of-a-client wrapper (``BackcompatClientFuture(future)``); tinker_sync's
creation methods return the client itself, so this is only the same wrapper under that name."""


def completed(value: T) -> APIFuture[T]:
    """An already-resolved future."""
    fut: APIFuture[T] = APIFuture()
    fut.set_result(value)
    return fut


def failed(exc: BaseException) -> APIFuture[Any]:
    """An already-failed future."""
    fut: APIFuture[Any] = APIFuture()
    fut.set_exception(exc)
    return fut


def pending_futures() -> list[APIFuture[Any]]:
    """Futures created in this process that are not done yet (for close and tests)."""
    with _pending_lock:
        return [f for f in _pending if not f.done()]


def fail_pending(exc_factory: Callable[[APIFuture[Any]], BaseException], owner: object) -> int:
    """Fail every pending future whose ``_owner`` is ``owner``; return how many."""
    n = 0
    for fut in pending_futures():
        if getattr(fut, "_owner", None) is owner and fut._fail(exc_factory(fut)):
            n += 1
    return n


def _exit_error(fut: APIFuture[Any]) -> ClientClosedError:
    what = fut._description or "an operation"
    rid = f" (request_id={fut.request_id})" if fut._request_ids else ""
    return ClientClosedError(
        f"the interpreter is exiting: {what}{rid} was still pending and cannot complete "
        "(the request may still run on the server); wait for the results you need before "
        "the main thread returns",
        outcome=RequestOutcome.UNKNOWN if fut._request_ids else RequestOutcome.NOT_SENT,
    )


def _fail_pending_at_exit() -> None:
    # Interpreter exit (docs/design/behavior.md#fast-interpreter-exit): the SDK's polls stop,
    # so a thread blocked in result() would wait forever and the interpreter's join of
    # non-daemon threads (a user's ThreadPoolExecutor) with it. Fail what cannot complete.
    for fut in pending_futures():
        if not isinstance(fut, AwaitableConcurrentFuture):  # follows a user's own future
            fut._fail(_exit_error(fut))


register_exit_callback(_fail_pending_at_exit)


def _after_fork_in_child() -> None:
    global _pending_lock
    _pending_lock = threading.Lock()
    parent = os.getppid()
    for fut in list(_pending):
        # A parent thread may have held this future's lock at fork time (completing it, or
        # checking done()): give it a fresh one before anything touches it, done() included.
        fut._condition = SignalSafeCondition()
        fut._waiters = []
        # The parent's callbacks may need locks held by parent threads: never run them here.
        fut._done_callbacks = []  # type: ignore[attr-defined]
        if fut._state not in ("PENDING", "RUNNING"):
            continue
        fut._fail(
            ForkedProcessError(
                f"this future was created in process {fut._pid} (parent {parent}) and cannot "
                "complete in a forked child: wait for it (future.result()) in the parent "
                "before forking, or make the call again in the child"
            )
        )


register_after_fork(_after_fork_in_child)
