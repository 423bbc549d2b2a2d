"""Future polling: long polls, try_again, queue pauses, poll faults, metadata-only answers,
the session futures poller (retrieve_futures), expiry (docs/design/protocol.md#polling)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from app_helpers import BASE_MODEL, KEY, Harness, decode_fwdbwd, decode_sample, fwdbwd_body

from tinker_sync.local._app import TinkerApp
from tinker_sync.local._httpapi import HttpRequest


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    with Harness(tmp_path, long_poll_s=0.3) as harness:
        yield harness


def _sampler(h: Harness) -> tuple[str, str]:
    sid = h.new_session()
    return sid, h.sampler(sid, 0, base_model=BASE_MODEL)


# ---------------------------------------------------------------------------- retrieve_future


def test_pending_poll_is_held_then_answers_try_again(h: Harness) -> None:
    _, sampler_id = _sampler(h)
    h.app.pause("paused_capacity", kind="training")  # sampling still runs
    rid = h.asample(sampler_id, 0).json["request_id"]
    assert decode_sample(h.result(rid, proto=True)).sequences
    h.app.resume()
    h.app.pause("paused_capacity", kind="sampling")
    rid = h.asample(sampler_id, 1).json["request_id"]
    t0 = time.monotonic()
    r = h.poll(rid)
    assert time.monotonic() - t0 >= 0.25  # held for about min(long_poll_s, 1 s)
    assert r.json == {"type": "try_again", "request_id": rid, "queue_state": "paused_capacity"}
    h.app.resume("sampling")
    assert decode_sample(h.result(rid, proto=True)).sequences


def test_long_poll_returns_as_soon_as_the_result_is_ready(tmp_path: Path) -> None:
    with Harness(tmp_path, long_poll_s=10.0) as h:
        _, sampler_id = _sampler(h)
        h.app.pause("paused_capacity", kind="sampling")
        rid = h.asample(sampler_id, 0).json["request_id"]
        timer = threading.Timer(0.3, h.app.resume)
        timer.start()
        t0 = time.monotonic()
        # the first poll is held (paused polls answer within ~1 s), a later one gets the result
        r = h.result(rid, proto=True)
        timer.join()
        assert r.is_proto and time.monotonic() - t0 < 5.0


def test_try_again_reports_active_when_work_is_slow(tmp_path: Path) -> None:
    with Harness(tmp_path, long_poll_s=0.2, work_delay_s=0.6) as h:
        _, sampler_id = _sampler(h)
        rid = h.asample(sampler_id, 0).json["request_id"]
        assert h.poll(rid).json == {"type": "try_again", "request_id": rid, "queue_state": "active"}
        assert h.result(rid, proto=True).is_proto


def test_an_active_pause_holds_polls_like_slow_work(tmp_path: Path) -> None:
    """pause("active") stops work without the 1 s paused-poll cap: polls are held long_poll_s."""
    with Harness(tmp_path, long_poll_s=2.0) as h:
        _, sampler_id = _sampler(h)
        h.app.pause("active", kind="sampling")
        rid = h.asample(sampler_id, 0).json["request_id"]
        t0 = time.monotonic()
        r = h.poll(rid)
        assert time.monotonic() - t0 >= 1.9  # not cut at 1 s
        assert r.json == {"type": "try_again", "request_id": rid, "queue_state": "active"}
        h.app.resume("sampling")
        assert decode_sample(h.result(rid, proto=True)).sequences


def test_pause_training_reports_state_and_reason(h: Harness) -> None:
    sid = h.new_session()
    mid = h.new_model(sid)
    h.app.pause("paused_rate_limit", "too many clients", kind="training")
    rid = h.fwdbwd(mid, 1).json["request_id"]
    r = h.poll(rid, proto=True)
    assert r.json == {
        "type": "try_again",
        "request_id": rid,
        "queue_state": "paused_rate_limit",
        "queue_state_reason": "too many clients",
    }
    assert h.app.applied(mid) == [(0, "CreateModel")]  # nothing advanced
    assert h.app.state()["paused"]["training"]["state"] == "paused_rate_limit"
    h.app.resume("training")
    assert h.result(rid, proto=True).is_proto
    with pytest.raises(ValueError):
        h.app.pause("bogus")


def test_metadata_only_flow(tmp_path: Path) -> None:
    with Harness(tmp_path, metadata_threshold_bytes=16) as h:
        mid = h.new_model(h.new_session())
        rid = h.fwdbwd(mid, 1).json["request_id"]
        h.result(rid, proto=False)  # wait until done (JSON form, metadata not allowed)
        meta = h.poll(rid, proto=True, allow_metadata=True).json
        assert meta["status"] == "complete_metadata" and meta["response_payload_size"] > 16
        payload = h.poll(rid, proto=True, allow_metadata=False)
        assert payload.is_proto and len(payload.content) == meta["response_payload_size"]
        # metadata is announced only once per future
        again = h.poll(rid, proto=True, allow_metadata=True)
        assert again.is_proto
        decode_fwdbwd(again)


def test_small_results_skip_metadata(h: Harness) -> None:
    mid = h.new_model(h.new_session())
    rid = h.optim(mid, 1).json["request_id"]
    h.result_json(rid)
    assert "metrics" in h.poll(rid, allow_metadata=True).json


def test_poll_faults_queue_state_fail_expire_metadata(h: Harness) -> None:
    sid, sampler_id = _sampler(h)
    mid = h.new_model(sid)
    h.faults.add('retrieve_future paused_rate_limit reason="limit hit" match.request_type=Sample')
    h.faults.add("retrieve_future fail:server match.request_type=ForwardBackward")
    h.faults.add("retrieve_future expire match.request_type=OptimStep")
    h.faults.add("retrieve_future metadata match.request_type=Forward")

    srid = h.asample(sampler_id, 0).json["request_id"]
    r = h.poll(srid, proto=True, allow_metadata=True)
    assert r.json == {
        "type": "try_again",
        "request_id": srid,
        "queue_state": "paused_rate_limit",
        "queue_state_reason": "limit hit",
    }
    assert h.result(srid, proto=True).is_proto  # the rule had times=1

    frid = h.fwdbwd(mid, 1).json["request_id"]
    r = h.poll(frid, proto=True)
    assert r.json["category"] == "server" and r.json["error"]
    assert h.poll(frid, proto=True).json["category"] == "server"  # the future stays failed

    orid = h.optim(mid, 2).json["request_id"]
    assert h.poll(orid).status == 410

    fwd = h.fwdbwd(mid, 3, forward_only=True).json["request_id"]
    meta = h.poll(fwd, proto=True, allow_metadata=True).json
    assert meta["status"] == "complete_metadata"
    assert len(h.poll(fwd, proto=True).content) == meta["response_payload_size"]
    h.faults.assert_exhausted()


def test_futures_expire_after_ttl(tmp_path: Path) -> None:
    clock = _Clock()
    with Harness(tmp_path, future_ttl_s=60.0, clock=clock) as h:
        mid = h.new_model(h.new_session())
        rid = h.optim(mid, 1).json["request_id"]
        h.result_json(rid)
        clock.advance(30)
        assert h.poll(rid).status == 200
        clock.advance(31)
        assert h.poll(rid).status == 410


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, dt: float) -> None:
        with self.lock:
            self.t += dt


def test_heartbeat_expiry(tmp_path: Path) -> None:
    clock = _Clock()
    with Harness(tmp_path, heartbeat_expiry_s=10.0, clock=clock) as h:
        sid, sampler_id = _sampler(h)
        clock.advance(9)
        assert h.post("session_heartbeat", {"session_id": sid}).status == 200
        clock.advance(9)
        assert h.post("session_heartbeat", {"session_id": sid}).status == 200
        h.app.pause(kind="sampling")
        rid = h.asample(sampler_id, 0).json["request_id"]
        clock.advance(11)
        r = h.post("session_heartbeat", {"session_id": sid})
        assert r.status == 410
        assert h.get(f"sessions/{sid}").status == 200
        h.app.resume()
        failed = h.result(rid).json
        assert failed["category"] == "user" and "expired" in failed["error"]


# ---------------------------------------------------------------------------- retrieve_futures


def _futures_poll(h: Harness, sampler_id: str, prev: int, **extra: Any) -> Any:
    body: dict[str, Any] = {
        "target": {
            "type": "sampling_session",
            "sampling_session_id": sampler_id,
            "cloned_sampler_id": 0,
        },
        "prev_cursor": prev,
        "retrieved_request_ids": [],
    }
    body.update(extra)
    return h.ok("POST", "retrieve_futures", body)


def test_retrieve_futures_cursor_acks_and_idle(tmp_path: Path) -> None:
    with Harness(tmp_path, long_poll_s=2.0) as h:
        _check_retrieve_futures(h)


def _check_retrieve_futures(h: Harness) -> None:
    _, sampler_id = _sampler(h)
    rids = [h.asample(sampler_id, i).json["request_id"] for i in range(3)]
    rids.append(
        h.asample(sampler_id, 3, sampling_params={"max_tokens": 4, "top_p": 5.0}).json["request_id"]
    )
    seen: dict[str, dict[str, Any]] = {}
    cursor = 0
    while len(seen) < 4:
        batch = _futures_poll(h, sampler_id, cursor)
        for c in batch["completions"]:
            seen[c["request_id"]] = c
        assert batch["cursor"] >= cursor
        cursor = batch["cursor"]
    assert set(seen) == set(rids)
    for rid in rids[:3]:
        assert (
            seen[rid]["state"] == "finished" and seen[rid]["response_payload_uncompressed_size"] > 0
        )
        payload = h.poll(rid, proto=True)
        assert len(payload.content) == seen[rid]["response_payload_uncompressed_size"]
    assert seen[rids[3]] == {"state": "failed", "request_id": rids[3]}
    assert h.poll(rids[3], allow_metadata=True).json["category"] == "user"

    # ack-only poll: answers at once, nothing new
    t0 = time.monotonic()
    ack = _futures_poll(h, sampler_id, cursor, timeout=0.0, retrieved_request_ids=sorted(rids[:2]))
    assert ack == {"completions": [], "cursor": cursor}
    assert time.monotonic() - t0 < 1.5  # not held for long_poll_s (2 s)
    # acknowledged payloads are released
    assert h.poll(rids[0]).status == 410
    assert h.poll(rids[2], proto=True).is_proto
    # an idle long poll waits ~long_poll_s and returns the same cursor
    t0 = time.monotonic()
    idle = _futures_poll(h, sampler_id, cursor)
    assert idle == {"completions": [], "cursor": cursor}
    assert time.monotonic() - t0 >= 1.9


def test_retrieve_futures_wakes_on_completion_and_separates_clones(tmp_path: Path) -> None:
    with Harness(tmp_path, long_poll_s=5.0) as h:
        _, sampler_id = _sampler(h)
        h.app.pause(kind="sampling")
        clone_rid = h.asample(sampler_id, 1_000_000_000).json["request_id"]
        rid = h.asample(sampler_id, 0).json["request_id"]
        threading.Timer(0.2, h.app.resume).start()
        t0 = time.monotonic()
        got: list[str] = []
        cursor = 0
        while not got:
            batch = _futures_poll(h, sampler_id, cursor)
            got += [c["request_id"] for c in batch["completions"]]
            cursor = batch["cursor"]
        assert got == [rid] and time.monotonic() - t0 < 4.0
        clone = h.ok(
            "POST",
            "retrieve_futures",
            {
                "target": {
                    "type": "sampling_session",
                    "sampling_session_id": sampler_id,
                    "cloned_sampler_id": 1,
                },
                "prev_cursor": 0,
            },
        )
        assert [c["request_id"] for c in clone["completions"]] == [clone_rid]
        assert (
            h.post(
                "retrieve_futures", {"target": {"sampling_session_id": "nope"}, "prev_cursor": 0}
            ).status
            == 404
        )


# ---------------------------------------------------------------------------- many long polls


def _req(path: str, body: Any) -> HttpRequest:
    return HttpRequest(
        "POST",
        f"/api/v1/{path}",
        {},
        {"x-api-key": KEY, "content-type": "application/json", "accept": "application/x-protobuf"},
        json.dumps(body).encode(),
    )


def test_thousand_concurrent_long_polls_are_cheap(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = TinkerApp("instant", data_dir=tmp_path, long_poll_s=30.0)
        try:
            sess = json.loads(
                (
                    await app.handle(
                        _req(
                            "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "t"}
                        )
                    )
                ).body
            )
            sampler = json.loads(
                (
                    await app.handle(
                        _req(
                            "create_sampling_session",
                            {
                                "session_id": sess["session_id"],
                                "sampling_session_seq_id": 0,
                                "base_model": BASE_MODEL,
                            },
                        )
                    )
                ).body
            )["sampling_session_id"]
            app.pause(kind="sampling")
            rids = []
            for i in range(1000):
                body = {
                    "sampling_session_id": sampler,
                    "seq_id": i,
                    "prompt": {"chunks": [{"tokens": [1, 2]}]},
                    "sampling_params": {"max_tokens": 2},
                }
                rids.append(
                    json.loads((await app.handle(_req("asample", body))).body)["request_id"]
                )
            threads_before = threading.active_count()
            polls = [
                asyncio.ensure_future(
                    app.handle(
                        _req("retrieve_future", {"request_id": r, "allow_metadata_only": False})
                    )
                )
                for r in rids
            ]
            await asyncio.sleep(0.2)
            assert not any(p.done() for p in polls)
            assert threading.active_count() <= threads_before + 1
            app.resume()
            t0 = time.monotonic()
            done = await asyncio.wait_for(asyncio.gather(*polls), 60)
            assert time.monotonic() - t0 < 30
            statuses = {r.status for r in done}
            assert statuses == {200}
            # every poll either got its payload or (paused answer before resume) a try_again
            assert (
                sum(1 for r in done if r.headers.get("content-type") == "application/x-protobuf")
                >= 900
            )
        finally:
            await app.aclose()

    asyncio.run(scenario())


def test_fwdbwd_body_helper_roundtrip() -> None:
    """The test helper builds bodies the server-side codec accepts (guards the other tests)."""
    from tinker_sync.local._wirecodec import decode_forward_backward

    req = decode_forward_backward(
        fwdbwd_body("m:train:0", 4, tokens=[[1, 2]]), "application/x-protobuf", None
    )
    assert (req.model_id, req.seq_id, req.loss_fn, len(req.datums)) == (
        "m:train:0",
        4,
        "cross_entropy",
        1,
    )
    assert req.datums[0].tokens.tolist() == [1, 2]
    assert req.datums[0].inputs["target_tokens"].tolist() == [2, 256]


def test_a_lost_request_is_accepted_never_completed_and_404_alone(h: Harness) -> None:
    """The ``lose`` fault (docs/design/local-server.md#fault-format): the submission is
    answered with a request id, the future never shows in retrieve_futures, polled alone it
    answers 404; a lost training op is never applied and later ops go on in seq order."""
    _, sampler_id = _sampler(h)
    rule = h.faults.add("asample lose after=1")
    kept = h.asample(sampler_id, 0).json["request_id"]
    lost = h.asample(sampler_id, 1).json["request_id"]
    later = h.asample(sampler_id, 2).json["request_id"]
    assert rule.hits == 1 and len({kept, lost, later}) == 3
    seen: set[str] = set()
    cursor = 0
    while {kept, later} - seen:
        batch = _futures_poll(h, sampler_id, cursor)
        seen.update(c["request_id"] for c in batch["completions"])
        cursor = batch["cursor"]
    assert _futures_poll(h, sampler_id, cursor, timeout=0.1)["completions"] == []
    assert lost not in seen
    r = h.poll(lost, allow_metadata=True)
    assert r.status == 404 and r.json == {"detail": f"future {lost} not found"}
    assert h.poll("req-never-existed").status == 410  # unknown, not lost: as before

    mid = h.new_model(h.new_session())
    h.faults.add("forward_backward lose")
    fwd = h.fwdbwd(mid, 1).json["request_id"]
    opt = h.optim(mid, 2).json["request_id"]
    assert "metrics" in h.result_json(opt)
    assert h.poll(fwd).status == 404
    assert h.app.applied(mid) == [(0, "CreateModel"), (2, "OptimStep")]
    h.faults.assert_exhausted()
