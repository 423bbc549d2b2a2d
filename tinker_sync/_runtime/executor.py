"""Process-wide pools of daemon worker threads by role, bounded lanes and a delay timer.

Usage::

    from tinker_sync._runtime.executor import pool, BoundedLane, call_later

    pool("sample-poll").submit(fetch_result, future)       # FIFO, grows lazily
    lane = BoundedLane("sample-poll", limit=16)             # <= 16 of these jobs at once
    lane.submit(fetch_payload, request_id)
    call_later(clock, 2.5, "sample-submit", retry, job)    # no thread sleeps meanwhile

Why not ``ThreadPoolExecutor``: not interpreter exit -- the SDK's exit hook
(:func:`tinker_sync._runtime.clock.register_exit_callback`) already shuts in-flight long polls down
before ``concurrent.futures`` joins its workers. The reasons are two things it does not do. Its
idle workers never exit, while these leave after 30 s idle, or at once when the process's last
client closes (:func:`retire_idle_threads`), so a burst of samples leaves no parked threads
behind. And its jobs are futures owned by the pool, while these are plain callables that the
thread waiting in ``result()`` can claim and run itself (:class:`Claimable`), so a sequential
``sample().result()`` makes no thread hand-off and no step pays for a second future. The workers
are daemon threads that grow lazily up to ``max_workers`` and never delay exit; overflow queues
FIFO; the most recently idle worker takes the next job (its stack and data likeliest still in
the CPU's caches; the workers idle longest stay idle and exit); a job must never wait on a job
of its own pool (docs/design/behavior.md#thread-inventory).

**Thread inventory (docs/design/behavior.md#thread-inventory).** Threads are named
``tinker_sync-<role>-<n>``. Process-wide pools:

=================  =====  ==============================================================
role               size   what runs there
=================  =====  ==============================================================
``sample-submit``  8      sampling sends: each tenant's fair lane (:class:`BoundedLane`)
                          runs one ``asample`` at a time per worker; a sample waiting for
                          a gate or the backoff deadline is parked in its limiter and holds
                          no thread. Timer jobs (retries, backoff ends) land here too.
                          Widened up to 64 while exchanges are slow and samples queue
                          (:meth:`DaemonPool.widen`, docs/limiter.md#send-width).
``sample-poll``    400    per-future long polls of samples (poller off); with the session
                          futures poller on, only payload fetches, at most 10 per poller
                          (:class:`BoundedLane`), so pending samples hold no thread. A
                          lone sample's poll (no other in flight) runs on the
                          thread that sent it (:meth:`DaemonPool.then_here`): it takes one
                          of these 400 slots, and ``sample-submit`` may start a worker in
                          its place (at most 8 lent at once).
``train-submit``   32     parallel forward/backward chunk sends.
``train-poll``     64     training future polls.
``rest``           16     RestClient calls and best-effort ``cancel_future`` batches.
``async``          32     ``*_async`` bridges.
``hedge``          2      second copies of slow requests (``_flow.hedge``), only while the
                          network is lossy; more at once wait their turn (and are dropped
                          once the first copy has answered). Two keep the budget below.
``timer``          1/clk  delayed jobs (sampling retries), one per clock in use.
=================  =====  ==============================================================

Per session: heartbeat and timer threads; per sampler with ``sample_use_retrieve_futures``
on, one ``tinker_sync-futures-poller`` thread (exits when idle); per TrainingClient one sender.
So 1,000 pending samples through the session poller need at most 24 SDK threads (8 senders,
10 fetchers, poller, heartbeat, two timers, and two hedges while the network is lossy), and
2,000 without it at most 400 polling threads (senders lent to polls included) plus the
senders (8, and up to 8 more started in place of lent ones). Idle workers exit after 30 s, or
at once when the process's last client is closed (:func:`retire_idle_threads`). :func:`configure_threads` changes the sizes before first
use.

Thread safety: every function and method may be called from any thread. Fork safety: in a
forked child the pools, lanes' counters and timers are forgotten (their threads did not survive)
and rebuilt on first use.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

from tinker_sync._runtime.causes import signal_exception
from tinker_sync._runtime.clock import Clock, exiting
from tinker_sync._runtime.fork import (
    fork_generation,
    make_condition,
    make_lock,
    register_after_fork,
)
from tinker_sync._runtime.governor import Governor, governor

log = logging.getLogger("tinker_sync.executor")

#: Default sizes per role (docs/design/behavior.md#thread-inventory); change them with
#: :func:`configure_threads`.
DEFAULT_SIZES: dict[str, int] = {
    "sample-submit": 8,
    "sample-poll": 400,
    "train-submit": 32,
    "train-poll": 64,
    "rest": 16,
    "async": 32,
    "hedge": 2,
}
#: Pools whose workers pace themselves while the main thread is busy (``_runtime.governor``).
GOVERNED_ROLES = frozenset({"sample-submit", "sample-poll"})

_IDLE_EXIT_S = 30.0

Job = tuple[Callable[..., Any], tuple[Any, ...]]


class DaemonPool:
    """A lazily growing pool of daemon threads running ``fn(*args)`` jobs in FIFO order.

    Thread-safe; not fork-safe by itself (the registry replaces it in a forked child).
    """

    def __init__(self, role: str, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers for {role!r} must be >= 1, got {max_workers}")
        self.role = role
        self.max_workers = max_workers
        self._lock = threading.Lock()
        self._jobs: collections.deque[Job] = collections.deque()
        #: Idle workers' wake-up locks (held; released to wake), the most recently idle last.
        self._sleepers: list[threading.Lock] = []
        self._threads = 0
        self._idle = 0
        self._running = 0
        self._finishing = 0  # running workers whose job said it is about to return
        self._tls = threading.local()
        self._counter = 0
        self._peak = 0
        self._retiring = _retire_when_idle
        #: requester -> the width it asked for (:meth:`widen`); the pool grows to the largest.
        self._widths: dict[Hashable, int] = {}
        self._limit = max_workers
        #: Sampling pools yield to a busy main thread (docs/scale-out.md#background-share).
        self._governor: Governor | None = governor() if role in GOVERNED_ROLES else None
        #: This pool's workers running a follow-up job of another pool (:meth:`then_here`):
        #: each lets this pool start one worker more meanwhile, at most ``max_workers``.
        self._lent = 0
        #: Other pools' workers running a job of this pool: each takes one of its slots.
        self._borrowed = 0

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def peak_threads(self) -> int:
        """Most worker threads alive at once since creation or :meth:`reset_peak`."""
        return self._peak

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._threads

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; start a worker if none is idle and the pool is not full."""
        with self._lock:
            self._jobs.append((fn, args))
            # A worker that just finished a job (or whose job said it is about to return) is
            # not idle yet but will take the next one: counting it avoids starting a thread the
            # lane limits above would not need.
            if self._threads - self._running + self._finishing >= len(self._jobs):
                if self._idle:
                    self._wake_locked()
                return
            if self._threads < self._cap():
                self._start_worker_locked()
            else:
                self._wake_locked()

    def _start_worker_locked(self) -> None:
        self._counter += 1
        name = f"tinker_sync-{self.role}-{self._counter}"
        worker = threading.Thread(target=self._work, name=name, daemon=True)
        self._threads += 1  # no call between counting it and the try below
        try:
            worker.start()
        except BaseException as exc:
            # A signal handler's exception (the caller may be the main thread) can
            # stop start() before the thread runs: then do not count it. One landing
            # in start()'s wait makes threading's cleanup raise RuntimeError over it.
            if worker.ident is None:
                self._threads -= 1
            raised = signal_exception(exc)
            if raised is not None and raised is not exc:
                raise raised  # noqa: B904 (the caller's own, unchanged)
            raise
        self._peak = max(self._peak, self._threads)

    @property
    def width(self) -> int:
        """The most workers the pool may run now: ``max_workers``, or more while widened."""
        return self._limit

    def widen(self, requester: Hashable, width: int) -> None:
        """Let the pool grow to ``width`` workers while ``requester`` asks for it.

        Usage: ``pool("sample-submit").widen(limiter, 24)``; ``widen(limiter, 0)`` withdraws.
        The pool runs up to the largest width asked for, never fewer than ``max_workers``;
        threads started beyond that exit when idle, like any worker. Queued jobs get workers
        at once.
        """
        with self._lock:
            if width > self.max_workers:
                self._widths[requester] = width
            else:
                self._widths.pop(requester, None)
            self._limit = max(self.max_workers, *self._widths.values(), 0)
            need = len(self._jobs) - self._idle - self._finishing
            while need > 0 and self._threads < self._cap():
                self._start_worker_locked()
                need -= 1

    def has_queued(self) -> bool:
        """True while jobs wait for a worker (a hint: read without the lock)."""
        return bool(self._jobs)

    def finishing(self) -> None:
        """Called by a job on one of this pool's workers that is about to return: from now on
        its worker counts as free, so a job submitted meanwhile waits for it instead of
        starting a thread (a :class:`BoundedLane` frees its slot this way)."""
        if self.has_follow_up():
            return  # it runs its follow-up next (then_here): not free for the next job
        with self._lock:
            if not getattr(self._tls, "finishing", False):
                self._tls.finishing = True
                self._finishing += 1

    def has_follow_up(self) -> bool:
        """On one of this pool's workers: a job took on a follow-up (:meth:`then_here`)."""
        return getattr(self._tls, "then", None) is not None

    def then_here(self, fn: Callable[[], object], role: str) -> bool:
        """From a job on one of this pool's workers: run ``fn`` on this same thread as soon as
        the job has returned, as a job of ``pool(role)``, instead of handing it to that pool's
        threads (no thread hand-off).

        Usage (a sample's send step, whose poll follows)::

            if not pool("sample-submit").then_here(poll.run, "sample-poll"):
                pool("sample-poll").submit(poll.run)

        ``fn`` takes one of ``pool(role)``'s worker slots while it runs, so that pool's bound
        holds; and this worker is lent meanwhile: this pool may start one worker more in its
        place, so a long ``fn`` (a long poll) never keeps this pool's own jobs waiting. At most
        ``max_workers`` workers are lent at once. False (the caller queues ``fn`` itself) when
        this thread is not one of this pool's workers, already has a follow-up, has said it is
        finishing (:meth:`finishing`), when the lent workers are at their bound, or when
        ``pool(role)`` has no free slot.
        """
        tls = self._tls
        if (
            not getattr(tls, "worker", False)
            or self.has_follow_up()
            or getattr(tls, "finishing", False)
        ):
            return False
        target = pool(role)
        if target is self or not target._borrow():
            return False
        with self._lock:
            lent = self._lent < self.max_workers
            if lent:
                self._lent += 1  # one step with the stores below: plain, under the lock
                tls.then = (fn, target)
                self._serve_queued_locked()  # a job queued meanwhile need not wait for fn
        if not lent:
            target._give_back()
        return lent

    def _serve_queued_locked(self) -> None:
        # Called with the lock held: a queued job no idle worker will take gets a new worker,
        # if the pool has room for one.
        if self._jobs and not self._idle and self._threads < self._cap():
            self._start_worker_locked()

    def _cap(self) -> int:
        # Called with the lock held: the most threads this pool may have now.
        return self._limit + self._lent - self._borrowed

    def _borrow(self) -> bool:
        """Take one worker slot for a job another pool's worker runs (:meth:`then_here`)."""
        with self._lock:
            if self._threads >= self._cap() or self._jobs:
                return False
            self._borrowed += 1
            return True

    def _give_back(self) -> None:
        with self._lock:
            self._borrowed -= 1
            self._serve_queued_locked()  # queued while the slot was taken

    def retire_idle(self, retiring: bool = True) -> None:
        """While ``retiring``, workers exit as soon as the queue is empty (not after 30 s)."""
        with self._lock:
            self._retiring = retiring
            while self._sleepers:
                self._sleepers.pop().release()

    def _wake_locked(self) -> None:
        """Wake the most recently idle worker (called with the lock held).

        Last in, first out: its stack and the objects it touched are likeliest still in the
        CPU's caches, and the workers idle longest stay idle (and exit after 30 s), so a pool
        runs on as few threads as its load needs. ``threading.Condition`` wakes the worker idle
        longest instead.
        """
        if self._sleepers:
            self._sleepers.pop().release()

    def _sleep_locked(self) -> bool:
        """Called with the lock held: release it until woken or :data:`_IDLE_EXIT_S` passed;
        True when woken."""
        waiter = threading.Lock()
        waiter.acquire()
        self._sleepers.append(waiter)
        self._lock.release()
        try:
            woke = waiter.acquire(True, _IDLE_EXIT_S)
        finally:
            self._lock.acquire()
        if not woke:
            try:
                self._sleepers.remove(waiter)
            except ValueError:  # woken just after the timeout: as good as woken
                woke = True
        return woke

    def _work(self) -> None:
        ran = False
        self._tls.worker = True
        while True:
            with self._lock:
                if ran:
                    self._running -= 1
                    if getattr(self._tls, "finishing", False):
                        self._tls.finishing = False
                        self._finishing -= 1
                while not self._jobs:
                    if self._retiring:
                        self._threads -= 1
                        return
                    self._idle += 1
                    woke = self._sleep_locked()
                    self._idle -= 1
                    if not woke and not self._jobs:
                        self._threads -= 1
                        return
                fn, args = self._jobs.popleft()
                self._running += 1
                ran = True
            if self._governor is not None:
                self._governor.pace()
            try:
                fn(*args)
            except BaseException:  # jobs own their errors; this is a last resort
                log.exception("unhandled error in %s job %r", self.role, fn)
            # An idle worker keeps nothing of its last job alive (a client, its credential).
            del fn, args
            if self._governor is not None:
                self._governor.done()
            then = getattr(self._tls, "then", None)
            if then is not None:
                self._follow_up(*then)
                del then

    def _follow_up(self, fn: Callable[[], object], target: DaemonPool) -> None:
        """Run a follow-up this worker took on (:meth:`then_here`), then give both slots back."""
        governor = target._governor
        try:
            if governor is not None:
                governor.pace()
            fn()
        except BaseException:
            log.exception("unhandled error in %s follow-up %r", target.role, fn)
        finally:
            if governor is not None:
                governor.done()
            with self._lock:
                self._tls.then = None
                self._lent -= 1
            target._give_back()


