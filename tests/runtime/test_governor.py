"""The sampling threads' share of the CPU while the main thread is busy
(docs/scale-out.md#background-share): the arithmetic on a fake clock and a fake main-thread CPU
clock, the environment switch, and the pools it governs against a real server."""

from __future__ import annotations

import gc
import logging
import threading

import pytest

from tinker_sync._runtime import executor
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._runtime.governor import (
    BUSY,
    DEFAULT_SHARE,
    MAX_PAUSE_S,
    PERIOD_S,
    STALE_S,
    Governor,
    governor,
    main_thread_cpu,
    share_from_env,
)

SHARE = 0.2  # ratio 0.25: the workers may use a quarter of the busy main thread's CPU


class MainCpu:
    """The main thread's CPU clock, moved by the test."""

    def __init__(self) -> None:
        self.seconds: float | None = 100.0

    def __call__(self) -> float | None:
        return self.seconds


def make(share: float = SHARE) -> tuple[Governor, FakeClock, MainCpu]:
    clock, main = FakeClock(), MainCpu()
    gov = Governor(share, clock=clock, main_cpu=main, thread_cpu=lambda: 0.0)
    gov.pace()  # the first measurement only takes the baselines
    return gov, clock, main


def period(
    clock: FakeClock, main: MainCpu, gov: Governor, *, main_used: float, ours: float
) -> None:
    """One measurement period: the main thread used ``main_used`` s, the workers ``ours`` s."""
    clock.advance(PERIOD_S * 1.001)  # a little over: float sums of periods are not exact
    assert main.seconds is not None
    main.seconds += main_used
    gov.charge(ours)


def test_workers_pause_until_the_busy_main_thread_is_back_at_the_ratio():
    gov, clock, main = make()
    period(clock, main, gov, main_used=0.005, ours=0.004)
    gov.pace()
    # ratio 0.25: 0.004 s of ours needs 0.016 s of the main thread's; it had 0.005
    assert clock.sleeps_for("background-share") == [pytest.approx(0.011)]
    assert gov.pauses == 1 and gov.paused_s == pytest.approx(0.011)
    # a worker arriving during the pause sleeps until its end, and nothing is measured
    clock_at = clock.monotonic()
    gov._until = clock_at + 0.003  # the pause decided at the next measurement
    gov.pace()
    assert clock.sleeps_for("background-share")[-1] == pytest.approx(0.003)
    assert gov.pauses == 1


def test_an_idle_main_thread_never_slows_the_workers():
    """A main thread blocked in result() uses no CPU: no pause however busy the workers."""
    gov, clock, main = make()
    for _ in range(5):
        period(clock, main, gov, main_used=BUSY * PERIOD_S * 0.9, ours=PERIOD_S * 2)
        gov.pace()
    assert clock.sleeps == [] and gov.pauses == 0


def test_the_main_threads_time_inside_sdk_calls_is_not_its_own_work():
    """A main thread busy submitting samples (or running a step in result()) is not busy with
    its own work: the workers are not paced for it."""
    gov, clock, main = make()
    assert main.seconds is not None
    gov.main_enter(main.seconds)
    gov.main_enter(main.seconds + 0.001)  # nested: result() inside a blocking SDK call
    period(clock, main, gov, main_used=0.009, ours=0.01)
    gov.main_leave(main.seconds)
    gov.pace()  # still inside the outer call: its 0.009 s so far are not the main thread's own
    assert clock.sleeps == [] and gov.pauses == 0
    gov.main_leave(main.seconds)
    period(clock, main, gov, main_used=0.0, ours=0.01)  # the main thread waited
    gov.pace()
    assert clock.sleeps == [] and gov.pauses == 0
    period(clock, main, gov, main_used=0.005, ours=0.004)  # its own work again
    gov.pace()
    assert clock.sleeps_for("background-share") == [pytest.approx(0.011)]


def test_workers_within_the_ratio_do_not_pause():
    gov, clock, main = make()
    for _ in range(5):
        period(clock, main, gov, main_used=0.008, ours=0.002)  # exactly 0.25
        gov.pace()
    assert clock.sleeps == [] and gov.pauses == 0


def test_a_pause_is_capped_and_what_is_left_is_paid_by_the_next_ones():
    gov, clock, main = make()
    period(clock, main, gov, main_used=0.004, ours=0.02)  # 0.019 over: 0.076 s of main's
    gov.pace()
    assert clock.sleeps_for("background-share") == [MAX_PAUSE_S]
    # the pause: the main thread ran alone for its length and paid 0.0125 s of the debt
    assert main.seconds is not None
    main.seconds += MAX_PAUSE_S
    gov.pace()
    assert clock.sleeps_for("background-share") == [MAX_PAUSE_S, pytest.approx(0.026)]


def test_time_under_the_share_is_banked_for_one_period_only():
    gov, clock, main = make()
    for _ in range(10):
        period(clock, main, gov, main_used=PERIOD_S, ours=0.0)  # workers idle: credit
        gov.pace()
    period(clock, main, gov, main_used=0.005, ours=0.005)  # 0.00375 over, 0.0025 banked
    gov.pace()
    assert clock.sleeps_for("background-share") == [pytest.approx(0.005)]


