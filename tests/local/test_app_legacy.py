"""``protocol="legacy"``: a server of an older protocol revision
(docs/design/behavior.md#older-servers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from app_helpers import BASE_MODEL, Harness


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    with Harness(tmp_path, protocol="legacy", long_poll_s=0.5) as harness:
        yield harness


def test_legacy_config(h: Harness) -> None:
    config = h.ok("POST", "client/config", {"sdk_version": "0.38.0"})
    assert config["use_pyqwest_transport"] is False
    assert config["create_model_via_load_weights"] is False
    assert "sample_use_retrieve_futures" not in config  # newer flags are absent
    r = h.post("client/dynamic_config", {"sdk_version": "0.38.0"})
    assert r.status == 404 and r.json["detail"]


def test_legacy_results_are_json_without_sequence_ids_or_metrics(h: Harness) -> None:
    sid = h.new_session()
    mid = h.new_model(sid)
    r = h.fwdbwd(mid, 1)
    out = h.result(r.json["request_id"], proto=True)  # Accept: protobuf is ignored
    assert not out.is_proto
    body = out.json
    assert body["metrics"] == {} and body["loss_fn_outputs"][0]["logprobs"]["dtype"] == "float32"
    assert h.result_json(h.optim(mid, 2).json["request_id"]) == {}

    sampler = h.sampler(sid, 0, base_model=BASE_MODEL)
    reply = h.asample(sampler, 0, num_samples=2)
    assert set(reply.json) == {"request_id"}
    sample = h.result(reply.json["request_id"], proto=True)
    assert not sample.is_proto
    seqs = sample.json["sequences"]
    assert len(seqs) == 2 and all("sequence_id" not in s for s in seqs)
    assert all(s["stop_reason"] in ("stop", "length") for s in seqs)


def test_legacy_json_results_decode_with_the_sdk_codec(h: Harness) -> None:
    """tinker_sync's own client-side JSON decoders read what the legacy server writes."""
    from tinker_sync._wire._jsonresults import (
        forward_backward_output_from_json,
        sample_response_from_json,
    )

    sid = h.new_session()
    mid = h.new_model(sid)
    out = forward_backward_output_from_json(h.result(h.fwdbwd(mid, 1).json["request_id"]).json)
    assert out.metrics == {} and len(out.loss_fn_outputs) == 1
    sampler = h.sampler(sid, 0, base_model=BASE_MODEL)
    rid = h.asample(sampler, 0, num_samples=2, prompt_logprobs=True, topk_sample_logprobs=2).json[
        "request_id"
    ]
    # (ids given explicitly: legacy replies carry none; see the report about None ids)
    resp = sample_response_from_json(h.result(rid).json, ["a", "b"])
    assert len(resp.sequences) == 2 and resp.prompt_logprobs is not None
    assert resp.sequences[0].topk_logprobs is not None


def test_legacy_create_via_load_is_422_and_old_flow_works(h: Harness) -> None:
    sid = h.new_session()
    mid = h.new_model(sid)
    path = h.save(mid, 1, "ck")
    r = h.post(
        "load_weights",
        {
            "session_id": sid,
            "model_seq_id": 1,
            "path": path,
            "optimizer": True,
            "type": "load_weights",
        },
    )
    assert r.status == 422 and r.json["detail"]
    info = h.ok("POST", "weights_info", {"tinker_path": path})
    new_mid = h.new_model(sid, 1, base_model=info["base_model"], rank=info["lora_rank"])
    r = h.post(
        "load_weights",
        {"model_id": new_mid, "seq_id": 1, "path": path, "optimizer": True, "type": "load_weights"},
    )
    assert h.result_json(r.json["request_id"])["path"] == path
    assert h.app.applied(new_mid) == [(0, "CreateModel"), (1, "LoadWeights")]
