"""The shared limiter: registry, deadline and dispatch gates
(docs/design/behavior.md#limiter-registry, docs/design/behavior.md#dispatch-gates,
docs/design/behavior.md#shared-backoff)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from signal_points import interrupt_at  # tests/signal_points.py
from waiting import until  # tests/waiting.py

from tinker_sync._config import normalize_base_url
from tinker_sync._flow.limiter import (
    BACKED_OFF_BYTE_PENALTY,
    STOP_RECHECK_S,
    Limiter,
    Ticket,
    limiter_for,
    reset_limiters,
)
from tinker_sync._runtime.clock import FakeClock, SystemClock

HANG = 60.0
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _fresh_registry():
    reset_limiters()
    yield
    reset_limiters()


def test_100_threads_get_or_create_one_key_and_get_the_same_object():
    """Pins docs/design/behavior.md#limiter-registry."""
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
    """A 5 s deadline survives a later, shorter backoff (docs/design/behavior.md#shared-backoff)."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.set_backoff(5.0, "429")
    clock.advance(1.0)
    limiter.set_backoff(1.0, "429")  # would end at 2.0: ignored
    assert limiter.backoff_until == 5.0
    assert limiter.recently_backed_off()
    clock.advance(14.0)
    assert not limiter.recently_backed_off()


class Tickets:
    """Makes tickets that record when they start or stop (started ones hold their gates)."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.started_at: list[float] = []
        self.stopped: list[tuple[str, BaseException]] = []
        self.stop_all: BaseException | None = None
        self.tickets: dict[str, Ticket] = {}

    def submit(self, name: str, owner: str = "a", estimate: int = 100) -> Ticket:
        def start(ticket: Ticket) -> None:
            if not self.limiter.claim(ticket):  # the send step's first call (Ticket docs)
                return
            with self.lock:
                self.started.append(name)
                self.started_at.append(self.limiter.clock.monotonic())

        def on_stop(exc: BaseException) -> None:
            with self.lock:
                self.stopped.append((name, exc))

        ticket = Ticket(
            owner=owner,
            estimate=estimate,
            start=start,
            on_stop=on_stop,
            stop_reason=lambda: self.stop_all,
        )
        self.tickets[name] = ticket
        self.limiter.enqueue(ticket)
        return ticket

    def done(self, name: str) -> None:
        self.limiter.release(self.tickets[name])
        self.limiter.sender_done(self.tickets[name])


def sdk_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("tinker_sync-")}


class SteppedClock(FakeClock):
    """Virtual time moves only when the test advances it; a timed wait lasts 10 real ms."""

    def wait(self, cond: Any, timeout: float | None) -> bool:
        if timeout is None:
            return super().wait(cond, None)
        return bool(cond.wait(0.01))


def test_200_tickets_parked_on_the_deadline_hold_no_thread_and_start_after_it():
    """The backoff wait is a timer, not blocked workers; nothing starts before the deadline."""
    clock = SteppedClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.send_width = 1_000  # the backed-off gate of 10 binds, not the senders
    limiter.set_backoff(5.0, "429")
    made = Tickets(limiter)
    before = threading.active_count()
    for i in range(200):
        made.submit(f"t{i}")
    # Recently backed off: only the gate of 10 is admitted; all 10 wait as held tickets.
    snap = limiter.snapshot()
    assert (snap["held"], snap["waiting"], snap["backed_off_count"]) == (10, 190, 0)
    assert not made.started
    assert threading.active_count() <= before + 1  # at most the executor's one timer thread
    clock.advance(4.9)
    made.submit("late")  # a pump before the deadline starts nothing either
    assert not made.started
    clock.advance(0.1)  # the deadline: the timer starts the held tickets
    released = 0
    while released < 201:  # each release admits and starts the next ticket
        until(lambda: len(made.started) > released)
        current = list(made.started)
        for name in current[released:]:
            made.done(name)
        released = len(current)
    assert min(made.started_at) >= 5.0
    assert made.started == [*(f"t{i}" for i in range(200)), "late"]  # one owner: FIFO
    snap = limiter.snapshot()
    assert (snap["count"], snap["backed_off_count"], snap["held"], snap["waiting"]) == (
        400,
        10,
        0,
        0,
    )


