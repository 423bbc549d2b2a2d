"""Hedger: when a second copy of a request leaves, who wins, and what happens to the loser.

The sends are scripted with events (no network): the first copy blocks until it is aborted or
released, so nothing depends on how fast the machine is beyond the hedge's own delay.
"""

from __future__ import annotations

import threading

import pytest

from tinker_sync._flow import hedge as hedge_module
from tinker_sync._flow.hedge import FACTOR, MAX_HEDGES, MIN_DELAY_S, MIN_SAMPLES, Hedger
from tinker_sync._transport import Reply
from tinker_sync.exceptions import APIConnectionError

HANG = 60.0


def reply(status: int = 200, body: bytes = b"{}") -> Reply:
    return Reply(
        status=status, headers={}, content=body, elapsed=0.0, method="POST", url="http://x/"
    )


def warmed(lossy: bool = True, latency: float = 0.001, kind: str = "k") -> Hedger:
    hedger = Hedger(lambda: lossy)
    for _ in range(MIN_SAMPLES):
        hedger.record(kind, latency)
    return hedger


class Blocked:
    """A first copy that waits until ``abort`` (then fails, like a shut-down socket)."""

    def __init__(self) -> None:
        self.aborted = threading.Event()
        self.release = threading.Event()
        self.thread: int | None = None
        self.aborted_thread: int | None = None

    def send(self) -> Reply:
        self.thread = threading.get_ident()
        while not self.release.is_set():
            if self.aborted.wait(0.01):
                raise APIConnectionError("connection shut down")
        return reply(200, b"first")

    def abort(self, ident: int) -> None:
        self.aborted_thread = ident
        self.aborted.set()


def test_the_delay_follows_recent_latency_with_a_floor() -> None:
    hedger = Hedger(lambda: True)
    assert hedger.delay("k") is None  # nothing known yet
    for _ in range(MIN_SAMPLES - 1):
        hedger.record("k", 0.5)
    assert hedger.delay("k") is None
    hedger.record("k", 0.5)
    assert hedger.delay("k") == pytest.approx(FACTOR * 0.5)
    for _ in range(64):
        hedger.record("fast", 0.001)
    assert hedger.delay("fast") == MIN_DELAY_S
    assert hedger.delay("other") is None  # kinds are apart


def test_a_healthy_network_sends_once_in_the_calling_thread() -> None:
    hedger = warmed(lossy=False)
    threads = []

    def send() -> Reply:
        threads.append(threading.get_ident())
        return reply()

    assert hedger.run("k", send, abort=pytest.fail, read_timeout=10.0).status == 200
    assert threads == [threading.get_ident()] and hedger.sent == 0


def test_no_hedge_when_it_could_not_leave_before_the_read_timeout() -> None:
    hedger = warmed(latency=1.0)  # delay 3 s
    first = Blocked()
    first.release.set()
    assert hedger.run("k", first.send, abort=first.abort, read_timeout=3.0).content == b"first"
    assert hedger.sent == 0


def test_a_hedge_that_answers_first_wins_and_cuts_the_first_copy() -> None:
    hedger = warmed()
    first = Blocked()
    calls = []

    def send() -> Reply:
        calls.append(threading.get_ident())
        if len(calls) == 1:
            return first.send()
        return reply(200, b"hedge")

    got = hedger.run("k", send, abort=first.abort, read_timeout=HANG)
    assert got.content == b"hedge"
    assert len(calls) == 2 and calls[0] == threading.get_ident() != calls[1]
    assert first.aborted_thread == threading.get_ident()  # the caller's socket, nobody else's
    assert (hedger.sent, hedger.won) == (1, 1)


def test_a_first_copy_that_answers_first_cuts_the_hedge_and_frees_its_thread() -> None:
    hedger = warmed()
    hedge = Blocked()
    hedge_out = threading.Event()
    calls = []

    def send() -> Reply:
        calls.append(threading.get_ident())
        if len(calls) == 1:
            assert hedge_out.wait(HANG)  # answer only once the copy is out
            return reply(200, b"first")
        hedge_out.set()
        return hedge.send()  # blocks until its socket is cut

    got = hedger.run("k", send, abort=hedge.abort, read_timeout=HANG)
    assert got.content == b"first"
    assert hedge.aborted.wait(HANG) and hedge.aborted_thread == calls[1] != calls[0]
    assert (hedger.sent, hedger.won) == (1, 0)


@pytest.mark.parametrize("hedge_outcome", ["raises", "503"])
def test_a_failed_hedge_leaves_the_first_copy_alone(hedge_outcome: str) -> None:
    hedger = warmed()
    first = Blocked()
    hedge_done = threading.Event()
    calls = []

    def send() -> Reply:
        calls.append(1)
        if len(calls) == 1:
            return first.send()
        try:
            if hedge_outcome == "raises":
                raise APIConnectionError("reset")
            return reply(503)
        finally:
            hedge_done.set()
            first.release.set()  # the first copy answers after the hedge failed

    got = hedger.run("k", send, abort=first.abort, read_timeout=HANG)
    assert got.content == b"first" and hedge_done.is_set()
    assert not first.aborted.is_set() and (hedger.sent, hedger.won) == (1, 0)