class Claimable:
    """A pool job that the thread waiting for its outcome may run itself instead, once.

    Usage::

        step = Claimable(poll.run)
        pool("sample-poll").submit(step.run)
        future._offer(step)         # result() may call step.run() first (see APIFuture)

    Whichever thread calls :meth:`run` first runs the function; later calls return False.
    This is task inlining (as in .NET's ``Task.Wait``): a sequential ``sample().result()``
    then makes no thread hand-off at all, and the woken worker finds nothing to do.
    Thread-safe; fork: a step claimed in the parent stays claimed in the child.
    """

    __slots__ = ("_fn", "_taken")

    def __init__(self, fn: Callable[[], object]) -> None:
        self._fn: Callable[[], object] | None = fn
        self._taken = threading.Lock()

    @property
    def claimed(self) -> bool:
        return self._taken.locked()

    def run(self) -> bool:
        """Run the function unless another thread claimed it first; True if this call ran it."""
        if not self._taken.acquire(blocking=False):
            return False
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()
        return True


class BoundedLane:
    """Runs jobs on a shared pool with at most ``limit`` of them running at once (FIFO).

    Usage::

        lane = BoundedLane("sample-poll", limit=16)
        lane.submit(fetch, request_id)

    Up to ``limit`` drain jobs run on ``pool(role)``; each takes queued jobs until the queue is
    empty, so a burst of 2,000 completions uses 16 threads, not 400. A ``fair`` lane runs one
    job per turn and then queues its drain again at the back of the pool (or, when no job waits
    for the pool, goes on with the next): lanes sharing a pool (one per sampling tenant) take
    turns, so a long backlog in one never delays another's next job by more than one job per
    busy drain.
    Thread-safe; in a forked child a lane starts empty (queued jobs belonged to the parent).
    """

    def __init__(self, role: str, limit: int, *, fair: bool = False) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.role = role
        self.limit = limit
        self.fair = fair
        self._lock = make_lock()
        self._jobs: collections.deque[Job] = collections.deque()
        self._active = 0
        self._generation = fork_generation()
        self._governor: Governor | None = governor() if role in GOVERNED_ROLES else None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._generation != fork_generation():
                self._jobs.clear()
                self._active = 0
                self._generation = fork_generation()
            self._jobs.append((fn, args))
            if self._active < self.limit:
                # Queued before it is counted (the pool runs nothing inline, and lane -> pool
                # is the lock order _drain uses too): a signal handler's exception on the
                # main thread in between lets one more drain run at most; counted first, it
                # could leave the lane counting a drain that never started, for good.
                pool(self.role).submit(self._drain)
                self._active += 1

    @property
    def active(self) -> int:
        return self._active

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    # This worker is about to be free: a drain the freed slot starts takes it,
                    # rather than a new thread (the lane's limit also bounds the pool's threads).
                    pool(self.role).finishing()
                    self._active -= 1
                    return
                fn, args = self._jobs.popleft()
            if self._governor is not None:
                self._governor.pace()  # a drain may run many jobs in one pool job
            try:
                fn(*args)
            except BaseException:
                log.exception("unhandled error in %s lane job %r", self.role, fn)
            if self._governor is not None:
                self._governor.done()
            shared = pool(self.role)
            follow_up = shared.has_follow_up()
            if self.fair or follow_up:
                with self._lock:
                    if not self._jobs:
                        self._active -= 1
                        return
                if not follow_up and not shared.has_queued():
                    continue  # nobody else waits for the pool: this turn goes on
                # One job per turn: the drain queues again behind every other lane's job on
                # the pool, so lanes sharing a pool are served round-robin (by this worker).
                # And a follow-up this worker took on (DaemonPool.then_here) runs as soon as
                # this job returns: the lane's next job goes to another worker.
                shared.finishing()
                shared.submit(self._drain)
                return


