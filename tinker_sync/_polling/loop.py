"""The per-future poll loop: ``POST /api/v1/retrieve_future`` until the result is known.

Usage::

    poll = Poll(session, request_id, "ForwardBackward", decode=decode_fwdbwd,
                on_done=settle, created_at=t0)
    pool("train-poll").submit(poll.run)

Each iteration sends ``{"request_id", "allow_metadata_only"}`` with no HTTP retries (this loop owns
them), the ``X-Tinker-Request-*`` headers and, for Sample / ForwardBackward / Forward, ``Accept:
application/x-protobuf`` (docs/design/behavior.md#poll-request). The server-side hold and the read
timeout come from the session's :class:`~tinker_sync._polling.hold.PollHold` (a few seconds when the
server honours a requested hold, else the server's own hold with a 45 s read timeout). What happens
next comes from :func:`tinker_sync._polling.decide.decide_reply`
(docs/design/behavior.md#poll-answer-order, docs/design/behavior.md#poll-error-table). The loop is
bounded by time (``poll_timeout``), never by an iteration count
(docs/design/behavior.md#poll-bounded-by-time), and it is iterative.

A poll loop that gets no useful answer (only connection errors, timeouts and 5xx) for the
client's ``stall_timeout`` (default 600 s) fails with StalledError naming the last status and
the server's last words; each loop records its attempts, last status, queue state and the
server's last answer with its time for ``ServiceClient.pending()`` and ``future.liveness()``.

``poll_timeout`` (default None: unbounded, as in the official SDK) runs on the session Clock;
on expiry ``on_done`` gets a TimeoutError chained (``__cause__``) to the last poll error. It
is deliberately not a public knob: callers bound their own wait with ``result(timeout)``,
which cancels nothing, and training futures may legitimately stay paused for over 15 min.

Each completion reports ``active`` to the queue-state observer and emits a ``future_done`` hook
event; a change of ``(state, reason)`` emits ``queue_state_change``
(docs/design/behavior.md#queue-state-reports, docs/design/behavior.md#hooks).

Thread safety: a Poll runs on one pool thread. Fork safety: polls do not survive a fork; their
futures fail in the child (``_futures``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from tinker_sync._flow.breaker import Turn
from tinker_sync._flow.health import StallWatch, describe_failure
from tinker_sync._flow.limiter import PAUSED_QUEUE_BACKOFF_S, Stopped
from tinker_sync._polling.decide import Action, Decision, PollCounters, decide_reply
from tinker_sync._polling.decide import decide_transport_error as _transport_error
from tinker_sync._polling.hold import PollPlan
from tinker_sync._runtime.causes import signal_exception
from tinker_sync._runtime.clock import exiting
from tinker_sync._session.state import Session
from tinker_sync._transport import Pool, Reply, RequestSpec, emit_hook
from tinker_sync.exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    ClientClosedError,
    StalledError,
)

T = TypeVar("T")
log = logging.getLogger("tinker_sync.polling")


def _answer_words(status: int, decision: Decision) -> str:
    """A poll's answer for liveness: ``"try_again"``, ``"HTTP 503: <the server's words>"``."""
    if isinstance(decision.exc, APIStatusError):
        return describe_failure(decision.exc)
    if decision.action is Action.PENDING and decision.reason == "try_again":
        return "try_again"
    return f"HTTP {status}"


class _Parked(Exception):
    """Ends a poll's wait for the tenant's circuit: it was cancelled or closed meanwhile."""


PROTO_KINDS = frozenset({"Sample", "ForwardBackward", "Forward"})

#: ``on_done(value, error)``: exactly one of them is set; called once, outside every lock.
Done = Callable[[Any, BaseException | None], None]
#: ``on_queue_state(state, reason)``: observer of try_again queue states.
QueueObserver = Callable[[str, str | None], None]