def test_owners_are_admitted_round_robin_behind_a_10000_ticket_backlog():
    """Fairness: another owner's first ticket is admitted within one slot of a free gate."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.send_width = 1_000  # let the count gate of 400 bind, not the senders
    made = Tickets(limiter)
    for i in range(10_000):
        made.submit(f"a{i}", owner="A")
    assert len(made.started) == 400 and limiter.snapshot()["waiting"] == 9_600
    made.submit("b0", owner="B")
    made.submit("b1", owner="B")
    made.done("a0")  # one slot frees: B's first ticket takes it, not A's 401st
    assert made.started[-1] == "b0"
    made.done("a1")
    assert made.started[-1] == "a400"  # then turns alternate
    made.done("a2")
    assert made.started[-1] == "b1"
    made.done("a3")
    assert made.started[-1] == "a401"


def test_gates_are_taken_only_when_a_sender_is_free():
    """A newcomer is never queued behind tickets admitted early that only wait for a thread."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.send_width = 3
    made = Tickets(limiter)
    for i in range(100):
        made.submit(f"a{i}", owner="A")
    assert made.started == ["a0", "a1", "a2"]
    assert limiter.snapshot()["count"] == 397  # the other gates were not taken
    made.submit("b0", owner="B")
    made.done("a1")
    assert made.started[-1] == "b0"  # the very next free sender