class _Timer:
    """One daemon thread per clock that submits delayed jobs to a pool when they fall due.

    Due times are on the given clock (a FakeClock makes them pass at once, in order); an empty
    timer parks on real time and its thread exits after 30 s idle. Thread-safe.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # Its with statement takes the C lock directly: a signal handler's exception on the
        # main thread cannot land between acquiring it and the body (docs/limiter.md#signals).
        self._cond = make_condition()
        self._heap: list[tuple[float, int, str, Job]] = []
        self._seq = itertools.count()
        self._running = False
        self._retiring = _retire_when_idle

    def call_later(self, delay: float, role: str, fn: Callable[..., Any], *args: Any) -> None:
        due = self.clock.monotonic() + max(0.0, delay)
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), role, (fn, args)))
            self._cond.notify()
            if not self._running:
                thread = threading.Thread(
                    target=self._run, name=f"tinker_sync-timer-{next(_timer_names)}", daemon=True
                )
                self._running = True  # no call between setting it and the try below
                try:
                    thread.start()
                except BaseException:
                    # A signal handler's exception (the caller may be the main thread) that
                    # stops start() before the thread runs: the next call starts one.
                    if thread.ident is None:
                        self._running = False
                    raise

    def retire_idle(self, retiring: bool = True) -> None:
        with self._cond:
            self._retiring = retiring
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            ready: list[tuple[str, Job]] = []
            with self._cond:
                if not self._heap:
                    if not self._retiring:
                        self._cond.wait(_IDLE_EXIT_S)  # real time: an idle timer moves no clock
                    if not self._heap:
                        self._running = False
                        return
                    continue
                now = self.clock.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    ready.append(heapq.heappop(self._heap)[2:])
                if not ready:
                    if exiting():
                        self._running = False
                        return
                    self.clock.wait(self._cond, self._heap[0][0] - now)
                    continue
            _submit_all(ready)
            del ready  # while this thread waits, it keeps nothing of the jobs it handed on


def _submit_all(ready: list[tuple[str, Job]]) -> None:
    for role, (fn, args) in ready:
        pool(role).submit(fn, *args)


_pools: dict[str, DaemonPool] = {}
_sizes: dict[str, int] = dict(DEFAULT_SIZES)
_pools_lock = threading.Lock()
_timers: dict[int, _Timer] = {}
_timer_names = itertools.count(1)
_retire_when_idle = False


def pool(role: str) -> DaemonPool:
    """Return the process-wide pool for ``role``, creating it on first use."""
    p = _pools.get(role)
    if p is not None:
        return p
    with _pools_lock:
        p = _pools.get(role)
        if p is None:
            p = DaemonPool(role, _sizes.get(role, 16))
            _pools[role] = p
        return p


def call_later(clock: Clock, delay: float, role: str, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on ``pool(role)`` once ``delay`` seconds have passed on ``clock``.

    No thread is blocked meanwhile (one timer thread per clock holds every delayed job).
    """
    key = id(clock)
    with _pools_lock:
        timer = _timers.get(key)
        if timer is None or timer.clock is not clock:
            timer = _timers[key] = _Timer(clock)
    timer.call_later(delay, role, fn, *args)


