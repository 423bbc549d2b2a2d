"""Tests for tinker_sync._flow.retry: docs/design/behavior.md#http-retry-policy,
docs/design/behavior.md#submission-loop, the classifier, both retry loops."""

from __future__ import annotations

import email.utils
import errno
import logging
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import urllib3.exceptions

from tinker_sync._config import ClientConfig
from tinker_sync._flow.retry import (
    BillingPause,
    SubmissionRetry,
    classify,
    holder_backoff,
    http_backoff,
    is_user_error,
    parse_retry_after,
    retry_delay,
    send_with_retries,
    should_retry,
    submission_loop,
)
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._transport import HookEvent, Pool, Reply, RequestSpec
from tinker_sync.exceptions import (
    APIConnectError,
    APIConnectionError,
    APIConnectTimeoutError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    BadRequestError,
    BillingError,
    ClientClosedError,
    ConflictError,
    ForkedProcessError,
    FutureExpiredError,
    InternalServerError,
    MissingCredentialsError,
    NotFoundError,
    RateLimitError,
    RequestErrorCategory,
    RequestFailedError,
    RequestOutcome,
    ResponseSnapshot,
    status_error_class,
)

WALL = 1_700_000_000.0


def reply(status: int, headers: dict[str, str] | None = None, body: bytes = b'{"x":1}') -> Reply:
    return Reply(
        status=status,
        headers={k.lower(): v for k, v in (headers or {}).items()},
        content=body,
        elapsed=0.0,
        method="POST",
        url="http://127.0.0.1:1/api/v1/x",
    )


def status_exc(status: int, headers: dict[str, str] | None = None) -> APIStatusError:
    cls = status_error_class(status)
    return cls(f"Error code: {status}", response=ResponseSnapshot(status, headers or {}, b"{}"))


# ---------------------------------------------------------------------------------------------
# docs/design/behavior.md#http-retry-policy: status x x-should-retry matrix, backoff ladder at both
# jitter extremes
# ---------------------------------------------------------------------------------------------

STATUSES = [400, 401, 402, 403, 404, 408, 409, 410, 422, 429, 499, 500, 502, 503, 504, 599]
RETRYABLE = {408, 409, 429, 500, 502, 503, 504, 599}


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("header", [None, "true", "false", "TRUE", " False ", "maybe"])
def test_should_retry_matrix(status: int, header: str | None) -> None:
    headers = {} if header is None else {"x-should-retry": header}
    forced = {"true": True, "false": False}.get((header or "").strip().lower())
    expected = forced if forced is not None else status in RETRYABLE
    assert should_retry(reply(status, headers)) is expected
    # the same decision for the exception built from that reply (one classifier,
    # docs/design/behavior.md#exception-hierarchy)
    exc = status_exc(status, headers)
    assert classify(exc).retryable is expected
    assert should_retry(exc) is expected


