"""Retry policy: Retry-After, HTTP backoff, one classifier, the HTTP retry loop, the holder loop.

Usage::

    from tinker_sync._flow.retry import send_with_retries, submission_loop, SubmissionRetry, classify

    reply = send_with_retries(transport, spec)                 # HTTP layer
    result = submission_loop(lambda: parse(send_with_retries(transport, spec)),
                             SubmissionRetry(clock=clock, billing=session_billing))  # holder

Two layers, both sleeping only through the injected :class:`~tinker_sync._runtime.clock.Clock`:

* :func:`send_with_retries` (official ``_base_client``): up to ``max_retries`` (10) retries
  of 408/409/429/>=500 and transport errors, ``x-should-retry`` overriding; delay from
  ``retry-after-ms`` / ``retry-after`` when in (0, 60] s, else ``min(0.5*2^k, 10) * U[0.75, 1]``.
  Every attempt reuses the spec's idempotency key and sends ``x-stainless-retry-count: k``.
* :func:`submission_loop` (official ``execute_with_retries``): retries retryable failures after
  ``min(2^n, 30)`` s, trimmed so the total stays within 300 s; a 402 pauses 5 s at a time
  (uncounted) while the billing incident is younger than the window (3600 s).

:func:`classify` is the single classification used by both loops, telemetry and logs
(docs/design/behavior.md#exception-hierarchy).

Thread safety: pure functions; :class:`BillingPause` is lock-guarded and meant to be shared by
all calls of one session. Fork safety: plain state.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import attrs

from tinker_sync._config import DEFAULT_TIMEOUT, HealthPolicy
from tinker_sync._flow.breaker import TenantHealth, Turn
from tinker_sync._flow.health import StallWatch, describe_failure
from tinker_sync._lazynp import loaded_isinstance
from tinker_sync._runtime.causes import related, signal_exception
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock, exiting
from tinker_sync._runtime.fork import make_lock
from tinker_sync._transport import (
    Hook,
    Reply,
    RequestSpec,
    Transport,
    emit_hook,
    error_from_reply,
)
from tinker_sync.exceptions import (
    APIConnectError,
    APIConnectionError,
    APIConnectTimeoutError,
    APIStatusError,
    APITimeoutError,
    PersistentServerError,
    RequestErrorCategory,
    RequestFailedError,
    RequestOutcome,
    StalledError,
    TinkerError,
)

__all__ = [
    "HOLDER_BUDGET_S",
    "INITIAL_RETRY_DELAY",
    "MAX_RETRY_DELAY",
    "RETRYABLE_STATUSES",
    "BillingPause",
    "Classification",
    "SubmissionRetry",
    "classify",
    "holder_backoff",
    "http_backoff",
    "is_retryable_status",
    "is_user_error",
    "is_user_status",
    "parse_retry_after",
    "permanent_connect_failure",
    "retry_delay",
    "send_with_retries",
    "should_retry",
    "submission_loop",
]

logger = logging.getLogger("tinker_sync.retry")

T = TypeVar("T")

#: The backoff numbers' one source is :class:`HealthPolicy` (docs/health.md); these name its
#: defaults.
_DEFAULT_POLICY = HealthPolicy()
INITIAL_RETRY_DELAY = _DEFAULT_POLICY.http_backoff_initial_s
MAX_RETRY_DELAY = _DEFAULT_POLICY.http_backoff_max_s
RETRY_AFTER_MAX = 60.0
HOLDER_BUDGET_S = 300.0
HOLDER_MAX_WAIT = _DEFAULT_POLICY.submit_backoff_max_s
BILLING_PAUSE_S = 5.0
BILLING_WARN_EVERY_S = 60.0
BILLING_INCIDENT_RESET_S = 300.0
DEFAULT_BILLING_WINDOW_S = 3600.0

_TRANSIENT_ERRNOS = frozenset(
    {errno.EBADF, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT}
)


# --------------------------------------------------------------------------------------------
# Pure policy functions
# --------------------------------------------------------------------------------------------


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, val in headers.items():
            if key.lower() == name:
                return val
    return value


def parse_retry_after(headers: Mapping[str, str], now_wall: float) -> float | None:
    """Seconds the server asked us to wait, or None when absent or outside (0, 60].

    ``retry-after-ms`` (float milliseconds) wins when it parses, even if out of range (then
    None, as in the official client). Otherwise ``retry-after`` as float seconds, or as an
    HTTP-date minus ``now_wall`` (the Clock's wall time).
    """
    raw_ms = _header(headers, "retry-after-ms")
    if raw_ms is not None:
        try:
            value: float | None = float(raw_ms) / 1000.0
        except ValueError:
            value = None
        if value is not None:
            return value if 0 < value <= RETRY_AFTER_MAX else None
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        import email.utils  # an HTTP date: rare (docs/scale-out.md#start-up)

        parsed = email.utils.parsedate_tz(raw)
        if parsed is None:
            return None
        value = float(email.utils.mktime_tz(parsed)) - now_wall
    return value if 0 < value <= RETRY_AFTER_MAX else None


def http_backoff(k: int, rng: Callable[[], float], policy: HealthPolicy | None = None) -> float:
    """Delay before HTTP retry ``k`` (0-based): ``min(0.5 * 2^k, 10) * (1 - 0.25 * rng())``
    with the default ``policy`` (its ``http_backoff_*`` knobs, docs/health.md)."""
    p = policy if policy is not None else _DEFAULT_POLICY
    base = min(p.http_backoff_initial_s * 2.0 ** min(max(k, 0), 64), p.http_backoff_max_s)
    return base * (1.0 - p.http_backoff_jitter * rng())


def retry_delay(
    headers: Mapping[str, str] | None, k: int, clock: Clock, policy: HealthPolicy | None = None
) -> float:
    """The HTTP-layer delay before retry ``k``: Retry-After if honoured, else :func:`http_backoff`."""
    if headers:
        honoured = parse_retry_after(headers, clock.time())
        if honoured is not None:
            return honoured
    return http_backoff(k, clock.random, policy)


def holder_backoff(n: int, policy: HealthPolicy | None = None) -> float:
    """Submission-loop delay after failure ``n`` (0-based): ``min(2^n, 30)`` with the default
    ``policy`` (its ``submit_backoff_*`` knobs, docs/health.md)."""
    p = policy if policy is not None else _DEFAULT_POLICY
    return float(
        min(p.submit_backoff_initial_s * 2.0 ** min(max(n, 0), 64), p.submit_backoff_max_s)
    )


#: The 4xx statuses worth repeating a request for; every status >= 500 is, too. The one
#: source for every retry layer (HTTP, submission, sampling).
RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    """408, 409, 429 (:data:`RETRYABLE_STATUSES`) and every status >= 500."""
    return status in RETRYABLE_STATUSES or status >= 500


def is_user_status(status: object) -> bool:
    """A 4xx other than 408: the caller's request was wrong, repeating it will not help."""
    return isinstance(status, int) and 400 <= status < 500 and status != 408


def _x_should_retry(headers: Mapping[str, str] | None) -> bool | None:
    if not headers:
        return None
    value = _header(headers, "x-should-retry")
    if value is None:
        return None
    value = value.strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None


_TRANSPORT_FAILURES = (TimeoutError, ConnectionError)
#: urllib3's and http.client's, checked without importing either (docs/scale-out.md#start-up)
_URLLIB3_FAILURES = ("ProtocolError", "TimeoutError")


def _transport_failure(exc: BaseException) -> bool:
    """A transport-level failure anywhere in the cause chain (incl. EBADF-style OSErrors)."""
    for e in related(exc):
        if isinstance(e, APIConnectionError):
            return True
        if isinstance(e, TinkerError):
            continue
        if isinstance(e, _TRANSPORT_FAILURES):
            return True
        if loaded_isinstance(e, "urllib3.exceptions", *_URLLIB3_FAILURES):
            return True
        if loaded_isinstance(e, "http.client", "IncompleteRead"):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
    return False


def is_user_error(exc: BaseException) -> bool:
    """Category ``user`` or a 4xx other than 408, following ``__cause__``/``__context__``."""
    for e in related(exc):
        if isinstance(e, RequestFailedError) and e.category is RequestErrorCategory.User:
            return True
        if is_user_status(getattr(e, "status_code", None)):
            return True
    return False


@attrs.frozen
class Classification:
    """What a failure means: ``retryable`` (by docs/design/behavior.md#exception-hierarchy),
    ``user_error``, status and outcome."""

    retryable: bool
    user_error: bool
    status_code: int | None
    outcome: RequestOutcome | None
    kind: str


def classify(exc: BaseException) -> Classification:
    """The one classifier (docs/design/behavior.md#exception-hierarchy) shared by both retry loops,
    telemetry and logs.

    Retryable: an :class:`APIStatusError` whose response says ``x-should-retry: true`` (or not
    ``false`` and has status 408/409/429/5xx); every connection error and timeout, including
    raw urllib3/OS errors such as EBADF found through ``__cause__``, except the ones
    that cannot heal by waiting (:func:`permanent_connect_failure`). Not retryable:
    credential errors, closed clients, forks, server-side failures (RequestFailedError), and
    anything else, including an exception a Python signal handler raised.
    """
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    outcome = getattr(exc, "outcome", None)
    outcome = outcome if isinstance(outcome, RequestOutcome) else None
    if isinstance(exc, APIStatusError):
        response = getattr(exc, "response", None)
        forced = _x_should_retry(getattr(response, "headers", None))
        retryable = forced if forced is not None else is_retryable_status(exc.status_code)
    elif isinstance(exc, APIConnectionError):
        retryable = permanent_connect_failure(exc) is None
    elif isinstance(exc, TinkerError):
        retryable = False
    else:
        # A signal handler's exception (an alarm timeout) is the caller's, never a retry's.
        retryable = _transport_failure(exc) and signal_exception(exc) is None
    return Classification(
        retryable=retryable,
        user_error=is_user_error(exc),
        status_code=status,
        outcome=outcome,
        kind=type(exc).__name__,
    )


def permanent_connect_failure(exc: BaseException) -> str | None:
    """A hint when a connection failure cannot heal by retrying, else None.

    A host name that does not resolve (any DNS answer but "try again later"), a TLS handshake
    answered in plain HTTP (an ``https://`` URL for an ``http://`` server), and a certificate
    that does not verify: retrying only makes the user wait for the same error.
    """
    for e in related(exc):
        if isinstance(e, socket.gaierror) and e.errno != socket.EAI_AGAIN:
            return "the host name does not resolve; check the base URL for typos"
        if loaded_isinstance(e, "ssl", "SSLCertVerificationError"):
            return "the server's TLS certificate does not verify"
        if loaded_isinstance(e, "ssl", "SSLError") and getattr(e, "reason", None) in (
            "WRONG_VERSION_NUMBER",
            "HTTP_REQUEST",
            "RECORD_LAYER_FAILURE",
        ):
            return "the server does not speak TLS here; did you mean http:// instead of https://?"
    return None


_REBUILDABLE = (APIConnectionError, APIConnectError, APITimeoutError, APIConnectTimeoutError)


def _with_context(
    exc: Exception, transport: Transport, spec: RequestSpec, attempts: int, elapsed: float
) -> Exception:
    """The final connection error, its message naming the URL, the attempts and any hint."""
    if type(exc) not in _REBUILDABLE:
        return exc
    assert isinstance(exc, APIConnectionError)
    hint = permanent_connect_failure(exc)
    tries = f"{attempts} attempt" + ("s" if attempts != 1 else "")
    url = f"{transport.config.normalized_base_url}{spec.path}"
    message = f"{exc.message}. {spec.method} {url} gave up after {tries} in {elapsed:.1f} s" + (
        f": {hint}" if hint else ""
    )
    return type(exc)(message, exc.request)


def retry_window(transport: Transport) -> float:
    """How long one request keeps retrying a server it gets no answer from: ``timeout``."""
    read = transport.config.timeout.read
    return DEFAULT_TIMEOUT if read is None else read


def should_retry(outcome: Reply | BaseException) -> bool:
    """Whether the HTTP layer retries this reply or exception (``x-should-retry`` wins)."""
    if isinstance(outcome, Reply):
        forced = _x_should_retry(outcome.headers)
        if forced is not None:
            return forced
        return is_retryable_status(outcome.status)
    return classify(outcome).retryable


# --------------------------------------------------------------------------------------------
# HTTP retry loop (docs/design/behavior.md#http-retry-policy)
# --------------------------------------------------------------------------------------------


def send_with_retries(
    transport: Transport,
    spec: RequestSpec,
    *,
    max_retries: int | None = None,
    clock: Clock | None = None,
    hooks: Sequence[Hook] | None = None,
    send: Callable[[RequestSpec, int], Reply] | None = None,
    tenant: TenantHealth | None = None,
) -> Reply:
    """Send ``spec`` with HTTP-level retries and return the first reply with status < 400.

    ``send(spec, attempt)`` replaces ``transport.send_once`` (the session's hedged send).
    ``tenant`` (docs/health.md): a retry of a 5xx or transport failure spends its retry budget,
    and none is made while its circuit is open or the budget is empty (the failure is raised
    for the caller's loop, which waits for the probe).

    ``max_retries``: argument, else ``spec.max_retries``, else the client's (default 10).
    ``clock``/``hooks`` default to the transport's. Raises the status exception
    (:func:`~tinker_sync._transport.error_from_reply`) for a final error reply, or the mapped
    transport exception; credential errors propagate at once. Each retry emits a
    ``retry_scheduled`` hook event and sleeps with reason ``"http-retry"``, timed by the
    client's :class:`HealthPolicy` (``http_backoff_*``).
    """
    if max_retries is None:
        max_retries = spec.max_retries
    if max_retries is None:
        max_retries = transport.config.max_retries
    clock = transport.clock if clock is None else clock
    send_once = transport.send_once if send is None else send
    start = attempt_start = clock.monotonic()
    k = 0
    ladder: _Ladder | None = None  # the rest is set up by a first failure (the rare case)
    while True:
        try:
            reply = send_once(spec, k)
        except Exception as exc:
            now = clock.monotonic()
            if ladder is None:
                ladder = _Ladder(tenant)
            window = retry_window(transport)
            policy = transport.config.health  # the backoff knobs (docs/health.md)
            # No connection at all: retries stay within ``timeout`` seconds of the first
            # attempt, the last one timed to end (if as long as this one) at that deadline, so
            # an unreachable server fails within ``timeout`` yet a shorter outage is ridden
            # out. A reply lost on an open connection (reset, cut short, read timeout) says
            # the server was reachable: on a lossy network that is retried up to max_retries.
            if isinstance(exc, APIConnectError):
                room = start + window - now - (now - attempt_start)
            else:
                room = math.inf
            delay = min(http_backoff(ladder.step(transport=True), clock.random, policy), room)
            if (
                k >= max_retries
                or room <= 0
                or not classify(exc).retryable
                or not _tenant_allows_retry(tenant, timeout=isinstance(exc, APITimeoutError))
            ):
                final = _with_context(exc, transport, spec, k + 1, now - start)
                if final is exc:
                    raise
                raise final from exc
            reason = type(exc).__name__
            failure: BaseException = exc
        else:
            if reply.status < 400:
                return reply
            if ladder is None:
                ladder = _Ladder(tenant)
            policy = transport.config.health
            if (
                k >= max_retries
                or not should_retry(reply)
                or (reply.status >= 500 and not _tenant_allows_retry(tenant, timeout=False))
            ):
                raise error_from_reply(reply)
            delay = retry_delay(reply.headers, ladder.step(transport=False), clock, policy)
            reason = f"status {reply.status}"
            failure = error_from_reply(reply)
        k += 1
        logger.debug(
            "retrying %s %s in %.3f s (%s, retry %d/%d)",
            spec.method,
            spec.path,
            delay,
            reason,
            k,
            max_retries,
        )
        emit_hook(
            transport.hooks if hooks is None else tuple(hooks),
            "retry_scheduled",
            layer="http",
            delay=delay,
            reason=reason,
            attempt=k,
            method=spec.method,
            path=spec.path,
        )
        clock.sleep(delay, "http-retry")
        if exiting():
            raise failure
        attempt_start = clock.monotonic()


class _Ladder:
    """The exponent of one request's next backoff (docs/health.md#lossy-networks).

    Usage: ``ladder = _Ladder(tenant)``, then ``n = ladder.step(transport=...)`` per failure.

    ``n`` counts the request's failures in a row; a transport failure (no HTTP answer) after the
    tenant's other requests were answered since the previous one restarts it at 0: one dropped
    connection on a lossy network is not server trouble. An outage (no answer in between) and
    5xx still climb the ladder, and the tenant's circuit still parks the retries.
    """

    def __init__(self, tenant: TenantHealth | None) -> None:
        self.tenant = tenant
        self.n = 0
        self._answered: int | None = None  # the tenant's successes at the previous failure

    def step(self, *, transport: bool) -> int:
        """The exponent for the wait after this failure (``transport``: no HTTP answer)."""
        answered = self.tenant.successes if self.tenant is not None else -1
        if transport and self._answered is not None and answered > self._answered:
            self.n = 0  # the tenant's other requests were answered meanwhile
        self._answered = answered
        n = self.n
        self.n += 1
        return n


def _tenant_allows_retry(tenant: TenantHealth | None, *, timeout: bool) -> bool:
    """An HTTP-layer retry is made only while the circuit is closed and the budget pays."""
    if tenant is None:
        return True
    return not tenant.is_open() and tenant.acquire_retry(timeout=timeout)


# --------------------------------------------------------------------------------------------
# Holder / submission loop (docs/design/behavior.md#submission-loop)
# --------------------------------------------------------------------------------------------


class BillingPause:
    """State of the 402 billing pause, shared by every submission of one session.

    ``should_pause(now)`` is called on each 402: True means "sleep 5 s and retry, uncounted".
    The incident starts at the first 402; after ``window_s`` (server
    ``billing_exception_max_pause_duration_sec``, default 3600) it returns False and the 402
    propagates as BillingError. A warning is logged at most every 60 s; an incident ends after
    300 s without a 402.
    Thread safety: lock-guarded. Fork safety: plain state.
    """

    def __init__(self, window_s: float = DEFAULT_BILLING_WINDOW_S) -> None:
        self.window_s = float(window_s)
        self._lock = make_lock()
        self._first: float | None = None
        self._last_seen: float | None = None
        self._last_warned: float | None = None

    def should_pause(self, now: float, detail: str = "") -> bool:
        with self._lock:
            if self._last_seen is not None and now - self._last_seen > BILLING_INCIDENT_RESET_S:
                self._first = self._last_seen = self._last_warned = None
            if self._first is not None and now - self._first > self.window_s:
                logger.error(
                    "The job was paused due to billing status for %.0f seconds. This has been "
                    "happening for too long. Aborting.",
                    now - self._first,
                )
                return False
            if self._last_warned is None or now - self._last_warned > BILLING_WARN_EVERY_S:
                self._last_warned = now
                logger.warning("The job is paused due to billing status. Error: %s", detail)
            if self._first is None:
                self._first = now
            self._last_seen = now
            return True

    @property
    def incident_start(self) -> float | None:
        with self._lock:
            return self._first


LoopObserver = Callable[[BaseException, Classification, int, float], object]


class SubmissionRetry:
    """The submission loop's decisions for one call, for a loop that sleeps or a dispatch that
    parks (the sampling dispatcher resubmits from a timer instead of sleeping).

    Usage::

        retry = SubmissionRetry(clock=clock, hooks=hooks, what="sample")
        try:
            send()
        except Exception as exc:
            if retry.billing_pause(exc): ...      # pause BILLING_PAUSE_S, then retry.paused(s)
            wait = retry.wait_after(exc)          # raises to give up (see submission_loop)

    Not thread-safe: one call's attempts are sequential.
    """

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        budget_s: float = HOLDER_BUDGET_S,
        billing: BillingPause | None = None,
        billing_window_s: float = DEFAULT_BILLING_WINDOW_S,
        hooks: Sequence[Hook] = (),
        on_exception: LoopObserver | None = None,
        max_retries: int | None = None,
        stall_timeout: float | None = None,
        reached: Callable[[], bool] | None = None,
        what: str = "request",
        stop: Callable[[], BaseException | None] | None = None,
        tenant: TenantHealth | None = None,
        fail_fast: bool = False,
        closed: Callable[[], BaseException | None] | None = None,
        policy: HealthPolicy | None = None,
    ) -> None:
        self.clock = clock
        #: The client's HealthPolicy: its submit_backoff_* knobs time the waits (docs/health.md).
        self.policy = policy
        #: Ends a wait for the tenant's circuit (the client was closed), as ``stop`` does.
        self.closed = closed
        #: The tenant's circuit breaker and retry budget (docs/health.md), None for none.
        self.tenant = tenant
        self.fail_fast = fail_fast
        self._spent = 0  # the cost of the last retry, refunded when an attempt succeeds
        self._same_error = ""  # the last 5xx (status and server's words) of this call
        self._same_count = 0
        self._successes_before = 0  # the tenant's successes when that run of errors began
        self.billing = billing if billing is not None else BillingPause(billing_window_s)
        self.budget_s = stall_timeout if stall_timeout is not None else budget_s
        self.hooks = hooks
        self.on_exception = on_exception
        self.max_retries = max_retries
        self.stall_timeout = stall_timeout
        self.reached = reached
        self.what = what
        self.stop = stop
        self.start = clock.monotonic()
        self.watch = StallWatch(clock, self.budget_s, what, since=self.start)
        self.attempt = 0
        self._ladder = _Ladder(tenant)  # the wait's exponent (docs/health.md#lossy-networks)

    def gate(self) -> None:
        """Before each attempt: wait (this thread) while the tenant's circuit is open, unless
        this attempt is the probe; the first attempt raises CircuitOpenError with
        ``fail_fast``. A wait longer than the budget ends with a StalledError."""
        tenant = self.tenant
        if tenant is None:
            return
        until = self.start + self.budget_s
        stop, closed = self.stop, self.closed

        def stopped() -> BaseException | None:
            reason = closed() if closed is not None else None
            return reason if reason is not None else (stop() if stop is not None else None)

        turn = tenant.wait_turn(stopped, until, fail_fast=self.fail_fast and self.attempt == 0)
        if turn is Turn.WAIT:
            waited = self.clock.monotonic() - self.start
            raise StalledError(
                f"{self.what}: the server has been failing for {waited:.0f} s "
                f"(stall_timeout={self.budget_s:g} s); {tenant.open_error().reason}",
                stalled_for=waited,
            )

    def succeeded(self) -> None:
        """The attempt succeeded: refund the cost of the retry that led to it."""
        if self.tenant is not None and self._spent:
            self.tenant.refund(self._spent)
            self._spent = 0

    def _same_error_again(self, exc: Exception) -> bool:
        """Whether ``exc`` (a 5xx) repeats this call's last error ``same_error_repeats``
        times in a row while other requests of the tenant succeed."""
        tenant = self.tenant
        if tenant is None or not isinstance(exc, APIStatusError):
            self._same_count = 0
            return False
        words = describe_failure(exc)
        if words != self._same_error:
            self._same_error = words
            self._same_count = 0
            self._successes_before = tenant.successes
        self._same_count += 1
        return (
            self._same_count >= tenant.policy.same_error_repeats
            and tenant.successes > self._successes_before
            and not tenant.is_open()
        )

    def billing_pause(self, exc: BaseException) -> bool:
        """True when ``exc`` is a 402 inside the billing window (pause, no attempt counted)."""
        return (
            isinstance(exc, APIStatusError)
            and exc.status_code == 402
            and self.billing.should_pause(self.clock.monotonic(), exc.message)
        )

    def paused(self, seconds: float) -> None:
        """A billing pause of ``seconds`` is over: it consumed no budget."""
        self.start += seconds
        self.watch.useful()

    def wait_after(self, exc: Exception) -> float:
        """The wait before the next attempt after ``exc``; raises to give up (``exc`` itself,
        a StalledError, or the ``stop()`` reason)."""
        clock = self.clock
        info = classify(exc)
        now = clock.monotonic()
        start, budget_s = self.start, self.budget_s
        elapsed = now - start
        if self.on_exception is not None:
            try:
                self.on_exception(exc, info, self.attempt, elapsed)
            except Exception:
                logger.warning("submission-loop observer failed", exc_info=True)
        if not info.retryable or self.max_retries == 0 or exiting():
            raise exc
        if self.reached is not None and not self.reached():
            raise exc
        server_trouble = info.status_code is None or info.status_code >= 500
        if server_trouble:
            stalled = self.watch.unhealthy(exc) if self.stall_timeout is not None else None
            if stalled is not None:
                raise stalled from exc
            if self._same_error_again(exc):
                assert isinstance(exc, APIStatusError)
                raise PersistentServerError(
                    f"{self.what}: the server answered {describe_failure(exc)} "
                    f"{self._same_count} times in a row while it answers other requests; "
                    "not retrying this request",
                    response=exc.response,
                    request=exc.request,
                    body=exc.body,
                ) from exc
        else:
            self.watch.useful()
            self._same_count = 0
        if elapsed >= budget_s:
            raise exc
        if server_trouble and self.tenant is not None:
            timeout = isinstance(exc, APITimeoutError)
            # An empty budget opens the circuit: the retry then waits for the probe (gate()).
            spent = self.tenant.acquire_retry(timeout=timeout)
            self._spent = self.tenant.retry_cost(timeout=timeout) if spent else 0
        reason = self.stop() if self.stop is not None else None
        if reason is not None:
            raise reason from exc
        n = self._ladder.step(transport=info.status_code is None)
        wait = min(holder_backoff(n, self.policy), start + budget_s - now)
        if wait <= 0:  # the budget is spent (float rounding can land a hair under it)
            raise exc
        self.attempt += 1
        if self.attempt == 1 and not (self.tenant is not None and self.tenant.is_open()):
            # While the circuit is open the tenant logs for everyone (one line per change).
            logger.info(
                "%s failed (%s); retrying for up to %.0f s more",
                self.what,
                describe_failure(exc),
                start + budget_s - now,
            )
        emit_hook(
            self.hooks,
            "retry_scheduled",
            layer="submission",
            delay=wait,
            reason=info.kind if info.status_code is None else f"status {info.status_code}",
            attempt=self.attempt,
        )
        return wait