def test_byte_gate_admits_while_non_negative_and_penalises_after_backoff():
    """A second 6 MiB prompt is admitted (budget >= 0), a third waits; a lone 30 MiB passes."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.configure(
        sample_dispatch_bytes=10 * MiB,
        fwdbwd_dispatch_bytes=50_000_000,
        inflight_response_bytes=50 * MiB,
    )
    made = Tickets(limiter)
    made.submit("first", estimate=6 * MiB)
    assert limiter.snapshot()["sample_bytes"] == 4 * MiB
    made.submit("second", estimate=6 * MiB)  # admitted: the budget was >= 0
    assert limiter.snapshot()["sample_bytes"] == -2 * MiB
    made.submit("third", estimate=1)
    assert made.started == ["first", "second"]  # budget < 0: waits
    made.done("first")
    assert made.started == ["first", "second", "third"]
    made.done("second")
    made.done("third")
    assert limiter.snapshot()["sample_bytes"] == 10 * MiB
    made.submit("huge", estimate=30 * MiB)  # a lone huge prompt cannot deadlock
    assert made.started[-1] == "huge"
    made.done("huge")
    limiter.set_backoff(1.0, "429")
    made.submit("penalised", estimate=MiB)
    snap = limiter.snapshot()
    assert snap["sample_bytes"] == 10 * MiB - BACKED_OFF_BYTE_PENALTY * MiB
    assert snap["backed_off_count"] == 9
    until(lambda: made.started[-1] == "penalised")
    made.done("penalised")
    assert limiter.snapshot()["backed_off_count"] == 10
    made.done("penalised")  # releasing twice changes nothing
    assert limiter.snapshot()["count"] == 400


def test_cancelled_waiter_sends_nothing_and_restores_permits():
    """A ticket stopped during the backoff never starts and leaves the gates as they were."""
    clock = SystemClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.set_backoff(30.0, "429")
    made = Tickets(limiter)
    made.submit("held")
    held = limiter.snapshot()
    assert (held["count"], held["backed_off_count"], held["held"]) == (399, 9, 1)
    made.stop_all = RuntimeError("cancelled")
    limiter.wake(everything=False)
    assert not made.started and [n for n, _ in made.stopped] == ["held"]
    after = limiter.snapshot()
    assert (after["count"], after["backed_off_count"], after["held"]) == (400, 10, 0)
    assert after["sample_bytes"] == limiter._budgets()[0].size


def test_same_tenant_spelled_differently_shares_one_limiter():
    """``https://EXAMPLE.com:443/`` and ``https://example.com`` are one tenant
    (docs/design/behavior.md#limiter-registry)."""
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
    """A ticket queued behind a full count gate stops on close and takes nothing."""
    clock = SystemClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.send_width = 1_000
    made = Tickets(limiter)
    for i in range(400):
        made.submit(f"full{i}", estimate=1)
    assert limiter.snapshot()["count"] == 0
    waiting = Tickets(limiter)
    waiting.submit("blocked", owner="other", estimate=1)
    assert limiter.snapshot()["waiting"] == 1 and not waiting.started
    waiting.stop_all = RuntimeError("closed")
    limiter.wake()
    assert [n for n, _ in waiting.stopped] == ["blocked"] and not waiting.started
    assert limiter.snapshot()["count"] == 0
    for i in range(400):
        made.done(f"full{i}")
    snap = limiter.snapshot()
    assert snap["count"] == 400 and snap["sample_bytes"] == limiter._budgets()[0].size
    assert snap["waiting"] == 0


def test_a_head_behind_closed_gates_is_asked_to_stop_again_only_after_a_wake_or_a_while():
    """Pumps that cannot admit do not ask the waiting head's stop_reason each time; a wake()
    (cancel, close, circuit change) or STOP_RECHECK_S makes the next pump ask again, and a
    stop found then is delivered (docs/limiter.md#stop-checks)."""
    clock = FakeClock()
    limiter = limiter_for("https://x", "k", clock)
    limiter.send_width = 1
    made = Tickets(limiter)
    made.submit("sending")  # takes the one sender
    asked: list[str] = []
    stop: list[BaseException] = []
    stopped: list[BaseException] = []

    def why() -> BaseException | None:
        asked.append("head")
        return stop[0] if stop else None

    head = Ticket(
        owner="b", estimate=1, start=lambda _: None, on_stop=stopped.append, stop_reason=why
    )
    limiter.enqueue(head)  # every sender taken: no pump
    assert asked == []
    limiter.pump()
    assert asked == ["head"]  # asked once when it reached the head behind the closed gates
    for _ in range(5):
        made.submit(f"more{len(made.tickets)}")
        limiter.pump()
    assert asked == ["head"]
    limiter.wake(everything=False)
    assert asked == ["head", "head"]
    limiter.pump()
    clock.advance(STOP_RECHECK_S)
    limiter.pump()
    assert asked == ["head"] * 3
    stop.append(RuntimeError("stuck"))
    clock.advance(STOP_RECHECK_S)
    limiter.pump()
    assert head.state == "finished" and stopped == stop
    assert limiter.snapshot()["count"] == 399  # only "sending" holds gates


def test_response_and_fwdbwd_budgets_admit_while_non_negative():
    """One oversized reservation is admitted; the next waits for a release
    (docs/design/behavior.md#poll-answer-order, docs/design/behavior.md#fwdbwd-byte-gate)."""
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


# ------------------------------------------------------------------ exceptions from signal handlers


class Lane(Tickets):
    """Tickets whose start() only schedules the send step; ``run()`` runs the scheduled steps
    as a sender thread would (claim first), outside any interruption."""

    def __init__(self, limiter: Limiter) -> None:
        super().__init__(limiter)
        self.scheduled: list[str] = []

    def submit(self, name: str, owner: str = "a", estimate: int = 100) -> Ticket:
        ticket = Ticket(
            owner=owner,
            estimate=estimate,
            start=lambda _ticket: self.scheduled.append(name),
            on_stop=lambda exc: self.stopped.append((name, exc)),
            stop_reason=lambda: self.stop_all,
        )
        self.tickets[name] = ticket
        self.limiter.enqueue(ticket)
        return ticket

    def run(self) -> None:
        while self.scheduled:
            name = self.scheduled.pop(0)
            if self.limiter.claim(self.tickets[name]):
                self.started.append(name)

    def settle(self) -> None:
        """Finish every started ticket until nothing moves (each send accepted at once)."""
        done: set[str] = set()
        self.limiter.pump()
        self.run()
        while set(self.started) - done:
            for name in list(self.started):
                if name not in done:
                    done.add(name)
                    self.done(name)
            self.run()


def _assert_gates_restored(limiter: Limiter) -> None:
    snap = limiter.snapshot()
    assert (snap["count"], snap["backed_off_count"], snap["held"], snap["waiting"]) == (
        400,
        10,
        0,
        0,
    )
    assert snap["sample_bytes"] == limiter._budgets()[0].size
    assert limiter._active == 0


def test_an_exception_at_any_signal_point_of_a_pump_starts_no_ticket_twice_and_loses_none():
    """A main-thread sample() admits inline: an alarm handler raising anywhere inside enqueue()
    (admission, round-robin, issuing starts) leaves the limiter whole. Afterwards every queued
    ticket starts exactly once and every gate comes back (docs/limiter.md#signals)."""

    def scenario(point: int | None) -> tuple[Limiter, Lane, int]:
        limiter = Limiter(("https://x", "k"), FakeClock())
        lane = Lane(limiter)
        limiter.send_width = 0  # queue everything first
        for name, owner in (("a0", "A"), ("a1", "A"), ("b0", "B"), ("a2", "A")):
            lane.submit(name, owner=owner)
        limiter.send_width = 3
        passed = interrupt_at(point, lambda: lane.submit("b1", owner="B"))
        return limiter, lane, passed

    _, _, points = scenario(None)
    assert points > 50
    for point in range(points):
        limiter, lane, _ = scenario(point)
        lane.run()
        assert len(lane.started) == len(set(lane.started)), (point, lane.started)
        lane.settle()
        # b1's own enqueue raised: it was queued (and then sent once) or not at all
        assert set(lane.started) - {"b1"} == {"a0", "a1", "a2", "b0"}, (point, lane.started)
        _assert_gates_restored(limiter)


def test_an_exception_at_any_signal_point_of_a_cancel_stops_the_ticket_at_most_once():
    """A cancel's wake() interrupted anywhere: the held ticket never starts, is stopped at most
    once, and its gates come back once the next wake or pump runs."""

    def scenario(point: int | None) -> tuple[Limiter, Lane, int]:
        limiter = Limiter(("https://x", "k"), FakeClock())
        limiter.set_backoff(30.0, "429")
        lane = Lane(limiter)
        lane.submit("held")
        lane.stop_all = RuntimeError("cancelled")
        return limiter, lane, interrupt_at(point, lambda: limiter.wake(everything=False))

    _, _, points = scenario(None)
    assert points > 10
    for point in range(points):
        limiter, lane, _ = scenario(point)
        limiter.wake()
        lane.run()
        assert not lane.started and len(lane.stopped) <= 1, (point, lane.stopped)
        _assert_gates_restored(limiter)


def test_a_sample_interrupted_at_any_signal_point_leaks_no_slot_and_is_sent_at_most_once(
    server: Any, service: Any
) -> None:
    """``sample()`` on the main thread queues its request inline: an exception raised at any
    signal point of that path (the retry layer's slot, the job, the limiter) reaches the caller,
    the abandoned sample is cancelled, its concurrency slot comes back, and the server never sees
    one seq_id twice (docs/limiter.md#signals)."""
    from tinker_sync import types
    from tinker_sync._flow import limiter as limiter_module
    from tinker_sync._sampling import job as job_module
    from tinker_sync._sampling import retry as retry_module

    files = {limiter_module.__file__, job_module.__file__, retry_module.__file__}
    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
    sampler.sample(prompt, 1, params).result(timeout=HANG)  # started: later samples queue inline
    handler = sampler._retry_handler()

    def where(code: Any) -> bool:
        return code.co_filename in files or code.co_name == "_submit"

    points = interrupt_at(None, lambda: sampler.sample(prompt, 1, params).result(), where)
    assert points > 30
    for point in range(points):
        interrupt_at(point, lambda: sampler.sample(prompt, 1, params), where)
        until(lambda: handler.in_flight == 0)
    assert len(sampler.sample(prompt, 2, params).result(timeout=HANG).sequences) == 2
    seq_ids = [
        (record.json or {}).get("seq_id")
        for record in server.requests.all()
        if record.endpoint == "asample"
    ]
    assert len(seq_ids) == len(set(seq_ids)) > 2


# ------------------------------------------------------------------ the tenant's probe (docs/health.md)


def _open_with_probe_due(limiter: Limiter) -> None:
    from tinker_sync._flow.breaker import HALF_OPEN

    tenant = limiter.tenant
    for i in range(tenant.policy.open_after):
        tenant.failure(("asample", f"k{i}"), "HTTP 503")
    limiter.clock.advance(tenant.policy.probe_max_s)  # type: ignore[attr-defined]
    assert tenant.state == HALF_OPEN


def test_an_exception_at_any_signal_point_of_a_probe_pump_issues_exactly_one_probe():
    """While the circuit is open, a pump interrupted anywhere (in the limiter or the breaker)
    gives the probe to exactly one held ticket: the next pump re-issues that one (its start
    never returned) and takes no second probe; when the probe's answer closes the circuit,
    every other ticket starts once (docs/limiter.md#signals, docs/health.md)."""
    from tinker_sync._flow import breaker as breaker_module
    from tinker_sync._flow import limiter as limiter_module

    files = {limiter_module.__file__, breaker_module.__file__}

    def scenario(point: int | None) -> tuple[Limiter, Lane, int]:
        limiter = Limiter(("https://x", "k"), FakeClock(rng=lambda: 0.5))
        lane = Lane(limiter)
        _open_with_probe_due(limiter)
        limiter.send_width = 0  # queue everything first
        for name in ("a0", "a1", "a2"):
            lane.submit(name)
        limiter.send_width = 3
        where = lambda code: code.co_filename in files  # noqa: E731
        return limiter, lane, interrupt_at(point, limiter.pump, where)

    _, _, points = scenario(None)
    assert points > 20
    for point in range(points):
        limiter, lane, _ = scenario(point)
        limiter.pump()
        lane.run()
        assert lane.started == ["a0"], (point, lane.started)
        assert limiter.tenant.probes == 1, point
        assert lane.tickets["a0"].probe, point
        limiter.pump()  # nothing more while the probe is out
        lane.run()
        assert lane.started == ["a0"], (point, lane.started)
        lane.tickets["a0"].probe = False  # the send step takes it; the answer closes it
        limiter.tenant.success()
        lane.settle()
        assert sorted(lane.started) == ["a0", "a1", "a2"], (point, lane.started)
        _assert_gates_restored(limiter)


def test_a_held_probe_ticket_that_stops_gives_the_probe_back():
    """A ticket granted the probe but stopped before its send step claimed it (cancelled,
    closed) abandons the probe: the next held ticket probes."""
    limiter = Limiter(("https://x", "k"), FakeClock(rng=lambda: 0.5))
    lane = Lane(limiter)
    _open_with_probe_due(limiter)
    first = lane.submit("a0")
    assert first.probe and lane.scheduled == ["a0"]
    lane.stop_all = RuntimeError("cancelled")
    limiter.wake(everything=False)
    assert [name for name, _ in lane.stopped] == ["a0"] and not first.probe
    lane.stop_all = None
    lane.submit("a1")
    lane.run()
    assert lane.started == ["a1"] and lane.tickets["a1"].probe
    assert limiter.tenant.probes == 2


def test_quiet_only_while_no_ticket_waits_for_the_gates_or_a_sender():
    """``quiet()`` says a send step may poll its own sample next: no other ticket is queued
    for the gates or held for a sender (docs/polling.md#which-thread-polls)."""
    limiter = limiter_for("https://x", "k", FakeClock())
    limiter.send_width = 1
    made = Tickets(limiter)
    assert limiter.quiet()
    made.submit("a")  # started at once: sending, nobody waits
    assert made.started == ["a"] and limiter.quiet()
    made.submit("b")  # the one sender is taken: b waits for the gates
    assert not limiter.quiet()
    made.done("a")  # b is admitted and starts
    assert made.started == ["a", "b"] and limiter.quiet()
    limiter.set_backoff(5.0, "429")
    limiter.hold(made.tickets["b"])  # held for the deadline: waits for a sender again
    assert not limiter.quiet()
