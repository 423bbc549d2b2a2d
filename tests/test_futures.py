"""APIFuture is a real concurrent.futures.Future (docs/design/behavior.md#apifuture-is-a-future,
docs/design/behavior.md#never-drop-a-failure, docs/design/behavior.md#training-not-cancellable,
docs/design/behavior.md#inherited-futures-fail-fast)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import pickle
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from tinker_sync._futures import APIFuture, completed, failed
from tinker_sync._runtime.executor import Claimable
from tinker_sync.exceptions import ForkedProcessError

T = TypeVar("T")


def resolve_later(fut: APIFuture[int], value: int, go: threading.Event) -> threading.Thread:
    def run() -> None:
        go.wait(60)
        fut._resolve(value)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_wait_as_completed_and_callbacks_work():
    futs = [APIFuture() for _ in range(5)]
    seen: list[int] = []
    for f in futs:
        f.add_done_callback(lambda f: seen.append(f.result()))
    go = threading.Event()
    threads = [resolve_later(f, i, go) for i, f in enumerate(futs)]
    go.set()
    done, not_done = concurrent.futures.wait(futs, timeout=60)
    assert not not_done
    assert sorted(f.result() for f in concurrent.futures.as_completed(futs, timeout=60)) == list(
        range(5)
    )
    assert sorted(seen) == list(range(5))
    for t in threads:
        t.join()


def test_result_timeout_raises_and_cancels_nothing_then_succeeds():
    fut: APIFuture[str] = APIFuture(cancellable=False)
    with pytest.raises(concurrent.futures.TimeoutError):
        fut.result(timeout=0.01)
    assert not fut.cancelled() and not fut.done()
    fut._resolve("ok")
    assert fut.result(timeout=0) == "ok"
    assert fut.result() == "ok"  # cached


def test_training_style_future_cannot_be_cancelled():
    fut: APIFuture[int] = APIFuture(cancellable=False)
    assert fut.cancel() is False
    assert fut._resolve(3) and fut.result() == 3


def test_cancel_runs_the_hook_and_later_completion_is_ignored():
    hook = threading.Event()
    fut: APIFuture[int] = APIFuture(on_cancel=hook.set)
    assert fut.cancel() is True and hook.is_set()
    assert fut._resolve(1) is False and fut._fail(RuntimeError()) is False
    with pytest.raises(concurrent.futures.CancelledError):
        fut.result()


def test_raising_callback_is_isolated_and_logged(caplog):
    fut: APIFuture[int] = APIFuture()
    after: list[int] = []

    def boom(f):
        raise RuntimeError("callback bug")

    fut.add_done_callback(boom)
    fut.add_done_callback(lambda f: after.append(f.result()))
    with caplog.at_level(logging.ERROR, logger="tinker_sync.futures"):
        fut._resolve(7)
    assert after == [7]
    assert any("callback bug" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_await_and_result_async():
    async def main():
        f1 = completed(1)
        f2: APIFuture[int] = APIFuture()
        loop = asyncio.get_running_loop()
        loop.call_later(0, f2._resolve, 2)
        return (await f1) + (await f2.result_async(timeout=60)) + (await f1.coroutine())

    assert asyncio.run(main()) == 4


def test_result_async_timeout_raises_timeout_error():
    async def main():
        f: APIFuture[int] = APIFuture()
        with pytest.raises(asyncio.TimeoutError):
            await f.result_async(timeout=0.01)
        return f.cancelled()

    assert asyncio.run(main()) is True


def test_blocking_result_inside_event_loop_warns_once(caplog):
    async def main():
        f = completed(5)
        pending: APIFuture[int] = APIFuture()
        threading.Timer(0.05, pending._resolve, args=(6,)).start()
        with caplog.at_level(logging.WARNING, logger="tinker_sync.futures"):
            assert pending.result(timeout=60) == 6
        return f.result()

    assert asyncio.run(main()) == 5
    assert sum("running event loop" in r.getMessage() for r in caplog.records) == 1


def test_futures_do_not_pickle_but_errors_inside_them_do():
    with pytest.raises(TypeError):
        pickle.dumps(completed(1))
    f = failed(ValueError("x"))
    assert isinstance(pickle.loads(pickle.dumps(f.exception())), ValueError)


def test_future_method_and_request_ids():
    f: APIFuture[int] = APIFuture()
    assert f.future() is f and f.request_id is None
    f._add_request_id("a")
    f._add_request_id("b")
    assert f.request_id == "a" and f.request_ids == ("a", "b")
    assert "request_id=a" in repr(f)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pending_future_fails_fast_in_a_forked_child():
    fut: APIFuture[int] = APIFuture(cancellable=False)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            exc = fut.exception(timeout=5)
            ok = isinstance(exc, ForkedProcessError)
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    assert not fut.done()  # the parent's future is untouched
    fut._resolve(1)


# ---------------------------------------------------------------------------------------------
# Inlining: result() runs a queued step nobody has taken yet
# ---------------------------------------------------------------------------------------------


def _offered(fut: APIFuture[str], value: str, ran_in: list[str]) -> Claimable:
    def step() -> None:
        ran_in.append(threading.current_thread().name)
        fut._resolve(value)

    claimable = Claimable(step)
    fut._offer(claimable)  # deliberately queued on no pool: only an inlining waiter can run it
    return claimable


def in_a_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a thread other than the main one (which never inlines) and return its
    result."""
    box: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            box.set_result(fn())
        except BaseException as exc:
            box.set_exception(exc)

    thread = threading.Thread(target=run, name="waiter")
    thread.start()
    thread.join(60)
    return box.result(0)


