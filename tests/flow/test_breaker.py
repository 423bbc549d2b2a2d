"""Tenant health (tinker_sync/_flow/breaker.py): the state machine on the injected clock, the
retry budget, and exact counts under 64 racing threads (docs/health.md)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tinker_sync import CircuitOpenError, HealthPolicy
from tinker_sync._config import ClientConfig, parse_health_policy
from tinker_sync._flow.breaker import CLOSED, HALF_OPEN, OPEN, TenantHealth, Turn
from tinker_sync._runtime.clock import FakeClock
from tinker_sync.exceptions import RequestOutcome

KEY = ("http://127.0.0.1:1", "identity")


class Timers:
    """Records the breaker's timer requests instead of starting a timer thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Any, tuple[Any, ...]]] = []

    def __call__(self, clock: Any, delay: float, role: str, fn: Any, *args: Any) -> None:
        self.calls.append((delay, fn, args))

    def fire_last(self) -> None:
        _, fn, args = self.calls[-1]
        fn(*args)


def make(rng: float = 0.5, **knobs: Any) -> tuple[TenantHealth, FakeClock, Timers]:
    clock = FakeClock(rng=lambda: rng)
    timers = Timers()
    tenant = TenantHealth(KEY, clock, schedule=timers)
    tenant.configure(HealthPolicy(**knobs))
    return tenant, clock, timers


def open_it(tenant: TenantHealth) -> None:
    for i in range(tenant.policy.open_after):
        tenant.failure(("asample", f"k{i}"), "HTTP 503")
    assert tenant.state == OPEN


def test_distinct_failures_within_the_window_open_it_one_request_alone_does_not() -> None:
    tenant, clock, _ = make()
    for _ in range(20):  # one request failing over and over is not server-wide trouble
        tenant.failure(("asample", "same"), "HTTP 500")
    assert tenant.state == CLOSED
    tenant.success()
    for i in range(4):
        tenant.failure(("p", i), "HTTP 503")
    tenant.success()  # a success in between starts the count again
    for i in range(4):
        tenant.failure(("p", i), "HTTP 503")
    assert tenant.state == CLOSED
    clock.advance(10.5)  # outside the 10 s window: the first four no longer count
    tenant.failure(("p", 9), "APIConnectError")
    assert tenant.state == CLOSED
    for i in range(4):
        tenant.failure(("q", i), "APIConnectError")
    assert tenant.state == OPEN
    assert tenant.reason.startswith("5 failed attempts of 5 requests within 10 s")
    assert tenant.opens == 1


def test_one_probe_at_a_time_on_a_capped_jittered_schedule() -> None:
    tenant, clock, timers = make(rng=0.5)  # jitter factor 1 - 0.5 * 0.5 = 0.75
    open_it(tenant)
    delays = []
    for failed in range(8):
        delay = timers.calls[-1][0]
        delays.append(delay)
        assert tenant.turn() is Turn.WAIT
        clock.advance(delay - 0.001)
        assert tenant.turn() is Turn.WAIT
        clock.advance(0.001)
        assert tenant.state == HALF_OPEN
        assert tenant.turn() is Turn.PROBE
        assert tenant.turn() is Turn.WAIT  # only one probe is out
        assert tenant.turn() is Turn.WAIT
        tenant.failure(("probe", failed), "HTTP 503")
        assert tenant.state == OPEN
    assert delays == [0.75, 1.5, 3.0, 6.0, 7.5, 7.5, 7.5, 7.5]  # capped at probe_max_s (10 s)
    assert tenant.probes == 8


def test_the_first_success_closes_it_refills_the_budget_and_wakes_the_parked_work() -> None:
    tenant, clock, timers = make()
    woken = []
    tenant.on_change(lambda: woken.append(tenant.state))
    tenant.acquire_retry(timeout=False)
    open_it(tenant)
    clock.advance(timers.calls[-1][0])
    timers.fire_last()  # the probe fell due: parked work is woken to send it
    assert woken == [HALF_OPEN]
    assert tenant.turn() is Turn.PROBE
    tenant.success()
    assert tenant.state == CLOSED
    assert woken == [HALF_OPEN, CLOSED]
    assert tenant.tokens == 500
    assert tenant.turn() is Turn.SEND
    timers.fire_last()  # a stale timer (the probe's lease) changes nothing
    assert woken == [HALF_OPEN, CLOSED]
    assert tenant.state == CLOSED


