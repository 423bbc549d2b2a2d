"""Per-model seq_id ordering, duplicate submissions and gaps
(docs/design/protocol.md#seq-ids-and-turns, docs/design/protocol.md#open-questions)."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from app_helpers import Harness, decode_fwdbwd

from tinker_sync.local._ordering import Offer, SeqQueue

# ---------------------------------------------------------------------------- SeqQueue unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_seqqueue_releases_in_order_and_detects_duplicates() -> None:
    q = SeqQueue[str](next_seq=1, gap_grace_s=5.0, clock=FakeClock())
    assert q.offer(3, "c") is Offer.ACCEPTED
    assert q.offer(2, "b") is Offer.ACCEPTED
    assert q.pop_ready() == []
    assert q.offer(1, "a") is Offer.ACCEPTED
    assert q.offer(1, "again") is Offer.DUPLICATE
    assert q.original(1) == "a"
    assert q.pop_ready() == [(1, "a"), (2, "b"), (3, "c")]
    assert q.offer(2, "late") is Offer.DUPLICATE
    assert q.offer(0, "old") is Offer.STALE
    assert q.next_seq == 4 and q.waiting == 0


def test_seqqueue_skips_a_gap_after_the_grace_period() -> None:
    clock = FakeClock()
    q = SeqQueue[str](next_seq=1, gap_grace_s=5.0, clock=clock)
    q.offer(3, "c")
    assert q.next_deadline() == 105.0
    clock.now = 104.9
    assert q.pop_ready() == []
    clock.now = 105.0
    assert q.pop_ready() == [(3, "c")]
    assert q.skipped == [(1, 2)]
    assert q.next_deadline() is None
    assert q.offer(2, "late") is Offer.STALE


def test_seqqueue_gap_clock_restarts_for_each_gap() -> None:
    clock = FakeClock()
    q = SeqQueue[str](next_seq=1, gap_grace_s=5.0, clock=clock)
    q.offer(2, "b")
    clock.now = 103.0
    q.offer(1, "a")
    assert q.pop_ready() == [(1, "a"), (2, "b")]
    q.offer(4, "d")  # new gap at 3 starts now
    assert q.next_deadline() == 108.0


def test_seqqueue_consumed_ids_count_as_processed() -> None:
    q = SeqQueue[str](next_seq=1, gap_grace_s=5.0, clock=FakeClock())
    q.offer(2, "b")
    assert q.consume(1) is Offer.ACCEPTED
    assert q.consume(1) is Offer.DUPLICATE
    assert q.original(1) is None
    assert q.pop_ready() == [(2, "b")]
    assert q.skipped == []


# ---------------------------------------------------------------------------- through the app


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    with Harness(tmp_path, long_poll_s=0.3, gap_grace_s=30.0) as harness:
        yield harness


def _model(h: Harness) -> str:
    return h.new_model(h.new_session())


def test_out_of_order_arrival_is_applied_in_seq_order(h: Harness) -> None:
    mid = _model(h)
    r3 = h.fwdbwd(mid, 3, forward_only=True).json["request_id"]
    r2 = h.optim(mid, 2).json["request_id"]
    # seq 1 is missing: nothing after it may run
    assert h.poll(r3).json["type"] == "try_again"
    assert h.app.applied(mid) == [(0, "CreateModel")]
    r1 = h.fwdbwd(mid, 1).json["request_id"]
    for rid in (r1, r3):
        assert h.result(rid, proto=True).is_proto
    assert "metrics" in h.result_json(r2)
    assert h.app.applied(mid) == [
        (0, "CreateModel"),
        (1, "ForwardBackward"),
        (2, "OptimStep"),
        (3, "Forward"),
    ]


def test_concurrent_shuffled_submissions_apply_in_order(h: Harness) -> None:
    mid = _model(h)
    seqs = list(range(1, 31))
    random.Random(7).shuffle(seqs)

    def submit(seq: int) -> str:
        r = h.optim(mid, seq) if seq % 3 == 0 else h.fwdbwd(mid, seq)
        assert r.status == 200
        return str(r.json["request_id"])

    with ThreadPoolExecutor(8) as pool:
        rids = list(pool.map(submit, seqs))
    for rid in rids:
        h.result(rid, proto=True)
    applied = h.app.applied(mid)
    assert [s for s, _ in applied] == list(range(31))
    assert [k for s, k in applied if s % 3 == 0 and s] == ["OptimStep"] * 10


def test_duplicate_submission_returns_original_future_and_applies_once(h: Harness) -> None:
    mid = _model(h)
    a = h.fwdbwd(mid, 1).json
    b = h.fwdbwd(mid, 1).json
    assert a == b
    out1 = decode_fwdbwd(h.result(a["request_id"], proto=True))
    c = h.fwdbwd(mid, 1).json  # after completion too
    assert c == a
    o1 = h.optim(mid, 2).json
    assert h.optim(mid, 2).json == o1
    h.result_json(o1["request_id"])
    assert h.app.applied(mid) == [(0, "CreateModel"), (1, "ForwardBackward"), (2, "OptimStep")]
    assert decode_fwdbwd(h.result(a["request_id"], proto=True)).metrics == out1.metrics


def test_duplicate_create_model_is_applied_once(h: Harness) -> None:
    sid = h.new_session()
    a = h.submit_model(sid, 0).json
    b = h.submit_model(sid, 0).json
    assert a == b
    h.result_json(a["request_id"])
    assert h.app.applied(a["model_id"]) == [(0, "CreateModel")]


def test_rejected_submission_counts_as_processed(h: Harness) -> None:
    mid = _model(h)
    bad = h.fwdbwd(mid, 1, loss_fn="no_such_loss")
    assert bad.status == 400 and "no_such_loss" in bad.json["detail"]
    # seq 2 runs at once although seq 1 never ran (gap_grace_s is 30 s here)
    ok = h.fwdbwd(mid, 2).json["request_id"]
    assert h.result(ok, proto=True).is_proto
    assert h.app.applied(mid) == [(0, "CreateModel"), (2, "ForwardBackward")]
    assert h.app.state()["models"][mid]["skipped"] == []
    # a resubmission of the rejected seq_id gets the same 4xx again
    again = h.fwdbwd(mid, 1)
    assert again.status == 400 and again.json == bad.json
    # invalid JSON-side arguments count too
    bad2 = h.post("save_weights", {"model_id": mid, "seq_id": 3, "path": "a/b"})
    assert bad2.status == 400
    ok2 = h.optim(mid, 4).json["request_id"]
    assert "metrics" in h.result_json(ok2)
    # a protobuf body whose datum cannot be decoded (3 bytes of int32 tokens), header intact
    from tinker_sync._wire import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest(model_id=mid, seq_id=5, loss_fn="cross_entropy")
    msg.data.add().model_input.add().encoded_text.tokens = b"\x01\x02\x03"
    bad3 = h.post(
        "forward_backward",
        raw=msg.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert bad3.status == 400 and "data[0]" in bad3.json["detail"]
    ok3 = h.fwdbwd(mid, 6).json["request_id"]
    assert h.result(ok3, proto=True).is_proto
    assert [s for s, _ in h.app.applied(mid)] == [0, 2, 4, 6]


def test_seq_id_zero_and_unknown_model_are_rejected(h: Harness) -> None:
    mid = _model(h)
    assert h.fwdbwd(mid, 0).status == 400
    assert h.fwdbwd("nope:train:0", 1).status == 404
    assert h.optim(mid, 0).status == 400


def test_gap_is_skipped_after_grace_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Harness(tmp_path, long_poll_s=2.0, gap_grace_s=0.3) as h:
        mid = _model(h)
        with caplog.at_level(logging.WARNING, logger="tinker_sync.local"):
            rid = h.fwdbwd(mid, 3).json["request_id"]
            assert h.result(rid, proto=True).is_proto
        assert h.app.applied(mid) == [(0, "CreateModel"), (3, "ForwardBackward")]
        assert h.app.state()["models"][mid]["skipped"] == [[1, 2]]
        assert any("1..2" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
        late = h.fwdbwd(mid, 1)
        assert late.status == 400 and "next expected seq_id is 4" in late.json["detail"]
        assert h.result(h.fwdbwd(mid, 4).json["request_id"], proto=True).is_proto


def test_failed_operation_does_not_block_later_ones(h: Harness) -> None:
    mid = _model(h)
    # importance_sampling without advantages: a user failure inside the backend
    r1 = h.fwdbwd(mid, 1, loss_fn="importance_sampling").json["request_id"]
    r2 = h.fwdbwd(mid, 2).json["request_id"]
    failed = h.result(r1).json
    assert failed["category"] == "user" and failed["error"]
    assert h.result(r2, proto=True).is_proto
    assert h.app.applied(mid) == [(0, "CreateModel"), (2, "ForwardBackward")]


def test_lost_reply_resubmission_is_applied_once(h: Harness) -> None:
    """``drop-after``: the handler ran but the reply was lost; the client resends the same seq_id."""
    import requests

    sid = h.new_session()
    h.faults.add("create_model drop-after")
    with pytest.raises(requests.ConnectionError):
        h.submit_model(sid, 0)
    created = h.submit_model(sid, 0).json
    mid = created["model_id"]
    h.result_json(created["request_id"])
    h.faults.add("forward_backward drop-after")
    with pytest.raises(requests.ConnectionError):
        h.fwdbwd(mid, 1)
    again = h.fwdbwd(mid, 1).json["request_id"]
    assert h.result(again, proto=True).is_proto
    sampler = h.sampler(sid, 0, base_model="Qwen/Qwen3-8B")
    h.faults.add("asample drop-after")
    with pytest.raises(requests.ConnectionError):
        h.asample(sampler, 0)
    retry = h.asample(sampler, 0).json
    assert h.app.state()["samplers"][sampler]["requests"] == 1
    assert h.result(retry["request_id"], proto=True).is_proto
    assert h.app.applied(mid) == [(0, "CreateModel"), (1, "ForwardBackward")]
    h.faults.assert_exhausted()