class Poll:
    """One future's poll loop; ``run()`` blocks until ``on_done`` has been called."""

    def __init__(
        self,
        session: Session,
        request_id: str,
        request_type: str,
        *,
        decode: Callable[[Decision], Any],
        on_done: Done,
        created_at: float,
        sdk_method: str | None = None,
        poll_timeout: float | None = None,
        is_cancelled: Callable[[], bool] = lambda: False,
        on_queue_state: QueueObserver | None = None,
        sampling: bool = False,
        allow_metadata_only: bool = True,
        model_id: str | None = None,
    ) -> None:
        self.session = session
        self.request_id = request_id
        self.request_type = request_type
        self.decode = decode
        self.on_done = on_done
        self.created_at = created_at
        self.sdk_method = sdk_method
        self.poll_timeout = poll_timeout
        self.is_cancelled = is_cancelled
        self.on_queue_state = on_queue_state
        self.sampling = sampling
        self.allow_metadata_only = allow_metadata_only
        self.model_id = model_id
        self.counters = PollCounters()
        self.stall = StallWatch(session.clock, session.config.stall_timeout, request_type)
        self.progress = session.health.track(request_id, request_type)
        self._reserved = 0
        self._last_state: tuple[str, str | None] = ("active", None)
        self._parked_since: float | None = None  # waiting for the tenant's circuit since
        self._stalled_while_parked: BaseException | None = None

    def _spec(self, plan: PollPlan) -> RequestSpec:
        iteration = self.counters.iteration
        headers = {
            "X-Tinker-Request-Iteration": str(iteration),
            "X-Tinker-Request-Type": self.request_type,
            **plan.headers,
        }
        if iteration == 0:
            roundtrip = max(0.0, self.session.clock.monotonic() - self.created_at)
            headers["X-Tinker-Create-Promise-Roundtrip-Time"] = f"{roundtrip:.6f}"
        return RequestSpec(
            method="POST",
            path="/api/v1/retrieve_future",
            pool=Pool.RETRIEVE_PROMISE,
            json={"request_id": self.request_id, "allow_metadata_only": self.allow_metadata_only},
            timeout=plan.timeout,
            headers=headers,
            expect="proto" if self.request_type in PROTO_KINDS else "json",
            max_retries=0,
            sdk_method=self.sdk_method,
            logical_key=f"poll:{self.request_id}",  # one request for the tenant's breaker
        )

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self.session.health.forget(self.request_id)
        if self._reserved:
            self.session.limiter.release_response_bytes(self._reserved)
            self._reserved = 0
        # Completion (success or failure) reports active
        # (docs/design/behavior.md#queue-state-reports).
        self._observe("active", None)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %s (%s) %s after %d poll(s)",
                self.request_id,
                self.request_type,
                "completed" if error is None else f"failed: {type(error).__name__}",
                self.counters.iteration,
                extra=self._log_extra(),
            )
        if self.session.hooks:
            clock = self.session.clock
            emit_hook(
                self.session.hooks,
                "future_done",
                request_id=self.request_id,
                request_type=self.request_type,
                ok=error is None,
                error=None if error is None else type(error).__name__,
                polls=self.counters.iteration,
                duration=clock.monotonic() - self.created_at,
            )
        self.on_done(value, error)

    def _log_extra(self) -> dict[str, Any]:
        return {
            "session_id": self.session.session_id,
            "request_id": self.request_id,
            "model_id": self.model_id,
        }

    def _observe(self, state: str, reason: str | None) -> None:
        """Tell the observer (and, on a change of ``(state, reason)``, the hooks)."""
        changed = (state, reason) != self._last_state
        self._last_state = (state, reason)
        if changed and self.session.hooks:
            emit_hook(
                self.session.hooks,
                "queue_state_change",
                request_id=self.request_id,
                request_type=self.request_type,
                state=state,
                reason=reason,
            )
        if self.on_queue_state is None:
            return
        try:
            self.on_queue_state(state, reason)
        except Exception:
            log.exception("queue-state observer failed", extra=self._log_extra())

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            # Never drop a failure (docs/design/behavior.md#never-drop-a-failure).
            self._finish(None, exc)

    def _stop_reason(self) -> BaseException | None:
        if self.session.closed:
            return ClientClosedError("the client was closed while this request was pending")
        return None

    def _stopped(self) -> bool:
        return self.is_cancelled() or self._stop_reason() is not None

    def _tenant_turn(self) -> bool:
        """Wait (this pool thread) while the tenant's circuit is open, unless this poll is its
        probe (docs/health.md). False when stopped meanwhile."""
        tenant = self.session.health.tenant
        if tenant is None or not tenant.is_open():
            self._parked_since = None
            return True
        clock = self.session.clock
        if self._parked_since is None:
            self._parked_since = clock.monotonic()
        limit = self.session.config.stall_timeout

        def stop() -> BaseException | None:
            return _Parked() if self.is_cancelled() or self._stop_reason() else None

        try:
            turn = tenant.wait_turn(stop, self._parked_since + limit)
        except _Parked:
            return False
        if turn is Turn.WAIT:
            waited = clock.monotonic() - self._parked_since
            self._stalled_while_parked = StalledError(
                f"{self.request_type} (request_id={self.request_id}): the server has been "
                f"failing for {waited:.0f} s (stall_timeout={limit:g} s); "
                f"{tenant.open_error().reason}",
                request_id=self.request_id,
                stalled_for=waited,
            )
            return True
        self._parked_since = None
        return True

    def _run(self) -> None:
        clock = self.session.clock
        deadline = None if self.poll_timeout is None else clock.monotonic() + self.poll_timeout
        transport = self.session.transport
        hold = self.session.poll_hold
        hedger = self.session.hedger

        def send() -> Reply:
            # A poll may be repeated: the server answers the same result again (hedging).
            plan = hold.begin()  # hold.polling() without its generator (one per poll)
            try:
                return transport.send_once(self._spec(plan))
            finally:
                hold.end()

        billing_window = float(self.session.server.billing_exception_max_pause_duration_sec)
        while True:
            if self.is_cancelled():
                self._finish(None, None)
                return
            stop = self._stop_reason()
            if stop is not None:
                self._finish(None, stop)
                return
            if not self._tenant_turn():
                continue  # stopped while parked: the next turn says why
            if self._stalled_while_parked is not None:
                self._finish(None, self._stalled_while_parked)
                return
            tenant = self.session.health.tenant
            kind = "sampling" if self.sampling else "training"
            if tenant is not None and not tenant.pause_turn(kind, self, self._stopped):
                continue  # stopped while its queue is paused: the next turn says why
            paused: str | None = None  # the paused queue state this poll was answered with
            answered = False  # an answer saying the queue is not paused
            try:
                started = clock.monotonic()
                status: int | None = None
                try:
                    reply = hedger.run(
                        f"poll:{self.request_type}",
                        send,
                        abort=lambda ident: transport.abort_threads(
                            [ident], (Pool.RETRIEVE_PROMISE,)
                        ),
                        read_timeout=hold.plan().timeout.read,
                    )
                except APIConnectionError as exc:
                    decision = _transport_error(exc, self.counters, jitter=clock.random())
                    self.progress.last_status = type(exc).__name__
                else:
                    hold.learn(reply.headers)
                    status = reply.status
                    self.progress.last_status = f"HTTP {status}"
                    now = clock.monotonic()
                    decision = decide_reply(
                        reply.status,
                        reply.headers,
                        reply.content,
                        self.counters,
                        request_id=self.request_id,
                        now=now,
                        elapsed=now - started,
                        jitter=clock.random(),
                        billing_window_s=billing_window,
                        op=self.request_type,
                    )
                state = decision.queue_state
                if decision.action is Action.PENDING:
                    # a queue state says whether the queue is paused; no state says nothing
                    paused = state if state and state.startswith("paused") else None
                    answered = bool(state) and paused is None
                else:  # a result, metadata or a final error: the queue moves
                    answered = decision.action is not Action.RETRY
            finally:
                if tenant is not None:  # the queue's pause: one poll at a time (docs/health.md)
                    tenant.pause_report(kind, self, paused=paused, answered=answered)
            self.counters.iteration += 1
            self.progress.attempts = self.counters.iteration
            if decision.queue_state:
                self.progress.queue_state = decision.queue_state
                self.progress.last_status = decision.reason or self.progress.last_status
            if status is not None:  # the server answered (a transport error is no answer)
                self.progress.answered(_answer_words(status, decision), clock)
            if status is not None and status < 500:
                self.stall.useful()
            elif decision.action is Action.RETRY and decision.exc is not None:
                stalled = self.stall.unhealthy(decision.exc, request_id=self.request_id)
                if stalled is not None:
                    self._finish(None, stalled)
                    return
                tenant = self.session.health.tenant
                if tenant is not None:  # an empty budget opens the circuit: the next turn waits
                    tenant.acquire_retry(timeout=isinstance(decision.exc, APITimeoutError))
            action = decision.action
            if action is Action.RESULT:
                try:
                    value = self.decode(decision)
                except Exception as exc:
                    raised = signal_exception(exc)
                    if raised is not None:  # a signal handler's (an alarm timeout): as it is
                        raise raised  # noqa: B904
                    err: BaseException = APIResponseValidationError(
                        f"could not decode the result of {self.request_id}: {exc}"
                    )
                    err.__cause__ = exc
                    self._finish(None, err)
                    return
                self._finish(value, None)
                return
            if action is Action.FAIL:
                assert decision.exc is not None
                self._finish(None, decision.exc)
                return
            if action is Action.METADATA:
                size = decision.payload_size
                try:
                    self.session.limiter.reserve_response_bytes(size, self._stop_reason)
                except Stopped as stopped:
                    self._finish(None, stopped.exc)
                    return
                self._reserved = size
                self.allow_metadata_only = False
                continue
            if action is Action.PENDING and decision.queue_state:
                self._observe(decision.queue_state, decision.queue_state_reason)
                if self.sampling and decision.queue_state.startswith("paused"):
                    self.session.limiter.set_backoff(
                        PAUSED_QUEUE_BACKOFF_S, f"queue {decision.queue_state}", self.session.hooks
                    )
            delay = decision.delay
            if deadline is not None and clock.monotonic() + delay >= deadline:
                err = TimeoutError(
                    f"polling {self.request_id} exceeded poll_timeout={self.poll_timeout} s"
                )
                err.__cause__ = self.counters.last_error
                self._finish(None, err)
                return
            if self.session.closed:
                continue  # no sleep: the next turn ends with ClientClosedError
            if delay > 0:
                clock.sleep(delay, f"poll:{decision.reason}")
            if exiting():
                self._finish(None, ClientClosedError("the interpreter is exiting"))
                return
