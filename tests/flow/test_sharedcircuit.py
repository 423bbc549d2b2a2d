"""The tenant circuit shared across processes (docs/health.md#across-processes): the record, and
two TenantHealth objects on two openings of one tenant file (separate descriptors and mappings:
two processes as far as the file goes), on FakeClocks with different monotonic origins and one
wall reading. The spawned-process tests in tests/flow/test_processes_circuit.py cover real
processes against a LocalServer.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from waiting import HANG, until  # tests/waiting.py

from tinker_sync import HealthPolicy
from tinker_sync._flow import sharedbackoff, sharedcircuit
from tinker_sync._flow.breaker import CLOSED, HALF_OPEN, OPEN, TenantHealth, Turn
from tinker_sync._flow.sharedcircuit import (
    RECORD_SIZE,
    CircuitRecord,
    decode,
    encode,
    open_shared_circuit,
)
from tinker_sync._runtime.clock import FakeClock

URL, IDENTITY = "https://tinker.example", "cd" * 32
KEY = (URL, IDENTITY)
RUN: dict[str, Any] = {"capture_output": True, "text": True, "check": True, "timeout": 60}
POLICY = HealthPolicy(probe_initial_s=1.0, probe_max_s=4.0, probe_jitter=0.0, probe_lease_s=5.0)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharedbackoff, "_warned", set())


class Timers:
    """Records timer requests (the probe's and the shared checks') instead of running them."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Any, tuple[Any, ...]]] = []

    def __call__(self, clock: Any, delay: float, role: str, fn: Any, *args: Any) -> None:
        self.calls.append((delay, fn, args))


class Process:
    """One process's view of the tenant: its own clock, tenant object and file opening."""

    def __init__(self, monotonic: float) -> None:
        self.clock = FakeClock(monotonic=monotonic, rng=lambda: 0.0)
        self.tenant = TenantHealth(KEY, self.clock, schedule=Timers(), share=True)
        self.tenant.configure(POLICY)

    def open_it(self) -> None:
        for i in range(POLICY.open_after):
            self.tenant.failure(("asample", f"k{i}"), "HTTP 503")


@pytest.fixture
def procs() -> list[Process]:
    made = [Process(0.0), Process(500.0), Process(9_000.0)]  # different monotonic origins
    yield made
    for proc in made:
        proc.tenant.close_shared()


def advance(procs: list[Process], seconds: float) -> None:
    """Time passes for every process alike (their wall readings stay equal)."""
    for proc in procs:
        proc.clock.advance(seconds)


def record() -> CircuitRecord | None:
    shared = open_shared_circuit(URL, IDENTITY, create=False)
    assert shared is not None
    try:
        return shared.read()
    finally:
        shared.close()


def test_the_record_round_trips_and_a_torn_or_corrupt_one_reads_as_none():
    rec = CircuitRecord("open", 7, 3, 1.5, 2.5, 3.5, 4.5, 99, "é" * 100)
    raw = encode(rec)
    assert len(raw) == RECORD_SIZE
    back = decode(raw)
    assert back is not None and back.reason == "é" * 60  # 120 bytes, whole characters
    assert back == CircuitRecord("open", 7, 3, 1.5, 2.5, 3.5, 4.5, 99, "é" * 60)
    torn = bytearray(raw)
    torn[40] ^= 0xFF
    assert decode(bytes(torn)) is None
    assert decode(raw[:-1]) is None


def test_an_opening_in_one_process_parks_the_others(procs: list[Process]):
    a, b, c = procs
    assert b.tenant.turn() is Turn.SEND  # opens the file: nothing shared yet
    a.open_it()
    assert a.tenant.state == OPEN
    for other in (b, c):
        assert other.tenant.turn() is Turn.WAIT
        assert other.tenant.state == OPEN
        assert other.tenant.opened_wall == a.tenant.opened_wall
        assert "5 failed attempts of 5 requests" in other.tenant.reason
        assert other.tenant.adopted_opens == 1
    rec = record()
    assert rec is not None and rec.state == "open" and rec.epoch == 1