def submission_loop(fn: Callable[[], T], retry: SubmissionRetry | None = None) -> T:
    """Call ``fn()`` until it succeeds, mirroring the official holder loop
    (docs/design/behavior.md#submission-loop); ``retry`` (a :class:`SubmissionRetry`, from
    :meth:`Session.submission_retry` in the SDK; defaults when None) makes the decisions:

    * Retryable failures (:func:`classify`) wait ``min(2^n, 30)`` s (reason
      ``"submission-retry"``), trimmed so that the time since the first attempt never exceeds
      ``budget_s`` (or ``stall_timeout`` when given); after that the failure propagates.
    * The user's knobs bound this layer too: with ``max_retries=0`` nothing is retried here;
      while ``reached()`` is False (the server never answered this session) the HTTP layer's
      retries were the whole budget, so an unreachable server fails within ``timeout``; and a
      call that got no useful answer (connection errors, timeouts, 5xx) for ``stall_timeout``
      seconds fails with :class:`~tinker_sync.exceptions.StalledError` naming ``what``.
    * ``stop()``, asked before each wait, ends the loop with the exception it returns (e.g.
      the caller was cancelled or its own progress deadline passed).
    * A 402 sleeps 5 s (reason ``"billing-pause"``) without counting an attempt and without
      consuming the budget, while ``billing`` (a per-session :class:`BillingPause`; a fresh one
      with ``billing_window_s`` when None) allows it.
    * ``on_exception(exc, classification, attempt, elapsed)`` sees every failure but billing
      pauses (telemetry); its exceptions are logged.

    ``fn`` must reuse one :class:`RequestSpec` (one idempotency key) across calls
    (docs/design/behavior.md#idempotency-key).
    """
    if retry is None:
        retry = SubmissionRetry()
    clock = retry.clock
    while True:
        retry.gate()
        try:
            result = fn()
        except Exception as exc:
            if retry.billing_pause(exc):
                pause_start = clock.monotonic()
                clock.sleep(BILLING_PAUSE_S, "billing-pause")
                retry.paused(clock.monotonic() - pause_start)
                if exiting():
                    raise
                continue
            clock.sleep(retry.wait_after(exc), "submission-retry")
        else:
            retry.succeeded()
            return result