def test_when_both_copies_fail_the_first_copys_error_is_raised() -> None:
    hedger = warmed()
    started = threading.Event()
    calls = []

    def send() -> Reply:
        calls.append(1)
        if len(calls) == 1:
            assert started.wait(HANG)  # fail only once the hedge is out
            raise APIConnectionError("first")
        started.set()
        raise APIConnectionError("hedge")

    with pytest.raises(APIConnectionError, match="first"):
        hedger.run("k", send, abort=pytest.fail, read_timeout=HANG)


class Outlasted:
    """A first copy that answers ``b"first"`` after ``hold`` s unless a hedge won (aborted)."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.aborted = threading.Event()

    def send(self) -> Reply:
        if self.aborted.wait(self.hold):
            raise APIConnectionError("connection shut down")
        return reply(200, b"first")

    def abort(self, ident: int) -> None:
        self.aborted.set()


def test_a_failed_copy_is_followed_by_another_while_the_first_is_out() -> None:
    """A copy lost to a reset no longer leaves the attempt to its read timeout: the next copy
    (after twice the wait) answers and wins."""
    hedger = warmed()
    first = Outlasted(hold=10.0)
    calls = []

    def send() -> Reply:
        calls.append(threading.get_ident())
        if len(calls) == 1:
            return first.send()
        if len(calls) == 2:
            raise APIConnectionError("reset")
        return reply(200, b"second copy")

    got = hedger.run("k", send, abort=first.abort, read_timeout=HANG)
    assert got.content == b"second copy" and len(calls) == 3
    assert (hedger.sent, hedger.won) == (2, 1)


def test_copies_stop_at_max_hedges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hedge_module, "MIN_DELAY_S", 0.02)  # waits 0.02, 0.04, ... s
    hedger = warmed()
    first = Blocked()
    calls = []

    def send() -> Reply:
        calls.append(1)
        if len(calls) == 1:
            return first.send()
        if len(calls) == 1 + MAX_HEDGES:
            first.release.set()  # the first copy answers once the last copy failed
        return reply(503)

    got = hedger.run("k", send, abort=first.abort, read_timeout=HANG)
    assert got.content == b"first" and not first.aborted.is_set()
    assert len(calls) == 1 + MAX_HEDGES and (hedger.sent, hedger.won) == (MAX_HEDGES, 0)


def test_a_kind_without_latencies_is_hedged_after_the_cold_delay_if_given() -> None:
    hedger = Hedger(lambda: True)
    first = Outlasted(hold=HANG)
    calls = []

    def send() -> Reply:
        calls.append(1)
        return first.send() if len(calls) == 1 else reply(200, b"copy")

    assert hedger.run("k", send, abort=first.abort, read_timeout=HANG, cold_delay=MIN_DELAY_S)
    assert (hedger.sent, hedger.won) == (1, 1)
    quick = Hedger(lambda: True)  # without a cold delay: one copy only, as before
    assert quick.run("k", lambda: reply(200), abort=pytest.fail, read_timeout=HANG).status == 200
    assert quick.sent == 0


def test_a_first_copy_that_answers_while_a_copy_is_out_counts_as_a_latency() -> None:
    hedger = Hedger(lambda: True)
    for _ in range(MIN_SAMPLES - 1):
        hedger.record("k", 0.001)
    hedge = Blocked()
    hedge_out = threading.Event()
    calls = []

    def send() -> Reply:
        calls.append(1)
        if len(calls) == 1:
            assert hedge_out.wait(HANG)
            return reply(200, b"first")
        hedge_out.set()
        return hedge.send()

    got = hedger.run("k", send, abort=hedge.abort, read_timeout=HANG, cold_delay=MIN_DELAY_S)
    assert got.content == b"first" and hedger.sent == 1
    assert hedger.delay("k") == MIN_DELAY_S  # the MIN_SAMPLES-th latency: the kind is known


def test_the_delay_is_real_time_while_a_test_clock_stands_in_for_the_default_one() -> None:
    # tinker_sync.testing's tinker_sleeps replaces the default clock; the hedge's delay was
    # waited on it, so every hedge left at once (and the wait moved virtual time on).
    from tinker_sync._runtime.clock import SYSTEM_CLOCK
    from tinker_sync.testing import VirtualSleepClock

    clock = VirtualSleepClock()
    names = ("monotonic", "time", "sleep", "wait", "random")
    for name in names:
        setattr(SYSTEM_CLOCK, name, getattr(clock, name))
    try:
        hedger = warmed(latency=10.0)  # delay 30 s of real time
        hedge_out = threading.Event()
        calls = []

        def send() -> Reply:
            calls.append(1)
            if len(calls) > 1:
                hedge_out.set()
                return reply(200, b"hedge")
            hedge_out.wait(0.5)  # a hedge due in 30 s does not come within half a second
            return reply(200, b"first")

        got = hedger.run("k", send, abort=lambda ident: None, read_timeout=HANG)
    finally:
        for name in names:
            delattr(SYSTEM_CLOCK, name)
    assert got.content == b"first" and not hedge_out.is_set()
    assert hedger.sent == 0 and clock.sleeps == []