def test_one_probe_at_a_time_across_processes_and_its_failure_reschedules_all(
    procs: list[Process],
):
    a, b, c = procs
    a.open_it()
    assert b.tenant.turn() is Turn.WAIT and c.tenant.turn() is Turn.WAIT
    advance(procs, 1.0)  # the probe is due (1 s, no jitter)
    assert b.tenant.state == HALF_OPEN
    assert b.tenant.turn() is Turn.PROBE  # b takes the lease first
    assert a.tenant.turn() is Turn.WAIT and c.tenant.turn() is Turn.WAIT
    assert a.tenant.state == OPEN  # waiting for b's probe, at most its lease
    b.tenant.failure(("asample", "probe"), "HTTP 503")
    rec = record()
    assert rec is not None and rec.failed_probes == 1 and rec.lease_owner == 0
    assert rec.probe_wall == pytest.approx(b.clock.time() + 2.0)  # the next delay: 2 s
    advance(procs, 1.9)
    assert [p.tenant.turn() for p in procs] == [Turn.WAIT] * 3
    advance(procs, 0.1)
    turns = [p.tenant.turn() for p in (c, a, b)]
    assert turns == [Turn.PROBE, Turn.WAIT, Turn.WAIT]  # exactly one probe again
    assert sum(p.tenant.probes for p in procs) == 2


def test_the_first_answer_in_any_process_closes_it_for_all(procs: list[Process]):
    a, b, c = procs
    a.open_it()
    assert b.tenant.turn() is Turn.WAIT
    advance(procs, 1.0)
    assert c.tenant.turn() is Turn.PROBE
    c.tenant.success()  # the probe is answered
    rec = record()
    assert rec is not None and rec.state == "closed" and rec.epoch == 1
    assert a.tenant.turn() is Turn.SEND and b.tenant.turn() is Turn.SEND
    assert a.tenant.adopted_closes == b.tenant.adopted_closes == 1
    assert a.tenant.tokens == POLICY.retry_capacity
    # The next opening is a new epoch, adopted again by the others.
    b.open_it()
    assert a.tenant.turn() is Turn.WAIT
    rec = record()
    assert rec is not None and rec.state == "open" and rec.epoch == 2


def test_while_closed_an_unchanged_record_is_not_decoded_and_the_clock_not_read(
    procs: list[Process], monkeypatch: pytest.MonkeyPatch
):
    # Every sample asks is_open() and turn() about ten times: while the circuit is closed
    # and no process wrote the record since, they compare its bytes and return.
    a, b, _ = procs
    a.open_it()
    advance(procs, 1.0)
    assert b.tenant.turn() is Turn.PROBE
    b.tenant.success()  # closed: a closed record stays in the file, as after any outage
    assert a.tenant.turn() is Turn.SEND and a.tenant.adopted_closes == 1
    decoded: list[bytes] = []
    monkeypatch.setattr(sharedcircuit, "decode", lambda raw: decoded.append(raw) or decode(raw))
    clock_reads = 0
    monotonic = a.clock.monotonic

    def counted() -> float:
        nonlocal clock_reads
        clock_reads += 1
        return monotonic()

    monkeypatch.setattr(a.clock, "monotonic", counted)
    for _ in range(100):
        assert not a.tenant.is_open() and a.tenant.turn() is Turn.SEND
    assert (len(decoded), clock_reads) == (0, 0)
    b.open_it()  # another process's opening is still adopted at the next call
    assert a.tenant.is_open() and a.tenant.turn() is Turn.WAIT
    assert a.tenant.adopted_opens == 1 and len(decoded) == 1


def test_waiting_for_another_processs_probe_waits_for_its_answer_not_on_the_clock(
    procs: list[Process],
):
    # On an injected (virtual) clock, a wait on the clock would move time by the whole lease
    # and spend the waiter's stall budget while the other process's probe is still out.
    a, b, _ = procs
    a.open_it()
    advance(procs, 1.0)
    assert a.tenant.turn() is Turn.PROBE
    assert b.tenant.turn() is Turn.WAIT
    start = b.clock.monotonic()
    turns: list[Turn] = []
    waiter = threading.Thread(target=lambda: turns.append(b.tenant.wait_turn(until=start + 5.0)))
    waiter.start()
    until(lambda: b.tenant.waiting == 1)
    a.tenant.success()  # the probe is answered in the other process
    waiter.join(HANG)
    assert turns == [Turn.SEND]
    assert b.clock.monotonic() == start  # no virtual time went by


def test_an_answer_in_a_process_that_never_saw_the_opening_closes_it(procs: list[Process]):
    a, b, _ = procs
    b.tenant.turn()
    a.open_it()
    b.tenant.success()  # b's request in flight since before the opening was answered
    assert a.tenant.turn() is Turn.SEND
    assert a.tenant.state == CLOSED