def configure_threads(**sizes: int) -> None:
    """Set pool sizes by role (``sample_submit=64`` or ``**{"sample-submit": 64}``).

    Takes effect for pools created afterwards; call it before the first request.
    """
    with _pools_lock:
        for key, value in sizes.items():
            role = key.replace("_", "-")
            if role not in DEFAULT_SIZES:
                raise ValueError(f"unknown thread role {key!r}; known: {sorted(DEFAULT_SIZES)}")
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
            _sizes[role] = value


def retire_idle_threads(retiring: bool = True) -> None:
    """While ``retiring`` (no client open in the process), pool workers and timers exit as
    soon as they have nothing to do, instead of idling 30 s; jobs submitted meanwhile (e.g.
    failing the last pending futures) still run. ``retiring=False`` (a client started again)
    restores the 30 s idle time. Thread-safe.
    """
    global _retire_when_idle
    with _pools_lock:
        _retire_when_idle = retiring
        pools, timers = list(_pools.values()), list(_timers.values())
    for p in pools:
        p.retire_idle(retiring)
    for timer in timers:
        timer.retire_idle(retiring)


def thread_counts() -> dict[str, int]:
    """Current worker threads per role (for tests and benchmarks)."""
    return {role: p.threads for role, p in _pools.items()}


def peak_thread_counts() -> dict[str, int]:
    """Peak worker threads per role since creation or :func:`reset_peaks`."""
    return {role: p.peak_threads for role, p in _pools.items()}


def reset_peaks() -> None:
    """Restart the peak counters at the current thread counts (benchmarks, tests)."""
    for p in list(_pools.values()):
        p.reset_peak()


def _after_fork_in_child() -> None:
    global _pools_lock, _retire_when_idle
    _retire_when_idle = False
    _pools.clear()
    _timers.clear()
    _pools_lock = threading.Lock()


register_after_fork(_after_fork_in_child)
