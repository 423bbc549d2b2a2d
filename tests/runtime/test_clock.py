"""Tests for tinker_sync._runtime.clock: FakeClock semantics, SystemClock waits, exit behaviour."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tinker_sync._runtime.clock import (
    EXIT_EVENT,
    SYSTEM_CLOCK,
    Clock,
    FakeClock,
    SystemClock,
    Waitable,
    exiting,
)
from tinker_sync._runtime.fork import make_condition

HANG_GUARD_S = 60.0


def test_fake_sleep_records_and_advances() -> None:
    clock = FakeClock(monotonic=100.0, wall=1_000.0)
    clock.sleep(2.5, reason="backoff")
    clock.sleep(0.0, reason="zero")
    clock.sleep(-1.0)
    assert clock.sleeps == [(2.5, "backoff"), (0.0, "zero"), (-1.0, "")]
    assert clock.monotonic() == pytest.approx(102.5)
    assert clock.time() == pytest.approx(1_002.5)
    assert clock.sleeps_for("backoff") == [2.5]


def test_fake_advance_and_set_wall() -> None:
    clock = FakeClock()
    clock.advance(10)
    assert clock.monotonic() == 10
    assert clock.sleeps == []
    clock.set_wall(5_000.0)
    assert clock.time() == 5_000.0
    clock.advance(1)
    assert clock.time() == 5_001.0
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_fake_on_sleep_hook_sees_each_sleep() -> None:
    seen: list[tuple[float, str]] = []
    clock = FakeClock(on_sleep=lambda s, r: seen.append((s, r)))
    clock.sleep(1.0, "a")
    clock.sleep(2.0, "b")
    assert seen == [(1.0, "a"), (2.0, "b")]


def test_fake_random_is_injectable_and_seeded() -> None:
    assert FakeClock(rng=lambda: 0.25).random() == 0.25
    a = [FakeClock(seed=7).random() for _ in range(3)]
    b = [FakeClock(seed=7).random() for _ in range(3)]
    assert a == b
    assert all(0.0 <= x < 1.0 for x in a)


def test_fake_wait_on_event() -> None:
    clock = FakeClock()
    event = threading.Event()
    assert clock.wait(event, 5.0) is False
    assert clock.monotonic() == 5.0
    event.set()
    assert clock.wait(event, 5.0) is True
    assert clock.monotonic() == 5.0  # a set event costs no virtual time
    assert [w[0] for w in clock.waits] == [5.0, 5.0]


def test_fake_wait_on_condition_advances_unless_notified() -> None:
    clock = FakeClock()
    cond = make_condition()
    with cond:
        assert clock.wait(cond, 3.0) is False
    assert clock.monotonic() == 3.0
    with pytest.raises(RuntimeError):  # must hold the lock, like Condition.wait
        clock.wait(cond, 1.0)


def test_fake_untimed_condition_wait_needs_a_real_notify() -> None:
    clock = FakeClock()
    cond = threading.Condition()
    entered = threading.Barrier(2)
    result: list[bool] = []

    def waiter() -> None:
        with cond:
            entered.wait()
            result.append(clock.wait(cond, None))

    t = threading.Thread(target=waiter)
    t.start()
    entered.wait()
    with cond:  # acquired only once the waiter is inside wait()
        cond.notify()
    t.join(HANG_GUARD_S)
    assert result == [True]
    assert clock.monotonic() == 0.0


def test_fake_clock_is_thread_safe() -> None:
    clock = FakeClock()
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(200):
            clock.sleep(0.5, f"w{i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
    assert len(clock.sleeps) == 1600
    assert clock.monotonic() == pytest.approx(800.0)
    clock.clear()
    assert clock.sleeps == [] and clock.waits == []


def test_both_clocks_satisfy_the_protocol() -> None:
    def use(clock: Clock) -> float:
        return clock.monotonic() + clock.time() + clock.random()

    assert use(FakeClock()) > 0
    assert use(SYSTEM_CLOCK) > 0
    assert isinstance(threading.Event(), Waitable)
    assert isinstance(threading.Condition(), Waitable)


def test_system_clock_basics() -> None:
    clock = SystemClock()
    t0 = clock.monotonic()
    clock.sleep(0)
    clock.sleep(-3)
    assert clock.monotonic() - t0 < 1.0
    assert abs(clock.time() - time.time()) < 5
    event = threading.Event()
    event.set()
    assert clock.wait(event, 30.0) is True
    assert clock.wait(event, None) is True
    assert 0.0 <= clock.random() < 1.0
    assert not exiting()


def test_system_clock_timed_condition_wait_times_out() -> None:
    cond = threading.Condition()
    with cond:
        assert SYSTEM_CLOCK.wait(cond, 0.01) is False


def test_system_clock_long_wait_wakes_on_notify() -> None:
    cond = threading.Condition()
    entered = threading.Barrier(2)
    result: list[bool] = []

    def waiter() -> None:
        with cond:
            entered.wait()
            result.append(SYSTEM_CLOCK.wait(cond, 3600.0))

    t = threading.Thread(target=waiter)
    t.start()
    entered.wait()
    with cond:
        cond.notify()
    t.join(HANG_GUARD_S)
    assert result == [True]


def test_exit_event_is_not_set_during_tests() -> None:
    assert not EXIT_EVENT.is_set()


@pytest.mark.slow
def test_interpreter_exit_interrupts_sleeps_in_pool_threads() -> None:
    """A script whose ThreadPoolExecutor job sleeps/waits an hour still exits promptly
    (docs/design/behavior.md#fast-interpreter-exit)."""
    script = textwrap.dedent(
        """
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from tinker_sync._runtime.clock import SYSTEM_CLOCK, register_exit_callback

        register_exit_callback(lambda: print("exit-callback", flush=True))
        pool = ThreadPoolExecutor(2)
        cond = threading.Condition()
        def waiter():
            with cond:
                SYSTEM_CLOCK.wait(cond, 3600)
        pool.submit(SYSTEM_CLOCK.sleep, 3600, "long")
        pool.submit(waiter)
        print("started", flush=True)
        """
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert "started" in proc.stdout and "exit-callback" in proc.stdout
    assert elapsed < 10.0  # interpreter start-up dominates; without the hook this is 3600 s


def test_daemon_threads_wait_without_waking_for_exit_checks() -> None:
    """SDK workers are daemon threads: a parked waiter must not wake twice a second
    (docs/design/behavior.md#shared-backoff)."""
    import threading as _threading

    from tinker_sync._runtime.clock import SYSTEM_CLOCK

    cond = _threading.Condition()
    wakeups = 0
    original = cond.wait

    def counting_wait(timeout: float | None = None) -> bool:
        nonlocal wakeups
        wakeups += 1
        return original(timeout)

    cond.wait = counting_wait  # type: ignore[method-assign]
    done = _threading.Event()

    def waiter() -> None:
        with cond:
            SYSTEM_CLOCK.wait(cond, 1.6)
        done.set()

    _threading.Thread(target=waiter, daemon=True).start()
    assert done.wait(HANG_GUARD_S)
    assert wakeups == 1  # one full-length wait, not 0.5 s slices
