"""RequestLog / RecordedRequest (tinker_sync.local._log)."""

from __future__ import annotations

import threading
import time

import pytest

from tinker_sync.local._log import RecordedRequest, RequestLog


def rec(
    endpoint: str, status: int | None = 200, method: str = "POST", **kw: object
) -> RecordedRequest:
    return RecordedRequest(
        time=time.time(),
        method=method,
        path="/api/v1/" + endpoint,
        endpoint=endpoint,
        status=status,
        **kw,  # type: ignore[arg-type]
    )


def test_filter_count_and_globs() -> None:
    log = RequestLog()
    log.record(rec("asample"))
    log.record(rec("asample", 429, fault="asample 429"))
    log.record(rec("training_runs/r1/checkpoints/weights/a", 200, method="DELETE"))
    log.record(rec("optim_step", None, dropped="before"))
    assert log.count("asample") == 2
    assert log.count("asample", status=429) == 1
    assert log.count("training_runs/*/checkpoints/**") == 1
    assert log.count("/api/v1/*") == 3
    assert log.count() == len(log) == 4
    assert [r.endpoint for r in log.filter(method="delete")] == [
        "training_runs/r1/checkpoints/weights/a"
    ]
    [dropped] = log.filter(status="dropped")
    assert dropped.dropped == "before" and "dropped-before" in repr(dropped)
    log.clear()
    assert log.count() == 0 and log.all() == []


def test_wait_for_wakes_on_record_from_another_thread() -> None:
    log = RequestLog()
    started = threading.Event()
    result: list[list[RecordedRequest]] = []

    def waiter() -> None:
        started.set()
        result.append(log.wait_for("asample", count=2, timeout=30))

    t = threading.Thread(target=waiter)
    t.start()
    assert started.wait(10)
    log.record(rec("asample"))
    log.record(rec("healthz"))
    log.record(rec("asample", 503))
    t.join(30)
    assert not t.is_alive()
    assert [r.status for r in result[0]] == [200, 503]


def test_wait_for_times_out_with_a_helpful_message() -> None:
    log = RequestLog()
    log.record(rec("asample"))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="saw 1"):
        log.wait_for("asample", count=2, timeout=0.1)
    assert time.monotonic() - t0 >= 0.1


def test_counts_stay_exact_after_eviction() -> None:
    log = RequestLog(max_entries=3)
    for _ in range(10):
        log.record(rec("asample"))
    assert log.count("asample") == 10
    assert len(log.filter("asample")) == 3
    assert len(log.wait_for("asample", count=10, timeout=1)) == 3


def test_subscribe_and_round_trip() -> None:
    log = RequestLog()
    calls: list[int] = []
    unsubscribe = log.subscribe(lambda: calls.append(1))
    original = rec(
        "forward_backward", proto={"seq_id": 3}, json=None, headers={"a": "b"}, query={"q": "1"}
    )
    log.record(original)
    unsubscribe()
    log.record(rec("asample"))
    assert calls == [1]
    assert RecordedRequest.from_dict(original.to_dict()) == original
