"""Tenant health: the circuit breaker and retry budget of one (normalized base URL, credential).

Usage (inside the SDK; one per :class:`~tinker_sync._flow.limiter.Limiter`)::

    tenant = limiter.tenant                     # same key and registry as the limiter
    tenant.success()                            # any answer below 500 but 429 (transport hook)
    tenant.failure(key, "HTTP 503", timeout=False)   # 5xx, connection failure, timeout
    turn = tenant.turn()                        # SEND (closed), PROBE (the one probe), WAIT
    turn = tenant.wait_turn(stop, until)        # the same, blocking on the caller's thread
    tenant.acquire_retry(timeout=False)         # the retry budget: False opens the circuit
    tenant.on_change(limiter.pump)              # parked tickets start when it closes / probes

States (docs/health.md draws them)::

    CLOSED --(open_after failures of >= open_after_distinct requests in failure_window_s,
              no success between; or a retry finds the budget empty)--> OPEN
    OPEN --(the probe delay has passed)--> HALF_OPEN: the next caller sends the one probe
    HALF_OPEN --(a failure, or no answer within probe_lease_s)--> OPEN, next delay doubled
    OPEN / HALF_OPEN --(a success of an attempt sent after the opening)--> CLOSED: the budget
              is full again, parked work resumes

The probe delay is ``min(probe_initial_s * 2^n, probe_max_s) * (1 - probe_jitter * r)``, ``n``
the failed probes so far and ``r`` the SDK clock's injectable random draw. The state is derived
from the clock when asked (a probe is due as soon as its time has passed), and one executor
timer per due probe wakes the parked work (no thread waits for it).

Logs (logger ``tinker_sync.health``): one WARNING when the circuit opens, one INFO when it
closes, and while it stays open one INFO summary at most every ``summary_every_s``; probes and
parked requests are logged at DEBUG only.

Across processes (``share=True``, the limiter registry's tenants): the circuit's opening, its
probe schedule, the one probe's lease and its closing are shared with the user's other
processes of the tenant through :mod:`tinker_sync._flow.sharedcircuit` (docs/health.md#across-
processes). Each record another process wrote is adopted once (wall times turned into this
clock's); the probe is taken under the file's lock; while it is not closed, a real-time check
every :data:`SHARED_CHECK_S` notices another process's answer. Off, or unusable: per process.

Thread safety: every method takes the one lock; listeners and most logs run outside it (the
lines saying another process opened or closed it are logged under it). Fork safety: the
limiter registry (which owns these) is emptied in a forked child, and a child's new tenant
gets its own probe token.
"""

from __future__ import annotations

import collections
import enum
import logging
import math
import os
import random
import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from tinker_sync._config import HealthPolicy
from tinker_sync._flow import sharedbackoff
from tinker_sync._flow.sharedcircuit import (
    CircuitRecord,
    SharedCircuit,
    open_shared_circuit,
    plausible,
)
from tinker_sync._runtime.clock import REAL_CLOCK, Clock
from tinker_sync._runtime.executor import call_later
from tinker_sync._runtime.fork import make_condition, make_lock
from tinker_sync._runtime.redact import scrub
from tinker_sync.exceptions import CircuitOpenError

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "TenantHealth", "Turn", "shared_max_ahead"]

log = logging.getLogger("tinker_sync.health")

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
Schedule = Callable[..., Any]
#: A blocked waiter re-checks its stop condition at least this often (seconds).
WAIT_SLICE_S = 1.0
#: While the probe is out, a blocked waiter re-checks its stop condition and the probe's lease
#: this often (real seconds: the probe's answer comes over the network, not from the clock).
PROBE_WAIT_SLICE_S = 0.5
#: While the circuit is not closed, the shared record is read again this often (real seconds):
#: how soon another process's answer (or its probe's end) is noticed here.
SHARED_CHECK_S = 0.5
#: The shared checks stop once no request of this process has asked for a turn for this long
#: (real seconds): an idle process (its clients closed) keeps no timer running; the next
#: request's turn starts them again.
SHARED_CHECK_IDLE_S = 10.0


class Turn(enum.Enum):
    """What a request may do now: send, send as the one probe, or wait."""

    SEND = "send"
    PROBE = "probe"
    WAIT = "wait"


