"""The shared sampling limiter and dispatcher: one per (normalized base_url, credential identity).

Usage::

    limiter = limiter_for(base_url, credential_identity, clock)
    ticket = Ticket(owner=sampler, estimate=prompt_bytes, start=send_step,
                    on_stop=fail, stop_reason=why_stop)
    limiter.enqueue(ticket)          # returns at once; start(ticket) runs when it may send
    # in send_step(ticket), on a worker thread:
    if limiter.backoff_remaining() > 0: limiter.hold(ticket)   # parked again, gates kept
    ...POST...; on 429: limiter.set_backoff(d, "429"); limiter.hold(ticket)
    limiter.release(ticket)          # accepted or failed: the gates go to the next ticket
    limiter.sender_done(ticket)      # the send step returned: the next ticket may start

**Scope (a deliberate difference from the official SDK).** The official SDK keeps one backoff
per ServiceClient. Here every client in the process that talks to the same normalized base URL
with the same credential shares one deadline and one set of dispatch gates, so one caller's
429 slows every caller of that tenant, and a second ServiceClient cannot dodge it. The
deadline is also shared with the user's other processes through a memory-mapped file
(:mod:`tinker_sync._flow.sharedbackoff`); the gates stay per process.

**Nothing waits on a thread.** A ticket waiting for a gate sits in its owner's queue; one
holding its gates while the deadline is ahead sits in the held list, and one timer (the
executor's, per clock) pumps the limiter when the deadline falls due. Admitted tickets are
sent through this tenant's fair lane on the ``sample-submit`` pool, so tenants take turns
on the pool and one tenant's backlog never delays another's dispatch.

Invariants the tests check (docs/limiter.md): get-or-create never splits a key; the deadline
only moves forward (a later success never shortens it); owners (sampling clients) are admitted
round-robin, each in FIFO order; the gates are count(400) -> count(10, only while recently
backed off) -> bytes, taken together when a ticket is admitted and returned once, when the
server accepts the request or the ticket stops; no ticket starts before the deadline.

Thread safety: all methods are thread-safe; callbacks run outside the lock. Fork safety: the
registry is emptied in a forked child (limiters hold locks that may have been held at fork
time).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import math
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from tinker_sync._flow import sharedbackoff
from tinker_sync._flow.breaker import TenantHealth, Turn
from tinker_sync._runtime.clock import Clock
from tinker_sync._runtime.executor import BoundedLane, call_later, pool
from tinker_sync._runtime.fork import make_condition, make_lock, register_after_fork

log = logging.getLogger("tinker_sync.ratelimit")

DISPATCH_COUNT = 400
BACKED_OFF_COUNT = 10
RECENT_BACKOFF_S = 10.0
BACKED_OFF_BYTE_PENALTY = 20
DEFAULT_SAMPLE_DISPATCH_BYTES = 10 * 1024 * 1024
DEFAULT_FWDBWD_DISPATCH_BYTES = 50_000_000
DEFAULT_INFLIGHT_RESPONSE_BYTES = 50 * 1024 * 1024
LARGE_PROMPT_BYTES = 128 * 1024
#: The backoff a 429 on ``asample`` without a usable Retry-After sets: this, or for a prompt
#: above LARGE_PROMPT_BYTES the longer one.
RATE_LIMIT_BACKOFF_S = 1.0
LARGE_PROMPT_BACKOFF_S = 5.0
#: The backoff a paused queue state on a sampling poll sets.
PAUSED_QUEUE_BACKOFF_S = 1.0
#: While the backoff keeps being extended, one INFO summary at most this often (seconds).
BACKOFF_SUMMARY_EVERY_S = 60.0
#: The send width follows latency (docs/limiter.md#send-width): once SEND_LATENCY_MIN_SAMPLES
#: of the last SEND_LATENCY_WINDOW ``asample`` exchanges sent at the base width are known, a
#: median above WIDEN_ABOVE_S widens the senders to base x median / SEND_TARGET_S, at most
#: MAX_SEND_WIDTH; exchanges older than SEND_LATENCY_MAX_AGE_S are forgotten (the width
#: starts at the base). Not while the process used more than BUSY_CPU_SHARE of a core over
#: those exchanges: then they are slow because the client is CPU-bound, and more senders
#: only add GIL contention.
SEND_LATENCY_WINDOW = 16
SEND_LATENCY_MIN_SAMPLES = 8
WIDEN_ABOVE_S = 0.075
SEND_TARGET_S = 0.0125
MAX_SEND_WIDTH = 64
SEND_LATENCY_MAX_AGE_S = 60.0
BUSY_CPU_SHARE = 0.75
#: A server on a loopback host keeps the base width: its exchanges are slow because this
#: machine is busy, not because the server is far away. ``TINKER_SYNC_LOOPBACK_WIDENS=1``
#: lifts that (tests and benchmarks that play a distant server with a delay fault).
LOOPBACK_WIDENS_ENV = "TINKER_SYNC_LOOPBACK_WIDENS"
#: A queue's head that waits for closed gates has its ``stop_reason`` asked again after a
#: ``wake()`` (a cancel, a close, a circuit change) or once this many seconds have passed since
#: it was last asked, not at every pump (docs/limiter.md#stop-checks).
STOP_RECHECK_S = 1.0


def _is_loopback(normalized_base_url: str) -> bool:
    """True for a server on this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = urllib.parse.urlsplit(normalized_base_url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: not known to be this machine


class Stopped(Exception):
    """Raised out of a limiter wait when the caller's ``should_stop`` returns an exception."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


#: Returns None to keep waiting, or the exception to stop with (cancelled, closed...).
ShouldStop = Callable[[], BaseException | None]


class ByteBudget:
    """A byte budget that admits a request while the remaining budget is >= 0.

    The request is then subtracted, so one request may overshoot and a huge request cannot
    deadlock.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.remaining = size


#: A ticket's states (``Ticket.state``): the one field that says where it is. The limiter's
#: queues and held list are indexes over it that may hold stale entries (docs/limiter.md#signals).
QUEUED = "queued"  # in its owner's queue, waiting for the gates
HELD = "held"  # holds its gates; waits for the deadline, then for a send step to claim it
SENDING = "sending"  # claimed by a send step (claim()); hold() parks it again
STOPPED = "stopped"  # stopped while waiting: on_stop is due
FINISHED = "finished"  # on_stop was delivered


class Ticket:
    """One sampling dispatch: queued for the gates, then held or sending (see module docs).

    ``owner`` (any hashable; one per sampling client) is the unit of round-robin fairness.
    ``start(ticket)`` runs (outside the lock, in whichever thread pumped) once the ticket holds
    its gates and the deadline has passed (it is handed the ticket, so it need not close over
    it: no reference cycle); it may run more than once for one admission, so the send step it
    schedules must begin with ``if not limiter.claim(ticket): return`` (exactly one claim
    succeeds). ``on_stop(exc)`` runs instead, at most once, when ``stop_reason()`` says so
    while the ticket waits in the limiter. Not thread-safe by itself: the limiter's lock guards
    the fields.
    """

    __slots__ = (
        "asked",
        "asked_at",
        "backed_off",
        "cost",
        "estimate",
        "issued",
        "on_stop",
        "owner",
        "probe",
        "round",
        "sending",
        "start",
        "state",
        "stop_reason",
    )

    def __init__(
        self,
        *,
        owner: Hashable,
        estimate: int,
        start: Callable[[Ticket], object],
        on_stop: Callable[[BaseException], object],
        stop_reason: ShouldStop,
    ) -> None:
        self.owner = owner
        self.estimate = estimate
        self.start = start
        self.on_stop = on_stop
        self.stop_reason = stop_reason
        self.cost: int | None = None  # bytes charged; None while the gates are not held
        self.backed_off = False  # holds a permit of the backed-off count gate
        self.sending = 0  # claims whose send step has not returned yet (sender_done)
        self.state = QUEUED
        self.round = 0  # +1 each time the ticket becomes HELD
        self.issued = -1  # the last round whose start() returned
        #: Granted the tenant's one probe while its circuit is open (set by the tenant, in the
        #: same step that takes the probe); the send step that claims it sends the probe.
        self.probe = False
        #: The limiter's wake count and clock reading when ``stop_reason`` last said None while
        #: the ticket headed its queue behind closed gates (-1: never asked there).
        self.asked = -1
        self.asked_at = 0.0


class Limiter:
    """Shared backoff deadline, dispatch gates and fair queues for one (base_url, credential).

    Thread-safe; obtain it with :func:`limiter_for`, never construct it directly (tests may,
    to play two processes sharing one deadline file).
    """

    def __init__(
        self,
        key: tuple[str, str],
        clock: Clock,
        shared: sharedbackoff.SharedDeadline | None = None,
        *,
        share: bool = False,
    ) -> None:
        self.key = key
        self.clock = clock
        self.shared = shared
        #: Open the tenant's shared deadline file on first use (and again after close_shared),
        #: in the directory (and with the switch) read when the limiter was made.
        self._share = share and sharedbackoff.enabled()
        self._share_dir = sharedbackoff.runtime_dir() if self._share else None
        # Fork-safe: a child may still reach a parent's limiter through an inherited object.
        self._lock = make_lock()
        self._gates_changed = make_condition(self._lock)
        self.backoff_until = float("-inf")  # never backed off
        self._count = DISPATCH_COUNT
        self._backed_off_count = BACKED_OFF_COUNT
        self._sample_bytes: ByteBudget | None = None
        self._fwdbwd_bytes: ByteBudget | None = None
        self._response_bytes: ByteBudget | None = None
        #: owner -> its tickets waiting for the gates; the dict order is the round-robin ring.
        self._queues: collections.OrderedDict[Hashable, collections.deque[Ticket]] = (
            collections.OrderedDict()
        )
        self._last_served: Hashable = None
        #: Index of HELD tickets (may repeat one or hold stale entries: the state decides).
        self._held: collections.deque[Ticket] = collections.deque()
        self._parked = 0  # tickets in state HELD
        #: Index of stopped tickets whose on_stop is due (ditto).
        self._stopping: collections.deque[tuple[Ticket, BaseException]] = collections.deque()
        self._timer_due: float | None = None
        #: wake() calls so far: a queue's head asked since the last one need not be asked
        #: again behind closed gates (docs/limiter.md#stop-checks).
        self._wakes = 0
        self._sender: BoundedLane | None = None
        #: A fixed send width set by a test (None: follow latency, see :attr:`send_width`).
        self._width_override: int | None = None
        self._base_width: int | None = None  # the sample-submit pool's size, read on first use
        self._width: int | None = None  # the latency-driven width (None: the base)
        self._latencies: collections.deque[float] = collections.deque(maxlen=SEND_LATENCY_WINDOW)
        #: (clock reading, process CPU seconds) at each recorded exchange.
        self._cpu_marks: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=SEND_LATENCY_WINDOW
        )
        self._latency_at = float("-inf")  # when the last exchange was recorded
        self._loopback = _is_loopback(key[0])
        self._active = 0  # claims whose send step has not returned (sender_done)
        self._users = 0  # started sessions using this limiter
        self._bad_shared_logged = False
        #: The shared record this limiter last published or adopted, compared by value: each
        #: record is honoured once. Read back, it moves nothing, so a clock whose wall and
        #: monotonic readings drift apart (tinker_sync.testing's virtual clock) never turns one
        #: record into a deadline that moves on with every timer pass.
        self._honoured_wall: float | None = None
        self._extensions = 0  # deadline moves since the last INFO line
        self._last_backoff_log = float("-inf")
        #: The tenant's circuit breaker and retry budget (docs/health.md): held tickets start
        #: only while it is closed, or one at a time as its probe. Its wake-ups re-check the
        #: held tickets' stop reasons, then pump.
        self.tenant = TenantHealth(key, clock, share=self._share, directory=self._share_dir)
        self.tenant.on_change(lambda: self.wake(everything=False))

    # ---------------------------------------------------------------- sizing

    def configure(
        self,
        *,
        sample_dispatch_bytes: int,
        fwdbwd_dispatch_bytes: int,
        inflight_response_bytes: int,
    ) -> None:
        """Size the byte budgets from the first server config seen; later calls are ignored."""
        # Built before the lock, stored in one step (plain stores): an exception raised in a
        # signal handler never leaves some budgets set and others not (docs/limiter.md#signals).
        sample = ByteBudget(sample_dispatch_bytes)
        fwdbwd = ByteBudget(fwdbwd_dispatch_bytes)
        response = ByteBudget(inflight_response_bytes)
        with self._lock:
            if self._sample_bytes is None:
                self._fwdbwd_bytes = fwdbwd
                self._response_bytes = response
                self._sample_bytes = sample  # last: _budgets() tests this one

    def _budgets(self) -> tuple[ByteBudget, ByteBudget, ByteBudget]:
        if self._sample_bytes is None:
            self.configure(
                sample_dispatch_bytes=DEFAULT_SAMPLE_DISPATCH_BYTES,
                fwdbwd_dispatch_bytes=DEFAULT_FWDBWD_DISPATCH_BYTES,
                inflight_response_bytes=DEFAULT_INFLIGHT_RESPONSE_BYTES,
            )
        assert self._sample_bytes and self._fwdbwd_bytes and self._response_bytes
        return self._sample_bytes, self._fwdbwd_bytes, self._response_bytes

    @property
    def sender(self) -> BoundedLane:
        """This tenant's fair lane on the ``sample-submit`` pool (bounded by the send width)."""
        lane = self._sender
        if lane is None:
            with self._lock:
                lane = self._sender
                if lane is None:
                    width = max(pool("sample-submit").max_workers, MAX_SEND_WIDTH)
                    lane = self._sender = BoundedLane("sample-submit", width, fair=True)
        return lane

    # ---------------------------------------------------------------- send width

    @property
    def send_width(self) -> int:
        """Tickets started or held at once (docs/limiter.md#send-width).

        The ``sample-submit`` pool's size, widened while recent exchanges are slow. Gates are
        taken only when a sender is free, so a newcomer is never queued behind tickets that
        were admitted early and are merely waiting for a thread. Setting it fixes the width.
        """
        if self._width_override is not None:
            return self._width_override
        if self._width is not None:
            return self._width
        if self._base_width is None:
            self._base_width = pool("sample-submit").max_workers
        return self._base_width

    @send_width.setter
    def send_width(self, width: int) -> None:
        self._width_override = width

    def in_flight(self) -> int:
        """Tickets started and not yet returned from their send step (for :meth:`record_send`)."""
        return self._active

    def quiet(self) -> bool:
        """No ticket waits for the gates or for a sender now (a hint, read without the lock):
        a send step may then poll its sample itself (docs/polling.md#which-thread-polls)."""
        return not self._queues and not self._parked

    def record_send(self, seconds: float, in_flight: int) -> None:
        """One ``asample`` exchange took ``seconds``; ``in_flight`` sends were under way then.

        Recomputes the latency-driven send width (Little's law: the sends in flight needed
        for a rate are that rate times the exchange time) and widens the pool to match. Only
        exchanges sent at the base width count: one sent wider may be slow because of the
        width itself (a server on this machine busy with our own sends), which must not feed
        back into more width.
        """
        if self._base_width is None:
            self._base_width = pool("sample-submit").max_workers
        if in_flight > self._base_width:
            return
        if self._loopback and os.environ.get(LOOPBACK_WIDENS_ENV, "").strip() != "1":
            return
        cpu = time.process_time()
        with self._lock:
            self._latency_at = now = self.clock.monotonic()
            self._latencies.append(seconds)
            self._cpu_marks.append((now, cpu))
            changed, width = self._update_width_locked()
        if changed:
            pool("sample-submit").widen(self, width)
            self.pump()

    def _update_width_locked(self) -> tuple[bool, int]:
        if self._base_width is None:
            self._base_width = pool("sample-submit").max_workers
        base = self._base_width
        width = base
        if len(self._latencies) >= SEND_LATENCY_MIN_SAMPLES:
            ordered = sorted(self._latencies)
            median = ordered[len(ordered) // 2]
            (t0, cpu0), (t1, cpu1) = self._cpu_marks[0], self._cpu_marks[-1]
            idle_cpu = t1 > t0 and (cpu1 - cpu0) / (t1 - t0) < BUSY_CPU_SHARE
            if median > WIDEN_ABOVE_S and idle_cpu:
                width = max(base, min(MAX_SEND_WIDTH, math.ceil(base * median / SEND_TARGET_S)))
        old = base if self._width is None else self._width
        self._width = None if width == base else width
        return width != old, width

    def _forget_stale_latencies_locked(self, now: float) -> tuple[bool, int]:
        if self._latencies and now - self._latency_at > SEND_LATENCY_MAX_AGE_S:
            self._latencies.clear()
            self._cpu_marks.clear()
            return self._update_width_locked()
        return False, 0

    # ---------------------------------------------------------------- deadline

    def set_backoff(
        self, seconds: float, cause: str, hooks: tuple[Callable[[Any], object], ...] = ()
    ) -> float:
        """Move the shared deadline to ``now + seconds`` unless it is already later.

        The deadline is also published to the user's other processes. ``hooks`` (the calling
        client's) receive a ``backoff_set`` event when it moved.
        """
        now = self.clock.monotonic()
        wall = self.clock.time() + seconds
        summary: str | None = None
        with self._lock:
            until = now + seconds
            moved = until > self.backoff_until
            previous = self._honoured_wall
            # One INFO line when a backoff starts, then one summary a minute while it is
            # extended (a paused queue moves it on every poll answer: docs/health.md#logs).
            starts = moved and now >= self.backoff_until
            if moved:
                self.backoff_until = until
                self._honoured_wall = wall  # before publishing: a pump may read it back
                self._extensions += 1
                if starts and now - self._last_backoff_log >= BACKOFF_SUMMARY_EVERY_S:
                    self._extensions = 0
                    self._last_backoff_log = now
                elif not starts and now - self._last_backoff_log >= BACKOFF_SUMMARY_EVERY_S:
                    summary = (
                        f"sampling still backed off ({cause}): extended "
                        f"{self._extensions} times in the last "
                        f"{now - self._last_backoff_log:.0f} s"
                    )
                    self._extensions = 0
                    self._last_backoff_log = now
                else:
                    starts = False
            result = self.backoff_until
        shared = self._shared_file() if moved else None
        if shared is not None:
            try:
                published = shared.publish(wall)
            except (OSError, ValueError) as exc:  # e.g. the file vanished: per process now
                log.debug("could not publish the sampling backoff: %s", exc)
            else:
                if published != wall:  # the record keeps a later deadline: ours or to adopt
                    with self._lock:
                        if self._honoured_wall == wall:
                            self._honoured_wall = previous
        if starts:
            log.info("sampling backoff for %.3f s (%s)", seconds, cause)
        elif summary is not None:
            log.info("%s", summary)
        elif moved:
            log.debug("sampling backoff for %.3f s (%s)", seconds, cause)
        if moved:
            from tinker_sync._transport import emit_hook

            emit_hook(
                hooks,
                "backoff_set",
                limiter_key=self.key[1][:12],
                until=result,
                seconds=seconds,
                cause=cause,
            )
        return result

    def _merge_shared_locked(self, now: float, *, reopen: bool = True) -> None:
        """Adopt a later deadline published by another process (lock held).

        ``reopen=False`` (a pump after a gate change) never reopens a file closed with the
        process's last client: only a new dispatch, a send or a 429 does.
        """
        shared = self._shared_file() if reopen else self.shared
        if shared is None:
            return
        wall = shared.read()
        if wall is None or wall == self._honoured_wall:
            return  # nothing published, or a record already honoured (ours or adopted)
        remaining = wall - self.clock.time()
        if remaining <= 0:
            return  # stale: already over
        if remaining > sharedbackoff.MAX_SHARED_WAIT_S:
            if not self._bad_shared_logged:
                self._bad_shared_logged = True
                log.debug("ignoring an implausible shared backoff deadline in %s", shared.path)
            return
        self._honoured_wall = wall
        until = now + remaining
        if until > self.backoff_until + 1e-3:  # our own publication reads back equal
            self.backoff_until = until

    def _shared_file(self) -> sharedbackoff.SharedDeadline | None:
        shared = self.shared
        if shared is None and self._share:
            self._share = False  # one attempt per opening; a failure is logged once
            shared = self.shared = sharedbackoff.open_shared_deadline(
                *self.key, directory=self._share_dir
            )
        return shared

    def add_user(self) -> None:
        """A session started using this limiter."""
        with self._lock:
            self._users += 1

    def remove_user(self) -> None:
        """A session using this limiter closed; the last one closes the shared file."""
        with self._lock:
            self._users = max(0, self._users - 1)
            last = self._users == 0
        if last:
            pool("sample-submit").widen(self, 0)  # the pool's extra width goes with the tenant
            self.close_shared()

    def close_shared(self) -> None:
        """Close the shared deadline file (it is opened again on next use)."""
        with self._lock:
            shared, self.shared = self.shared, None
            if shared is not None:
                self._share = True
        if shared is not None:
            shared.close()
        self.tenant.close_shared()

    def backoff_remaining(self) -> float:
        """Seconds until the deadline (this process's or another's), 0 when passed."""
        now = self.clock.monotonic()
        with self._lock:
            self._merge_shared_locked(now)
            return max(0.0, self.backoff_until - now)

    def recently_backed_off(self) -> bool:
        return self.clock.monotonic() < self.backoff_until + RECENT_BACKOFF_S

    # ---------------------------------------------------------------- dispatch

    def enqueue(self, ticket: Ticket) -> None:
        """Queue a ticket behind its owner's earlier ones; it starts when admitted."""
        with self._lock:
            self._shared_file()  # a new dispatch: (re)open the shared deadline
            narrowed, width = self._forget_stale_latencies_locked(self.clock.monotonic())
            queue = self._queues.get(ticket.owner)
            if queue is None:
                # Created holding the ticket: the ring never gets an empty queue of ours.
                self._queues[ticket.owner] = collections.deque((ticket,))
                front = next(iter(self._queues))
                if front == self._last_served and front != ticket.owner:
                    # The owner served last is only at the front because it was alone: the
                    # newcomer takes the next turn.
                    self._queues.move_to_end(front)
            else:
                queue.append(ticket)
            busy = self._senders_busy_locked()
        if narrowed:
            pool("sample-submit").widen(self, width)
        if not busy:
            self.pump()

    def _senders_busy_locked(self) -> bool:
        """Every sender is taken and no stop is due: a pump now admits nobody, and the pump
        that frees a sender (sender_done, the deadline's timer, a wake) comes anyway."""
        return self._active + self._parked >= self.send_width and not self._stopping

    def claim(self, ticket: Ticket) -> bool:
        """The send step's first call: True for exactly one claim per admission (HELD ->
        SENDING); False for a repeated start(), or once the ticket was stopped."""
        with self._lock:
            if ticket.state is not HELD:
                return False
            # One step (plain stores, nothing a signal can interrupt in between).
            ticket.sending += 1
            self._active += 1
            self._parked -= 1
            ticket.state = SENDING
            return True

    def hold(self, ticket: Ticket) -> None:
        """Park a claimed ticket that keeps its gates (after a 429, or to wait for the deadline)."""
        with self._lock:
            if ticket.state is not SENDING:
                return  # parked already
            self._held.append(ticket)  # the index first: a stale entry is skipped, never lost
            ticket.round += 1
            self._parked += 1
            ticket.state = HELD
        self.pump()

    def release(self, ticket: Ticket) -> None:
        """Return a ticket's gates (idempotent) and admit the next tickets.

        The ticket keeps its sender slot until :meth:`sender_done` (its send step returned).
        """
        sample_bytes, _, _ = self._budgets()
        with self._lock:
            if ticket.cost is None:
                return
            self._return_gates_locked(ticket, sample_bytes)
            # Still in its send step (sender_done pumps next) while every sender is taken.
            if ticket.sending > 0 and self._senders_busy_locked():
                return
        self.pump()

    def _return_gates_locked(self, ticket: Ticket, sample_bytes: ByteBudget) -> None:
        # Plain stores only: idempotent (cost None), and done as one step.
        cost = ticket.cost
        if cost is not None:
            sample_bytes.remaining += cost
            self._count += 1
            if ticket.backed_off:
                self._backed_off_count += 1
            ticket.backed_off = False
            ticket.cost = None

    def sender_done(self, ticket: Ticket) -> None:
        """The ticket's send step has returned: its sender may take the next ticket."""
        with self._lock:
            if ticket.sending <= 0:
                return
            ticket.sending -= 1
            self._active -= 1
        self.pump()

    def pump(self) -> None:
        """Admit queued tickets round-robin, start held ones once the deadline has passed.

        Safe against an exception raised at any call (a signal handler's, on the main thread):
        every transition is one step on the ticket's state; whatever an interrupted pump left
        undone, the next pump on any thread does (docs/limiter.md#signals).
        """
        issue: list[tuple[Ticket, int]] = []
        sample_bytes, _, _ = self._budgets()
        with self._lock:
            if not self._queues and not self._held and not self._stopping:
                return  # nothing to admit, start or deliver: the deadline is read when needed
            now = self.clock.monotonic()
            self._merge_shared_locked(now, reopen=False)
            self._admit_locked(now, sample_bytes)
            if self._held and not self._parked:
                # No HELD ticket: every entry is stale (claimed or stopped). The state and the
                # counter change in one step, so clearing here drops nothing.
                self._held.clear()
            if self._held:
                if now >= self.backoff_until:
                    kept: collections.deque[Ticket] = collections.deque()
                    seen: set[int] = set()
                    due: list[Ticket] = []  # HELD, and no start() returned for this round
                    probing = False  # a HELD ticket already holds the tenant's probe
                    for ticket in self._held:
                        if ticket.state is HELD and id(ticket) not in seen:
                            seen.add(id(ticket))
                            kept.append(ticket)
                            probing = probing or ticket.probe
                            if ticket.issued != ticket.round:
                                due.append(ticket)
                    self._held = kept  # one store; claimed entries go at the next scan
                    if due:
                        # The breaker (docs/health.md): every held ticket while the circuit
                        # is closed, else only the one probe. A probe whose start() never
                        # returned is issued again, and no second probe is taken meanwhile;
                        # turn() marks the probe ticket in the step that takes the probe.
                        # Lock order: limiter, then tenant.
                        if probing:
                            turn = Turn.WAIT if self.tenant.is_open() else Turn.SEND
                        else:
                            turn = self.tenant.turn(due[0])
                        for ticket in due:
                            if turn is Turn.SEND or ticket.probe:
                                issue.append((ticket, ticket.round))
                else:
                    self._schedule_locked(now)
        if self._stopping:  # appended under the lock (by this pump, or a wake() that delivers
            self._deliver_stops()  # them itself): an empty index needs no second lock
        for ticket, round_ in issue:
            # Issued until start() returned: if it never does (an exception), the next pump
            # issues it again, and the extra start finds the claim taken.
            ticket.start(ticket)
            ticket.issued = round_

    def _admit_locked(self, now: float, sample_bytes: ByteBudget) -> None:
        queues = self._queues
        send_width = self.send_width
        while queues:
            owner, queue = next(iter(queues.items()))
            if not queue:
                del queues[owner]
                continue
            ticket = queue[0]
            if ticket.state is not QUEUED:  # admitted or stopped; an exception cut the cleanup
                self._advance_locked(owner, queue)
                continue
            recent = now < self.backoff_until + RECENT_BACKOFF_S
            closed = (
                self._active + self._parked >= send_width
                or self._count <= 0
                or (recent and self._backed_off_count <= 0)
                or sample_bytes.remaining < 0
            )
            if closed and ticket.asked == self._wakes and now - ticket.asked_at < STOP_RECHECK_S:
                return  # asked since the last wake(), and not long ago (docs/limiter.md)
            stop = ticket.stop_reason()
            if stop is None:
                if closed:
                    ticket.asked = self._wakes
                    ticket.asked_at = now
                    return  # every gate is ticket-independent: nobody else would pass either
                cost = ticket.estimate * BACKED_OFF_BYTE_PENALTY if recent else ticket.estimate
                self._held.append(ticket)  # the index first: a stale entry is skipped
                # The admission, as one step (plain stores; a signal cannot land in between):
                self._count -= 1
                if recent:
                    self._backed_off_count -= 1
                ticket.backed_off = recent
                sample_bytes.remaining -= cost
                ticket.cost = cost
                ticket.round += 1
                self._parked += 1
                self._last_served = owner
                ticket.state = HELD
            else:
                self._stopping.append((ticket, stop))  # the index first
                self._last_served = owner
                ticket.state = STOPPED
            self._advance_locked(owner, queue)

    def _advance_locked(self, owner: Hashable, queue: collections.deque[Ticket]) -> None:
        # Drop the queue's head (no longer QUEUED); round-robin: the owner served last waits a
        # turn. Repeating it after an interruption is harmless: the head is checked first.
        queue.popleft()
        if not queue:
            del self._queues[owner]
        elif owner == self._last_served:
            self._queues.move_to_end(owner)

    def _deliver_stops(self) -> None:
        """Call on_stop for stopped tickets, each at most once (claimed under the lock)."""
        sample_bytes, _, _ = self._budgets()
        while True:
            with self._lock:
                if not self._stopping:
                    return
                ticket, exc = self._stopping[0]
                deliver = ticket.state is STOPPED
                probe = deliver and ticket.probe
                if deliver:
                    self._return_gates_locked(ticket, sample_bytes)
                    ticket.probe = False
                    ticket.state = FINISHED
                self._stopping.popleft()
            if probe:  # stopped holding the tenant's probe, never sent: the next one probes
                self.tenant.abandon_probe()
            if deliver:
                ticket.on_stop(exc)

    def _schedule_locked(self, now: float) -> None:
        due = self.backoff_until
        if self._timer_due is not None and self._timer_due <= due:
            return
        call_later(self.clock, due - now, "sample-submit", self._timer_fired)
        self._timer_due = due  # after: an interrupted call_later leaves no phantom timer

    def _timer_fired(self) -> None:
        with self._lock:
            self._timer_due = None
        self.pump()

    def wake(self, *, everything: bool = True) -> None:
        """Stop tickets whose ``stop_reason`` is set (after a cancel or close), wake waiters.

        Held tickets and the head of each queue are always checked; ``everything`` also
        checks every queued ticket (close), which a single cancel does not need.
        """
        with self._lock:
            self._wakes += 1
            self._gates_changed.notify_all()
            for ticket in self._held:
                if ticket.state is HELD:
                    stop = ticket.stop_reason()
                    if stop is not None:
                        self._stopping.append((ticket, stop))  # the index first
                        self._parked -= 1
                        ticket.state = STOPPED
            if everything:
                for queue in self._queues.values():
                    for ticket in queue:
                        if ticket.state is QUEUED:
                            stop = ticket.stop_reason()
                            if stop is not None:
                                self._stopping.append((ticket, stop))
                                ticket.state = STOPPED  # its queue entry goes at its turn
        self._deliver_stops()
        self.pump()

    # ---------------------------------------------------------------- other gates

    @contextmanager
    def fwdbwd_bytes(self, estimated_bytes: int) -> Iterator[None]:
        """Hold forward/backward dispatch bytes for one chunk's send."""
        _, budget, _ = self._budgets()
        with self._lock:
            self._wait_gate(lambda: budget.remaining >= 0, lambda: None)
            budget.remaining -= estimated_bytes
        try:
            yield
        finally:
            with self._lock:
                budget.remaining += estimated_bytes
                self._gates_changed.notify_all()

    def reserve_response_bytes(self, nbytes: int, should_stop: ShouldStop) -> None:
        """Reserve in-flight response bytes for a metadata-only result."""
        _, _, budget = self._budgets()
        with self._lock:
            self._wait_gate(lambda: budget.remaining >= 0, should_stop)
            budget.remaining -= nbytes

    def release_response_bytes(self, nbytes: int) -> None:
        _, _, budget = self._budgets()
        with self._lock:
            budget.remaining += nbytes
            self._gates_changed.notify_all()

    def _wait_gate(self, admitted: Callable[[], bool], should_stop: ShouldStop) -> None:
        # Called with self._lock held.
        while True:
            stop = should_stop()
            if stop is not None:
                raise Stopped(stop)
            if admitted():
                return
            self.clock.wait(self._gates_changed, None)

    def snapshot(self) -> dict[str, Any]:
        """Gate levels and queue lengths, for tests and debugging."""
        sample_bytes, fwdbwd, response = self._budgets()
        with self._lock:
            return {
                "count": self._count,
                "backed_off_count": self._backed_off_count,
                "sample_bytes": sample_bytes.remaining,
                "fwdbwd_bytes": fwdbwd.remaining,
                "response_bytes": response.remaining,
                "backoff_until": self.backoff_until,
                "waiting": sum(
                    ticket.state is QUEUED for queue in self._queues.values() for ticket in queue
                ),
                "held": self._parked,
            }


_registry: dict[tuple[str, str], Limiter] = {}
_registry_lock = threading.Lock()


def limiter_for(normalized_base_url: str, credential_identity: str, clock: Clock) -> Limiter:
    """Get or create the limiter of a key; never replaces an entry."""
    key = (normalized_base_url, credential_identity)
    with _registry_lock:
        limiter = _registry.get(key)
        if limiter is None:
            limiter = Limiter(key, clock, share=True)
            _registry[key] = limiter
        return limiter


def existing_limiter(normalized_base_url: str, credential_identity: str) -> Limiter | None:
    """The limiter of a key if this process made one, else None (creates nothing)."""
    with _registry_lock:
        limiter = _registry.get((normalized_base_url, credential_identity))
    return limiter


def reset_limiters() -> None:
    """Forget every limiter (tests, and in a forked child)."""
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


register_after_fork(reset_limiters)
