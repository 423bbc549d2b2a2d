"""Tests for tinker_sync._runtime.fork: the lock factory, at-fork resets, ForkGuard."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from tinker_sync._runtime import fork
from tinker_sync._runtime.fork import (
    ForkGuard,
    ForkSafeCondition,
    current_pid,
    fork_generation,
    make_condition,
    make_lock,
    register_after_fork,
)

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
HANG_GUARD_S = 60.0


def _run_in_child(body) -> int:
    """Fork; run ``body()`` in the child (its int return is the exit code); return it."""
    pid = os.fork()
    if pid == 0:  # child
        code = 99
        try:
            code = int(body())
        except BaseException:
            code = 98
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_lock_behaves_like_a_lock() -> None:
    lock = make_lock()
    assert not lock.locked()
    with lock:
        assert lock.locked()
        assert not lock.acquire(blocking=False)
    assert lock.acquire(timeout=1)
    lock.release()
    assert "Lock" in repr(lock)


def test_condition_is_a_threading_condition_and_notifies() -> None:
    cond = make_condition()
    assert isinstance(cond, threading.Condition)
    ready = threading.Barrier(2)
    state = {"flag": False}

    def waiter() -> None:
        with cond:
            ready.wait()
            assert cond.wait_for(lambda: state["flag"], timeout=HANG_GUARD_S)

    t = threading.Thread(target=waiter)
    t.start()
    ready.wait()
    with cond:  # the waiter released the lock inside wait_for
        state["flag"] = True
        cond.notify_all()
    t.join(HANG_GUARD_S)
    assert not t.is_alive()


def test_condition_over_plain_lock() -> None:
    lock = make_lock()
    cond = make_condition(lock)
    with cond:
        assert lock.locked()
        assert not cond.wait(0)
    assert not lock.locked()


def test_condition_rejects_foreign_lock() -> None:
    with pytest.raises(TypeError):
        make_condition(threading.Lock())  # type: ignore[arg-type]


def test_forkguard_in_same_process() -> None:
    guard = ForkGuard()
    assert guard.pid == current_pid() == os.getpid()
    assert not guard.changed()
    assert not guard.check()


@needs_fork
def test_lock_held_by_other_thread_is_free_in_child() -> None:
    lock = make_lock()
    other = make_lock()
    holding = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with lock, other:
            holding.set()
            release.wait(HANG_GUARD_S)

    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(HANG_GUARD_S)
    try:

        def child() -> int:
            if not lock.acquire(timeout=5):
                return 1
            lock.release()
            if not other.acquire(timeout=5):
                return 2
            other.release()
            return 0

        assert _run_in_child(child) == 0
        assert lock.locked()  # still held in the parent
    finally:
        release.set()
        t.join(HANG_GUARD_S)


@needs_fork
def test_condition_forgets_parent_waiters_in_child() -> None:
    cond = make_condition()
    waiting = threading.Event()
    stop = {"flag": False}

    def parent_waiter() -> None:
        with cond:
            waiting.set()
            cond.wait_for(lambda: stop["flag"], timeout=HANG_GUARD_S)

    t = threading.Thread(target=parent_waiter)
    t.start()
    assert waiting.wait(HANG_GUARD_S)
    with cond:  # the waiter is inside wait(): it is registered in the waiter list
        pass
    try:

        def child() -> int:
            # A ghost waiter of the parent would swallow notify(1); the child's waiter must wake.
            woke = threading.Event()
            entered = threading.Barrier(2)

            def child_waiter() -> None:
                with cond:
                    entered.wait()
                    if cond.wait(timeout=10):  # True only when notified
                        woke.set()

            ct = threading.Thread(target=child_waiter)
            ct.start()
            entered.wait()
            with cond:  # acquired once the waiter is inside wait()
                cond.notify(1)
            ct.join(15)
            return 0 if woke.is_set() else 1

        assert _run_in_child(child) == 0
    finally:
        with cond:
            stop["flag"] = True
            cond.notify_all()
        t.join(HANG_GUARD_S)


@needs_fork
def test_after_fork_callbacks_run_in_order_and_errors_are_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    def first() -> None:
        calls.append("first")

    def broken() -> None:
        raise RuntimeError("boom")

    def last() -> None:
        calls.append("last")

    register_after_fork(first)
    register_after_fork(broken)
    register_after_fork(last)
    try:
        gen = fork_generation()
        guard = ForkGuard()

        def child() -> int:
            if calls[-2:] != ["first", "last"]:
                return 1
            if fork_generation() != gen + 1:
                return 2
            if not guard.check() or guard.check():  # True exactly once
                return 3
            return 0

        assert _run_in_child(child) == 0
        assert calls == []  # the parent ran none of them
    finally:
        with fork._registry_lock:
            for cb in (first, broken, last):
                fork._callbacks.remove(cb)


@needs_fork
def test_weak_after_fork_callback_is_dropped_with_its_object() -> None:
    class Owner:
        def __init__(self) -> None:
            self.hits = 0

        def on_fork(self) -> None:
            self.hits += 1

    alive = Owner()
    dead = Owner()
    register_after_fork(alive.on_fork, weak=True)
    register_after_fork(dead.on_fork, weak=True)
    del dead
    gc.collect()

    def child() -> int:
        return 0 if alive.hits == 1 else 1

    assert _run_in_child(child) == 0
    assert alive.hits == 0


def test_condition_class_exported() -> None:
    assert isinstance(make_condition(), ForkSafeCondition)
