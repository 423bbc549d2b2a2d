"""Visible, bounded waits: the "cannot reach the server" warning, stall deadlines, pending(),
liveness (docs/health.md#liveness).

Usage (inside the SDK)::

    health = Health("https://host", clock)       # one per Session
    Transport(..., hooks=(*user_hooks, health.observe))   # sees every attempt's outcome
    health.reached                               # the server has answered (any status) before
    progress = health.track("req-1", "ForwardBackward")   # poll loops record what they see
    progress.attempts += 1; health.forget("req-1")
    health.watch(poller)                         # tracked() adds poller.progress() (a weak ref)
    progress.answered("try_again", clock)        # the server's last answer and its time
    entry = pending_entry(kind, rid, age, [progress], clock, tenant_state(health.tenant, url))
    watch = StallWatch(clock, 600.0, "forward_backward")  # one per pending call or poll loop
    watch.useful()                               # an answer that is not a failure
    err = watch.unhealthy(exc)                   # a StalledError once 600 s passed, else None

The warning goes through ``logging`` (logger ``tinker_sync.health``) at the first failed connect
of a streak (or at the second failure in a row when replies are lost on open connections:
resets, read timeouts, 502/503/504), naming the base URL (user info and secrets scrubbed) and
what is pending; then at most once a minute while the streak lasts, and never more than once a
minute across streaks (a flapping network recovers and fails many times a minute); an INFO line
says when the server answers again (only after a warning).

A *stall* is a call with no useful answer for ``stall_timeout`` seconds: every attempt since the
last useful answer was a connection error, a timeout or a 5xx. :class:`StallWatch` turns that
into a :class:`~tinker_sync.exceptions.StalledError` naming the last status or error and the
server's last words.

Thread safety: :class:`Health` is lock-guarded; a :class:`StallWatch` belongs to one loop.
Fork safety: plain state; a forked child's session starts afresh.
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from tinker_sync._config import HealthPolicy
from tinker_sync._flow.breaker import shared_max_ahead
from tinker_sync._flow.sharedbackoff import enabled
from tinker_sync._flow.sharedcircuit import open_shared_circuit, plausible
from tinker_sync._runtime.clock import Clock, exiting
from tinker_sync._runtime.fork import make_lock
from tinker_sync._runtime.redact import scrub
from tinker_sync.exceptions import (
    APIStatusError,
    RequestOutcome,
    StalledError,
    TinkerError,
    server_words,
)

__all__ = [
    "WARN_EVERY_S",
    "Health",
    "PendingFuture",
    "Progress",
    "StallWatch",
    "TenantState",
    "describe_failure",
    "is_unhealthy_status",
    "pending_entry",
    "recorded_tenant_state",
    "tenant_state",
]

if TYPE_CHECKING:
    from tinker_sync._flow.breaker import TenantHealth

log = logging.getLogger("tinker_sync.health")

#: While a server stays unreachable, the warning repeats at most this often.
WARN_EVERY_S = 60.0
_GATEWAY_STATUSES = frozenset({502, 503, 504})
_CONNECT_ERRORS = frozenset({"APIConnectError", "APIConnectTimeoutError"})


def is_unhealthy_status(status: int | None) -> bool:
    """A status that is no useful answer: none at all (transport error) or any 5xx."""
    return status is None or status >= 500


def describe_failure(exc: BaseException) -> str:
    """``HTTP 500: <server's words>`` or ``APIConnectError: <reason>``: bounded, scrubbed."""
    if isinstance(exc, APIStatusError):
        words = server_words(exc.response.content) if exc.response is not None else ""
        return f"HTTP {exc.status_code}" + (f": {words}" if words else "")
    text = exc.message if isinstance(exc, TinkerError) else str(exc)
    text = " ".join(scrub(text).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Progress:
    """What one pending request's loop last saw (updated by its loop, read by pending())."""

    kind: str
    request_id: str
    started: float = field(default_factory=time.monotonic)
    attempts: int = 0
    last_status: str | None = None
    queue_state: str | None = None
    #: The server's last answer: (what it said, wall time, monotonic time) on the SDK clock;
    #: one tuple, replaced whole, so that a reader never mixes two answers.
    answer: tuple[str, float, float] | None = None

    def answered(self, what: str, clock: Clock) -> None:
        """Record an answer of the server (any HTTP status) at this moment of ``clock``."""
        self.answer = (what, clock.time(), clock.monotonic())


class ProgressSource(Protocol):
    """Something that tracks pending requests of its own (the session futures poller)."""

    def progress(self) -> list[Progress]: ...


@dataclass(frozen=True)
class TenantState:
    """Health of the tenant (base URL and API key) a client talks to, at one moment.

    Usage::

        h = service.health()                       # also on every service.pending() entry
        if h.state != "closed":
            print(f"failing for {h.open_for:.0f} s: {h.reason}; next probe in {h.next_probe_in}")

    ``state``: ``"closed"`` (requests flow), ``"open"`` (the server is failing: requests wait
    and one probe at a time goes out) or ``"half_open"`` (a probe is due or out); ``since``
    (wall-clock seconds, as ``time.time()``) and ``open_for`` (seconds) say since when it is
    not closed, ``reason`` why (both None / ``""`` while closed); ``last_failure`` is the last
    server-wide failure seen (``"HTTP 503"``, ``"APIConnectError"``, ...; ``""`` if none);
    ``next_probe_in`` the seconds until the next probe may go out (None unless open);
    ``parked`` the requests waiting for the circuit; ``retry_tokens`` of ``retry_capacity``
    the retry budget left; ``paused`` maps a queue (``"sampling"``, ``"training"``) to the
    paused state the server declared for it; ``opens`` and ``probes`` count since the tenant
    was first used in this process. ``base_url`` has user info and secrets removed; the API
    key is never part of it (docs/health.md#liveness).
    """

    base_url: str
    state: Literal["closed", "open", "half_open"]
    since: float | None = None
    open_for: float | None = None
    reason: str = ""
    last_failure: str = ""
    next_probe_in: float | None = None
    parked: int = 0
    retry_tokens: int = 0
    retry_capacity: int = 0
    paused: Mapping[str, str] = field(default_factory=dict, hash=False)
    opens: int = 0
    probes: int = 0


@dataclass(frozen=True)
class PendingFuture:
    """What a call that has not finished yet last heard: an entry of
    :meth:`ServiceClient.pending`, or ``future.liveness()``.

    Usage::

        for p in service.pending():
            print(p.kind, p.request_id, p.attempts, p.last_answer, p.last_answer_age, p.queue_state)

    ``kind`` (``"ForwardBackward"``, ``"Sample"``, ``"CreateModel"``, ...), ``request_id``
    (None until the server accepted it), ``age`` (seconds since it started), ``attempts``
    (polls or sends so far), ``last_status`` (the last attempt's outcome: ``"HTTP 503"``,
    ``"APIConnectError"``, ``"try_again"``, ...), ``queue_state`` (e.g.
    ``"paused_rate_limit"``; None if never told). ``last_answer`` is what the server last
    answered it (``"try_again"``, ``"HTTP 503: <the server's words>"``, ...; a transport error
    is no answer), ``last_answer_at`` when (wall-clock seconds, as ``time.time()``) and
    ``last_answer_age`` how many seconds ago (all None before the first answer to a poll).
    ``tenant`` is the health of its tenant (:class:`TenantState`) in the same snapshot.
    """

    kind: str
    request_id: str | None
    age: float
    attempts: int
    last_status: str | None
    queue_state: str | None
    last_answer: str | None = None
    last_answer_at: float | None = None
    last_answer_age: float | None = None
    tenant: TenantState | None = None


def tenant_state(tenant: TenantHealth | None, url: str) -> TenantState:
    """The public snapshot of ``tenant`` (read under its lock once); a closed state with
    nothing counted when the client has not met its tenant yet (no request made)."""
    if tenant is None:
        return TenantState(base_url=scrub(url), state="closed")
    snap = tenant.snapshot()
    state = snap["state"]
    assert state in ("closed", "open", "half_open")
    return TenantState(
        base_url=tenant.url,
        state=state,
        since=_opt_float(snap["since"]),
        open_for=_opt_float(snap.get("open_for")),
        reason=str(snap["reason"]),
        last_failure=str(snap.get("last_failure", "")),
        next_probe_in=_opt_float(snap["next_probe_in"]),
        parked=_int(snap["waiting"]),
        retry_tokens=_int(snap["tokens"]),
        retry_capacity=tenant.policy.retry_capacity,
        paused=dict(cast("dict[str, str]", snap["paused"])),
        opens=_int(snap["opens"]),
        probes=_int(snap["probes"]),
    )


def recorded_tenant_state(
    url: str, credential_identity: str, policy: HealthPolicy, wall: float
) -> TenantState:
    """The tenant as its shared circuit record shows it at wall time ``wall``, for a client
    that has not met its tenant yet: another process of this user may have opened the circuit
    (docs/health.md#liveness). Closed when nothing is recorded, the record is implausible or
    sharing is off; nothing counted (``opens``, ``probes``: this process has seen none)."""
    closed = TenantState(base_url=scrub(url), state="closed")
    shared = open_shared_circuit(url, credential_identity, create=False) if enabled() else None
    if shared is None:
        return closed
    try:
        record = shared.read()
    finally:
        shared.close()
    if (
        record is None
        or record.state == "closed"
        or not plausible(record, wall, shared_max_ahead(policy))
    ):
        return closed
    state = record.state_at(wall)
    return TenantState(
        base_url=scrub(url),
        state=state,
        since=record.opened_wall,
        open_for=max(0.0, wall - record.opened_wall),
        reason=record.reason,
        next_probe_in=max(0.0, record.probe_wall - wall) if state == "open" else None,
    )


def _opt_float(value: object) -> float | None:
    return None if value is None else float(cast(float, value))


def _int(value: object) -> int:
    return int(cast(int, value))


def pending_entry(
    kind: str,
    request_id: str | None,
    age: float,
    found: list[Progress],
    clock: Clock,
    tenant: TenantState | None,
    *,
    submitting: bool = False,
) -> PendingFuture:
    """The :class:`PendingFuture` of a call whose requests' progress records are ``found``
    (in request order; empty before its first poll). ``submitting``: not accepted yet."""
    last = found[-1] if found else None
    answers = [p.answer for p in found if p.answer is not None]
    answer = max(answers, key=lambda a: a[2]) if answers else None
    return PendingFuture(
        kind=kind,
        request_id=request_id,
        age=age,
        attempts=sum(p.attempts for p in found),
        last_status=last.last_status if last else ("submitting" if submitting else None),
        queue_state=last.queue_state if last else None,
        last_answer=answer[0] if answer else None,
        last_answer_at=answer[1] if answer else None,
        last_answer_age=max(0.0, clock.monotonic() - answer[2]) if answer else None,
        tenant=tenant,
    )


class StallWatch:
    """The stall deadline of one pending call: ``limit`` seconds without a useful answer."""

    def __init__(
        self, clock: Clock, limit: float, what: str, *, since: float | None = None
    ) -> None:
        self.clock = clock
        self.limit = float(limit)
        self.what = what
        #: When the current run of failures began (None: the last answer was useful).
        self.since = since
        self._all_not_sent = True  # every failure of this run never reached the server

    def useful(self) -> None:
        """The server gave a useful answer: the deadline starts again at the next failure."""
        self.since = None
        self._all_not_sent = True

    def unhealthy(
        self, exc: BaseException, *, request_id: str | None = None
    ) -> StalledError | None:
        """Record a failed attempt; a :class:`StalledError` (cause ``exc``) once stalled."""
        now = self.clock.monotonic()
        if self.since is None:
            self.since = now
        if getattr(exc, "outcome", None) is not RequestOutcome.NOT_SENT:
            self._all_not_sent = False
        stalled_for = now - self.since
        if stalled_for < self.limit:
            return None
        status = exc.status_code if isinstance(exc, APIStatusError) else None
        rid = f" (request_id={request_id})" if request_id else ""
        err = StalledError(
            f"{self.what}{rid}: no useful answer from the server for {stalled_for:.0f} s "
            f"(stall_timeout={self.limit:g} s); last: {describe_failure(exc)}",
            status_code=status,
            request_id=request_id,
            stalled_for=stalled_for,
        )
        if self._all_not_sent:  # nothing of this call ever reached the server
            err.outcome = RequestOutcome.NOT_SENT
        err.__cause__ = exc
        return err


class Health:
    """Reachability of one server as seen by one session; see the module docs."""

    def __init__(self, url: str, clock: Clock) -> None:
        self.url = scrub(url)
        self.clock = clock
        self.reached = False
        self._lock = make_lock()
        self._failing_since: float | None = None
        self._warned = False
        self._last_warned = -math.inf
        self._failures = 0
        self._last_failure: float | None = None
        self._progress: dict[str, Progress] = {}
        self._sources: weakref.WeakSet[ProgressSource] = weakref.WeakSet()
        #: The tenant's circuit breaker and retry budget (set once the limiter is known).
        self.tenant: TenantHealth | None = None
        #: Set by close(): the failures of aborted requests are not the server's.
        self.closing = False
        #: Summary of what is pending, for the warning (set by the owning client).
        self.describe_pending: Callable[[], str] = self._describe_tracked

    # ---------------------------------------------------------------- per-attempt outcomes

    def observe(self, event: Any) -> None:
        """Transport hook: every attempt's ``request`` event (status, or error class name)."""
        if getattr(event, "kind", None) != "request":
            return
        data = event.data
        status = data.get("status")
        error = data.get("error")
        if status is not None:
            self.reached = True
        if self.closing or exiting():
            return  # requests cut short by close() or Ctrl-C say nothing about the server
        tenant = self.tenant
        if tenant is not None:
            # When the attempt began, on the tenant's clock: an outcome of an attempt sent
            # before the circuit opened (or before its probe) decides nothing (docs/health.md).
            started = data.get("started")
            if started is None or tenant.clock is not self.clock:  # another session's clock
                started = tenant.clock.monotonic() - float(data.get("duration") or 0.0)
            if error is not None or status >= 500:
                what = error if error is not None else f"HTTP {status}"
                key = (data.get("path"), data.get("idempotency_key"))
                timeout = error is not None and "Timeout" in error
                tenant.failure(key, what, timeout=timeout, sent_at=started)
            else:  # an answer: the server is up (a 429 refunds nothing; the limiter paces it)
                tenant.success(refund=0 if status == 429 else None, sent_at=started)
        if error is not None or status in _GATEWAY_STATUSES:
            what = error if error is not None else f"HTTP {status}"
            self.failed(what, data.get("path"), connect=what in _CONNECT_ERRORS)
        else:
            self.ok()

    def failed(self, what: str, path: str | None = None, *, connect: bool = True) -> None:
        """One failed attempt. A failed connect warns at once; a reply lost on an open
        connection (reset, read timeout, 502-504: common on lossy networks) only when the
        next attempt fails too."""
        now = self.clock.monotonic()
        with self._lock:
            self._last_failure = now
            self._failures += 1
            if self._failing_since is None:
                self._failing_since = now
            if not self._warned:
                if not connect and self._failures < 2:
                    return
                if now - self._last_warned < WARN_EVERY_S:
                    # A flapping network starts a new streak after every recovery; it still
                    # warns at most once a minute (the streak warns once the minute is up).
                    return
                first = True
                self._warned = True
            elif now - self._last_warned < WARN_EVERY_S:
                return
            else:
                first = False
            self._last_warned = now
            since = self._failing_since
            failures = self._failures
        assert since is not None
        where = f" ({path})" if path else ""
        if first:
            log.warning(
                "cannot reach the Tinker server at %s: %s%s. Pending: %s",
                self.url,
                what,
                where,
                self._safe_pending(),
            )
        else:
            log.warning(
                "the Tinker server at %s has been unreachable for %.0f s (%d failed attempts, "
                "last: %s%s). Pending: %s",
                self.url,
                now - since,
                failures,
                what,
                where,
                self._safe_pending(),
            )

    def ok(self) -> None:
        if self._failing_since is None:  # fast path: nothing to report
            return
        now = self.clock.monotonic()
        with self._lock:
            since, self._failing_since = self._failing_since, None
            failures, self._failures = self._failures, 0
            warned, self._warned = self._warned, False
        if since is not None and warned:
            log.info(
                "the Tinker server at %s answers again after %.0f s (%d failed attempts)",
                self.url,
                now - since,
                failures,
            )

    def recently_failed(self, window_s: float) -> bool:
        """Whether an attempt failed in the last ``window_s`` seconds (a lossy network)."""
        last = self._last_failure
        return last is not None and self.clock.monotonic() - last < window_s

    def _safe_pending(self) -> str:
        try:
            return self.describe_pending() or "nothing"
        except Exception:  # a log line must never fail the request
            log.debug("could not describe pending work", exc_info=True)
            return "unknown"

    # ---------------------------------------------------------------- pending requests

    def track(self, request_id: str, kind: str) -> Progress:
        """The progress record of ``request_id`` (made on first use)."""
        with self._lock:
            progress = self._progress.get(request_id)
            if progress is None:
                progress = self._progress[request_id] = Progress(kind, request_id)
            return progress

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._progress.pop(request_id, None)

    def progress(self, request_id: str) -> Progress | None:
        with self._lock:
            return self._progress.get(request_id)

    def watch(self, source: ProgressSource) -> None:
        """Add ``source.progress()`` to :meth:`tracked` for as long as ``source`` lives."""
        with self._lock:
            self._sources.add(source)

    def tracked(self) -> list[Progress]:
        with self._lock:
            tracked = list(self._progress.values())
            sources = list(self._sources)
        for source in sources:  # outside the lock: a source takes its own
            tracked += source.progress()
        return tracked

    def _describe_tracked(self) -> str:
        return summarize([p.kind for p in self.tracked()])


def summarize(kinds: list[str]) -> str:
    """``"2 ForwardBackward, 1 Sample"`` (most frequent first), or ``""``."""
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{n} {kind}" for kind, n in ordered)
