"""The shared limiter: registry, deadline and dispatch gates (B11-B13; T-B4, T-B5, T-B7, T-B11)."""

from __future__ import annotations

import threading

import pytest

from tinker_sync._clock import FakeClock, SystemClock
from tinker_sync._config import normalize_base_url
from tinker_sync._ratelimit import (
    BACKED_OFF_BYTE_PENALTY,
    Limiter,
    Stopped,
    limiter_for,
    reset_limiters,
)

HANG = 60.0
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _fresh_registry():
    reset_limiters()
    yield
    reset_limiters()


def test_100_threads_get_or_create_one_key_and_get_the_same_object():
    """T-B4 (B11)."""
    clock = SystemClock()
    barrier = threading.Barrier(100)
    got: list[Limiter] = [None] * 100  # type: ignore[list-item]

    def worker(i: int) -> None:
        barrier.wait(HANG)
        got[i] = limiter_for(normalize_base_url("https://EXAMPLE.com:443/"), "k", clock)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert len({id(x) for x in got}) == 1
    assert limiter_for(normalize_base_url("https://example.com"), "k", clock) is got[0]
    assert limiter_for(normalize_base_url("https://example.com"), "other", clock) is not got[0]
    assert limiter_for(normalize_base_url("http://example.com"), "k", clock) is not got[0]


def test_deadline_only_moves_forward():
    """T-B7 (B13): a 5 s deadline survives a later, shorter backoff."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.set_backoff(5.0, "429")
    clock.advance(1.0)
    limiter.set_backoff(1.0, "429")  # would end at 2.0: ignored
    assert limiter.backoff_until == 5.0
    assert limiter.recently_backed_off()
    clock.advance(14.0)
    assert not limiter.recently_backed_off()


def test_200_waiters_make_at_most_3_timed_waits_each():
    """T-B7 (B13): waiters block on the condition, they do not poll."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.set_backoff(5.0, "429")
    done = threading.Barrier(201)

    def waiter() -> None:
        limiter.wait_backoff(lambda: None)
        done.wait(HANG)

    threads = [threading.Thread(target=waiter, name=f"w{i}") for i in range(200)]
    for t in threads:
        t.start()
    done.wait(HANG)
    for t in threads:
        t.join(HANG)
    per_thread: dict[str, int] = {}
    for _timeout, name in clock.waits:
        per_thread[name] = per_thread.get(name, 0) + 1
    assert max(per_thread.values()) <= 3


