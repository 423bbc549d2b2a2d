"""The backoff deadline shared across processes: the mapped file and the limiters reading it.

Two limiters built on two separate openings of one tenant file behave like two processes
(separate descriptors and mappings of the same file); a fork test and the spawned-process
tests in test_sampling_client.py cover real processes. Clocks are FakeClocks sharing one wall
reading, so deadlines are asserted exactly.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from tinker_sync._flow import sharedbackoff
from tinker_sync._flow.limiter import Limiter, limiter_for, reset_limiters
from tinker_sync._flow.sharedbackoff import (
    RECORD_SIZE,
    decode,
    encode,
    open_shared_deadline,
    tenant_file_name,
)
from tinker_sync._runtime.clock import FakeClock

URL, IDENTITY = "https://tinker.example", "ab" * 32


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    reset_limiters()
    monkeypatch.setattr(sharedbackoff, "_warned", set())


def two_processes(clock_a: FakeClock, clock_b: FakeClock) -> tuple[Limiter, Limiter]:
    a = Limiter((URL, IDENTITY), clock_a, open_shared_deadline(URL, IDENTITY))
    b = Limiter((URL, IDENTITY), clock_b, open_shared_deadline(URL, IDENTITY))
    assert a.shared is not None and b.shared is not None
    return a, b


def tenant_path() -> Path:
    return Path(os.environ["TINKER_SYNC_RUNTIME_DIR"]) / tenant_file_name(URL, IDENTITY)


def test_a_backoff_set_in_one_process_holds_the_other():
    clock_a, clock_b = FakeClock(), FakeClock(monotonic=500.0)  # different monotonic origins
    a, b = two_processes(clock_a, clock_b)
    assert b.backoff_remaining() == 0.0
    a.set_backoff(2.0, "429")
    assert b.backoff_remaining() == pytest.approx(2.0)
    assert b.backoff_until == pytest.approx(502.0)  # on b's own monotonic clock
    assert b.recently_backed_off()  # the gate of 10 applies there too
    clock_b.advance(1.5)
    assert b.backoff_remaining() == pytest.approx(0.5)


def test_the_shared_deadline_only_moves_forward():
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = two_processes(clock_a, clock_b)
    a.set_backoff(5.0, "429")
    b.set_backoff(1.0, "429")  # shorter: the file keeps 5 s
    assert a.shared is not None and a.shared.read() == pytest.approx(clock_a.time() + 5.0)
    assert b.backoff_remaining() == pytest.approx(5.0)


def virtual_wait(clock: FakeClock, seconds: float) -> None:
    """What tinker_sync.testing's virtual clock does: monotonic time moves, wall time not."""
    wall = clock.time()
    clock.advance(seconds)
    clock.set_wall(wall)


def test_a_record_from_another_process_is_honoured_once():
    # Read back after a virtual wait, the record still lies ahead on the real wall clock:
    # adopting it again moved the deadline on with every timer pass (SamplingStuckError).
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = two_processes(clock_a, clock_b)
    a.set_backoff(5.0, "429")
    assert b.backoff_remaining() == pytest.approx(5.0)
    virtual_wait(clock_b, 5.0)
    assert b.backoff_remaining() == 0.0
    a.set_backoff(8.0, "429")  # a new record is a new backoff
    assert b.backoff_remaining() == pytest.approx(8.0)


def test_a_shorter_backoff_does_not_readopt_the_longer_record_of_the_same_process():
    clock = FakeClock()
    a, b = two_processes(clock, FakeClock())
    a.set_backoff(30.0, "429")
    virtual_wait(clock, 30.0)
    a.set_backoff(1.0, "429")  # the file keeps the 30 s record: ours, already honoured
    assert a.shared is not None and a.shared.read() == pytest.approx(clock.time() + 30.0)
    assert a.backoff_remaining() == pytest.approx(1.0)
    assert b.backoff_remaining() == pytest.approx(30.0)  # another process still honours it


def test_the_file_is_named_by_a_hash_and_never_holds_the_key():
    key = "tml-secret-key-value"
    name = tenant_file_name(URL, key)
    assert key not in name and URL not in name and name.endswith(".backoff")
    a, _ = two_processes(FakeClock(), FakeClock())
    a.set_backoff(1.0, "429")
    assert tenant_path().stat().st_size == RECORD_SIZE
    assert stat.S_IMODE(tenant_path().stat().st_mode) == 0o600