class ProbeHolder(Protocol):
    """What :meth:`TenantHealth.turn` marks as the probe (a limiter ticket)."""

    probe: bool


class TenantHealth:
    """Circuit breaker and retry budget of one tenant; see the module docs."""

    def __init__(
        self,
        key: tuple[str, str],
        clock: Clock,
        *,
        schedule: Schedule = call_later,
        share: bool = False,
        directory: str | None = None,
    ) -> None:
        self.key = key
        #: ``schedule(clock, delay, role, fn, *args)``: the executor's timer (tests record it).
        self._schedule = schedule
        self.url = scrub(key[0])
        self.clock = clock
        self.policy = HealthPolicy()
        self._configured = False
        self._lock = make_lock()
        self._changed = make_condition(self._lock)
        self._state = CLOSED
        #: (time, request key) of the failed attempts since the last success.
        self._failures: collections.deque[tuple[float, Hashable]] = collections.deque()
        self.opened_at: float | None = None
        self.opened_wall: float | None = None
        self.reason = ""
        self.last_failure = ""
        self._failed_probes = 0
        self._probe_due = math.inf
        self._probe_sent: float | None = None
        self._probe_gen = 0
        self.tokens = self.policy.retry_capacity
        #: Exact counters (tests, pending(), the summary line).
        self.successes = 0
        self.failures = 0
        self.opens = 0
        self.probes = 0
        self.expired_probes = 0  # probes whose lease ended before they reported
        self.stale_successes = 0  # answers to attempts sent before the opening (not closing)
        self.waiting = 0
        self._last_summary = -math.inf
        self._listeners: list[Callable[[], object]] = []
        #: A server-declared pause per queue kind: its state, the poll holding the one turn,
        #: and when the next poll may go out (pause_turn).
        self._paused: dict[str, str] = {}
        self._pause_holder: dict[str, object] = {}
        self._pause_next: dict[str, float] = {}
        self._pause_last: dict[str, object] = {}  # the poll that held the turn last
        self._pause_changed = make_condition(self._lock)
        #: Polls waiting for their turn while their queue is paused (tests, pending()).
        self.pause_waiting = 0
        #: The circuit shared with the user's other processes (module docs): opened on first
        #: use, in the directory and under the switch read at construction.
        self._share = share and sharedbackoff.enabled()
        self._share_dir = directory
        self._shared: SharedCircuit | None = None
        #: The record last written or adopted here: each record is honoured once.
        self._seen: CircuitRecord | None = None
        self._epoch = 0  # the shared epoch of the last opening known here
        self._token = (os.getpid() << 32 | random.getrandbits(32)) or 1  # our probe lease
        self._checking = False  # a shared check is scheduled
        self._last_turn = time.monotonic()  # real time of the last turn asked while not closed
        self._remote_probe = False  # another process's probe is out (we wait for its lease)
        self._bad_record_logged = False
        #: Openings and closings adopted from another process (tests, the summary).
        self.adopted_opens = 0
        self.adopted_closes = 0

    @property
    def state(self) -> str:
        """CLOSED, OPEN or HALF_OPEN, as of now on the clock."""
        with self._lock:
            self._advance_locked(self.clock.monotonic())
            return self._state

    # ---------------------------------------------------------------- configuration

    def configure(self, policy: HealthPolicy) -> None:
        """Size this tenant from the first policy seen; later calls are ignored."""
        with self._lock:
            if not self._configured:
                self._configured = True
                self.policy = policy
                self.tokens = policy.retry_capacity

    def on_change(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` (outside the lock) when it closes or a probe falls due."""
        with self._lock:
            self._listeners.append(listener)

    # ---------------------------------------------------------------- outcomes

    def success(self, refund: int | None = None, *, sent_at: float | None = None) -> None:
        """A request got an answer (not 5xx, not 429): refund, and close if not closed.

        ``refund`` (the cost of the retry that succeeded) replaces ``success_refund``.
        ``sent_at`` (this tenant's clock) is when the answered attempt began: an answer to an
        attempt sent before the circuit opened (a long poll the server held through the
        outage) does not close it; the probe decides. None: an answer of now.
        """
        with self._lock:
            self.successes += 1
            policy = self.policy
            self.tokens = min(
                policy.retry_capacity,
                self.tokens + (policy.success_refund if refund is None else refund),
            )
            self._failures.clear()
            if self._state == CLOSED:
                self._close_shared_record_locked()  # opened by another process: an answer
                return
            if sent_at is not None and self.opened_at is not None and sent_at <= self.opened_at:
                self.stale_successes += 1
                return
            now = self.clock.monotonic()
            opened_at = self.opened_at if self.opened_at is not None else now
            failed_probes = self._failed_probes
            self._close_locked()
            listeners = list(self._listeners)
        log.info(
            "the Tinker server at %s answers again: circuit closed after %.0f s "
            "(%d failed probes); parked requests resume",
            self.url,
            now - opened_at,
            failed_probes,
        )
        self._notify(listeners)

    def failure(
        self, key: Hashable, what: str, *, timeout: bool = False, sent_at: float | None = None
    ) -> None:
        """An attempt of request ``key`` failed server-wide (5xx, connection, timeout).

        ``sent_at`` (this tenant's clock): when the attempt began. While the probe is out, a
        failure of an attempt sent before it says nothing of the probe. None: sent now.
        """
        del timeout  # the budget charges timeouts more; the breaker counts them alike
        reason: str | None = None
        summary: str | None = None
        with self._lock:
            self.failures += 1
            self.last_failure = what
            now = self.clock.monotonic()
            self._advance_locked(now)
            policy = self.policy
            if not policy.enabled:
                return
            if self._state == HALF_OPEN and self._probe_sent is not None:
                if sent_at is not None and sent_at < self._probe_sent:
                    return
                self._reopen_locked(now)
                summary = self._summary_due_locked(now)
            elif self._state == CLOSED:
                failures = self._failures
                failures.append((now, key))
                while failures and now - failures[0][0] > policy.failure_window_s:
                    failures.popleft()
                distinct = len({k for _, k in failures})
                if len(failures) < policy.open_after or distinct < policy.open_after_distinct:
                    return
                reason = (
                    f"{len(failures)} failed attempts of {distinct} requests within "
                    f"{policy.failure_window_s:g} s, last: {what}"
                )
                self._open_locked(now, reason)
                summary = None
            else:
                return
        if reason is not None:
            self._log_open(reason)
        if summary is not None:
            log.info("%s", summary)

    # ---------------------------------------------------------------- the retry budget

    def refund(self, tokens: int) -> None:
        """Return ``tokens`` to the budget (the cost of a retry that then succeeded)."""
        with self._lock:
            self.tokens = min(self.policy.retry_capacity, self.tokens + tokens)

    def retry_cost(self, *, timeout: bool) -> int:
        return self.policy.timeout_retry_cost if timeout else self.policy.retry_cost

    def acquire_retry(self, *, timeout: bool) -> bool:
        """Spend the cost of one retry; an empty bucket opens the circuit and says False."""
        with self._lock:
            policy = self.policy
            if not policy.enabled:
                return True
            cost = policy.timeout_retry_cost if timeout else policy.retry_cost
            if self.tokens >= cost:
                self.tokens -= cost
                return True
            if self._state != CLOSED:
                return False
            reason = (
                f"the retry budget is spent ({self.tokens} of {policy.retry_capacity} tokens "
                f"left), last: {self.last_failure or 'unknown'}"
            )
            self._open_locked(self.clock.monotonic(), reason)
        self._log_open(reason)
        return False

    # ---------------------------------------------------------------- admission

    def turn(self, holder: ProbeHolder | None = None) -> Turn:
        """SEND while closed; PROBE for the first caller once a probe is due; else WAIT.

        ``holder.probe`` is set True in the same step that takes the probe, so an exception
        raised right after this returns (a signal handler's) cannot lose whom it went to.
        """
        if self._state == CLOSED and self._nothing_new():
            return Turn.SEND  # the fast path: closed, and no other process wrote the record
        with self._lock:
            # Not ``return`` inside ``with``: an exception raised right after a returning call
            # there (a signal handler's) would skip the lock's exit and leave it held.
            turn = self._turn_locked(self.clock.monotonic(), holder)
        return turn

    def is_open(self) -> bool:
        """Whether requests are parked now (open, or half-open with the probe out)."""
        if self._state == CLOSED and self._nothing_new():
            return False  # the fast path: no lock, no clock
        with self._lock:
            now = self.clock.monotonic()
            self._advance_locked(now)
            return self._state != CLOSED and self.policy.enabled

    def wait_turn(
        self,
        stop: Callable[[], BaseException | None] | None = None,
        until: float = math.inf,
        *,
        fail_fast: bool = False,
    ) -> Turn:
        """Block the calling thread until it may send (SEND or PROBE), or return WAIT once
        ``until`` (monotonic) has passed. Raises ``stop()``'s exception, or
        :class:`CircuitOpenError` at once when ``fail_fast`` and the circuit is open."""
        counted = False
        try:
            while True:
                reason = stop() if stop is not None else None
                if reason is not None:
                    raise reason
                with self._lock:
                    now = self.clock.monotonic()
                    turn = self._turn_locked(now)
                    if turn is not Turn.WAIT:
                        return turn
                    if fail_fast:
                        raise self._open_error_locked()
                    if now >= until:
                        return Turn.WAIT
                    if not counted:
                        counted = True
                        self.waiting += 1
                    if (
                        self._state == HALF_OPEN and self._probe_sent is not None
                    ) or self._remote_probe:
                        # The probe is out (here or in another process): its answer is an
                        # event, not a time. Wait for the
                        # report (success, failure, abandon) in real time, so that an injected
                        # virtual clock does not run ahead while the probe is in flight and
                        # expire its lease (or the caller's stall budget) before it answers.
                        self._changed.wait(PROBE_WAIT_SLICE_S)
                        continue
                    wait = min(WAIT_SLICE_S, until - now, max(self._probe_due - now, 0.0))
                    self.clock.wait(self._changed, wait)
        finally:
            if counted:
                with self._lock:
                    self.waiting -= 1

    def open_error(self) -> CircuitOpenError:
        """The :class:`CircuitOpenError` describing the current opening."""
        with self._lock:
            error = self._open_error_locked()
        return error  # not returned inside the with (see turn())

    def abandon_probe(self) -> None:
        """The probe was granted but will not be sent (stopped): the next caller probes."""
        with self._lock:
            if self._state != HALF_OPEN or self._probe_sent is None:
                return
            self._probe_sent = None
            self._release_lease_locked()
            self._changed.notify_all()
            listeners = list(self._listeners)
        self._notify(listeners)

    def close_shared(self) -> None:
        """Close the shared circuit file (it is opened again on next use)."""
        with self._lock:
            shared, self._shared = self._shared, None
            if shared is not None:
                self._share = True
                self._seen = None
        if shared is not None:
            shared.close()

    def snapshot(self) -> dict[str, object]:
        """State, counters and budget (tests, pending(), the CLI)."""
        with self._lock:
            now = self.clock.monotonic()
            self._advance_locked(now)
            return {
                "state": self._state,
                "since": self.opened_wall,
                "open_for": None if self.opened_at is None else now - self.opened_at,
                "reason": self.reason,
                "last_failure": self.last_failure,
                "tokens": self.tokens,
                "successes": self.successes,
                "failures": self.failures,
                "opens": self.opens,
                "probes": self.probes,
                "failed_probes": self._failed_probes,
                "expired_probes": self.expired_probes,
                "stale_successes": self.stale_successes,
                "next_probe_in": (max(0.0, self._probe_due - now) if self._state == OPEN else None),
                "waiting": self.waiting,
                "paused": dict(self._paused),
            }

    # ---------------------------------------------------------------- a server-declared pause

    def pause_turn(self, kind: str, who: object, stopped: Callable[[], bool]) -> bool:
        """Before a poll of a ``kind`` ("sampling", "training") future: while the server says
        that queue is paused, one poll of the tenant at a time goes out, at most
        ``paused_polls_per_s`` a second; the others wait here, on their thread, until the pause
        ends or it is their turn. False when ``stopped()`` says so meanwhile (docs/health.md).
        A True answer must be followed by :meth:`pause_report` (the turn is held till then).
        While the queue is not paused it returns True at once, without asking ``stopped()``
        (the caller has just checked its own stop).
        """
        if kind not in self._paused:
            return True  # the fast path: no pause declared (a dict lookup; no lock)
        while True:
            if stopped():
                return False
            with self._lock:
                rate = self.policy.paused_polls_per_s
                if not self.policy.enabled or rate <= 0 or kind not in self._paused:
                    return True
                holder = self._pause_holder.get(kind)
                if holder is not None and holder is not who:
                    # Waits for an answer of the poll out (an event): real time, not the clock.
                    self.pause_waiting += 1
                    try:
                        self._pause_changed.wait(PROBE_WAIT_SLICE_S)
                    finally:
                        self.pause_waiting -= 1
                    continue
                # Alone (no other poll waits, it polled last), a poll keeps its own pace
                # (docs/polling.md); otherwise turns are spaced 1 / paused_polls_per_s apart.
                alone = self.pause_waiting == 0 and self._pause_last.get(kind, who) is who
                self._pause_holder[kind] = self._pause_last[kind] = who
                delay = (
                    0.0 if alone else self._pause_next.get(kind, -math.inf) - self.clock.monotonic()
                )
            if delay > 0:
                self.clock.sleep(delay, "poll:paused")
            return True

    def pause_report(self, kind: str, who: object, *, paused: str | None, answered: bool) -> None:
        """After a poll of ``kind`` (it gives its turn back): ``paused`` is the paused queue
        state it was answered with, else None; ``answered`` whether its answer says the queue
        is not paused (a result, an error of the request, an active queue state), which ends
        the pause and wakes every waiting poll. Other outcomes (5xx, no state) change nothing.
        """
        if paused is None and kind not in self._paused and kind not in self._pause_holder:
            return  # the fast path: no pause declared, no turn held; nobody waits for one
        with self._lock:
            now = self.clock.monotonic()
            if self._pause_holder.get(kind) is who:
                del self._pause_holder[kind]
            if paused is not None:
                rate = self.policy.paused_polls_per_s
                if rate > 0:
                    self._paused[kind] = paused
                    self._pause_next[kind] = now + 1.0 / rate
                self._pause_changed.notify()  # the next poll takes the turn
            elif answered:
                self._paused.pop(kind, None)
                self._pause_next.pop(kind, None)
                self._pause_last.pop(kind, None)
                self._pause_changed.notify_all()  # the pause is over: everyone polls
            else:
                self._pause_changed.notify()

    def paused(self, kind: str) -> str | None:
        """The paused queue state the server last declared for ``kind``, or None."""
        with self._lock:
            state = self._paused.get(kind)
        return state  # not returned inside the with (see turn())

    # ---------------------------------------------------------------- internals (lock held)

    def _advance_locked(self, now: float) -> None:
        self._sync_locked(now)
        self._step_locked(now)

    def _step_locked(self, now: float) -> None:
        if self._state == OPEN and now >= self._probe_due:
            self._state = HALF_OPEN
            self._remote_probe = False
            self._probe_sent = None
        elif (
            self._state == HALF_OPEN
            and self._probe_sent is not None
            and now - self._probe_sent >= self.policy.probe_lease_s
        ):
            self.expired_probes += 1
            self._reopen_locked(now)  # the probe got no answer in time: it failed
            self._step_locked(now)

    def _turn_locked(self, now: float, holder: ProbeHolder | None = None) -> Turn:
        if not self.policy.enabled:
            return Turn.SEND
        self._advance_locked(now)
        if self._state == CLOSED:
            return Turn.SEND
        self._last_turn = time.monotonic()
        self._start_checks_locked()
        if self._state == HALF_OPEN and self._probe_sent is None:
            if not self._claim_probe_locked(now):
                return Turn.SEND if self._state == CLOSED else Turn.WAIT
            self._probe_sent = now
            if holder is not None:
                holder.probe = True  # plain stores, one step with taking the probe
            self.probes += 1
            # No timer for the lease: a timer on a virtual clock would move it by the whole
            # lease at once and fail a probe still in flight. Every probe reports (an answer of
            # any status or a transport error, or abandon_probe()); the lease is a backstop
            # that the next caller checks (_advance_locked).
            log.debug("probing the Tinker server at %s (probe %d)", self.url, self.probes)
            return Turn.PROBE
        return Turn.WAIT

    def _open_locked(self, now: float, reason: str) -> None:
        self._state = OPEN
        self.opens += 1
        self.opened_at = now
        self.opened_wall = self.clock.time()
        self.reason = reason
        self._failed_probes = 0
        self._failures.clear()
        self._last_summary = now
        self._schedule_probe_locked(now)
        self._publish_open_locked(now)

    def _reopen_locked(self, now: float) -> None:
        self._failed_probes += 1
        self._state = OPEN
        self._schedule_probe_locked(now)
        self._publish_reopen_locked(now)

    def _close_locked(self, *, publish: bool = True) -> None:
        self._state = CLOSED
        self._remote_probe = False
        self.opened_at = None
        self.opened_wall = None
        self.reason = ""
        self._failed_probes = 0
        self._probe_due = math.inf
        self._probe_sent = None
        self._probe_gen += 1
        self.tokens = self.policy.retry_capacity
        self._changed.notify_all()
        if publish:
            self._publish_close_locked()

    def probe_delay(self, failed_probes: int) -> float:
        """Seconds from an opening (or a failed probe) to the next probe."""
        policy = self.policy
        base = min(policy.probe_initial_s * 2.0 ** min(failed_probes, 64), policy.probe_max_s)
        return base * (1.0 - policy.probe_jitter * self.clock.random())

    def _schedule_probe_locked(self, now: float) -> None:
        self._schedule_wake_locked(now, self.probe_delay(self._failed_probes))

    def _schedule_wake_locked(self, now: float, delay: float) -> None:
        self._probe_due = now + delay
        self._remote_probe = False
        self._probe_sent = None
        self._probe_gen += 1
        self._schedule(self.clock, delay, "sample-submit", self._wake, self._probe_gen)
        self._start_checks_locked()

    def _wake(self, gen: int) -> None:
        """Timer: a probe fell due (or a probe's lease ended); wake the parked work."""
        with self._lock:
            if gen != self._probe_gen:
                return
            self._advance_locked(self.clock.monotonic())
            self._changed.notify_all()
            listeners = list(self._listeners)
        self._notify(listeners)

    # ---------------------------------------------------------------- across processes (lock held)

    def _shared_file(self) -> SharedCircuit | None:
        shared = self._shared
        if shared is None and self._share and self.policy.enabled:
            self._share = False  # one attempt per opening; a failure is logged once
            shared = self._shared = open_shared_circuit(*self.key, directory=self._share_dir)
        return shared

    def _max_ahead(self) -> float:
        return shared_max_ahead(self.policy)

    def _plausible(self, record: CircuitRecord | None, wall: float) -> bool:
        if record is None:
            return False
        if plausible(record, wall, self._max_ahead()):
            return True
        if not self._bad_record_logged:
            self._bad_record_logged = True
            log.debug("ignoring an implausible shared circuit record of %s", self.url)
        return False

    def _nothing_new(self) -> bool:
        """Without this tenant's lock: nothing for :meth:`_sync_locked` to adopt (no shared
        file to open, or the file still holds the bytes of the record last seen).

        With ``self._state == CLOSED`` read just before, the closed state needs no lock:
        the clock moves only an open circuit, and only a slow path (under the lock) or a
        record another process wrote (which this check sees) opens it.
        """
        shared = self._shared
        if shared is None:
            return not (self._share and self.policy.enabled)  # else: the file is opened first
        return shared.holds(self._seen)

    def _sync_locked(self, now: float) -> None:
        """Adopt a record another process wrote since we last looked (honoured once)."""
        shared = self._shared_file()
        if shared is None:
            return
        record = shared.read()
        seen = self._seen
        if record is None or record is seen:
            return
        self._seen = record
        if record == seen:
            return  # the same record, decoded again: now the object the fast path compares
        self._adopt_locked(record, now)

    def _adopt_locked(self, record: CircuitRecord, now: float) -> None:
        wall = self.clock.time()
        if not self._plausible(record, wall):
            return
        if record.state == CLOSED:
            if self._state != CLOSED and record.epoch >= self._epoch:
                self._epoch = record.epoch
                self.adopted_closes += 1
                self._close_locked(publish=False)
                log.info(
                    "the Tinker server at %s answers again: circuit closed by another process "
                    "of this tenant; parked requests resume",
                    self.url,
                )
            self._epoch = max(self._epoch, record.epoch)
            return
        if record.epoch < self._epoch or (record.epoch == self._epoch and self._state == CLOSED):
            return  # an opening that was closed here (its closing did not reach the file)
        if record.epoch > self._epoch or self._state == CLOSED:
            self._epoch = record.epoch
            self.opens += 1
            self.adopted_opens += 1
            self._state = OPEN
            self.opened_at = now - max(0.0, wall - record.opened_wall)
            self.opened_wall = record.opened_wall
            self.reason = record.reason
            self._failures.clear()
            self._last_summary = now
            log.warning(
                "the Tinker server at %s is failing (%s): circuit opened by another process "
                "of this tenant; this tenant's requests wait",
                self.url,
                record.reason,
            )
        self._follow_locked(record, now, wall)

    def _follow_locked(self, record: CircuitRecord, now: float, wall: float) -> None:
        """Take an open record's probe schedule (and another process's probe) as ours."""
        self._failed_probes = record.failed_probes
        if record.lease_owner == self._token and self._probe_sent is not None:
            return  # our own probe is out
        self._state = OPEN
        if record.probe_out(wall) and _alive(record.lease_owner):
            # Another process's probe: wait for its answer (the shared checks see it), for
            # its lease at most. A real-time timer: the lease ends in real time, and a timer
            # on an injected virtual clock would move that clock by the whole lease at once.
            remaining = record.lease_wall - wall
            self._probe_due = now + remaining
            self._probe_sent = None
            self._probe_gen += 1
            self._remote_probe = True
            self._schedule(REAL_CLOCK, remaining, "sample-submit", self._wake, self._probe_gen)
            self._start_checks_locked()
        else:
            self._schedule_wake_locked(now, max(0.0, record.probe_wall - wall))
        self._step_locked(now)

    def _claim_probe_locked(self, now: float) -> bool:
        """Take the tenant's one probe across processes (under the file's lock): False when
        another process's probe is out, its schedule is later, or it closed the circuit."""
        shared = self._shared_file()
        if shared is None:
            return True
        claimed = False

        def change(current: CircuitRecord | None) -> CircuitRecord | None:
            nonlocal claimed
            if current is not None and current != self._seen:
                self._seen = current
                self._adopt_locked(current, now)
                if self._state != HALF_OPEN or self._probe_sent is not None:
                    return None
            wall = self.clock.time()
            if current is not None and current.lease_owner not in (0, self._token):
                self.expired_probes += 1  # its prober never reported (it crashed, or hangs)
            claimed = True
            return self._record_locked(
                "open", wall, probe_wall=wall, lease_wall=wall + self.policy.probe_lease_s
            )

        try:
            written = shared.update(change)
        except (OSError, ValueError) as exc:  # e.g. the file vanished: per process now
            log.debug("could not share the circuit of %s: %s", self.url, exc)
            return True
        if claimed:
            self._seen = written
        return claimed

    def _record_locked(
        self, state: str, wall: float, *, probe_wall: float = 0.0, lease_wall: float = 0.0
    ) -> CircuitRecord:
        return CircuitRecord(
            state,
            self._epoch,
            self._failed_probes,
            self.opened_wall if self.opened_wall is not None else wall,
            probe_wall,
            lease_wall,
            wall,
            self._token if lease_wall else 0,
            self.reason,
        )

    def _write_locked(self, change: Callable[[CircuitRecord | None], CircuitRecord | None]) -> None:
        shared = self._shared_file()
        if shared is None:
            return
        try:
            written = shared.update(change)
        except (OSError, ValueError) as exc:
            log.debug("could not share the circuit of %s: %s", self.url, exc)
            return
        if written is not None:
            self._seen = written

    def _publish_open_locked(self, now: float) -> None:
        def change(current: CircuitRecord | None) -> CircuitRecord | None:
            wall = self.clock.time()
            if (
                current is not None
                and current.state == OPEN
                and current.epoch >= self._epoch
                and current != self._seen
                and self._plausible(current, wall)
            ):
                self._seen = current  # another process opened it first: follow its schedule
                self._epoch = current.epoch
                self.opened_at = now - max(0.0, wall - current.opened_wall)
                self.opened_wall = current.opened_wall
                self.reason = current.reason
                self._follow_locked(current, now, wall)
                return None
            self._epoch = max(self._epoch, current.epoch if current is not None else 0) + 1
            return self._record_locked(OPEN, wall, probe_wall=wall + self._probe_due - now)

        self._write_locked(change)

    def _publish_reopen_locked(self, now: float) -> None:
        def change(current: CircuitRecord | None) -> CircuitRecord | None:
            wall = self.clock.time()
            if current is not None and (
                current.state != OPEN
                or current.epoch != self._epoch
                or current.lease_owner not in (0, self._token)
            ):
                return None  # closed, reopened or probed elsewhere: adopted at the next look
            return self._record_locked(OPEN, wall, probe_wall=wall + self._probe_due - now)

        self._write_locked(change)

    def _publish_close_locked(self) -> None:
        def change(current: CircuitRecord | None) -> CircuitRecord | None:
            if current is None or current.state != OPEN:
                return None
            self._epoch = max(self._epoch, current.epoch)
            return CircuitRecord(
                CLOSED,
                self._epoch,
                0,
                current.opened_wall,
                changed_wall=self.clock.time(),
                reason=current.reason,
            )

        self._write_locked(change)

    def _close_shared_record_locked(self) -> None:
        """A success while closed here: close the record if another process opened it."""
        shared = self._shared_file()
        if shared is None:
            return
        seen = self._seen
        record = seen if shared.holds(seen) else shared.read()  # unchanged: no decode
        if record is not None and record.state == OPEN:
            self._publish_close_locked()

    def _release_lease_locked(self) -> None:
        def change(current: CircuitRecord | None) -> CircuitRecord | None:
            if current is None or current.lease_owner != self._token or current.state != OPEN:
                return None
            return self._record_locked(OPEN, self.clock.time(), probe_wall=current.probe_wall)

        if self._shared is not None:
            self._write_locked(change)

    def _start_checks_locked(self) -> None:
        if self._checking or self._shared is None:
            return
        self._checking = True
        # Real time: reading another process's answer is no wait the injected clock may skip.
        self._schedule(REAL_CLOCK, SHARED_CHECK_S, "sample-submit", self._check)

    def _check(self) -> None:
        """Timer: while not closed, look at the shared record; wake the parked work."""
        with self._lock:
            self._checking = False
            if self._state == CLOSED:
                return
            self._advance_locked(self.clock.monotonic())
            if self._state != CLOSED and time.monotonic() - self._last_turn < SHARED_CHECK_IDLE_S:
                self._start_checks_locked()
            self._changed.notify_all()
            listeners = list(self._listeners)
        self._notify(listeners)

    def _summary_due_locked(self, now: float) -> str | None:
        if now - self._last_summary < self.policy.summary_every_s:
            return None
        self._last_summary = now
        opened = self.opened_at if self.opened_at is not None else now
        return (
            f"the Tinker server at {self.url} is still failing: circuit open for "
            f"{now - opened:.0f} s, {self._failed_probes} failed probes, {self.waiting} "
            f"requests parked, last: {self.last_failure}"
        )

    def _open_error_locked(self) -> CircuitOpenError:
        return CircuitOpenError(
            f"the Tinker server at {self.url} is failing: its circuit is open since "
            f"{_wall(self.opened_wall)} ({self.reason}); nothing was sent",
            since=self.opened_wall,
            reason=self.reason,
        )

    def _log_open(self, reason: str) -> None:
        log.warning(
            "the Tinker server at %s is failing (%s): circuit open; this tenant's requests wait "
            "and one probe at a time goes out (at most every %g s)",
            self.url,
            reason,
            self.policy.probe_max_s,
        )

    def _notify(self, listeners: list[Callable[[], object]]) -> None:
        for listener in listeners:
            try:
                listener()
            except Exception:
                log.exception("tenant health listener failed")


def _alive(token: int) -> bool:
    """Whether the process that took a probe lease (its pid: the token's high bits) may still
    run: False only when no such process exists here (it crashed), so its lease ends now."""
    pid = token >> 32
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process, or no permission to ask: assume it runs
        return True
    return True


def _wall(wall: float | None) -> str:
    if wall is None:
        return "unknown"
    import time

    return time.strftime("%H:%M:%S", time.gmtime(wall)) + " UTC"


def shared_max_ahead(policy: HealthPolicy) -> float:
    """How far ahead a shared record's probe or lease time may lie and still be believed."""
    return max(policy.probe_max_s, policy.probe_lease_s) + sharedbackoff.MAX_SHARED_WAIT_S