def test_done_charges_the_workers_cpu_since_its_pace():
    clock, main, worker = FakeClock(), MainCpu(), [0.0]
    gov = Governor(SHARE, clock=clock, main_cpu=main, thread_cpu=lambda: worker[0])
    gov.pace()
    done = threading.Event()

    def other_worker() -> None:  # its own baseline: its first pace charges nothing
        gov.pace()
        done.set()

    worker[0] = 0.004  # this worker's job
    threading.Thread(target=other_worker).start()
    assert done.wait(5)
    gov.done()  # charges 0.004
    clock.advance(PERIOD_S * 1.001)
    assert main.seconds is not None
    main.seconds += 0.005
    gov.pace()  # as in the first test, a pause of 0.011 s
    assert clock.sleeps_for("background-share") == [pytest.approx(0.011)]


def test_measured_once_a_period():
    """Calls within a period cost one clock read: the main thread's clock is not read."""
    gov, clock, main = make()
    main.seconds = None  # would make a measurement forget its baselines
    clock.advance(PERIOD_S / 2)
    gov.charge(1.0)
    gov.pace()
    assert gov._start is not None  # not measured
    clock.advance(PERIOD_S)
    gov.pace()
    assert gov._start is None and gov.pauses == 0  # measured: unreadable, stays idle


def test_a_window_after_a_long_idle_stretch_only_takes_baselines():
    """The first job after the workers sat idle for a while (the main thread maybe busy
    meanwhile with no sampling at all) is not paused for what happened before it."""
    gov, clock, main = make()
    clock.advance(STALE_S * 2)
    assert main.seconds is not None
    main.seconds += STALE_S * 2  # busy all along
    gov.charge(0.01)  # the last job of the previous burst, charged late
    gov.pace()
    assert clock.sleeps == [] and gov.pauses == 0
    period(clock, main, gov, main_used=0.005, ours=0.004)  # a fresh window decides as usual
    gov.pace()
    assert clock.sleeps_for("background-share") == [pytest.approx(0.011)]


def test_share_must_be_a_fraction():
    with pytest.raises(ValueError, match="share"):
        Governor(1.0)
    with pytest.raises(ValueError, match="share"):
        Governor(0.0)


def test_the_environment_sets_the_share_or_switches_it_off(caplog: pytest.LogCaptureFixture):
    env = "TINKER_SYNC_BACKGROUND_SHARE"
    assert share_from_env({}) == DEFAULT_SHARE
    assert share_from_env({env: "0.3"}) == 0.3
    assert share_from_env({env: "1"}) is None
    with caplog.at_level(logging.WARNING, logger="tinker_sync.governor"):
        assert share_from_env({env: "lots"}) == DEFAULT_SHARE
        assert share_from_env({env: "0"}) == DEFAULT_SHARE
    assert [r.getMessage().split(" must")[0] for r in caplog.records] == [env, env]


def test_the_main_threads_cpu_clock_moves_with_its_work():
    before = main_thread_cpu()
    if before is None:
        pytest.skip("no per-thread CPU clocks on this platform: there is no governor")
    x = 0
    for i in range(300_000):
        x = (x * 31 + i) % 1_000_003
    after = main_thread_cpu()
    assert after is not None and after > before


def test_sampling_pools_pace_while_the_main_thread_computes(server, service):  # type: ignore[no-untyped-def]
    """Against a real server: 300 samples in flight while this (main) thread runs a
    pure-Python loop. The governor pauses the sampling workers, every sample still completes,
    and the server saw each one once; with the main thread waiting in result() instead, at
    most the first measurement pauses (its window may reach back into the test's own work)."""
    from tinker_sync import types

    gov = governor()
    if gov is None:
        pytest.skip("no per-thread CPU clocks on this platform: there is no governor")
    assert threading.current_thread() is threading.main_thread()
    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    prompt = types.ModelInput.from_ints(list(range(32)))
    params = types.SamplingParams(max_tokens=4)
    for f in [sampler.sample(prompt, 1, params) for _ in range(20)]:
        f.result()  # warm: the pools exist, the connections are open
    assert executor.pool("sample-poll")._governor is gov

    # The main thread waits on three bursts. The window of one measurement may still reach
    # back into its own work before them (at most one pause); no other pause comes. A
    # collection landing on the main thread would be its own CPU too: none may land here.
    gc.disable()
    try:
        idle_pauses = gov.pauses
        for _ in range(3):
            for f in [sampler.sample(prompt, 1, params) for _ in range(300)]:
                f.result()
    finally:
        gc.enable()
    assert gov.pauses - idle_pauses <= 1  # a waiting main thread is never "busy"

    busy_pauses = gov.pauses
    futures = [sampler.sample(prompt, 1, params) for _ in range(300)]
    x, i = 0, 0
    while not all(f.done() for f in futures):
        for i in range(20_000):
            x = (x * 31 + i) % 1_000_003
    assert gov.pauses - busy_pauses >= 1
    results = [f.result() for f in futures]
    assert all(len(r.sequences[0].tokens) == 4 for r in results)
    assert server.requests.count("asample") == 1220  # each sample sent once