def test_torn_corrupt_and_stale_records_are_ignored(caplog: pytest.LogCaptureFixture):
    clock = FakeClock()
    a, b = two_processes(clock, FakeClock())
    a.set_backoff(3.0, "429")
    raw = bytearray(tenant_path().read_bytes())
    raw[10] ^= 0xFF  # a torn write (or a crash mid-write): the checksum no longer matches
    tenant_path().write_bytes(bytes(raw))
    assert decode(bytes(raw)) is None
    assert b.shared is not None and b.shared.read() is None
    assert b.backoff_remaining() == 0.0
    tenant_path().write_bytes(encode(clock.time() - 100.0))  # stale: long over
    assert b.backoff_remaining() == 0.0
    with caplog.at_level(logging.DEBUG, logger="tinker_sync.ratelimit"):
        tenant_path().write_bytes(encode(clock.time() + 10_000.0))  # implausible: ignored
        assert b.backoff_remaining() == 0.0
        assert b.backoff_remaining() == 0.0
    assert sum("implausible" in r.getMessage() for r in caplog.records) == 1
    a.set_backoff(5.0, "429")  # the next writer repairs the file
    assert b.backoff_remaining() == pytest.approx(5.0)


def test_a_short_or_empty_file_is_sized_and_reads_as_no_deadline():
    tenant_path().parent.mkdir(mode=0o700, exist_ok=True)
    tenant_path().write_bytes(b"")
    shared = open_shared_deadline(URL, IDENTITY)
    assert shared is not None and shared.read() is None
    assert tenant_path().stat().st_size == RECORD_SIZE
    shared.close()
    shared.close()  # idempotent
    assert shared.read() is None


@pytest.mark.parametrize("case", ["opt-out", "missing-parent", "not-a-dir", "open-to-others"])
def test_unusable_directories_fall_back_to_per_process_with_one_debug_log(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    target = tmp_path / "run"
    if case == "opt-out":
        monkeypatch.setenv("TINKER_SYNC_SHARED_BACKOFF", "0")
    elif case == "missing-parent":
        target = tmp_path / "absent" / "run"
    elif case == "not-a-dir":
        target.write_text("x")
    else:
        target.mkdir(mode=0o700)
        target.chmod(0o777)
    monkeypatch.setenv("TINKER_SYNC_RUNTIME_DIR", str(target))
    with caplog.at_level(logging.DEBUG, logger="tinker_sync.ratelimit"):
        assert open_shared_deadline(URL, IDENTITY) is None
        assert open_shared_deadline(URL, IDENTITY) is None
        limiter = limiter_for(URL, IDENTITY, FakeClock())
        limiter.set_backoff(1.0, "429")  # still works, per process
        assert limiter.backoff_remaining() == 1.0
    logs = [r for r in caplog.records if "per process" in r.getMessage()]
    assert len(logs) == (0 if case == "opt-out" else 1)
    assert all(r.levelno == logging.DEBUG for r in logs)
    assert not list(tmp_path.rglob("*.backoff"))


def test_default_runtime_dir_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("TINKER_SYNC_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert sharedbackoff.runtime_dir() == str(tmp_path / "tinker_sync")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(sharedbackoff.tempfile, "gettempdir", lambda: str(tmp_path))
    assert sharedbackoff.runtime_dir() == str(tmp_path / f"tinker_sync-{os.getuid()}")


def test_close_shared_reopens_on_next_use():
    clock = FakeClock()
    limiter = limiter_for(URL, IDENTITY, clock)
    other = Limiter((URL, IDENTITY), FakeClock(), open_shared_deadline(URL, IDENTITY))
    limiter.set_backoff(1.0, "429")
    limiter.close_shared()
    assert limiter.shared is None
    other.set_backoff(4.0, "429")
    assert limiter.backoff_remaining() == pytest.approx(4.0)  # reopened and read


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_sees_and_sets_the_parents_deadline():
    clock = FakeClock()
    parent = limiter_for(URL, IDENTITY, clock)
    parent.set_backoff(2.0, "429")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            child = limiter_for(URL, IDENTITY, clock)  # a fresh registry after fork
            if child is not parent and abs(child.backoff_remaining() - 2.0) < 1e-6:
                child.set_backoff(7.0, "429")
                code = 0
        finally:
            os.write(write, b"x")
            os._exit(code)
    os.read(read, 1)
    _, status = os.waitpid(pid, 0)
    os.close(read)
    os.close(write)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent.backoff_remaining() == pytest.approx(7.0)
