"""Daemon pools, bounded lanes and the delay timer (docs/design/behavior.md#thread-inventory,
docs/design/behavior.md#fast-interpreter-exit)."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import pytest
from waiting import until  # tests/waiting.py

from tinker_sync._runtime import executor
from tinker_sync._runtime.clock import FakeClock, SystemClock
from tinker_sync._runtime.executor import (
    BoundedLane,
    DaemonPool,
    call_later,
    configure_threads,
    pool,
)

HANG = 60.0


@pytest.fixture
def fresh_sizes() -> Iterator[None]:
    saved = dict(executor._sizes)
    yield
    executor._sizes.clear()
    executor._sizes.update(saved)


def test_a_widened_pool_starts_workers_for_queued_jobs_and_takes_the_largest_width():
    """``widen`` lets the pool grow past ``max_workers`` to the largest width asked for,
    starting workers for jobs already queued; withdrawing returns to ``max_workers``
    (docs/limiter.md#send-width)."""
    p = DaemonPool("test-widen", 2)
    gate = threading.Event()
    started = threading.Semaphore(0)

    def blocker() -> None:
        started.release()
        gate.wait(HANG)

    try:
        for _ in range(6):
            p.submit(blocker)
        for _ in range(2):
            assert started.acquire(timeout=HANG)
        assert p.threads == 2 and p.width == 2  # four jobs queued behind two workers
        p.widen("a", 5)
        p.widen("b", 4)
        assert p.width == 5 and p.threads == 5  # three started at once for the queued jobs
        for _ in range(3):
            assert started.acquire(timeout=HANG)
        p.widen("a", 0)
        assert p.width == 4
        p.widen("b", 1)  # at or below max_workers: withdrawn
        assert p.width == 2 and p.peak_threads == 5
    finally:
        gate.set()


def test_pool_grows_lazily_to_its_cap_and_queues_fifo():
    """Workers start on demand up to max_workers; overflow runs in FIFO order
    (docs/design/behavior.md#thread-inventory)."""
    p = DaemonPool("test-fifo", 3)
    assert p.threads == 0
    gate = threading.Event()
    started = threading.Barrier(4)
    order: list[int] = []
    done = threading.Event()

    def blocker() -> None:
        started.wait(HANG)
        gate.wait(HANG)

    def record(i: int) -> None:
        order.append(i)
        if i == 9:
            done.set()

    for _ in range(3):
        p.submit(blocker)
    started.wait(HANG)  # all three workers are busy
    for i in range(10):
        p.submit(record, i)
    assert p.threads == 3 and p.peak_threads == 3
    names = {t.name for t in threading.enumerate() if t.name.startswith("tinker_sync-test-fifo-")}
    assert len(names) == 3
    assert all(t.daemon for t in threading.enumerate() if t.name in names)
    gate.set()
    assert done.wait(HANG)
    assert sorted(order) == list(range(10))
    serial = DaemonPool("test-serial", 1)
    serial_order: list[int] = []
    last = threading.Event()
    for i in range(50):
        serial.submit(serial_order.append, i)
    serial.submit(last.set)
    assert last.wait(HANG)
    assert serial_order == list(range(50))  # overflow runs in FIFO order


def test_the_most_recently_idle_worker_takes_the_next_job():
    """Idle workers are woken last in, first out: the one idle the shortest time (its stack and
    data likeliest still in the CPU's caches) takes the next job, and the one idle longest
    stays idle, to exit after 30 s once the load is gone."""
    p = DaemonPool("test-lifo", 3)
    p.retire_idle(False)  # an earlier test may have closed the process's last client
    started = threading.Barrier(4)
    gates = [threading.Event() for _ in range(3)]
    worker_of: dict[int, str] = {}

    def blocker(i: int) -> None:
        worker_of[i] = threading.current_thread().name
        started.wait(HANG)
        gates[i].wait(HANG)

    for i in range(3):
        p.submit(blocker, i)
    started.wait(HANG)  # three workers, each in its own job
    for i, gate in enumerate(gates):  # they go idle one after the other: 0, 1, then 2
        gate.set()
        until(lambda i=i: p._idle == i + 1)
    took: list[str] = []
    ran = threading.Event()

    def record() -> None:
        took.append(threading.current_thread().name)
        ran.set()

    p.submit(record)
    assert ran.wait(HANG)
    assert took == [worker_of[2]]  # not worker_of[0], idle the longest
    assert p.threads == 3  # none was started for it


def test_a_failing_job_does_not_kill_its_worker(caplog):
    p = DaemonPool("test-errors", 1)
    p.retire_idle(False)  # an earlier test may have closed the process's last client
    ran = threading.Event()
    workers: list[threading.Thread] = []

    def boom() -> None:
        workers.append(threading.current_thread())
        raise RuntimeError("job error")

    def after() -> None:
        workers.append(threading.current_thread())
        ran.set()

    p.submit(boom)
    p.submit(after)
    assert ran.wait(HANG)
    assert workers[0] is workers[1]  # the same worker ran the job after the failing one
    assert p.threads == 1
    assert "unhandled error in test-errors job" in caplog.text


def test_bounded_lane_runs_at_most_limit_jobs_at_once():
    """A burst of 200 fetches uses at most ``limit`` threads of the shared pool
    (docs/design/behavior.md#session-futures-poller, docs/design/behavior.md#thread-inventory)."""
    lane = BoundedLane("test-lane", 4)
    lock = threading.Lock()
    running = 0
    peak = 0
    finished = threading.Semaphore(0)
    release = threading.Event()
    four_running = threading.Barrier(5)

    def job(i: int) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        if i < 4:
            four_running.wait(HANG)  # the first four run together...
        release.wait(HANG)  # ...and hold their threads until released
        with lock:
            running -= 1
        finished.release()

    for i in range(200):
        lane.submit(job, i)
    four_running.wait(HANG)
    assert lane.active == 4 and pool("test-lane").threads == 4
    release.set()
    for _ in range(200):
        assert finished.acquire(timeout=HANG)
    assert peak == 4
    assert pool("test-lane").peak_threads == 4
    until_zero = time.monotonic() + HANG
    while lane.active and time.monotonic() < until_zero:
        threading.Event().wait(0.001)
    assert lane.active == 0


def test_a_lane_submit_interrupted_at_any_signal_point_never_wedges_the_lane(fresh_sizes):
    """A main-thread submit cut short by a signal handler's exception (at any point where one can
    land) may lose its own job, but never leaves the lane counting a drain that does not run,
    nor the pool counting a thread that never started: the next job always runs, on a pool
    that has to start a thread and on one with threads already (docs/limiter.md#signals)."""
    from signal_points import interrupt_at

    ran: list[str] = []
    done = threading.Condition()

    def job(name: str) -> None:
        with done:
            ran.append(name)
            done.notify_all()

    def wait_for(name: str) -> None:
        with done:
            assert done.wait_for(lambda: name in ran, HANG), name

    def where(code: object) -> bool:
        return getattr(code, "co_filename", None) == executor.__file__

    def fresh_lane(name: str) -> BoundedLane:
        # A one-thread pool of its own with no thread yet (submit starts it), whose worker
        # exits as soon as it is empty, so none outlives the test.
        executor._sizes[name] = 1
        pool(name).retire_idle()
        return BoundedLane(name, 1)

    points = interrupt_at(None, lambda: fresh_lane("test-lane-x").submit(job, "count"), where)
    assert points > 5
    for point in range(points):
        for lane in (fresh_lane(f"test-lane-{point}"), BoundedLane("test-lane", 1)):
            interrupt_at(point, lambda: lane.submit(job, f"cut{point}"), where)  # noqa: B023
            lane.submit(job, f"next{point}{lane.role}")
            wait_for(f"next{point}{lane.role}")


def test_a_timer_call_interrupted_at_any_signal_point_never_leaves_the_timer_without_a_thread():
    """A main-thread call_later cut short by a signal handler's exception (at any point where
    one can land in the executor's code) may lose its own job, but the next call's job always
    runs: the timer never counts a thread that never started (docs/limiter.md#signals)."""
    from signal_points import interrupt_at

    ran: list[str] = []
    done = threading.Condition()

    def job(name: str) -> None:
        with done:
            ran.append(name)
            done.notify_all()

    def where(code: object) -> bool:
        return getattr(code, "co_filename", None) == executor.__file__

    clock = SystemClock()
    points = interrupt_at(
        None, lambda: executor._Timer(clock).call_later(0, "test-timer", job, "count"), where
    )
    assert points > 5
    for point in range(points):
        timer = executor._Timer(clock)
        interrupt_at(point, lambda: timer.call_later(0, "test-timer", job, f"cut{point}"), where)  # noqa: B023
        timer.call_later(0, "test-timer", job, f"next{point}")
        with done:
            assert done.wait_for(lambda: f"next{point}" in ran, HANG), point  # noqa: B023


def test_a_lane_that_empties_and_refills_never_grows_its_pool_past_its_limit():
    """Drains that find the queue empty free their worker before their slot: a drain started
    by the next submission takes that worker, so the pool's threads stay within the lane's
    limit however submissions and drain exits interleave (16 submitting threads)."""
    role = "test-lane-refill"
    lane = BoundedLane(role, 3)
    done = threading.Semaphore(0)
    start = threading.Barrier(16)

    def submitter() -> None:
        start.wait(HANG)
        for _ in range(300):
            lane.submit(done.release)  # tiny jobs: drains empty and restart all the time

    threads = [threading.Thread(target=submitter) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    for _ in range(16 * 300):
        assert done.acquire(timeout=HANG)
    assert pool(role).peak_threads <= 3


def test_a_fair_lane_taking_turns_reuses_its_worker():
    """A fair lane's drain queues itself again after each job; the worker that ran the job
    takes it, so a one-slot lane runs 50 jobs on one thread (no thread per turn)."""
    role = "test-lane-fair-turns"
    lane = BoundedLane(role, 1, fair=True)
    done = threading.Semaphore(0)
    for _ in range(50):
        lane.submit(done.release)
    for _ in range(50):
        assert done.acquire(timeout=HANG)
    assert pool(role).peak_threads == 1


def test_a_follow_up_runs_on_the_same_thread_after_the_job_and_lends_the_worker():
    """``then_here``: the follow-up runs on the worker that ran the job, once the job has
    returned (a sample's poll after its send, no hand-off). Meanwhile the worker is lent: its
    pool starts a worker for its next job instead of making it wait for the follow-up, and the
    follow-up holds a slot of the other pool (docs/polling.md#which-thread-polls)."""
    source, target = DaemonPool("test-then-src", 1), pool("test-then-dst")
    source.retire_idle(False)
    gate, lent = threading.Event(), threading.Event()
    ran: list[tuple[str, int]] = []
    agreed: list[bool] = []
    done = threading.Semaphore(0)

    def follow_up() -> None:
        ran.append(("follow-up", threading.get_ident()))
        lent.set()
        gate.wait(HANG)
        done.release()

    def job() -> None:
        ran.append(("job", threading.get_ident()))
        agreed.append(source.then_here(follow_up, "test-then-dst"))
        agreed.append(source.then_here(follow_up, "test-then-dst"))  # one follow-up a job
        ran.append(("job returns", threading.get_ident()))

    def next_job() -> None:
        ran.append(("next job", threading.get_ident()))
        done.release()

    try:
        before = target.threads
        source.submit(job)
        assert lent.wait(HANG)
        assert agreed == [True, False]
        assert [what for what, _ in ran] == ["job", "job returns", "follow-up"]
        assert len({ident for _, ident in ran}) == 1  # one thread, no hand-off
        assert target._borrowed == 1 and target.threads == before  # a slot, not a thread
        source.submit(next_job)  # a pool of one: the lent worker's place is taken
        assert done.acquire(timeout=HANG)
        assert ran[-1][0] == "next job" and ran[-1][1] != ran[0][1]
        assert source.threads == 2 and source._lent == 1
        assert not source.then_here(follow_up, "test-then-dst")  # not on one of its workers
    finally:
        gate.set()
    assert done.acquire(timeout=HANG)
    deadline = time.monotonic() + HANG
    while source._lent or target._borrowed:  # given back just after the follow-up returned
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_no_follow_up_beyond_the_lent_bound_or_the_other_pools_slots(fresh_sizes):
    """At most ``max_workers`` workers of a pool are lent at once, and a follow-up needs a free
    slot of the pool it counts in: otherwise ``then_here`` says no and the caller queues it."""
    executor._sizes["test-then-one"] = 1  # the pool it counts in has one slot
    source = DaemonPool("test-then-bound", 2)
    gate = threading.Event()
    answers: list[bool] = []
    asked = threading.Semaphore(0)

    def job(role: str) -> None:
        answers.append(source.then_here(lambda: gate.wait(HANG), role))
        asked.release()

    try:
        for _ in range(2):
            source.submit(job, "test-then-one")
            assert asked.acquire(timeout=HANG)
        assert answers == [True, False]  # the first follow-up took the one slot
        answers.clear()
        for _ in range(3):
            source.submit(job, "test-then-many")
            assert asked.acquire(timeout=HANG)
        assert answers == [True, False, False] and source._lent == 2  # two lent of two
    finally:
        gate.set()


@pytest.mark.parametrize("fair", [False, True])
def test_a_lane_job_that_took_on_a_follow_up_leaves_the_lanes_next_job_to_the_pool(fair):
    """A send step that took on its sample's poll (``then_here``) returns, and the poll runs
    next on that thread: the lane's next job (queued meanwhile) goes back to the pool instead
    of keeping the poll waiting behind it (docs/polling.md#which-thread-polls)."""
    role = f"test-then-lane-{int(fair)}"
    lane = BoundedLane(role, limit=1, fair=fair)
    polled = threading.Event()
    where: dict[str, int] = {}
    finished = threading.Semaphore(0)

    def poll() -> None:
        where["poll"] = threading.get_ident()
        polled.set()
        finished.release()

    def next_send() -> None:
        where["next send"] = threading.get_ident()
        where["poll ran first"] = polled.wait(5.0)  # same thread: waits for a poll behind it
        finished.release()

    def send() -> None:
        where["send"] = threading.get_ident()
        assert pool(role).then_here(poll, "test-then-lane-polls")
        lane.submit(next_send)  # queued on the lane while this step runs

    lane.submit(send)
    assert finished.acquire(timeout=HANG) and finished.acquire(timeout=HANG)
    assert where["poll"] == where["send"]  # no hand-off between the send and its poll
    assert where["poll ran first"]  # and the lane's next job did not keep it waiting


def _assert_kept_by_nobody_once_run(role: str, hand_on: Callable[..., None]) -> None:
    """``hand_on(job, payload)`` runs ``job(payload)`` on ``pool(role)``; once it ran, nothing
    may keep ``payload`` alive (a job's closure may hold a client and its credential)."""
    pool(role).retire_idle(False)  # the worker stays, idle
    ran = threading.Event()

    class Payload:
        pass

    def job(payload: Payload) -> None:
        ran.set()

    payload = Payload()
    alive = weakref.ref(payload)
    hand_on(job, payload)
    del payload
    assert ran.wait(HANG)
    until(lambda: gc.collect() >= 0 and alive() is None, timeout=10.0)  # idle threads wait 30 s


def test_an_idle_worker_keeps_nothing_of_its_last_job_alive():
    """A worker waiting for its next job holds no reference to its last one's function or
    arguments."""
    role = "test-idle-refs"
    _assert_kept_by_nobody_once_run(role, pool(role).submit)
    assert pool(role).threads == 1  # still there, idle


def test_a_waiting_timer_keeps_nothing_of_the_jobs_it_handed_on():
    """The timer thread waiting for its next due job holds no reference to the ones it already
    handed to their pool (a sampling retry's closure holds its client and credential)."""
    role = "test-timer-refs"
    clock = SystemClock()
    _assert_kept_by_nobody_once_run(
        role, lambda job, payload: call_later(clock, 0.0, role, job, payload)
    )


def test_call_later_on_a_fake_clock_runs_in_due_order_without_sleeping():
    """Delayed jobs fall due on the injected clock (a fake clock passes time at once)."""
    clock = FakeClock()
    ran: list[tuple[str, float]] = []
    done = threading.Semaphore(0)

    def job(name: str) -> None:
        ran.append((name, clock.monotonic()))
        done.release()

    started = time.monotonic()
    call_later(clock, 30.0, "test-timer", job, "late")
    call_later(clock, 5.0, "test-timer", job, "early")
    call_later(clock, 0.0, "test-timer", job, "now")
    for _ in range(3):
        assert done.acquire(timeout=HANG)
    assert time.monotonic() - started < 10.0  # virtual waits, not real ones
    assert {name for name, _ in ran} == {"late", "early", "now"}
    due = dict(ran)
    assert due["late"] >= 30.0 and due["early"] >= 5.0
    timer_waits = [t for t, name in clock.waits if name.startswith("tinker_sync-timer-")]
    assert timer_waits and all(w is not None and w > 0 for w in timer_waits)


def test_call_later_on_the_system_clock():
    clock = SystemClock()
    fired = threading.Event()
    started = time.monotonic()
    call_later(clock, 0.05, "test-timer", fired.set)
    assert fired.wait(HANG)
    assert time.monotonic() - started >= 0.05


def test_configure_threads_validates_and_applies_to_new_pools(fresh_sizes):
    with pytest.raises(ValueError, match="unknown thread role"):
        configure_threads(nope=3)
    with pytest.raises(ValueError):
        configure_threads(sample_submit=0)
    with pytest.raises(ValueError):
        DaemonPool("bad", 0)
    with pytest.raises(ValueError):
        BoundedLane("bad", 0)
    configure_threads(sample_submit=7, **{"train-poll": 5})
    assert executor._sizes["sample-submit"] == 7 and executor._sizes["train-poll"] == 5


def test_inventory_defaults_are_documented():
    """The documented sizes (the sample-submit pool is deliberately small: sends never wait)."""
    assert executor.DEFAULT_SIZES["sample-submit"] == 8
    assert executor.DEFAULT_SIZES["sample-poll"] == 400
    assert executor.DEFAULT_SIZES["train-poll"] == 64
    assert executor.DEFAULT_SIZES["rest"] == 16
    doc = executor.__doc__ or ""
    for role in executor.DEFAULT_SIZES:
        assert f"``{role}``" in doc


def test_the_pending_sample_budget_holds_even_while_hedging():
    """1,000 pending samples through the session poller: 8 senders + 10 payload fetchers +
    poller + heartbeat + two timers + the hedge pool (lossy networks only) fit in 24 threads."""
    from tinker_sync._polling.poller import FETCH_LANE_LIMIT

    sizes = executor.DEFAULT_SIZES
    fixed = 4  # futures poller, heartbeat, the session's timer, the executor's timer
    assert sizes["sample-submit"] + FETCH_LANE_LIMIT + sizes["hedge"] + fixed <= 24


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_gets_fresh_pools_even_if_a_pool_lock_was_held():
    """Pools (and their locks) are rebuilt in a child (docs/design/behavior.md#fork-detection)."""
    p = pool("test-fork")
    p.submit(lambda: None)
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with executor._pools_lock, p._lock:
            held.set()
            release.wait(HANG)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(HANG)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            ok = threading.Event()
            fresh = pool("test-fork")
            fresh.submit(ok.set)
            call_later(SystemClock(), 0.0, "test-fork", lambda: None)
            os.write(write_fd, b"ok" if ok.wait(20) and fresh is not p else b"no")
        finally:
            os._exit(0)
    os.close(write_fd)
    release.set()
    holder.join(HANG)
    import select

    ready, _, _ = select.select([read_fd], [], [], HANG)
    answer = os.read(read_fd, 10) if ready else b"hung"
    os.close(read_fd)
    if answer == b"hung":
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert answer == b"ok"