def test_a_crashed_probers_lease_expires(procs: list[Process]):
    a, b, _ = procs
    a.open_it()
    advance(procs, 1.0)
    assert a.tenant.turn() is Turn.PROBE
    a.tenant.close_shared()  # a "crashes": it never reports its probe
    assert b.tenant.turn() is Turn.WAIT
    advance(procs, POLICY.probe_lease_s - 0.1)
    assert b.tenant.turn() is Turn.WAIT  # the lease still holds
    advance(procs, 0.1)
    assert b.tenant.turn() is Turn.PROBE  # expired: b probes
    assert b.tenant.expired_probes == 1
    rec = record()
    assert rec is not None and rec.lease_owner not in (0, a.tenant._token)


def test_the_lease_of_a_prober_that_no_longer_exists_ends_at_once(procs: list[Process]):
    a, b, _ = procs
    a.open_it()
    advance(procs, 1.0)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], **RUN)
    wall = a.clock.time()
    rec = record()
    assert rec is not None
    shared = open_shared_circuit(URL, IDENTITY)
    assert shared is not None
    shared.update(  # as a process that took the lease and crashed would have left it
        lambda _: CircuitRecord(
            "open", rec.epoch, 0, rec.opened_wall, wall, wall + 60.0, wall,
            int(dead.stdout) << 32 | 1, rec.reason,
        )
    )  # fmt: skip
    shared.close()
    assert b.tenant.turn() is Turn.PROBE  # not 60 s later
    assert b.tenant.expired_probes == 1


def test_an_abandoned_probe_frees_the_lease_for_another_process(procs: list[Process]):
    a, b, _ = procs
    a.open_it()
    advance(procs, 1.0)
    assert a.tenant.turn() is Turn.PROBE
    assert b.tenant.turn() is Turn.WAIT
    a.tenant.abandon_probe()
    assert b.tenant.turn() is Turn.PROBE


def tenant_file() -> Path:
    name = sharedbackoff.tenant_file_name(URL, IDENTITY, ".circuit")
    return Path(os.environ["TINKER_SYNC_RUNTIME_DIR"]) / name


def test_torn_corrupt_and_implausible_records_are_ignored(
    procs: list[Process], caplog: pytest.LogCaptureFixture
):
    a, b, _ = procs
    a.tenant.turn()
    b.tenant.turn()
    wall = a.clock.time()
    good = CircuitRecord("open", 5, 0, wall, wall + 1.0, changed_wall=wall, reason="x")
    raw = bytearray(encode(good))
    raw[30] ^= 0xFF  # torn
    tenant_file().write_bytes(bytes(raw))
    assert a.tenant.turn() is Turn.SEND
    with caplog.at_level(logging.DEBUG, logger="tinker_sync.health"):
        for bad in (
            CircuitRecord("open", 5, 0, wall, wall + 10_000.0, changed_wall=wall),  # far ahead
            CircuitRecord("open", 6, 0, wall + 10_000.0, wall, changed_wall=wall),  # future
            CircuitRecord("open", 7, 0, float("nan"), wall, changed_wall=wall),
        ):
            tenant_file().write_bytes(encode(bad))
            assert a.tenant.turn() is Turn.SEND
    assert sum("implausible" in r.getMessage() for r in caplog.records) == 1
    tenant_file().write_bytes(encode(good))  # a plausible record is adopted
    assert a.tenant.turn() is Turn.WAIT


def test_the_switch_keeps_the_circuit_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv("TINKER_SYNC_SHARED_BACKOFF", "0")
    a, b = Process(0.0), Process(100.0)
    a.open_it()
    assert a.tenant.state == OPEN and b.tenant.turn() is Turn.SEND
    assert not tenant_file().exists()


def test_an_unusable_directory_keeps_it_per_process_with_one_debug_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    target = tmp_path / "run"
    target.mkdir(mode=0o700)
    target.chmod(0o777)  # open to others
    monkeypatch.setenv("TINKER_SYNC_RUNTIME_DIR", str(target))
    with caplog.at_level(logging.DEBUG, logger="tinker_sync.ratelimit"):
        a, b = Process(0.0), Process(100.0)
        a.open_it()
        assert b.tenant.turn() is Turn.SEND
    lines = [r for r in caplog.records if "tenant circuit is per process" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.DEBUG
    assert not list(target.glob("*.circuit"))