def test_byte_gate_admits_while_non_negative_and_penalises_after_backoff():
    """T-B5 (B12): a second 6 MiB prompt waits; a lone 30 MiB prompt is admitted."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.configure(
        sample_dispatch_bytes=10 * MiB,
        fwdbwd_dispatch_bytes=50_000_000,
        inflight_response_bytes=50 * MiB,
    )
    with limiter.dispatch(6 * MiB, lambda: None):
        assert limiter.snapshot()["sample_bytes"] == 4 * MiB
        with limiter.dispatch(6 * MiB, lambda: None):  # admitted: budget was >= 0
            assert limiter.snapshot()["sample_bytes"] == -2 * MiB
            entered = threading.Event()

            def third() -> None:
                with limiter.dispatch(1, lambda: None):
                    entered.set()

            t = threading.Thread(target=third)
            t.start()
            assert not entered.wait(0.2)  # budget < 0: waits
        assert entered.wait(HANG)  # released: admitted
        t.join(HANG)
    assert limiter.snapshot()["sample_bytes"] == 10 * MiB
    with limiter.dispatch(30 * MiB, lambda: None):  # a lone huge prompt cannot deadlock
        pass
    limiter.set_backoff(1.0, "429")
    with limiter.dispatch(MiB, lambda: None):
        snap = limiter.snapshot()
        assert snap["sample_bytes"] == 10 * MiB - BACKED_OFF_BYTE_PENALTY * MiB
        assert snap["backed_off_count"] == 9
    assert limiter.snapshot()["backed_off_count"] == 10


def test_cancelled_waiter_sends_nothing_and_restores_permits():
    """T-B11 (B13): a waiter stopped during the backoff leaves the gates as they were."""
    clock = SystemClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.set_backoff(30.0, "429")
    cancelled = threading.Event()
    outcome: list[BaseException] = []
    sent = []

    in_backoff = threading.Event()

    def stop_during_backoff() -> BaseException | None:
        in_backoff.set()
        return RuntimeError("cancelled") if cancelled.is_set() else None

    def sampler() -> None:
        try:
            with limiter.dispatch(100, lambda: None):
                limiter.wait_backoff(stop_during_backoff)
                sent.append(1)
        except Stopped as exc:
            outcome.append(exc.exc)

    t = threading.Thread(target=sampler)
    t.start()
    assert in_backoff.wait(HANG)
    held = limiter.snapshot()
    assert (held["count"], held["backed_off_count"]) == (399, 9)  # gates held while waiting
    cancelled.set()
    limiter.wake()
    t.join(HANG)
    assert not sent and isinstance(outcome[0], RuntimeError)
    after = limiter.snapshot()
    assert (after["count"], after["backed_off_count"]) == (400, 10)
    assert after["sample_bytes"] == limiter._budgets()[0].size


def test_same_tenant_spelled_differently_shares_one_limiter():
    """T-B2 (B11): ``https://EXAMPLE.com:443/`` and ``https://example.com`` are one tenant."""
    import tinker_sync

    clock = FakeClock()
    spelled = [
        tinker_sync.ServiceClient(base_url=url, api_key=key)
        for url, key in (
            ("https://EXAMPLE.com:443/", "tml-one"),
            ("https://example.com", "tml-one"),
            ("HTTPS://example.COM/", "tml-one"),
            ("https://example.com", "tml-two"),
            ("https://example.org", "tml-one"),
        )
    ]
    limiters = [
        limiter_for(c._config.normalized_base_url, c._config.credentials.identity, clock)
        for c in spelled
    ]
    assert limiters[0] is limiters[1] is limiters[2]
    assert limiters[3] is not limiters[0] and limiters[4] is not limiters[0]
    assert "tml-one" not in repr(limiters[0].key)  # the identity is a hash
    limiters[0].set_backoff(0.75, "429")
    assert limiters[1].backoff_until == 0.75 and limiters[3].backoff_until == float("-inf")


def test_stopping_a_gate_waiter_leaves_the_gates_intact():
    """B12/B13: a waiter blocked on the count gate stops on request and takes nothing."""
    import contextlib

    clock = SystemClock()
    limiter = limiter_for("https://x", "k", clock)
    stop = threading.Event()
    outcome: list[BaseException] = []
    waiting = threading.Event()

    def should_stop() -> BaseException | None:
        waiting.set()
        return RuntimeError("closed") if stop.is_set() else None

    with contextlib.ExitStack() as stack:
        for _ in range(400):
            stack.enter_context(limiter.dispatch(1, lambda: None))
        assert limiter.snapshot()["count"] == 0

        def blocked() -> None:
            try:
                with limiter.dispatch(1, should_stop):
                    pass
            except Stopped as exc:
                outcome.append(exc.exc)

        t = threading.Thread(target=blocked)
        t.start()
        assert waiting.wait(HANG)
        stop.set()
        limiter.wake()
        t.join(HANG)
        assert isinstance(outcome[0], RuntimeError)
        assert limiter.snapshot()["count"] == 0
    snap = limiter.snapshot()
    assert snap["count"] == 400 and snap["sample_bytes"] == limiter._budgets()[0].size


def test_response_and_fwdbwd_budgets_admit_while_non_negative():
    """B21/B27: one oversized reservation is admitted; the next waits for a release."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.configure(
        sample_dispatch_bytes=10 * MiB,
        fwdbwd_dispatch_bytes=50_000_000,
        inflight_response_bytes=50 * MiB,
    )
    limiter.reserve_response_bytes(80 * MiB, lambda: None)  # admitted: budget was >= 0
    assert limiter.snapshot()["response_bytes"] == -30 * MiB
    admitted = threading.Event()

    def second() -> None:
        limiter.reserve_response_bytes(MiB, lambda: None)
        admitted.set()

    t = threading.Thread(target=second)
    t.start()
    assert not admitted.wait(0.2)
    limiter.release_response_bytes(80 * MiB)
    assert admitted.wait(HANG)
    t.join(HANG)
    limiter.release_response_bytes(MiB)
    assert limiter.snapshot()["response_bytes"] == 50 * MiB
    with limiter.fwdbwd_bytes(60_000_000):
        assert limiter.snapshot()["fwdbwd_bytes"] == -10_000_000
    assert limiter.snapshot()["fwdbwd_bytes"] == 50_000_000