def test_outcomes_of_attempts_sent_before_the_opening_or_the_probe_decide_nothing() -> None:
    """A long poll the server held through an outage is answered after the circuit opened: its
    answer does not close it (it released every parked request at once, a connect storm);
    while the probe is out, a failure of an attempt sent before it does not fail the probe."""
    tenant, clock, timers = make(rng=0.0)
    sent_before = clock.monotonic()  # a long poll goes out while the tenant is healthy
    clock.advance(1.0)
    open_it(tenant)
    tenant.success(sent_at=sent_before)  # the held poll is answered now
    assert tenant.state == OPEN and tenant.stale_successes == 1
    assert tenant.turn() is Turn.WAIT
    clock.advance(timers.calls[-1][0])
    assert tenant.turn() is Turn.PROBE
    probe_sent = clock.monotonic()
    tenant.success(sent_at=sent_before)
    clock.advance(0.5)
    tenant.failure(("asample", "old"), "APIConnectionError", sent_at=sent_before)
    assert tenant.state == HALF_OPEN and tenant.turn() is Turn.WAIT  # the probe is still out
    assert tenant.snapshot()["failed_probes"] == 0
    tenant.failure(("asample", "probe"), "APIConnectionError", sent_at=probe_sent)
    assert tenant.state == OPEN and tenant.snapshot()["failed_probes"] == 1
    clock.advance(timers.calls[-1][0])
    assert tenant.turn() is Turn.PROBE
    tenant.success(sent_at=clock.monotonic())  # the probe's answer closes it
    assert tenant.state == CLOSED and tenant.stale_successes == 2


def test_a_probe_without_an_answer_within_its_lease_counts_as_failed() -> None:
    tenant, clock, timers = make(rng=0.0, probe_lease_s=90.0)
    open_it(tenant)
    clock.advance(1.0)
    scheduled = len(timers.calls)
    assert tenant.turn() is Turn.PROBE
    assert len(timers.calls) == scheduled  # no lease timer: the next caller checks the lease
    clock.advance(89.0)
    assert tenant.turn() is Turn.WAIT
    clock.advance(1.0)  # lease over: the probe failed, the next one is 2 s later
    assert tenant.state == OPEN
    assert tenant.snapshot()["failed_probes"] == 1
    assert tenant.expired_probes == 1
    clock.advance(2.0)
    assert tenant.turn() is Turn.PROBE
    tenant.abandon_probe()  # e.g. the probe was cancelled before it was sent
    assert tenant.turn() is Turn.PROBE
    assert tenant.probes == 3


def test_the_retry_budget_spends_refunds_and_opens_the_circuit_when_empty() -> None:
    tenant, _, _ = make()
    assert tenant.tokens == 500
    for _ in range(50):
        assert tenant.acquire_retry(timeout=True)  # a timeout retry costs 10
    assert tenant.tokens == 0
    tenant.success()  # a success refunds 1
    tenant.refund(5)  # the cost of a retry that then succeeded
    assert tenant.tokens == 6
    assert tenant.acquire_retry(timeout=False)  # costs 5
    assert tenant.tokens == 1
    assert tenant.state == CLOSED
    assert not tenant.acquire_retry(timeout=False)  # empty: the retry waits for the probe
    assert tenant.state == OPEN
    assert tenant.reason.startswith("the retry budget is spent (1 of 500 tokens left)")
    tenant.refund(10_000)
    assert tenant.tokens == 500  # never above the capacity


def test_fail_fast_raises_circuit_open_error_saying_since_when_and_why() -> None:
    tenant, clock, _ = make()
    clock.set_wall(1_700_000_000.0)
    open_it(tenant)
    with pytest.raises(CircuitOpenError) as info:
        tenant.wait_turn(fail_fast=True)
    err = info.value
    assert err.outcome is RequestOutcome.NOT_SENT
    assert err.since == 1_700_000_000.0
    assert err.reason.startswith("5 failed attempts of 5 requests")
    assert "circuit is open since 22:13:20 UTC" in str(err)
    assert "last: HTTP 503" in str(err)


def test_wait_turn_waits_on_the_clock_until_the_probe_and_is_bounded() -> None:
    tenant, clock, timers = make(rng=0.0)  # first probe after 1 s
    open_it(tenant)
    start = clock.monotonic()
    assert tenant.wait_turn(until=start + 0.5) is Turn.WAIT  # bounded: the probe is later
    assert tenant.wait_turn(until=start + 100) is Turn.PROBE
    assert clock.monotonic() == pytest.approx(start + 1.0)
    assert tenant.waiting == 0

    class Stop(Exception):
        pass

    with pytest.raises(Stop):
        tenant.wait_turn(lambda: Stop())


def test_a_disabled_policy_never_opens_and_never_limits_retries() -> None:
    tenant, _, _ = make(enabled=False)
    for i in range(100):
        tenant.failure(("p", i), "HTTP 503")
        assert tenant.acquire_retry(timeout=True)
    assert tenant.state == CLOSED
    assert tenant.turn() is Turn.SEND


