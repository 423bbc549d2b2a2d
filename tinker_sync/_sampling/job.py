"""One sample() call's life: dispatch through the shared limiter, polling, retries, settling.

Usage (inside SamplingClient)::

    job = SampleJob(client, body, estimate, finish, sdk_method, retry)
    job.queue("sample-submit", job.begin)
    return job.fut

Steps run on the SDK's sample pools (or inline in a thread waiting in ``result()``); no lock
is held across I/O (docs/design/behavior.md#sampling-lock-free-seq-ids).

Thread safety: a job's steps run one at a time; its small state is lock-guarded. Fork safety:
jobs do not survive a fork (their futures fail in the child).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tinker_sync._flow.breaker import Turn
from tinker_sync._flow.health import StallWatch
from tinker_sync._flow.limiter import (
    LARGE_PROMPT_BACKOFF_S,
    LARGE_PROMPT_BYTES,
    RATE_LIMIT_BACKOFF_S,
    Limiter,
    Stopped,
    Ticket,
)
from tinker_sync._flow.retry import SubmissionRetry, parse_retry_after
from tinker_sync._futures import APIFuture
from tinker_sync._polling.decide import Decision
from tinker_sync._polling.loop import Poll
from tinker_sync._polling.poller import SessionFuturesPoller, cancel_queue_for
from tinker_sync._runtime.executor import BoundedLane, Claimable, call_later, pool
from tinker_sync._sampling.retry import LOST_RESUBMITS, RetryHandler
from tinker_sync._transport import (
    Pool,
    RequestSpec,
    emit_hook,
)
from tinker_sync._wire import _jsonresults, _proto
from tinker_sync.exceptions import (
    APIResponseValidationError,
    APIStatusError,
    ClientClosedError,
    MissingCredentialsError,
    RequestFailedError,
    RequestLostError,
    RequestOutcome,
    SamplingStuckError,
    StalledError,
)
from tinker_sync.types import (
    SampleResponse,
    UntypedAPIFuture,
)

if TYPE_CHECKING:
    from tinker_sync.sampling_client import SamplingClient

log = logging.getLogger("tinker_sync.sampling")

__all__ = ["Cancelled", "PollerWaiter", "SampleJob", "check_features", "close_poller"]


class SampleJob:
    """One ``sample()`` call: retries (docs/design/behavior.md#sampling-retry-layer) around dispatch
    (docs/design/behavior.md#dispatch-gates, docs/design/behavior.md#shared-backoff) and the result
    wait.

    Runs on the sample pools, one step at a time; never blocks a thread while waiting for a
    concurrency slot, a retry delay or (with the session poller) the result.
    """

    def __init__(
        self,
        client: SamplingClient,
        body: dict[str, Any],
        estimate: int,
        finish: Callable[[SampleResponse], Any],
        sdk_method: str | None,
        retry: bool,
    ) -> None:
        self.client = client
        self.session = client._session
        self.config = client._retry_config
        self.body = body
        self.estimate = estimate
        self.postprocess = finish
        self.sdk_method = sdk_method
        self.retry = retry and self.config.enable_retry_logic
        self.attempt = 0
        self.handler: RetryHandler | None = None
        self.limiter: Limiter | None = None
        self.poller: SessionFuturesPoller | None = None
        self.ticket: Ticket | None = None
        self.spec: RequestSpec | None = None
        self.created_at = 0.0
        self.submit_retry: SubmissionRetry | None = None
        self._lock = threading.Lock()
        self.request_id: str | None = None
        self._cancel_sent: set[str] = set()
        #: Request ids the server accepted and then lost (docs/polling.md#lost-requests).
        self.lost: list[str] = []
        self._stop: BaseException | None = None
        #: Set by _on_cancel: stop_reason (asked several times per sample) reads this flag,
        #: not the future's state under its condition lock.
        self._cancelled = False
        self._released = False
        self._slot: list[bool] = []  # [True] once a concurrency slot is held
        self.fut: APIFuture[Any] = APIFuture(on_cancel=self._on_cancel, description="Sample")
        self.fut._owner = self.session  # type: ignore[attr-defined]
        self._stall = StallWatch(self.session.clock, self.session.config.stall_timeout, "Sample")
        self._parked_since: float | None = None
        #: fail_fast: the CircuitOpenError of a call made while its tenant's circuit is open.
        self._open_at_call: BaseException | None = None
        limiter = self.session._limiter  # None before the session started: nothing opened
        fail_fast = self.session.config.health.fail_fast
        if limiter is not None and fail_fast and limiter.tenant.is_open():
            self._open_at_call = limiter.tenant.open_error()

    # ---------------------------------------------------------------- stop conditions

    def stop_reason(self) -> BaseException | None:
        """Why this job must stop now (cancelled, closed, stuck), else None."""
        if self._cancelled:
            return Cancelled()
        if self.session.closed or self.client._closed:
            return ClientClosedError("the client was closed while this sample was pending")
        handler = self.handler
        if handler is not None and handler.stuck():
            return self._stuck_error()
        return self._parked_too_long()

    def _parked_too_long(self) -> BaseException | None:
        """A StalledError once the tenant's circuit has been open for ``stall_timeout`` since
        this job first saw it open (docs/health.md); the tenant's wake-ups ask."""
        limiter = self.limiter
        if limiter is None:
            return None
        clock = self.session.clock
        if not limiter.tenant.is_open():
            self._parked_since = None
            return None
        now = clock.monotonic()
        if self._parked_since is None:
            self._parked_since = now
            return None
        waited = now - self._parked_since
        limit = self.session.config.stall_timeout
        if waited < limit:
            return None
        err = StalledError(
            f"Sample: the server has been failing for {waited:.0f} s "
            f"(stall_timeout={limit:g} s); {limiter.tenant.open_error().reason}",
            stalled_for=waited,
        )
        err.outcome = RequestOutcome.NOT_SENT if self.request_id is None else err.outcome
        return err

    def _stuck_error(self) -> SamplingStuckError:
        return SamplingStuckError(
            f"No progress made in {self.config.progress_timeout:g}s on sampler "
            f"{self.client._sampler_id}. Requests appear to be stuck."
        )

    def _poll_should_stop(self) -> bool:
        """``Poll.is_cancelled`` hook: also stops the poll when closed or stuck."""
        reason = self.stop_reason()
        if reason is None:
            return False
        if not isinstance(reason, Cancelled):
            self._stop = reason
        return True

    def _on_cancel(self) -> None:
        """Runs in the cancelling thread once ``fut.cancel()`` succeeded
        (docs/design/behavior.md#sample-cancellation)."""
        self._cancelled = True  # first: every stop_reason from now on says Cancelled
        limiter = self.limiter
        if limiter is not None:
            limiter.wake(everything=False)  # a held ticket stops now, a queued one at its turn
        with self._lock:
            request_id = self.request_id
        if request_id is None:
            return
        self._server_cancel(request_id)
        poller = self.poller
        if poller is not None and poller.forget(request_id):
            self._release(progressed=False)

    def _server_cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._cancel_sent:
                return
            self._cancel_sent.add(request_id)
        cancel_queue_for(self.session).enqueue(request_id)

    # ---------------------------------------------------------------- steps

    def queue(
        self,
        role: str,
        step: Callable[[], None],
        lane: BoundedLane | None = None,
        *,
        follow: str | None = None,
    ) -> None:
        """Run ``step`` on ``pool(role)`` (or ``lane``), or in a thread waiting in ``result()``.

        ``follow``: on a worker of ``pool(follow)``, run ``step`` on this same thread once its
        current job has returned, as a job of ``pool(role)`` (``DaemonPool.then_here``), when
        both pools have room.
        """
        if self.fut._waited_on_here():
            step()  # the waiting thread is running this job: go on, nobody to hand over to
            return
        claimable = Claimable(step)
        self.fut._offer(claimable)
        if follow is not None and pool(follow).then_here(claimable.run, role):
            return
        if lane is not None:
            lane.submit(claimable.run)
        else:
            pool(role).submit(claimable.run)

    def begin(self) -> None:
        """First step (sample-submit): session start, clone id, then a concurrency slot."""
        try:
            try:
                self.session.ensure_started()
            except MissingCredentialsError as exc:
                if self.client._service is None:  # unpickled or built from a handle
                    raise MissingCredentialsError(
                        f"{exc} This SamplingClient was unpickled or built from a sampler "
                        "handle, which carries no credential by default: give this process "
                        "TINKER_API_KEY, pass api_key= to from_sampler_handle, or create the "
                        "ServiceClient with pickle_credentials=True."
                    ) from None
                raise
            self.client._ensure_clone()
        except BaseException as exc:
            self.fut._fail(exc)
            return
        self.admit()

    def admit(self) -> None:
        """Take a concurrency slot, or park (no thread) until one frees up."""
        if self._open_at_call is not None:
            self.fut._fail(self._open_at_call)  # fail_fast: nothing sent
            return
        try:
            self.limiter = self.session.limiter
            self.handler = self.client._retry_handler()
        except BaseException as exc:
            self.fut._fail(exc)
            return
        if self.fut.cancelled():
            return
        self.handler.admit(self.attempt_once, self._slot)  # _slot records a taken slot at once
        if self._slot:
            self.attempt_once()

    def abandon(self) -> None:
        """``sample()`` is raising (a signal handler's exception while it queued this job, on
        the main thread): the caller never gets the future, so the sample must not go on.
        Cancel it and give back its concurrency slot (docs/limiter.md#signals)."""
        self.fut.cancel()  # a queued ticket stops at its turn, a held one now
        if self._slot:
            self._release(progressed=False)  # once: a later finish finds it released

    def attempt_once(self) -> None:
        """Queue a submission under a fresh seq_id with the tenant's dispatcher (no waiting)."""
        stop = self.stop_reason()
        if stop is not None:
            self.finish(None, stop)
            return
        limiter = self.limiter
        assert limiter is not None
        seq_id = self.client._take_seq_id()
        self.spec = RequestSpec(
            method="POST",
            path="/api/v1/asample",
            pool=Pool.SAMPLE,
            json=dict(self.body, seq_id=seq_id),
            headers={"X-Tinker-Sampling-Backpressure": "1"},
            max_retries=0,
            sdk_method=self.sdk_method,
        )
        self.created_at = self.session.clock.monotonic()
        self.submit_retry = None  # the submission loop's state for this seq_id, on first send
        ticket = Ticket(
            owner=id(self.client),  # the round-robin unit (an int: keeps no client alive)
            estimate=self.estimate,
            start=self._start_send,
            on_stop=self._stopped_waiting,
            stop_reason=self.stop_reason,
        )
        self.ticket = ticket
        limiter.enqueue(ticket)

    def _start_send(self, ticket: Ticket) -> None:
        limiter = self.limiter
        assert limiter is not None
        self.queue("sample-submit", functools.partial(self._send, ticket), lane=limiter.sender)

    def _stopped_waiting(self, exc: BaseException) -> None:
        self.finish(None, exc)

    def _send(self, ticket: Ticket) -> None:
        """One send of the held ticket: re-check stop and deadline, POST, then settle.

        A 429 (or a 402 inside the billing window) moves the tenant's deadline and parks the
        ticket again with its gates and seq_id; a retryable failure parks it on the timer for
        the submission loop's delay. Nothing here waits. The sender slot is freed when this
        step returns, so a started ticket never queues behind another for a thread.
        """
        limiter = self.limiter
        assert limiter is not None
        # The limiter may start one admission more than once (docs/limiter.md#signals): only
        # the step that claims it sends. Send steps run on SDK workers, or inline in a non-main
        # thread waiting in result(): never where a signal handler can interrupt them.
        if ticket is not self.ticket or not limiter.claim(ticket):
            return
        try:
            self._send_once()
        finally:
            limiter.sender_done(ticket)

    def _send_once(self) -> None:
        from tinker_sync._flow.retry import send_with_retries

        limiter, ticket, session = self.limiter, self.ticket, self.session
        assert limiter is not None and ticket is not None and self.spec is not None
        clock = session.clock
        stop = self.stop_reason()
        if stop is not None:
            if ticket.probe:
                ticket.probe = False
                limiter.tenant.abandon_probe()
            limiter.release(ticket)
            self.finish(None, stop)
            return
        if limiter.backoff_remaining() > 0:  # another client or process backed off meanwhile
            if ticket.probe:  # not sent: the next started ticket probes
                ticket.probe = False
                limiter.tenant.abandon_probe()
            limiter.hold(ticket)
            return
        if ticket.probe:
            ticket.probe = False  # this send is the probe; its outcome reaches the tenant
        elif limiter.tenant.turn() is Turn.WAIT:  # the circuit opened since it was started
            limiter.hold(ticket)
            return
        if self.submit_retry is None:
            self.submit_retry = session.submission_retry("sample", stop=self.stop_reason)
        try:
            # The server answers a repeated seq_id with the same future: a slow send may be
            # hedged (a second copy on a lossy network).
            transport = session.transport
            sent_at, in_flight = clock.monotonic(), limiter.in_flight()
            try:
                reply = send_with_retries(
                    transport, self.spec, max_retries=0, send=session.hedged_send(transport)
                )
            except APIStatusError:  # an answer: its time counts (docs/limiter.md#send-width)
                limiter.record_send(clock.monotonic() - sent_at, in_flight)
                raise
            limiter.record_send(clock.monotonic() - sent_at, in_flight)
            accepted = reply.parse(UntypedAPIFuture)
        except APIStatusError as exc:
            if exc.status_code == 429 or (
                exc.status_code == 402
                and session.billing.should_pause(clock.monotonic(), exc.message)
            ):
                delay = parse_retry_after(exc.response.headers, clock.time())
                if delay is None:
                    delay = (
                        LARGE_PROMPT_BACKOFF_S
                        if self.estimate > LARGE_PROMPT_BYTES
                        else RATE_LIMIT_BACKOFF_S
                    )
                limiter.set_backoff(delay, f"{exc.status_code} on asample", session.hooks)
                limiter.hold(ticket)  # same seq_id, same gates, after the deadline
                return
            self._submit_failed(exc)
            return
        except Exception as exc:
            self._submit_failed(exc)
            return
        except BaseException as exc:
            limiter.release(ticket)
            self.finish(None, exc)
            return
        limiter.release(ticket)
        self.submit_retry.succeeded()
        # Sent and accepted: the ticket and the submission state hold this job's methods, and
        # holding them here would leave reference cycles behind for the garbage collector.
        self.ticket = self.submit_retry = None
        self._accepted(accepted)

    def _submit_failed(self, exc: Exception) -> None:
        """The submission loop's retry (same seq_id, gates kept), parked on the timer."""
        limiter, ticket, retry = self.limiter, self.ticket, self.submit_retry
        assert limiter is not None and ticket is not None and retry is not None
        try:
            wait = retry.wait_after(exc)
        except BaseException as final:
            limiter.release(ticket)
            self.finish(None, final)
            return
        call_later(self.session.clock, wait, "sample-submit", limiter.hold, ticket)

    def _accepted(self, accepted: UntypedAPIFuture) -> None:
        """The server took the request: wait for its result (poll or session poller)."""
        request_id = accepted.request_id
        with self._lock:
            self.request_id = request_id
        self.fut._set_request_ids((request_id,))
        sequence_ids = accepted.sample_sequence_ids
        if self.fut.cancelled():
            self._server_cancel(request_id)
            self.finish(None, Cancelled())
            return
        created_at = self.created_at
        poller = self.client._futures_poller()
        if poller is None:
            poll = self._poll(request_id, sequence_ids, created_at, allow_metadata_only=True)
            # A lone sample (no other of this client's in flight, none waiting to be sent):
            # the send step's own thread polls next, once the step has returned (its sender
            # slot freed), so there is no hand-off between the send and the poll. With others
            # in flight the poll is queued: lending senders to polls then cost more wake-ups
            # and CPU per sample than the hand-off (docs/polling.md#which-thread-polls).
            limiter, handler = self.limiter, self.handler
            alone = (
                limiter is not None
                and handler is not None
                and handler.in_flight <= 1
                and limiter.quiet()
            )
            self.queue("sample-poll", poll.run, follow="sample-submit" if alone else None)
            return
        self.poller = poller
        poller.wait(request_id, PollerWaiter(self, request_id, sequence_ids, created_at))
        if self.fut.cancelled() and poller.forget(request_id):
            self._server_cancel(request_id)
            self.finish(None, Cancelled())

    def _poll(
        self,
        request_id: str,
        sequence_ids: list[str] | None,
        created_at: float,
        *,
        allow_metadata_only: bool,
        on_done: Callable[[Any, BaseException | None], None] | None = None,
    ) -> Poll:
        def decode(decision: Decision) -> SampleResponse:
            decode_sample_response = _proto.decode_sample_response
            sample_response_from_json = _jsonresults.sample_response_from_json

            if decision.protobuf:
                return decode_sample_response(decision.body, sequence_ids)
            return sample_response_from_json(decision.body, sequence_ids)

        return Poll(
            self.session,
            request_id,
            "Sample",
            decode=decode,
            on_done=on_done or self.finish,
            created_at=created_at,
            sdk_method=self.sdk_method,
            is_cancelled=self._poll_should_stop,
            on_queue_state=self.client.on_queue_state_change,
            sampling=True,
            allow_metadata_only=allow_metadata_only,
        )

    # ---------------------------------------------------------------- settling

    def finish(self, value: Any, error: BaseException | None) -> None:
        """One attempt ended: resolve, fail, or schedule a retry under a new seq_id."""
        if error is None and value is None:  # the poll stopped at our request
            error = self._stop or Cancelled()
        if isinstance(error, Cancelled) or self.fut.cancelled():
            self._release(progressed=False)
            return
        if error is None:
            try:
                value = self.postprocess(value)
            except Exception as exc:
                error = exc
        if error is not None and isinstance(error, SamplingStuckError):
            with self._lock:
                request_id = self.request_id
            if request_id is not None:
                self._server_cancel(request_id)
        if isinstance(error, RequestLostError):
            final = self._lost(error)
            resubmit = final is None
            error = final or error
        else:
            resubmit = self.retry and error is not None and self.config.is_retryable(error)
        if resubmit:
            assert error is not None
            stalled = self._stalled(error)
            if stalled is not None:
                self._release(progressed=False)
                self.fut._fail(stalled)
                return
            handler = self.handler
            if handler is not None and handler.stuck():
                stuck = self._stuck_error()
                stuck.__cause__ = error
                self._release(progressed=False)
                self.fut._fail(stuck)
                return
            delay = self.config.delay(self.attempt, self.session.clock.random())
            self.attempt += 1
            with self._lock:
                self.request_id = None
            log.debug(
                "retrying sample on %s in %.3f s after %r", self.client._sampler_id, delay, error
            )
            emit_hook(
                self.session.hooks,
                "retry_scheduled",
                layer="sample",
                delay=delay,
                reason=type(error).__name__,
                attempt=self.attempt,
                method="POST",
                path="/api/v1/asample",
            )
            call_later(self.session.clock, delay, "sample-submit", self.attempt_once)
            return
        self._release(progressed=error is None)
        if error is not None:
            self.fut._fail(error)
        else:
            self.fut._resolve(value)

    def _lost(self, error: RequestLostError) -> RequestLostError | None:
        """The server lost this attempt: resubmit (None) at most LOST_RESUBMITS times, else
        the error to fail with, naming every lost request id."""
        with self._lock:
            if error.request_id is not None:
                self.lost.append(error.request_id)
            lost = list(self.lost)
        if self.retry and len(lost) <= LOST_RESUBMITS:
            return None
        if len(lost) <= 1:
            return error
        final = RequestLostError(
            f"{error.message}; resubmitted {len(lost) - 1} time(s), each lost "
            f"(request ids {', '.join(lost)})",
            op=error.op,
            request_id=error.request_id,
        )
        final.__cause__ = error
        return final

    def _stalled(self, error: BaseException) -> BaseException | None:
        """The user's knobs bound this layer too: ``max_retries=0`` (no retry: ``error``) and
        ``stall_timeout`` without a useful answer (a StalledError)."""
        if self.session.config.max_retries == 0:
            return error
        status = getattr(error, "status_code", None)
        if isinstance(status, int) and status < 500:
            self._stall.useful()
            return None
        return self._stall.unhealthy(error, request_id=self.request_id)

    def _release(self, *, progressed: bool) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        handler = self.handler
        if handler is not None:
            handler.release(progressed=progressed)


class PollerWaiter:
    """A sample's registration with the session futures poller
    (docs/design/behavior.md#session-futures-poller)."""

    def __init__(
        self,
        job: SampleJob,
        request_id: str,
        sequence_ids: list[str] | None,
        created_at: float,
    ) -> None:
        self.job = job
        self.request_id = request_id
        self.sequence_ids = sequence_ids
        self.created_at = created_at
        self._reserved = 0

    def abandoned(self) -> BaseException | None:
        reason = self.job.stop_reason()
        if reason is not None and not isinstance(reason, Cancelled):
            return reason
        return None

    def on_failure(self, exc: BaseException) -> None:
        self.job.finish(None, exc)

    def on_completion(self, completion: dict[str, Any]) -> None:
        """Fetch the payload: a ``finished`` size is reserved first, then fetched in full."""
        job = self.job
        size = completion.get("response_payload_uncompressed_size")
        full = (
            completion.get("state") == "finished"
            and isinstance(size, int)
            and not isinstance(size, bool)
            and size > 0
        )
        if full:
            assert isinstance(size, int)
            limiter = job.session.limiter
            try:
                limiter.reserve_response_bytes(size, job.stop_reason)
            except Stopped as stopped:
                job.finish(None, stopped.exc)
                return
            self._reserved = size
        poll = job._poll(
            self.request_id,
            self.sequence_ids,
            self.created_at,
            allow_metadata_only=not full,
            on_done=self._fetched,
        )
        poll.run()

    def _fetched(self, value: Any, error: BaseException | None) -> None:
        job = self.job
        if self._reserved:
            job.session.limiter.release_response_bytes(self._reserved)
            self._reserved = 0
        poller = job.poller
        if poller is not None and (
            value is not None or isinstance(error, (RequestFailedError, APIResponseValidationError))
        ):
            poller.mark_retrieved(self.request_id)
        job.finish(value, error)


class Cancelled(Exception):
    """Internal: the sample future was cancelled."""


def check_features(response: SampleResponse, alt_k: int, last_n: int | None) -> None:
    """Fail loudly when the server silently ignored a newer sampling option
    (docs/design/behavior.md#sampling-wire-rules)."""
    if alt_k > 0 and response.prompt_alt_tokens is None:
        raise RuntimeError(
            f"prompt_alt_tokens_k={alt_k} was requested but the server returned no "
            "prompt_alt_tokens; it may predate this feature"
        )
    if last_n is None:
        return
    values = response.prompt_logprobs  # None where not computed (NaN in the array)
    if values is None:
        return
    if any(v is not None for v in values[: max(0, len(values) - last_n)]):
        raise RuntimeError(
            f"prompt_logprobs_last_n={last_n} was requested but the server scored earlier "
            "prompt tokens too; it may predate this feature"
        )


def close_poller(poller: SessionFuturesPoller, pid: int) -> None:
    """Finalizer of a collected client: stop its poller (never a parent's, from a child)."""
    if os.getpid() == pid:
        poller.close()