LADDER = [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


@pytest.mark.parametrize("k", range(7))
def test_http_backoff_ladder_at_both_jitter_extremes(k: int) -> None:
    assert http_backoff(k, lambda: 0.0) == pytest.approx(LADDER[k])  # factor 1.0
    assert http_backoff(k, lambda: 1.0) == pytest.approx(LADDER[k] * 0.75)  # factor 0.75
    mid = http_backoff(k, lambda: 0.5)
    assert LADDER[k] * 0.75 < mid < LADDER[k]


def test_http_backoff_huge_k_does_not_overflow() -> None:
    assert http_backoff(10_000, lambda: 0.0) == 10.0
    assert http_backoff(-3, lambda: 0.0) == 0.5


def test_holder_backoff_ladder() -> None:
    assert [holder_backoff(n) for n in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert holder_backoff(5000) == 30


# ---------------------------------------------------------------------------------------------
# docs/design/behavior.md#http-retry-policy: Retry-After parsing
# ---------------------------------------------------------------------------------------------


def http_date(seconds_from_wall: float) -> str:
    return email.utils.formatdate(WALL + seconds_from_wall, usegmt=True)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "60000"}, 60.0),
        ({"retry-after-ms": "60001"}, None),
        ({"retry-after-ms": "750"}, 0.75),
        ({"retry-after-ms": "0.5"}, 0.0005),
        ({"retry-after-ms": "0"}, None),
        ({"retry-after-ms": "-5"}, None),
        ({"retry-after-ms": "60001", "retry-after": "5"}, None),  # ms wins when it parses
        ({"retry-after-ms": "soon", "retry-after": "5"}, 5.0),  # unparsable ms falls through
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after": "60"}, 60.0),
        ({"retry-after": "61"}, None),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "0"}, None),
        ({"retry-after": "garbage"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": ""}, None),
        ({"Retry-After": "2"}, 2.0),  # any header case
        ({"retry-after": http_date(30)}, 30.0),
        ({"retry-after": http_date(61)}, None),
        ({"retry-after": http_date(-10)}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    got = parse_retry_after(headers, WALL)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_retry_after_date_uses_the_clock_wall_time() -> None:
    clock = FakeClock(wall=WALL, rng=lambda: 0.0)
    headers = {"retry-after": http_date(30)}
    assert retry_delay(headers, 0, clock) == pytest.approx(30.0)
    clock.advance(20)  # the same date is now 10 s ahead
    assert retry_delay(headers, 0, clock) == pytest.approx(10.0)
    clock.advance(20)  # now in the past: fall back to the backoff ladder
    assert retry_delay(headers, 3, clock) == pytest.approx(4.0)
    assert retry_delay(None, 1, clock) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# classify (docs/design/behavior.md#exception-hierarchy)
# ---------------------------------------------------------------------------------------------


def chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


CLASSIFY_TABLE: list[tuple[BaseException, bool, bool]] = [
    # (exception, retryable, user_error)
    (status_exc(400), False, True),
    (status_exc(404), False, True),
    (status_exc(408), True, False),
    (status_exc(409), True, True),
    (status_exc(429), True, True),
    (status_exc(402), False, True),
    (status_exc(500), True, False),
    (status_exc(503, {"x-should-retry": "false"}), False, False),
    (status_exc(400, {"x-should-retry": "true"}), True, True),
    (APIConnectionError("reset"), True, False),
    (APIConnectError("refused"), True, False),
    (APITimeoutError("slow"), True, False),
    (APIConnectTimeoutError("slow connect"), True, False),
    (APIResponseValidationError("bad body"), False, False),
    (MissingCredentialsError("none"), False, False),
    (ClientClosedError("closed"), False, False),
    (ForkedProcessError("forked"), False, False),
    (FutureExpiredError("gone"), False, False),
    (RequestFailedError("bad input", category="user"), False, True),
    (RequestFailedError("oops", category="server"), False, False),
    (urllib3.exceptions.ProtocolError("raw"), True, False),
    (urllib3.exceptions.ReadTimeoutError(None, "/x", "raw"), True, False),  # type: ignore[arg-type]
    (TimeoutError("t"), True, False),
    (OSError(errno.EBADF, "Bad file descriptor"), True, False),
    (chained(RuntimeError("wrapped"), OSError(errno.EBADF, "Bad file descriptor")), True, False),
    (chained(ValueError("outer"), status_exc(422)), False, True),
    (OSError(errno.ENOENT, "no such file"), False, False),
    (ValueError("bug"), False, False),
    (KeyError("bug"), False, False),
]


@pytest.mark.parametrize(("exc", "retryable", "user_error"), CLASSIFY_TABLE)
def test_classify_table(exc: BaseException, retryable: bool, user_error: bool) -> None:
    info = classify(exc)
    assert info.retryable is retryable
    assert info.user_error is user_error
    assert is_user_error(exc) is user_error
    assert info.kind == type(exc).__name__


def test_classify_reports_status_and_outcome() -> None:
    info = classify(status_exc(503))
    assert info.status_code == 503 and info.outcome is RequestOutcome.UNKNOWN
    assert classify(status_exc(404)).outcome is RequestOutcome.REJECTED
    assert classify(APIConnectError("x")).outcome is RequestOutcome.NOT_SENT
    assert classify(ValueError()).status_code is None


def test_user_error_through_context_and_cycles() -> None:
    inner = RequestFailedError("bad", category=RequestErrorCategory.User)
    outer = RuntimeError("outer")
    outer.__context__ = inner
    inner.__context__ = outer  # a cycle must not loop forever
    assert is_user_error(outer)


def test_exceptions_pickle_and_hold_no_secret() -> None:
    """For the errors the retry layer raises (docs/design/behavior.md#exception-hierarchy)."""
    secret = "tml-retry-secret-0123456789"
    snapshot = ResponseSnapshot(429, {"X-API-Key": secret, "retry-after": "1"}, secret.encode())
    errors: list[BaseException] = [
        RateLimitError(f"Error code: 429 - key {secret}", response=snapshot, body={"k": secret}),
        APIConnectionError(f"Connection error: {secret}"),
        APIConnectTimeoutError(f"Connect timed out: {secret}"),
    ]
    for err in errors:
        clone = pickle.loads(pickle.dumps(err))
        assert type(clone) is type(err)
        assert secret not in str(clone) and secret not in repr(clone.__dict__.get("response"))
        assert classify(clone).retryable == classify(err).retryable


# ---------------------------------------------------------------------------------------------
# send_with_retries over a scripted transport (explicit test double, not a mock)
# ---------------------------------------------------------------------------------------------


class ScriptedTransport:
    """Answers each attempt from a script of replies/exceptions; records what it was sent."""

    def __init__(
        self, script: list[Reply | BaseException], clock: FakeClock, max_retries: int = 10
    ) -> None:
        self.script = list(script)
        self.clock = clock
        self.config = ClientConfig.from_env(max_retries=max_retries, environ={})
        self.hooks: tuple[Callable[[HookEvent], object], ...] = ()
        self.attempts: list[tuple[int, str | None]] = []

    def send_once(self, spec: RequestSpec, attempt: int = 0) -> Reply:
        self.attempts.append((attempt, spec.idempotency_key))
        item = self.script.pop(0) if self.script else reply(200)
        if isinstance(item, BaseException):
            raise item
        return item


def spec(**kw: Any) -> RequestSpec:
    return RequestSpec(method="POST", path="/api/v1/x", pool=Pool.TRAIN, json={}, **kw)


def run(
    script: list[Reply | BaseException], **kw: Any
) -> tuple[Reply, ScriptedTransport, FakeClock]:
    clock = FakeClock(wall=WALL, rng=lambda: 0.0)
    transport = ScriptedTransport(script, clock, kw.pop("client_max_retries", 10))
    result = send_with_retries(transport, kw.pop("spec", spec()), **kw)  # type: ignore[arg-type]
    return result, transport, clock


def test_retries_until_success_sharing_one_key() -> None:
    result, transport, clock = run([reply(503), reply(500), reply(200)])
    assert result.status == 200
    assert [a for a, _ in transport.attempts] == [0, 1, 2]
    keys = {k for _, k in transport.attempts}
    assert len(keys) == 1 and next(iter(keys)).startswith("tinker_sync-retry-")
    assert clock.sleeps == [(0.5, "http-retry"), (1.0, "http-retry")]


def test_exhausts_max_retries_then_raises_the_status_error() -> None:
    clock = FakeClock(wall=WALL, rng=lambda: 1.0)
    transport = ScriptedTransport([reply(503)] * 20, clock)
    with pytest.raises(InternalServerError) as info:
        send_with_retries(transport, spec())  # type: ignore[arg-type]
    assert len(transport.attempts) == 11
    assert [s for s, _ in clock.sleeps] == pytest.approx(
        [d * 0.75 for d in [0.5, 1, 2, 4, 8, 10, 10, 10, 10, 10]]
    )
    assert info.value.status_code == 503 and info.value.body == {"x": 1}


@pytest.mark.parametrize(
    ("status", "cls"), [(400, BadRequestError), (404, NotFoundError), (418, APIStatusError)]
)
def test_non_retryable_status_raises_at_once(status: int, cls: type[Exception]) -> None:
    with pytest.raises(cls):
        run([reply(status)])


def test_should_retry_false_stops_and_true_forces() -> None:
    with pytest.raises(InternalServerError):
        run([reply(500, {"x-should-retry": "false"}), reply(200)])
    result, transport, _ = run([reply(400, {"x-should-retry": "true"}), reply(200)])
    assert result.status == 200 and len(transport.attempts) == 2


def test_retry_after_is_honoured_exactly() -> None:
    _, _, clock = run(
        [reply(429, {"retry-after-ms": "750"}), reply(429, {"retry-after": "61"}), reply(200)]
    )
    assert [s for s, _ in clock.sleeps] == pytest.approx([0.75, 1.0])  # 61 s is ignored -> k=1


def test_transport_errors_are_retried_with_backoff() -> None:
    script: list[Reply | BaseException] = [
        APIConnectError("refused"),
        APITimeoutError("slow"),
        reply(200),
    ]
    result, transport, clock = run(script)
    assert result.status == 200
    assert [s for s, _ in clock.sleeps] == [0.5, 1.0]


def test_final_transport_error_propagates() -> None:
    with pytest.raises(APITimeoutError):
        run([APITimeoutError("slow")] * 3, max_retries=2)


def test_credential_errors_are_not_retried() -> None:
    clock = FakeClock()
    transport = ScriptedTransport([MissingCredentialsError("none"), reply(200)], clock)
    with pytest.raises(MissingCredentialsError):
        send_with_retries(transport, spec())  # type: ignore[arg-type]
    assert len(transport.attempts) == 1 and clock.sleeps == []


def test_max_retries_precedence() -> None:
    # argument > spec.max_retries > client config
    with pytest.raises(InternalServerError):
        run([reply(500)] * 5, spec=spec(max_retries=0))
    _, transport, _ = run([reply(500)] * 2 + [reply(200)], spec=spec(max_retries=0), max_retries=2)
    assert len(transport.attempts) == 3
    with pytest.raises(InternalServerError):
        run([reply(500)] * 2 + [reply(200)], client_max_retries=1)


def test_retry_hook_events() -> None:
    events: list[HookEvent] = []
    run([reply(503), reply(200)], hooks=[events.append])
    assert [e.kind for e in events] == ["retry_scheduled"]
    assert events[0]["delay"] == 0.5 and events[0]["reason"] == "status 503"
    assert events[0]["attempt"] == 1 and events[0]["layer"] == "http"


# ---------------------------------------------------------------------------------------------
# The submission loop (docs/design/behavior.md#submission-loop): 300 s budget, 402 billing window
# ---------------------------------------------------------------------------------------------


class Failing:
    """Raises the scripted exceptions in order, then returns ``value``."""

    def __init__(self, errors: list[BaseException], value: object = "ok") -> None:
        self.errors = list(errors)
        self.value = value
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.value


def test_submission_loop_budget_is_300_seconds() -> None:
    clock = FakeClock()
    fn = Failing([status_exc(503)] * 1000)
    with pytest.raises(InternalServerError):
        submission_loop(fn, SubmissionRetry(clock=clock))
    waits = clock.sleeps_for("submission-retry")
    assert waits[:8] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert sum(waits) == pytest.approx(300.0)
    assert waits[-1] == pytest.approx(300.0 - sum(waits[:-1]))  # the last wait is trimmed
    assert clock.monotonic() == pytest.approx(300.0)
    assert fn.calls == len(waits) + 1


def test_submission_loop_budget_counts_time_spent_in_attempts() -> None:
    clock = FakeClock()

    def slow_failure() -> None:
        clock.advance(100)  # each attempt itself takes 100 s
        raise APITimeoutError("slow")

    with pytest.raises(APITimeoutError):
        submission_loop(slow_failure, SubmissionRetry(clock=clock))
    assert clock.sleeps_for("submission-retry") == [1, 2]  # 100+1+100+2+100 > 300
    assert clock.monotonic() == pytest.approx(303.0)


def test_submission_loop_success_and_non_retryable() -> None:
    clock = FakeClock()
    failing = Failing([status_exc(500), APIConnectionError("x")])
    assert submission_loop(failing, SubmissionRetry(clock=clock)) == "ok"
    assert clock.sleeps_for("submission-retry") == [1, 2]
    clock.clear()
    with pytest.raises(NotFoundError):
        submission_loop(Failing([status_exc(404)]), SubmissionRetry(clock=clock))
    assert clock.sleeps == []
    with pytest.raises(ConflictError):  # 409 is retryable, but x-should-retry: false wins
        submission_loop(
            Failing([status_exc(409, {"x-should-retry": "false"})]), SubmissionRetry(clock=clock)
        )


def test_submission_loop_observer_sees_each_failure() -> None:
    seen: list[tuple[str, bool, int]] = []

    def observer(exc: BaseException, info: Any, attempt: int, elapsed: float) -> None:
        seen.append((type(exc).__name__, info.retryable, attempt))
        raise RuntimeError("observers must not break the loop")

    clock = FakeClock()
    fn = Failing([status_exc(500), status_exc(404)])
    with pytest.raises(NotFoundError):
        submission_loop(fn, SubmissionRetry(clock=clock, on_exception=observer))
    assert seen == [("InternalServerError", True, 0), ("NotFoundError", False, 1)]


# docs/health.md#lossy-networks: a failure climbs a request's backoff ladder unless it is a
# transport failure after the tenant's other requests were answered since the previous one.
LOST = APIConnectionError("connection reset")
LADDERS = {
    # (each attempt's outcome, whether other requests were answered before it failed): waits
    "outage: no answer in between": ([(LOST, False)] * 4, [1, 2, 4, 8], [0.5, 1, 2, 4]),
    "lossy: others answered": ([(LOST, True)] * 4, [1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]),
    "lossy, then an outage": (
        [(LOST, True), (LOST, True), (LOST, False), (LOST, False)],
        [1, 1, 2, 4],
        [0.5, 0.5, 1, 2],
    ),
    # three: a fourth same 5xx while others are answered ends the call (PersistentServerError)
    "5xx while others answered": ([(status_exc(503), True)] * 3, [1, 2, 4], [0.5, 1, 2]),
}


@pytest.mark.parametrize("case", sorted(LADDERS))
def test_both_loops_climb_the_ladder_unless_the_server_answered_others(case: str) -> None:
    from tinker_sync._flow.breaker import TenantHealth

    outcomes, submission_waits, http_waits = LADDERS[case]
    clock = FakeClock(wall=WALL, rng=lambda: 0.0)
    tenant = TenantHealth(("http://127.0.0.1:1", "key"), clock)
    script: list[tuple[Exception, bool]] = []

    def next_outcome() -> Exception | None:
        if not script:
            return None
        exc, others_answered = script.pop(0)
        if others_answered:
            tenant.success()  # another request of the tenant was answered meanwhile
        return exc

    def attempt() -> str:
        exc = next_outcome()
        if exc is not None:
            raise exc
        return "ok"

    script[:] = outcomes
    assert submission_loop(attempt, SubmissionRetry(clock=clock, tenant=tenant)) == "ok"
    assert clock.sleeps_for("submission-retry") == submission_waits

    class Transport(ScriptedTransport):
        def send_once(self, spec: RequestSpec, attempt: int = 0) -> Reply:
            exc = next_outcome()
            if isinstance(exc, APIStatusError):
                return reply(exc.status_code)
            if exc is not None:
                raise exc
            return reply(200)

    clock.clear()
    script[:] = outcomes
    transport = Transport([], clock)
    assert send_with_retries(transport, spec(), tenant=tenant).status == 200  # type: ignore[arg-type]
    assert clock.sleeps_for("http-retry") == http_waits
    assert tenant.opens == 0


def test_billing_pause_window_then_billing_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tinker_sync.retry")
    clock = FakeClock()
    fn = Failing([status_exc(402)] * 10_000)
    with pytest.raises(BillingError):
        submission_loop(fn, SubmissionRetry(clock=clock))
    pauses = clock.sleeps_for("billing-pause")
    assert set(pauses) == {5.0}
    assert len(pauses) == 721  # 402s at t = 0, 5, ..., 3600 pause; the one at 3605 propagates
    assert clock.sleeps_for("submission-retry") == []  # uncounted: no backoff attempts
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert 1 <= len(warnings) <= 3600 // 60 + 1
    assert [r for r in caplog.records if r.levelno == logging.ERROR]


def test_billing_pause_does_not_consume_the_retry_budget() -> None:
    clock = FakeClock()
    fn = Failing([status_exc(402)] * 100 + [status_exc(503)] * 1000)
    with pytest.raises(InternalServerError):
        submission_loop(fn, SubmissionRetry(clock=clock))
    assert sum(clock.sleeps_for("billing-pause")) == 500.0
    assert sum(clock.sleeps_for("submission-retry")) == pytest.approx(300.0)


def test_billing_incident_resets_after_300_quiet_seconds() -> None:
    billing = BillingPause(window_s=100.0)
    assert billing.should_pause(0.0)
    assert billing.should_pause(90.0)
    assert billing.incident_start == 0.0
    assert billing.should_pause(395.0)  # 305 s without a 402: a new incident
    assert billing.incident_start == 395.0
    assert billing.should_pause(495.0)
    assert not billing.should_pause(496.0)  # > 100 s into this incident


def test_billing_state_is_shared_across_calls() -> None:
    clock = FakeClock()
    billing = BillingPause(window_s=20.0)
    retry = SubmissionRetry(clock=clock, billing=billing)
    assert submission_loop(Failing([status_exc(402)] * 3), retry) == "ok"
    with pytest.raises(BillingError):
        submission_loop(
            Failing([status_exc(402)] * 100), SubmissionRetry(clock=clock, billing=billing)
        )
    assert len(clock.sleeps_for("billing-pause")) == 5  # t=0..20 in the shared incident


def test_submission_loop_retry_hooks() -> None:
    events: list[HookEvent] = []
    submission_loop(
        Failing([status_exc(429)]), SubmissionRetry(clock=FakeClock(), hooks=[events.append])
    )
    assert [(e.kind, e["layer"], e["delay"], e["reason"]) for e in events] == [
        ("retry_scheduled", "submission", 1.0, "status 429")
    ]


# ---------------------------------------------------------------------------------------------
# docs/design/behavior.md#exception-hierarchy: every exception pickles and holds no secret
# ---------------------------------------------------------------------------------------------

SECRET = "tml-t-e8-secret-key-0123456789"
JWT_SECRET = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLXZhbHVl"


def _all_exception_classes() -> list[type[BaseException]]:
    import tinker_sync.exceptions as mod

    found = {
        obj
        for name in mod.__all__
        if isinstance(obj := getattr(mod, name), type) and issubclass(obj, mod.TinkerError)
    }
    return sorted(found, key=lambda c: c.__name__)


def _instance(cls: type[BaseException]) -> BaseException:
    from tinker_sync.exceptions import (
        APIError,
        FuturePollError,
        RequestSnapshot,
        TinkerError,
    )

    message = f"failed with key {SECRET} and token {JWT_SECRET}"
    request = RequestSnapshot("POST", f"http://h/x?k={SECRET}", {"X-API-Key": SECRET})
    if issubclass(cls, APIStatusError):
        status = getattr(cls, "status_code", 0) or {
            "BadRequestError": 400,
            "AuthenticationError": 401,
            "BillingError": 402,
            "PermissionDeniedError": 403,
            "NotFoundError": 404,
            "ConflictError": 409,
            "UnprocessableEntityError": 422,
            "RateLimitError": 429,
            "InternalServerError": 500,
        }.get(cls.__name__, 418)
        response = ResponseSnapshot(
            status, {"X-API-Key": SECRET, "set-cookie": SECRET}, message.encode()
        )
        return cls(message, response=response, request=request)
    if issubclass(cls, APIResponseValidationError):
        return cls(message, response=ResponseSnapshot(200, {}, message.encode()), request=request)
    if issubclass(cls, APIError):
        return cls(message, request)
    if issubclass(cls, RequestFailedError):
        return cls(message, request_id="req-1", category="user")
    if issubclass(cls, FuturePollError):
        return cls(message, status_code=403)
    if issubclass(cls, TinkerError):
        return cls(message)
    return cls(message)


@pytest.mark.parametrize("cls", _all_exception_classes(), ids=lambda c: c.__name__)
def test_every_exception_pickles_without_secrets(cls: type[BaseException]) -> None:
    err = _instance(cls)
    data = pickle.dumps(err)
    clone = pickle.loads(data)
    assert type(clone) is cls
    assert str(clone) == str(err)
    for secret in (SECRET, JWT_SECRET):
        assert secret.encode() not in data
        assert secret not in str(clone) and secret not in repr(clone)
        for attr in ("request", "response"):
            snap = getattr(clone, attr, None)
            if snap is not None:
                assert secret not in repr(
                    vars(snap)
                    if hasattr(snap, "__dict__")
                    else [getattr(snap, s) for s in snap.__slots__]
                )
    if isinstance(err, APIStatusError):
        assert clone.status_code == err.status_code


def test_status_errors_built_from_replies_hold_no_secret() -> None:
    from tinker_sync._transport import error_from_reply

    body = f'{{"detail": "bad key {SECRET}"}}'.encode()
    r = Reply(
        status=401,
        headers={"x-api-key": SECRET},
        content=body,
        elapsed=0.0,
        method="GET",
        url="http://h/x",
    )
    err = error_from_reply(r)
    data = pickle.dumps(err)
    assert SECRET.encode() not in data and SECRET not in str(err) and SECRET not in repr(err.body)
    assert err.body == {"detail": "bad key <redacted>"}