def test_result_runs_an_unclaimed_step_in_the_waiting_thread():
    fut: APIFuture[str] = APIFuture()
    ran_in: list[str] = []
    step = _offered(fut, "done", ran_in)
    assert in_a_thread(fut.result) == "done"
    assert ran_in == ["waiter"] and step.claimed
    assert step.run() is False and ran_in == ["waiter"]  # runs once


def test_result_in_the_main_thread_never_inlines():
    """The main thread runs signal handlers: a step run there could be cut anywhere by an alarm
    timeout or Ctrl-C, so it only waits (docs/guarantees.md#signals-and-exit)."""
    assert threading.current_thread() is threading.main_thread()
    fut: APIFuture[str] = APIFuture()
    ran_in: list[str] = []
    step = _offered(fut, "done", ran_in)
    worker = threading.Timer(0.1, step.run)  # the pool's stand-in; an inlining result() would
    worker.name = "worker"  # have claimed the step long before
    worker.start()
    assert fut.result() == "done"
    worker.join()
    assert ran_in == ["worker"]


def test_result_with_a_timeout_never_inlines():
    fut: APIFuture[str] = APIFuture()
    ran_in: list[str] = []
    step = _offered(fut, "done", ran_in)
    with pytest.raises(concurrent.futures.TimeoutError):
        fut.result(timeout=0.01)  # a step may block (a long poll): a timeout could not hold
    assert not step.claimed and ran_in == []
    assert step.run() and fut.result(timeout=0) == "done"


def test_no_inlining_once_a_callback_is_registered():
    fut: APIFuture[str] = APIFuture()
    ran_in: list[str] = []
    step = _offered(fut, "done", ran_in)
    fut.add_done_callback(lambda f: None)
    fut._run_inline()  # what result() does first: the waiter may hold a lock the callback needs
    assert not step.claimed and ran_in == []
    worker = threading.Thread(target=step.run, name="worker")
    worker.start()
    assert fut.result() == "done"
    worker.join()
    assert ran_in == ["worker"]


def test_a_step_taken_by_a_worker_is_not_run_again():
    fut: APIFuture[str] = APIFuture()
    ran_in: list[str] = []
    step = _offered(fut, "done", ran_in)
    assert step.run()  # the pool worker won the race
    assert fut.result() == "done" and len(ran_in) == 1


def test_inlined_steps_chain_in_the_waiting_thread():
    fut: APIFuture[str] = APIFuture()
    seen: list[tuple[str, bool]] = []

    def second() -> None:
        seen.append(("second", fut._waited_on_here()))
        fut._resolve("two steps")

    def first() -> None:
        seen.append(("first", fut._waited_on_here()))
        fut._offer(Claimable(second))

    fut._offer(Claimable(first))
    assert in_a_thread(fut.result) == "two steps"
    assert seen == [("first", True), ("second", True)]
    assert not fut._waited_on_here()  # only while result() runs them


def test_result_interrupted_at_any_signal_point_never_leaves_the_future_locked():
    """A signal handler's exception raised inside ``result()`` (an alarm timeout on the main
    thread), at any point where one can land in the waiting code, leaves the future's lock
    free: the SDK thread that completes it later never blocks (docs/limiter.md#signals)."""
    from signal_points import Interrupt, interrupt_at

    codes = {
        threading.Condition.__enter__.__code__,
        threading.Condition.__exit__.__code__,
        concurrent.futures.Future.result.__code__,
    }

    def where(code: object) -> bool:
        return code in codes

    def wait(fut: APIFuture[int]) -> None:
        try:
            fut.result(timeout=0.001)
        except concurrent.futures.TimeoutError:
            pass

    points = interrupt_at(None, lambda: wait(APIFuture()), where)
    assert points >= 3
    for point in range(points):
        fut: APIFuture[int] = APIFuture()
        try:
            interrupt_at(point, lambda: wait(fut), where)  # noqa: B023
        except Interrupt:
            pass
        resolver = threading.Thread(target=fut._resolve, args=(point,), daemon=True)
        resolver.start()
        resolver.join(10.0)
        assert not resolver.is_alive(), f"point {point}: the future's lock was left held"
        assert fut.result(timeout=10.0) == point


@pytest.mark.parametrize("end", ["resolve", "fail", "cancel"])
def test_a_done_future_keeps_its_outcome_not_the_work_behind_it(end: str) -> None:
    """A program that keeps its futures must not keep every job behind them alive (and the
    garbage collector walking them): once done, a future lets go of its cancel hook and of the
    step a waiting thread could have run."""
    import weakref

    class Work:
        def cancel(self) -> None:
            pass

        def step(self) -> bool:
            return True

    work = Work()
    gone = weakref.ref(work)
    fut: APIFuture[int] = APIFuture(on_cancel=work.cancel)
    fut._offer(Claimable(work.step))
    del work
    assert gone() is not None  # the pending future holds it
    if end == "resolve":
        fut._resolve(1)
    elif end == "fail":
        fut._fail(ValueError("no"))
    else:
        assert fut.cancel()
    assert gone() is None  # freed by reference counting alone: nothing else held it
    assert fut.done()
    late = Work()  # a step queued after the end (a cancelled sample's job going on)
    late_gone = weakref.ref(late)
    fut._offer(Claimable(late.step))
    del late
    assert late_gone() is None
