"""The session futures poller (``retrieve_futures``, docs/design/behavior.md#session-futures-poller)
and best-effort sample cancels (docs/design/behavior.md#sample-cancellation).

Usage (inside ``SamplingClient``)::

    poller = SessionFuturesPoller(session, sampling_session_id, cloned_sampler_id)
    poller.wait(request_id, waiter)      # waiter.on_completion(c) / on_failure(e) run on a lane
    ...                                  # after fetching the payload:
    poller.mark_retrieved(request_id)    # reported once, on the next successful poll
    poller.close()                       # stop the thread; one best-effort ack

    cancel_queue_for(session).enqueue(request_id)   # POST /api/v1/cancel_future, if enabled

When server ``sample_use_retrieve_futures`` is on, one lazy daemon thread per (sampling session,
cloned sampler) long-polls ``POST /api/v1/retrieve_futures`` with ``prev_cursor`` and no
``timeout`` (45 s HTTP read timeout), or, when the server honours requested holds
(:mod:`tinker_sync._polling.hold`), with ``"timeout": <hold>`` and a read timeout a little
longer than that hold. With no waiter left it sends an ack-only poll
(``"timeout": 0.0``, 5 s). It idles while nothing waits and nothing is to be acknowledged, and
its thread exits after 30 s idle (restarted on demand). Sorted ``retrieved_request_ids`` go out
on the next poll and are dropped once a poll carrying them succeeded. Errors: 402 inside the
billing window sleeps 5 s; retryable errors (timeouts, connection errors, 408/409/429/5xx)
sleep 1 s, until ``stall_timeout`` passes without a useful answer (then the current waiters
fail with StalledError); a 400 is retried at most 3 times (1 s apart; the budget resets after a success);
anything else fails every current and future waiter with :class:`TinkerError`, except that a
completion already recorded still wins.

Lost requests (docs/polling.md#lost-requests): any answered poll counts as progress, so a
request the server accepted and then lost would wait forever. After each answered poll, the
waiter that has waited longest, once it has waited :data:`LOST_PROBE_AFTER_S` (on the session
clock) since it registered or was last probed, is probed alone: one ``retrieve_future`` by its
request id (no hold when the server honours requested holds), on ``pool("sample-poll")``. One
probe per poller is in flight at a time, at least :data:`LOST_PROBE_SPACING_S` apart. A 404
fails the waiter with :class:`RequestLostError` (the sampling layer resubmits it), a 410 with
:class:`FutureExpiredError`; a finished future the poller never heard of is handed to the
waiter as a size-less completion; ``try_again`` and errors change nothing.

Waiters do not occupy threads: the poller records completions and hands each waiter's callback
to a :class:`~tinker_sync._runtime.executor.BoundedLane` on ``pool("sample-poll")`` (at most 16 at
once per poller), where the sample's payload fetch runs.

Thread safety: every method may be called from any thread. Fork safety: a poller belongs to
the process that made it (its thread does not survive a fork); SamplingClient builds a new one
in a forked child. Its locks are fork-safe, so touching an inherited poller never deadlocks.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from tinker_sync._config import Timeout
from tinker_sync._flow.health import Progress, StallWatch, describe_failure
from tinker_sync._flow.retry import BILLING_PAUSE_S, classify
from tinker_sync._polling.decide import lost_decision
from tinker_sync._polling.hold import HOLD_HEADER
from tinker_sync._runtime.clock import exiting
from tinker_sync._runtime.executor import BoundedLane, pool
from tinker_sync._runtime.fork import make_condition, make_lock, register_after_fork
from tinker_sync._transport import Pool, RequestSpec, error_from_reply
from tinker_sync.exceptions import (
    APIStatusError,
    ClientClosedError,
    FutureExpiredError,
    TinkerError,
)

if TYPE_CHECKING:
    from tinker_sync._session.state import Session

log = logging.getLogger("tinker_sync.poller")

ACK_POLL_TIMEOUT = Timeout(5.0, connect=5.0)
CANCEL_TIMEOUT = Timeout(30.0, connect=5.0)
MAX_BAD_REQUEST_RETRIES = 3
RETRYABLE_SLEEP_S = 1.0
FETCH_LANE_LIMIT = 10
IDLE_EXIT_S = 30.0
MAX_FORGOTTEN = 10_000
#: A waiter still pending this long (session clock) after it registered, or after its last
#: probe, while polls are answered, is probed alone by its request id: three 5 s holds.
LOST_PROBE_AFTER_S = 15.0
#: Probes of one poller go one at a time, at least this far apart (at most 5 per second).
LOST_PROBE_SPACING_S = 0.2
#: Read timeout of a probe on a server that honours requested holds (it asks for none).
PROBE_TIMEOUT = Timeout(5.0, connect=5.0)


class Waiter(Protocol):
    """What a pending sample gives the poller; callbacks run on the fetch lane, once."""

    def on_completion(self, completion: dict[str, Any]) -> None: ...

    def on_failure(self, exc: BaseException) -> None: ...

    def abandoned(self) -> BaseException | None:
        """Checked after every poll: an exception drops the waiter and fails it with that."""
        ...


class SessionFuturesPoller:
    """One ``retrieve_futures`` poll thread for a (sampling session, cloned sampler) pair.

    Thread-safe; fork: belongs to its process (see the module docs).
    """

    def __init__(
        self,
        session: Session,
        sampling_session_id: str,
        cloned_sampler_id: int,
        *,
        lane_limit: int = FETCH_LANE_LIMIT,
    ) -> None:
        self.session = session
        self.sampling_session_id = sampling_session_id
        self.cloned_sampler_id = cloned_sampler_id
        self.lane = BoundedLane("sample-poll", lane_limit)
        self._lock = make_lock()
        self._cond = make_condition(self._lock)
        self._waiters: dict[str, Waiter] = {}
        #: Per waiter: the poll count, monotonic time and session-clock time when it registered
        #: (for pending()).
        self._joined: dict[str, tuple[int, float, float]] = {}
        #: What the last poll saw ("HTTP 200", "HTTP 503", "APIConnectError", ...).
        self._last_status: str | None = None
        #: The server's last answer to a poll: (what, wall time, session-clock time), one tuple.
        self._answer: tuple[str, float, float] | None = None
        self._completions: dict[str, dict[str, Any]] = {}
        #: Cancelled request ids whose completion may still arrive (then dropped).
        self._forgotten: dict[str, None] = {}
        self._retrieved: set[str] = set()
        #: Per waiter: session-clock time it registered or was last probed (lost requests).
        self._probed: dict[str, float] = {}
        self._probing: str | None = None
        self._last_probe_at = float("-inf")
        #: Number of lost-request probes sent (tests and debugging).
        self.probes = 0
        self._cursor = 0
        self._acked_cursor = 0
        self._failure: str | None = None
        self._closing = False
        self._running = False
        self._thread_count = 0
        #: Number of polls sent (tests and debugging).
        self.polls = 0
        #: Set while the poll thread is parked with nothing to do (tests and debugging).
        self.parked = threading.Event()
        session.health.watch(self)  # its waiters show in ServiceClient.pending()

    def __repr__(self) -> str:
        return (
            f"<SessionFuturesPoller {self.sampling_session_id} clone={self.cloned_sampler_id} "
            f"waiters={len(self._waiters)} cursor={self._cursor}>"
        )

    # ---------------------------------------------------------------- waiter side

    def wait(self, request_id: str, waiter: Waiter) -> None:
        """Call ``waiter.on_completion`` once ``request_id`` completes (or ``on_failure``)."""
        with self._lock:
            completion = self._completions.pop(request_id, None)
            if completion is None:
                if self._failure is not None:
                    failure: BaseException | None = TinkerError(self._failure)
                elif self._closing:
                    failure = ClientClosedError("the SamplingClient was closed")
                else:
                    failure = None
                    self._waiters[request_id] = waiter
                    joined = self.session.clock.monotonic()
                    self._joined[request_id] = (self.polls, time.monotonic(), joined)
                    self._probed[request_id] = self.session.clock.monotonic()
                    self.parked.clear()
                    self._ensure_thread()
                    self._cond.notify_all()
        if completion is not None:
            self.lane.submit(waiter.on_completion, completion)
        elif failure is not None:
            self.lane.submit(waiter.on_failure, failure)

    def forget(self, request_id: str) -> bool:
        """Drop the waiter of ``request_id`` (cancelled); True if it was still waiting."""
        with self._lock:
            if self._completions.pop(request_id, None) is None:
                self._forget_completion(request_id)
            return self._take(request_id) is not None

    def _forget_completion(self, request_id: str) -> None:
        # Called with the lock held: a completion of request_id that arrives later is dropped.
        self._forgotten[request_id] = None
        while len(self._forgotten) > MAX_FORGOTTEN:
            del self._forgotten[next(iter(self._forgotten))]

    def mark_retrieved(self, request_id: str) -> None:
        """Report ``request_id``'s payload as fetched on the next successful poll."""
        with self._lock:
            if self._closing and not self._running:
                return
            self._retrieved.add(request_id)
            self.parked.clear()  # work is due: "parked" again only after it was done
            self._ensure_thread()
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def progress(self) -> list[Progress]:
        """For :meth:`ServiceClient.pending`: each waiting sample, the polls sent since it
        registered (``attempts``), what the last poll saw (``last_status``) and the server's
        last answer to a poll since it registered (``answer``)."""
        with self._lock:
            polls, status, answer = self.polls, self._last_status, self._answer
            return [
                Progress(
                    "Sample",
                    rid,
                    started=since,
                    attempts=polls - base,
                    last_status=status,
                    answer=answer if answer is not None and answer[2] >= joined else None,
                )
                for rid, (base, since, joined) in self._joined.items()
            ]

    @property
    def failure(self) -> str | None:
        return self._failure

    def close(self) -> None:
        """Stop polling: fail the waiters left (ClientClosedError), send one last ack if due."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            waiters = self._take_all()
            self._completions.clear()
            if (self._retrieved or self._cursor > self._acked_cursor) and not exiting():
                self._ensure_thread()  # one best-effort ack (skipped at interpreter exit)
            self._cond.notify_all()
        for waiter in waiters:
            self.lane.submit(waiter.on_failure, ClientClosedError("the SamplingClient was closed"))

    # ---------------------------------------------------------------- poll thread

    def _ensure_thread(self) -> None:
        # Called with the lock held.
        if self._running:
            return
        self._running = True
        self._thread_count += 1
        threading.Thread(
            target=self._run,
            name=f"tinker_sync-futures-poller-{self.cloned_sampler_id}-{self._thread_count}",
            daemon=True,
        ).start()

    def _idle(self) -> bool:
        return not self._waiters and not self._retrieved and self._cursor <= self._acked_cursor

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            # Never leave waiters hanging (docs/design/behavior.md#never-drop-a-failure).
            log.exception("futures poller for %s crashed", self.sampling_session_id)
            self._fail(f"the futures poller crashed: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._running = False

    def _loop(self) -> None:
        clock = self.session.clock
        bad_requests = 0
        stall = StallWatch(clock, self.session.config.stall_timeout, "Sample (retrieve_futures)")
        while True:
            if self.session.closed and not self._closing:
                self.close()
            with self._lock:
                while not self._closing and self._idle():
                    self.parked.set()
                    woke = self._cond.wait(IDLE_EXIT_S)
                    self.parked.clear()
                    if not woke and self._idle() and not self._closing:
                        self._running = False
                        return
                closing = self._closing
                if self._failure is not None or (closing and self._idle()):
                    self._running = False
                    return
                sent = sorted(self._retrieved)
                ack_only = closing or not self._waiters
                prev = self._cursor
            if exiting():
                return
            body: dict[str, Any] = {
                "target": {
                    "type": "sampling_session",
                    "sampling_session_id": self.sampling_session_id,
                    "cloned_sampler_id": self.cloned_sampler_id,
                },
                "prev_cursor": prev,
                "retrieved_request_ids": sent,
            }
            hold = self.session.poll_hold
            try:
                self.polls += 1
                with hold.polling() as plan:
                    if ack_only:
                        body["timeout"] = 0.0
                    elif plan.hold_s is not None:
                        body["timeout"] = plan.hold_s
                    spec = RequestSpec(
                        method="POST",
                        path="/api/v1/retrieve_futures",
                        pool=Pool.RETRIEVE_FUTURES,
                        json=body,
                        timeout=ACK_POLL_TIMEOUT if ack_only else plan.timeout,
                        max_retries=0,
                        sdk_method=None,
                    )
                    reply = self.session.transport.send_once(spec)
                self._last_status = f"HTTP {reply.status}"
                error = error_from_reply(reply) if reply.status >= 400 else None
                words = describe_failure(error) if error is not None else self._last_status
                self._answer = (words, clock.time(), clock.monotonic())
                hold.learn(reply.headers)
                if error is not None:
                    raise error
                completions, cursor = _parse(reply.json())
            except Exception as exc:
                if not isinstance(exc, APIStatusError):  # a status is recorded above
                    self._last_status = type(exc).__name__
                if closing or exiting():
                    log.debug("final retrieve_futures ack failed: %r", exc)
                    return
                if self.session.closed:  # close() cut this poll: wind down without a sleep
                    continue
                if (
                    isinstance(exc, APIStatusError)
                    and exc.status_code == 402
                    and self.session.billing.should_pause(clock.monotonic(), exc.message)
                ):
                    clock.sleep(BILLING_PAUSE_S, "futures-poller-billing")
                    continue
                info = classify(exc)
                if info.retryable:
                    if info.status_code is None or info.status_code >= 500:
                        stalled = stall.unhealthy(exc)
                        if stalled is not None:
                            self._fail_waiters(stalled)
                            stall.useful()
                            continue
                    clock.sleep(RETRYABLE_SLEEP_S, "futures-poller-retry")
                    continue
                if (
                    isinstance(exc, APIStatusError)
                    and exc.status_code == 400
                    and bad_requests < MAX_BAD_REQUEST_RETRIES
                ):
                    bad_requests += 1
                    clock.sleep(RETRYABLE_SLEEP_S, "futures-poller-400")
                    continue
                message = (
                    f"retrieve_futures polling failed for sampling session "
                    f"{self.sampling_session_id} (clone {self.cloned_sampler_id}): "
                    f"{type(exc).__name__}: {exc}"
                )
                log.error("%s", message)
                self._fail(message)
                return
            bad_requests = 0
            stall.useful()
            ready: list[tuple[Waiter, dict[str, Any]]] = []
            with self._lock:
                self._retrieved.difference_update(sent)
                self._acked_cursor = max(self._acked_cursor, prev)
                self._cursor = max(self._cursor, cursor)
                for completion in completions:
                    rid = completion["request_id"]
                    waiter = self._take(rid)
                    if waiter is not None:
                        ready.append((waiter, completion))
                    elif rid in self._forgotten:  # cancelled: nobody will fetch it
                        del self._forgotten[rid]
                    elif not self._closing:
                        # Not waited for yet (the waiter registers right after acceptance).
                        self._completions[rid] = completion
                current = list(self._waiters.items())
            for waiter, completion in ready:
                self.lane.submit(waiter.on_completion, completion)
            self._check_abandoned(current)
            if closing:
                return
            self._maybe_probe()

    # ---------------------------------------------------------------- lost requests

    def _maybe_probe(self) -> None:
        """After an answered poll: probe the longest-waiting overdue waiter, if none is being
        probed and the last probe is at least LOST_PROBE_SPACING_S old."""
        now = self.session.clock.monotonic()
        with self._lock:
            if (
                self._probing is not None
                or self._closing
                or now - self._last_probe_at < LOST_PROBE_SPACING_S
            ):
                return
            due = [(since, rid) for rid, since in self._probed.items()]
            if not due:
                return
            since, request_id = min(due)
            if now - since < LOST_PROBE_AFTER_S:
                return
            self._probing = request_id
            self._last_probe_at = now
            self._probed[request_id] = now
            self.probes += 1
        try:
            pool("sample-poll").submit(self._probe, request_id)
        except BaseException:
            with self._lock:
                self._probing = None
            raise

    def _probe(self, request_id: str) -> None:
        try:
            self._probe_once(request_id)
        except Exception as exc:  # a probe never harms the waiter: it waits on
            log.debug("lost-request probe of %s failed: %r", request_id, exc)
        finally:
            with self._lock:
                self._probing = None

    def _probe_once(self, request_id: str) -> None:
        if self.session.closed or exiting():
            return
        hold = self.session.poll_hold
        headers = {"X-Tinker-Request-Type": "Sample"}
        if hold.server_max is not None:
            headers[HOLD_HEADER] = "0"
            timeout = PROBE_TIMEOUT
        else:  # an older server holds it as long as it likes
            timeout = hold.plan().timeout
        spec = RequestSpec(
            method="POST",
            path="/api/v1/retrieve_future",
            pool=Pool.RETRIEVE_PROMISE,
            json={"request_id": request_id, "allow_metadata_only": True},
            headers=headers,
            timeout=timeout,
            max_retries=0,
            sdk_method=None,
        )
        reply = self.session.transport.send_once(spec)
        hold.learn(reply.headers)
        failure: BaseException | None = None
        if reply.status == 404:
            failure = lost_decision(request_id, "Sample", error_from_reply(reply)).exc
            log.warning("%s", failure)
        elif reply.status == 410:
            failure = FutureExpiredError(
                f"request {request_id} expired on the server (HTTP 410 when probed alone)"
            )
        elif reply.status >= 300 or _is_try_again(reply.content, reply.headers):
            return  # pending, or the probe failed: keep waiting
        with self._lock:
            waiter = self._take(request_id)
            if waiter is not None and failure is None:
                # Done, but its completion never came: drop it if it comes after all.
                self._forget_completion(request_id)
        if waiter is None:
            return
        if failure is not None:
            self.lane.submit(waiter.on_failure, failure)
        else:
            log.info("request %s finished without a retrieve_futures completion", request_id)
            self.lane.submit(waiter.on_completion, {"state": "finished", "request_id": request_id})

    def _check_abandoned(self, current: list[tuple[str, Waiter]]) -> None:
        for rid, waiter in current:
            try:
                reason = waiter.abandoned()
            except Exception as exc:  # a broken check must not kill the poller
                reason = exc
            if reason is None:
                continue
            with self._lock:
                mine = self._waiters.get(rid) is waiter
                if mine:
                    self._take(rid)
            if mine:
                self.lane.submit(waiter.on_failure, reason)

    def _take(self, request_id: str) -> Waiter | None:
        # Called with the lock held: remove one waiter (None if it was not waiting).
        self._joined.pop(request_id, None)
        self._probed.pop(request_id, None)
        return self._waiters.pop(request_id, None)

    def _take_all(self) -> list[Waiter]:
        # Called with the lock held: remove every waiter.
        waiters = list(self._waiters.values())
        self._waiters.clear()
        self._joined.clear()
        self._probed.clear()
        return waiters

    def _fail_waiters(self, exc: BaseException) -> None:
        """Fail the current waiters with ``exc`` (a stall); later waits poll afresh."""
        with self._lock:
            waiters = self._take_all()
        log.error("%s", exc)
        for waiter in waiters:
            self.lane.submit(waiter.on_failure, exc)

    def _fail(self, message: str) -> None:
        with self._lock:
            self._failure = message
            waiters = self._take_all()
            self._running = False
        for waiter in waiters:
            self.lane.submit(waiter.on_failure, TinkerError(message))


def _is_try_again(content: bytes, headers: Any) -> bool:
    """Whether a 2xx ``retrieve_future`` answer says the future is still pending."""
    if "json" not in headers.get("content-type", ""):
        return False
    try:
        body = json.loads(content)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("type") == "try_again"


def _parse(data: object) -> tuple[list[dict[str, Any]], int]:
    """Validate a ``retrieve_futures`` reply: ``{"completions": [...], "cursor": int}``."""
    from tinker_sync.exceptions import APIResponseValidationError

    if not isinstance(data, dict):
        raise APIResponseValidationError("retrieve_futures: expected a JSON object")
    cursor = data.get("cursor", 0)
    raw = data.get("completions") or []
    if isinstance(cursor, bool) or not isinstance(cursor, int) or not isinstance(raw, list):
        raise APIResponseValidationError("retrieve_futures: bad cursor or completions")
    completions = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("request_id"), str):
            raise APIResponseValidationError("retrieve_futures: a completion lacks request_id")
        completions.append(item)
    return completions, cursor


# -------------------------------------------------------------------- cancel_future


class CancelQueue:
    """Best-effort ``POST /api/v1/cancel_future`` for abandoned samples of one session.

    Ids are queued only while dynamic config ``sample_cancel_enabled`` is on; a drain job on
    ``pool("rest")`` sends them in batches of at most ``sample_cancel_max_batch_size``, each
    request with 0 retries and a 30 s timeout. Failures are logged at DEBUG, never raised.
    Thread-safe; a forked child gets a fresh queue (the registry is per process).
    """

    def __init__(self, session: Session) -> None:
        self._session_ref = weakref.ref(session)
        self._lock = make_lock()
        self._ids: list[str] = []
        self._draining = False
        #: Request ids sent so far (tests and debugging).
        self.sent = 0

    def enqueue(self, request_id: str) -> bool:
        """Queue ``request_id`` when the server enables cancels; True if queued."""
        session = self._session_ref()
        if session is None or not session.dynamic.sample_cancel_enabled or session.closed:
            return False
        with self._lock:
            self._ids.append(request_id)
            if not self._draining:
                # Queued before the flag is set (the pool runs nothing inline): a signal
                # handler's exception on the main thread in between lets a second drain run at
                # most; flagged first, it could leave no drain and every later cancel unsent.
                pool("rest").submit(self._drain)
                self._draining = True
        return True

    def _drain(self) -> None:
        while True:
            session = self._session_ref()
            with self._lock:
                size = 64 if session is None else session.dynamic.sample_cancel_max_batch_size
                batch = self._ids[: max(1, size)]
                del self._ids[: len(batch)]
                if not batch or session is None:
                    self._ids.clear()
                    self._draining = False
                    return
            for request_id in batch:
                self._send(session, request_id)

    def _send(self, session: Session, request_id: str) -> None:
        spec = RequestSpec(
            method="POST",
            path="/api/v1/cancel_future",
            pool=Pool.SAMPLE,
            json={"request_id": request_id},
            timeout=CANCEL_TIMEOUT,
            max_retries=0,
            sdk_method=None,
        )
        try:
            reply = session.transport.send_once(spec)
        except Exception as exc:
            log.debug("cancel_future %s failed: %r", request_id, exc)
            return
        self.sent += 1
        if reply.status >= 400:
            log.debug("cancel_future %s answered %d", request_id, reply.status)


_cancel_queues: weakref.WeakKeyDictionary[Session, CancelQueue] = weakref.WeakKeyDictionary()
_cancel_lock = make_lock()


def cancel_queue_for(session: Session) -> CancelQueue:
    """The session's cancel queue (created on first use)."""
    with _cancel_lock:
        queue = _cancel_queues.get(session)
        if queue is None:
            queue = _cancel_queues[session] = CancelQueue(session)
        return queue


def _after_fork_in_child() -> None:
    _cancel_queues.clear()


register_after_fork(_after_fork_in_child)