def test_64_threads_reporting_at_once_lose_no_count() -> None:
    """The critique's race: read-modify-write of failure counts from many threads."""
    tenant, _, _ = make(enabled=True, open_after=10**9)
    per_thread = 500
    start = threading.Barrier(64)

    def report(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            tenant.failure(("p", n, i), "HTTP 503")
            tenant.success()

    threads = [threading.Thread(target=report, args=(n,)) for n in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tenant.failures == 64 * per_thread
    assert tenant.successes == 64 * per_thread
    assert tenant.state == CLOSED


def test_64_threads_spending_the_budget_get_exactly_its_capacity() -> None:
    tenant, _, _ = make()
    granted = []
    lock = threading.Lock()
    start = threading.Barrier(64)

    def spend() -> None:
        start.wait()
        n = sum(tenant.acquire_retry(timeout=False) for _ in range(10))
        with lock:
            granted.append(n)

    threads = [threading.Thread(target=spend) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 100  # 500 tokens / 5 per retry, not one more
    assert tenant.tokens == 0
    assert tenant.state == OPEN and tenant.opens == 1


def test_64_threads_failing_at_once_open_it_exactly_once() -> None:
    tenant, _, timers = make()
    start = threading.Barrier(64)

    def fail(n: int) -> None:
        start.wait()
        tenant.failure(("p", n), "APIConnectError")

    threads = [threading.Thread(target=fail, args=(n,)) for n in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tenant.failures == 64
    assert tenant.opens == 1
    assert len(timers.calls) == 1  # one probe scheduled


def test_the_policy_comes_from_the_environment_and_is_validated() -> None:
    policy = parse_health_policy("fail_fast=1, open_after=8,probe_max_s=12.5")
    assert policy == HealthPolicy(fail_fast=True, open_after=8, probe_max_s=12.5)
    assert parse_health_policy("") == HealthPolicy()
    config = ClientConfig.from_env(
        api_key="tml-x", environ={"TINKER_SYNC_HEALTH": "retry_capacity=50"}
    )
    assert config.health.retry_capacity == 50
    assert ClientConfig.from_public_state(config.public_state(), api_key="tml-x").health == (
        config.health
    )
    with pytest.raises(ValueError, match="TINKER_SYNC_HEALTH: 'nope=1'"):
        parse_health_policy("nope=1")
    with pytest.raises(ValueError, match="open_after='x'"):
        parse_health_policy("open_after=x")
    with pytest.raises(ValueError, match="probe_jitter"):
        HealthPolicy(probe_jitter=2.0)
    with pytest.raises(ValueError, match="http_backoff_jitter"):
        HealthPolicy(http_backoff_jitter=1.5)
    backoff = parse_health_policy("http_backoff_max_s=4,submit_backoff_initial_s=0.5")
    assert (backoff.http_backoff_max_s, backoff.submit_backoff_initial_s) == (4.0, 0.5)


def test_a_probe_answered_429_closes_it() -> None:
    """A 429 is an answer: the server is up (the limiter's deadline paces the work). Before,
    a probe answered 429 stayed out until its lease ended and counted as failed."""
    from types import SimpleNamespace

    from tinker_sync._flow.health import Health

    tenant, clock, timers = make(rng=0.0)
    health = Health(KEY[0], clock)
    health.tenant = tenant
    open_it(tenant)
    clock.advance(timers.calls[-1][0])
    assert tenant.turn() is Turn.PROBE
    health.observe(SimpleNamespace(kind="request", data={"status": 429, "path": "/x"}))
    assert tenant.state == CLOSED
    assert tenant.successes == 1 and tenant.snapshot()["failed_probes"] == 0


def test_a_poll_turn_asks_nothing_while_its_queue_is_not_paused() -> None:
    # Every poll takes a turn: while nothing is paused it costs a dict lookup (the caller has
    # just checked its own stop); a declared pause still asks stopped() and holds the turn.
    tenant, _, _ = make()
    asked: list[str] = []

    def stopped(who: str) -> bool:
        asked.append(who)
        return False

    a, b = object(), object()
    for _ in range(10):
        assert tenant.pause_turn("sampling", a, lambda: stopped("a"))
        tenant.pause_report("sampling", a, paused=None, answered=True)
    assert asked == []
    tenant.pause_report("sampling", a, paused="paused_rate_limit", answered=False)
    assert tenant.paused("sampling") == "paused_rate_limit"
    assert tenant.pause_turn("training", b, lambda: stopped("b"))  # another queue: not paused
    assert tenant.pause_turn("sampling", a, lambda: stopped("a"))
    assert asked == ["a"]
    tenant.pause_report("sampling", a, paused=None, answered=True)  # the pause is over
    assert tenant.paused("sampling") is None
    assert tenant.pause_turn("sampling", b, lambda: stopped("b")) and asked == ["a"]
