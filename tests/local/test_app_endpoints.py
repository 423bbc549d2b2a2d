"""Shapes of every endpoint the local TinkerApp serves (docs/design/protocol.md#endpoints), over
real HTTP."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zstandard
from app_helpers import BASE_MODEL, Harness, decode_fwdbwd, decode_sample, fwdbwd_body
from tinker.types.checkpoint import Checkpoint
from tinker.types.checkpoints_list_response import CheckpointsListResponse
from tinker.types.client_config_response import ClientConfigResponse
from tinker.types.get_server_capabilities_response import GetServerCapabilitiesResponse
from tinker.types.get_session_response import GetSessionResponse
from tinker.types.session_search_response import SessionSearchResponse
from tinker.types.training_run import TrainingRun
from tinker.types.training_runs_response import TrainingRunsResponse
from tinker.types.weights_info_response import WeightsInfoResponse

from tinker_sync.local._app import DEFAULT_CLIENT_CONFIG


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    with Harness(tmp_path, long_poll_s=1.0) as harness:
        yield harness


@pytest.fixture
def model(h: Harness) -> tuple[str, str]:
    sid = h.new_session()
    return sid, h.new_model(sid)


# ---------------------------------------------------------------------------- bootstrap


def test_client_config_advertises_every_flag_and_no_pyqwest(h: Harness) -> None:
    body = h.ok("POST", "client/config", {"sdk_version": "0.38.0"})
    assert body["use_pyqwest_transport"] is False
    assert set(DEFAULT_CLIENT_CONFIG) <= set(body)
    ClientConfigResponse.model_validate(body)
    h.app.set_client_config(sample_use_retrieve_futures=True, fwdbwd_max_chunk_len=7)
    body = h.ok("POST", "client/config", {"sdk_version": "0.38.0"})
    assert body["sample_use_retrieve_futures"] is True
    assert body["fwdbwd_max_chunk_len"] == 7


def test_client_config_overrides_at_construction(tmp_path: Path) -> None:
    with Harness(tmp_path, client_config={"proto_compress_fwdbwd": True}) as h:
        body = h.ok("POST", "client/config", {"sdk_version": "0.38.0"})
        assert body["proto_compress_fwdbwd"] is True
        assert body["use_pyqwest_transport"] is False


def test_dynamic_config_defaults_and_overrides(h: Harness) -> None:
    body = h.ok("POST", "client/dynamic_config", {"sdk_version": "0.38.0"})
    assert body == {
        "refresh_interval_sec": 300,
        "sample_cancel_enabled": False,
        "sample_cancel_max_batch_size": 64,
    }
    h.app.set_dynamic_config(sample_cancel_enabled=True)
    assert (
        h.ok("POST", "client/dynamic_config", {"sdk_version": "0.38.0"})["sample_cancel_enabled"]
        is True
    )


def test_auth_token_issues_a_jwt_accepted_afterwards(h: Harness) -> None:
    import base64

    jwt = h.ok("POST", "auth/token", {})["jwt"]
    payload = jwt.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert {"exp", "iat", "sub", "org_id", "email"} <= set(claims)
    assert claims["exp"] > claims["iat"]
    assert str(claims["iss"]).startswith("passport-")
    assert (
        h.post(
            "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "x"}, key=jwt
        ).status
        == 200
    )
    tampered = jwt[:-3] + ("AAA" if not jwt.endswith("AAA") else "BBB")
    r = h.post(
        "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "x"}, key=tampered
    )
    assert r.status == 401
    assert 'error="invalid_token"' in r.headers["www-authenticate"]


def test_telemetry_capabilities_health(h: Harness) -> None:
    event = {
        "event": "SESSION_START",
        "event_id": "e",
        "event_session_index": 0,
        "severity": "INFO",
        "timestamp": "t",
    }
    body = {
        "events": [event],
        "platform": "Linux",
        "sdk_version": "0.38.0",
        "session_id": "x",
        "process_uuid": "u",
    }
    assert h.ok("POST", "telemetry", body) == {"status": "accepted"}
    caps = h.ok("GET", "get_server_capabilities")
    GetServerCapabilitiesResponse.model_validate(caps)
    assert caps["supported_models"] and all(m["model_name"] for m in caps["supported_models"])
    assert h.ok("GET", "healthz") == {"status": "ok"}
    assert h.app.state()["telemetry_events"] == 1


def test_capabilities_follow_the_models_argument(tmp_path: Path) -> None:
    with Harness(tmp_path, models=["a/b", "c/d"], accept_any_model=False) as h:
        names = [
            m["model_name"] for m in h.ok("GET", "get_server_capabilities")["supported_models"]
        ]
        assert names == ["a/b", "c/d"]
        sid = h.new_session()
        assert h.submit_model(sid, 0, base_model="x/y").status == 400
        assert h.submit_model(sid, 1, base_model="a/b").status == 200


# ---------------------------------------------------------------------------- sessions


def test_session_heartbeat_finish(h: Harness) -> None:
    sid = h.new_session(project_id="p1", display_name="demo", user_metadata={"a": "b"})
    assert h.ok("POST", "session_heartbeat", {"session_id": sid, "type": "session_heartbeat"}) == {
        "type": "session_heartbeat"
    }
    assert h.post("session_heartbeat", {"session_id": "nope"}).status == 404
    h.ok("POST", f"sessions/{sid}/finish", {"reason": {"type": "success"}, "detail": None})
    r = h.post("session_heartbeat", {"session_id": sid, "type": "session_heartbeat"})
    assert r.status == 410 and r.json["detail"]
    assert (
        h.post("sessions/nope/finish", {"reason": {"type": "success"}, "detail": None}).status
        == 404
    )


def test_sessions_rest(h: Harness, model: tuple[str, str]) -> None:
    sid, mid = model
    other = h.new_session(display_name="Other run", user_metadata={"team": "x"})
    listed = h.ok("GET", "sessions", query={"limit": 20, "offset": 0, "access_scope": "owned"})
    assert listed["sessions"][:2] == [other, sid]  # newest first
    got = h.ok("GET", f"sessions/{sid}", query={"access_scope": "owned"})
    GetSessionResponse.model_validate(got)
    assert got["training_run_ids"] == [mid] and got["sampler_ids"] == []
    assert h.get("sessions/unknown").status == 404
    h.ok("PUT", f"sessions/{sid}/project", {"project_id": "proj"})
    runs = h.ok("GET", "training_runs", query={"project_id": "proj"})
    assert [r["training_run_id"] for r in runs["training_runs"]] == [mid]
    trace = h.ok("GET", f"sessions/{sid}/trace_export")
    assert trace["status"] == "ready"
    exported = h.s.get(trace["url"], timeout=10)
    assert exported.status_code == 200 and mid in exported.json()["models"]
    found = h.ok(
        "POST",
        "sessions/search",
        {"user_metadata": {"team": "x"}, "owner": {"type": "own"}, "limit": 50},
    )
    SessionSearchResponse.model_validate(found)
    assert [s["session_id"] for s in found["sessions"]] == [other]
    page = h.ok(
        "POST", "sessions/search", {"user_metadata": {}, "owner": {"type": "own"}, "limit": 1}
    )
    assert len(page["sessions"]) == 1 and page["next_cursor"]["last_session_id"] == other
    page2 = h.ok(
        "POST", "sessions/search", {"user_metadata": {}, "limit": 1, "cursor": page["next_cursor"]}
    )
    assert [s["session_id"] for s in page2["sessions"]] == [sid]


# ---------------------------------------------------------------------------- training


def test_create_model_and_get_info(h: Harness) -> None:
    sid = h.new_session()
    r = h.submit_model(sid, 0)
    assert r.status == 200 and r.json["model_id"] == f"{sid}:train:0"
    assert h.result_json(r.json["request_id"]) == {
        "model_id": f"{sid}:train:0",
        "type": "create_model",
    }
    info = h.ok("POST", "get_info", {"model_id": f"{sid}:train:0", "type": "get_info"})
    assert info["model_data"] == {
        "arch": "instant",
        "model_name": BASE_MODEL,
        "tokenizer_id": "tinker-sync/byte",
    }
    assert (
        info["lora_rank"] == 4 and info["is_lora"] is True and info["model_id"] == f"{sid}:train:0"
    )
    assert h.post("get_info", {"model_id": "nope:train:0"}).status == 404
    assert h.submit_model("no-such-session", 0).status == 404


def test_forward_backward_protobuf_and_json_results(h: Harness, model: tuple[str, str]) -> None:
    _, mid = model
    r = h.fwdbwd(mid, 1, tokens=[[1, 2, 3], [4, 5, 6, 7]])
    assert r.status == 200 and set(r.json) == {"request_id"}
    out = decode_fwdbwd(h.result(r.json["request_id"], proto=True))
    assert [td.shape for d in out.loss_fn_outputs for td in d.values()] == [[3], [4]]
    assert "loss:sum" in out.metrics and all(k.count(":") == 1 for k in out.metrics)
    js = h.result(r.json["request_id"])  # no Accept: protobuf -> the JSON form
    assert not js.is_proto
    assert len(js.json["loss_fn_outputs"]) == 2 and js.json["metrics"] == out.metrics


def test_forward_backward_zstd_and_json_bodies(h: Harness, model: tuple[str, str]) -> None:
    _, mid = model
    body = zstandard.ZstdCompressor().compress(fwdbwd_body(mid, 1))
    r = h.post(
        "forward_backward",
        raw=body,
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"},
    )
    assert r.status == 200, r.content
    assert decode_fwdbwd(h.result(r.json["request_id"], proto=True)).metrics["loss:sum"] > 0
    legacy = {
        "model_id": mid,
        "seq_id": 2,
        "forward_backward_input": {
            "data": [
                {
                    "model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
                    "loss_fn_inputs": {
                        "target_tokens": {"data": [2, 3], "dtype": "int64", "shape": [2]}
                    },
                }
            ],
            "loss_fn": "cross_entropy",
        },
        "type": "forward_backward",
    }
    r = h.post("forward_backward", legacy)
    assert r.status == 200, r.content
    assert decode_fwdbwd(h.result(r.json["request_id"], proto=True)).loss_fn_outputs[0][
        "logprobs"
    ].shape == [2]
    assert h.app.applied(mid) == [
        (0, "CreateModel"),
        (1, "ForwardBackward"),
        (2, "ForwardBackward"),
    ]


def test_forward_only_does_not_change_weights(h: Harness, model: tuple[str, str]) -> None:
    _, mid = model

    def forward(seq: int) -> list[float]:
        r = h.fwdbwd(mid, seq, forward_only=True)
        return (
            decode_fwdbwd(h.result(r.json["request_id"], proto=True))
            .loss_fn_outputs[0]["logprobs"]
            .tolist()
        )

    first = forward(1)
    assert forward(2) == first
    h.result_json(h.fwdbwd(mid, 3).json["request_id"])
    opt = h.result_json(h.optim(mid, 4, lr=0.5).json["request_id"])
    assert all(k.count(":") == 1 for k in opt["metrics"])
    assert forward(5) != first
    assert [k for _, k in h.app.applied(mid)] == [
        "CreateModel",
        "Forward",
        "Forward",
        "ForwardBackward",
        "OptimStep",
        "Forward",
    ]


def test_optim_step_other_optimizer_family_fails_as_user_error(
    h: Harness, model: tuple[str, str]
) -> None:
    _, mid = model
    r = h.post(
        "optim_step",
        {
            "model_id": mid,
            "seq_id": 1,
            "optimizer_params": {"type": "dimuon", "learning_rate": 0.1},
        },
    )
    assert r.status == 200
    failed = h.result(r.json["request_id"]).json
    assert failed["category"] == "user" and "dimuon" in failed["error"]


def test_save_load_and_checkpoint_rest(h: Harness, model: tuple[str, str]) -> None:
    sid, mid = model
    h.result_json(h.fwdbwd(mid, 1).json["request_id"])
    h.result_json(h.optim(mid, 2).json["request_id"])
    path = h.save(mid, 3, "step1", ttl_seconds=3600, user_metadata={"k": "v"})
    assert path == f"tinker://{mid}/weights/step1"
    # Same name again without overwrite -> user failure; with overwrite -> fine.
    r = h.post("save_weights", {"model_id": mid, "seq_id": 4, "path": "step1", "overwrite": False})
    assert h.result(r.json["request_id"]).json["category"] == "user"
    assert h.save(mid, 5, "step1", overwrite=True) == path

    ckpts = h.ok("GET", f"training_runs/{mid}/checkpoints")
    CheckpointsListResponse.model_validate(ckpts)
    (ck,) = ckpts["checkpoints"]
    Checkpoint.model_validate(ck)
    assert (
        ck["checkpoint_id"] == "weights/step1"
        and ck["checkpoint_type"] == "training"
        and ck["size_bytes"] > 0
    )

    # create-via-load with optimizer state
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
    assert r.status == 200 and r.json["model_id"] == f"{sid}:train:1"
    loaded = h.result_json(r.json["request_id"])
    assert loaded["model_id"] == f"{sid}:train:1" and loaded["path"] == path
    info = h.ok("POST", "get_info", {"model_id": f"{sid}:train:1"})
    assert info["lora_rank"] == 4

    # both models now compute the same logprobs
    def logprobs(model_id: str, seq: int) -> list[float]:
        rr = h.fwdbwd(model_id, seq, forward_only=True)
        return (
            decode_fwdbwd(h.result(rr.json["request_id"], proto=True))
            .loss_fn_outputs[0]["logprobs"]
            .tolist()
        )

    assert logprobs(f"{sid}:train:1", 1) == logprobs(mid, 6)

    # legacy in-place load into the first model
    r = h.post("load_weights", {"model_id": mid, "seq_id": 7, "path": path, "optimizer": False})
    assert h.result_json(r.json["request_id"])["path"] == path
    # a missing checkpoint is a 4xx at submission
    r = h.post(
        "load_weights",
        {
            "session_id": sid,
            "model_seq_id": 2,
            "path": f"tinker://{mid}/weights/nope",
            "optimizer": False,
        },
    )
    # (400, not 404: a 404/422 would make clients fall back to the legacy flow,
    # docs/design/behavior.md#older-servers)
    assert r.status == 400 and "not found" in r.json["detail"]

    info = h.ok("POST", "weights_info", {"tinker_path": path})
    WeightsInfoResponse.model_validate(info)
    assert info["base_model"] == BASE_MODEL and info["lora_rank"] == 4

    # publish / unpublish / ttl / delete
    h.ok("POST", f"training_runs/{mid}/checkpoints/weights/step1/publish")
    assert h.post(f"training_runs/{mid}/checkpoints/weights/step1/publish").status == 409
    ck = h.ok("GET", f"training_runs/{mid}/checkpoints")["checkpoints"][0]
    assert ck["public"] is True
    h.ok("DELETE", f"training_runs/{mid}/checkpoints/weights/step1/publish")
    h.ok("PUT", f"training_runs/{mid}/checkpoints/weights/step1/ttl", {"ttl_seconds": 7200})
    assert (
        h.ok("GET", f"training_runs/{mid}/checkpoints")["checkpoints"][0]["expires_at"] is not None
    )
    h.ok("PUT", f"training_runs/{mid}/checkpoints/weights/step1/ttl", {"ttl_seconds": None})
    assert h.ok("GET", f"training_runs/{mid}/checkpoints")["checkpoints"][0]["expires_at"] is None

    run = h.ok("GET", f"training_runs/{mid}", query={"access_scope": "owned"})
    TrainingRun.model_validate(run)
    assert run["last_checkpoint"]["tinker_path"] == path
    runs = h.ok("GET", "training_runs", query={"limit": 1, "offset": 0, "access_scope": "owned"})
    TrainingRunsResponse.model_validate(runs)
    assert (
        runs["cursor"] == {"offset": 0, "limit": 1, "total_count": 2}
        and len(runs["training_runs"]) == 1
    )

    h.ok("DELETE", f"training_runs/{mid}/checkpoints/weights/step1")
    assert h.call("DELETE", f"training_runs/{mid}/checkpoints/weights/step1").status == 404
    assert h.ok("GET", f"training_runs/{mid}/checkpoints")["checkpoints"] == []
    assert h.get("training_runs/nope:train:0").status == 404


def test_checkpoint_names_with_spaces_and_multi_segment_ids(
    h: Harness, model: tuple[str, str]
) -> None:
    _, mid = model
    path = h.save(mid, 1, "ck 1")
    assert path.endswith("/weights/ck 1")
    listed = h.ok("GET", "checkpoints", query={"limit": 100, "offset": 0})
    assert (
        listed["cursor"]["total_count"] == 1
        and listed["checkpoints"][0]["checkpoint_id"] == "weights/ck 1"
    )
    h.ok("DELETE", f"training_runs/{mid}/checkpoints/weights/ck%201")
    assert h.ok("GET", "checkpoints")["checkpoints"] == []


def test_user_checkpoints_newest_first(h: Harness, model: tuple[str, str]) -> None:
    _, mid = model
    for i, name in enumerate(["a", "b", "c"], start=1):
        h.save(mid, i, name)
    ids = [c["checkpoint_id"] for c in h.ok("GET", "checkpoints")["checkpoints"]]
    assert ids == ["weights/c", "weights/b", "weights/a"]
    page = h.ok("GET", "checkpoints", query={"limit": 1, "offset": 1})
    assert [c["checkpoint_id"] for c in page["checkpoints"]] == ["weights/b"]
    assert page["cursor"] == {"offset": 1, "limit": 1, "total_count": 3}


def test_save_weights_for_sampler_named_and_ephemeral(h: Harness, model: tuple[str, str]) -> None:
    sid, mid = model
    r = h.post(
        "save_weights_for_sampler", {"model_id": mid, "seq_id": 1, "path": "s1", "kind": "snapshot"}
    )
    named = h.result_json(r.json["request_id"])
    assert named["path"] == f"tinker://{mid}/sampler_weights/s1"
    r = h.post(
        "save_weights_for_sampler",
        {"model_id": mid, "seq_id": 2, "sampling_session_seq_id": 0, "kind": "snapshot"},
    )
    eph = h.result_json(r.json["request_id"])
    assert eph["sampling_session_id"] == f"{sid}:sample:0"
    got = h.ok("GET", f"samplers/{sid}:sample:0")
    assert got == {
        "sampler_id": f"{sid}:sample:0",
        "base_model": BASE_MODEL,
        "model_path": None,
        "tokenizer_id": "tinker-sync/byte",
    }
    # a sampling session on the named weights gives the same samples as the ephemeral one
    from_path = h.sampler(sid, 1, model_path=named["path"])
    assert h.ok("GET", f"samplers/{from_path}")["model_path"] == named["path"]
    outs = []
    for sampler_id in (f"{sid}:sample:0", from_path):
        rr = h.asample(sampler_id, 0, sampling_params={"max_tokens": 5, "seed": 3})
        outs.append(decode_sample(h.result(rr.json["request_id"], proto=True)).sequences[0].tokens)
    assert outs[0] == outs[1]
    assert h.get("samplers/nope").status == 404


def test_save_weights_external_signed_urls(h: Harness, model: tuple[str, str]) -> None:
    _, mid = model
    r = h.post(
        "save_weights_external",
        {"model_id": mid, "seq_id": 1, "path": "ext", "type": "save_weights_external"},
    )
    out = h.result_json(r.json["request_id"])
    assert out["path"] == f"tinker://{mid}/external_weights/ext" and out["size_bytes"] > 0
    urls = h.ok(
        "GET", f"training_runs/{mid}/checkpoints/external_weights/ext/external_weights_urls"
    )
    assert urls["urls"] and urls["expires"]
    total = 0
    for rel, url in urls["urls"].items():
        assert url.startswith(h.url)
        got = h.s.get(url, timeout=10)  # no API key needed: the link is signed
        assert got.status_code == 200, (rel, got.text)
        total += len(got.content)
    assert total == out["size_bytes"]
    bad = next(iter(urls["urls"].values())).replace("/_files/", "/_files/x")
    assert h.s.get(bad, timeout=10).status_code == 403
    assert h.get(f"training_runs/{mid}/checkpoints/weights/ext/external_weights_urls").status in (
        400,
        404,
    )


def test_save_weights_external_encrypts_to_age_recipients(
    h: Harness, model: tuple[str, str]
) -> None:
    """Each file is stored as <name>.age, encrypted to every recipient (the cookbook's
    weights.download path); the plain export's bytes come back after decryption."""
    pyrage = pytest.importorskip("pyrage")
    _, mid = model
    alice, bob = pyrage.x25519.Identity.generate(), pyrage.x25519.Identity.generate()
    plain = h.result_json(
        h.post(
            "save_weights_external",
            {"model_id": mid, "seq_id": 1, "path": "plain", "type": "save_weights_external"},
        ).json["request_id"]
    )
    enc = h.result_json(
        h.post(
            "save_weights_external",
            {
                "model_id": mid,
                "seq_id": 2,
                "path": "enc",
                "age_encryption_recipients": [str(alice.to_public()), str(bob.to_public())],
                "type": "save_weights_external",
            },
        ).json["request_id"]
    )
    assert enc["path"] == f"tinker://{mid}/external_weights/enc"

    def fetch(name: str) -> dict[str, bytes]:
        urls = h.ok(
            "GET", f"training_runs/{mid}/checkpoints/external_weights/{name}/external_weights_urls"
        )["urls"]
        return {rel: h.s.get(url, timeout=10).content for rel, url in urls.items()}

    plain_files, enc_files = fetch("plain"), fetch("enc")
    assert sorted(enc_files) == sorted(f"{rel}.age" for rel in plain_files)
    for rel, data in plain_files.items():
        assert enc_files[f"{rel}.age"] != data
        for identity in (alice, bob):
            assert pyrage.decrypt(enc_files[f"{rel}.age"], [identity]) == data
    assert enc["size_bytes"] == sum(len(v) for v in enc_files.values())
    assert plain["size_bytes"] == sum(len(v) for v in plain_files.values())


def test_save_weights_external_rejects_a_bad_recipient_before_queueing(
    h: Harness, model: tuple[str, str]
) -> None:
    pytest.importorskip("pyrage")
    _, mid = model
    r = h.post(
        "save_weights_external",
        {
            "model_id": mid,
            "seq_id": 1,
            "path": "bad",
            "age_encryption_recipients": ["age1notakey"],
            "type": "save_weights_external",
        },
    )
    assert r.status == 400
    assert "age_encryption_recipients[0]" in r.json["detail"]


def test_legacy_archive_redirect(h: Harness, model: tuple[str, str]) -> None:
    _, mid = model
    h.save(mid, 1, "arch")
    r = h.get(
        f"training_runs/{mid}/checkpoints/weights/arch/archive",
        headers={"Accept": "application/json"},
    )
    assert r.status == 302 and r.headers["location"] == r.json["url"] and r.headers["expires"]
    tar = h.s.get(r.headers["location"], timeout=10)
    names = tarfile.open(fileobj=io.BytesIO(tar.content)).getnames()
    assert sorted(names) == ["full.bin", "weights.bin"]


def test_copy_weights_is_idempotent_by_key(h: Harness, model: tuple[str, str]) -> None:
    sid, mid = model
    path = h.save(mid, 1, "src")
    other = h.new_session()
    body = {"source_path": path, "session_id": other, "model_seq_id": 0}
    headers = {"X-Idempotency-Key": "abc", "X-Tinker-Weights-Access-Token": "tok"}
    first = h.ok("POST", "copy_weights", body, headers=headers)
    assert first["tinker_path"] == f"tinker://{other}:train:0/weights/src"
    assert h.ok("POST", "copy_weights", body, headers=headers) == first  # replay: same answer
    assert h.post("copy_weights", body, headers={"X-Idempotency-Key": "def"}).status == 409
    proj = h.ok("POST", "copy_weights", {"source_path": path, "destination_project_id": "p"})
    assert (
        proj["tinker_path"].endswith("/weights/src") and proj["tinker_path"] != first["tinker_path"]
    )
    assert (
        h.ok("POST", "weights_info", {"tinker_path": proj["tinker_path"]})["base_model"]
        == BASE_MODEL
    )
    assert h.post("copy_weights", {"source_path": path}).status == 400


def test_unload_model_and_custom_loss(h: Harness, model: tuple[str, str]) -> None:
    sid, mid = model
    r = h.post("unload_model", {"model_id": mid, "type": "unload_model"})
    assert h.result_json(r.json["request_id"]) == {"model_id": mid, "type": "unload_model"}
    assert h.fwdbwd(mid, 1).status == 404
    graph = {
        "format": 1,
        "nodes": [
            {
                "op": "placeholder",
                "name": "logprobs",
                "target": "logprobs",
                "args": [],
                "kwargs": {},
            }
        ],
    }
    body = {
        "session_id": sid,
        "custom_loss_seq_id": 0,
        "name": "mine",
        "inputs": [{"name": "logprobs", "rank": 1}],
        "graph": graph,
        "type": "create_custom_loss",
    }
    r1 = h.post("create_custom_loss", body)
    r2 = h.post("create_custom_loss", body)
    assert r1.json["request_id"] == r2.json["request_id"]
    assert h.result_json(r1.json["request_id"])["loss_id"] == f"{sid}:loss:0"


# ---------------------------------------------------------------------------- sampling


def test_sampling_session_join_and_asample(h: Harness) -> None:
    sid = h.new_session()
    sampler_id = h.sampler(sid, 0, base_model=BASE_MODEL)
    assert sampler_id == f"{sid}:sample:0"
    assert h.sampler(sid, 0, base_model=BASE_MODEL) == sampler_id  # idempotent per seq
    assert (
        h.ok("POST", "join_sampling_session", {"sampling_session_id": sampler_id})["client_counter"]
        == 1
    )
    assert (
        h.ok("POST", "join_sampling_session", {"sampling_session_id": sampler_id})["client_counter"]
        == 2
    )
    r = h.asample(
        sampler_id,
        0,
        num_samples=3,
        prompt_logprobs=True,
        topk_prompt_logprobs=2,
        topk_sample_logprobs=2,
        sampling_params={
            "max_tokens": 5,
            "stop": None,
            "temperature": 1.0,
            "top_k": -1,
            "top_p": 1.0,
        },
    )
    assert r.status == 200
    ids = r.json["sample_sequence_ids"]
    assert len(ids) == 3 and len(set(ids)) == 3
    out = decode_sample(h.result(r.json["request_id"], proto=True))
    assert len(out.sequences) == 3
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == 2
    assert out.topk_prompt_logprobs[1] is not None and len(out.topk_prompt_logprobs[1]) == 2
    assert all(len(s.topk_logprobs) == len(s.tokens) for s in out.sequences)
    js = h.result(r.json["request_id"]).json  # JSON fallback carries the same tokens
    assert [s["tokens"] for s in js["sequences"]] == [s.tokens for s in out.sequences]
    assert [s["sequence_id"] for s in js["sequences"]] == ids
    assert h.asample("nope:sample:0", 0).status == 404


def test_compute_logprobs_and_targets(h: Harness) -> None:
    sid = h.new_session()
    sampler_id = h.sampler(sid, 0, base_model=BASE_MODEL)
    target = {"data": [5, -1, 7, 8], "dtype": "int64", "shape": [2, 2]}
    r = h.asample(
        sampler_id,
        0,
        tokens=[1, 2, 3],
        prompt_logprobs=True,
        prompt_logprobs_last_n=1,
        target_prompt_logprobs=target,
        prompt_alt_tokens_k=2,
        sampling_params={"max_tokens": 1},
    )
    out = decode_sample(h.result(r.json["request_id"], proto=True))
    assert out.prompt_logprobs[:2] == [None, None] and out.prompt_logprobs[2] is not None
    assert out.target_prompt_logprobs.shape == [2, 2]
    assert out.target_prompt_logprobs.tolist()[0][1] == 0.0  # -1 cells answer 0.0
    assert out.prompt_alt_tokens.tokens.shape == [2, 2]


def test_asample_duplicates_return_the_original_future(h: Harness) -> None:
    sid = h.new_session()
    sampler_id = h.sampler(sid, 0, base_model=BASE_MODEL)
    a = h.asample(sampler_id, 5).json
    b = h.asample(sampler_id, 5).json
    assert a == b
    c = h.asample(sampler_id, 6).json
    assert c["request_id"] != a["request_id"]


def test_cancel_future(tmp_path: Path) -> None:
    with Harness(tmp_path, long_poll_s=0.2) as h:
        sid = h.new_session()
        sampler_id = h.sampler(sid, 0, base_model=BASE_MODEL)
        h.app.pause("paused_capacity", kind="sampling")
        rid = h.asample(sampler_id, 0).json["request_id"]
        h.ok("POST", "cancel_future", {"request_id": rid})
        h.app.resume()
        failed = h.result(rid).json
        assert failed["category"] == "user" and "cancel" in failed["error"]
        assert h.post("cancel_future", {"request_id": "unknown"}).status == 200


def test_retrieve_future_unknown_is_410(h: Harness) -> None:
    r = h.poll("req-unknown")
    assert r.status == 410 and r.json["detail"]


def test_base_model_sampler_needs_a_valid_path(h: Harness) -> None:
    sid = h.new_session()
    assert (
        h.post("create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0}).status
        == 400
    )
    r = h.post(
        "create_sampling_session",
        {"session_id": sid, "sampling_session_seq_id": 0, "model_path": "s3://x"},
    )
    assert r.status == 400
    r = h.post(
        "create_sampling_session",
        {
            "session_id": sid,
            "sampling_session_seq_id": 0,
            "model_path": "tinker://a:train:0/weights/b",
        },
    )
    assert r.status == 404


def test_state_snapshot(h: Harness, model: tuple[str, str]) -> None:
    sid, mid = model
    state = h.app.state()
    assert state["models"][mid]["last_seq"] == 0
    assert state["models"][mid]["applied"] == [[0, "CreateModel"]]
    assert state["sessions"][sid]["models"] == [mid]
    json.dumps(state)


def test_datum_arrays_reach_the_backend_dense(h: Harness, model: tuple[str, str]) -> None:
    """A CSR loss_fn_input arrives densified with the declared shape (via the proto codec)."""
    from tinker_sync._wire import tinker_public_pb2 as pb

    _, mid = model
    msg = pb.ForwardBackwardRequest(model_id=mid, seq_id=1, loss_fn="cross_entropy")
    d = msg.data.add()
    d.model_input.add().encoded_text.tokens = np.asarray([1, 2, 3], dtype="<i4").tobytes()
    d.loss_fn_inputs["target_tokens"].dense = np.asarray([2, 3, 4], dtype="<i8").tobytes()
    d.loss_fn_inputs["target_tokens"].dtype = pb.DTYPE_INT64
    d.loss_fn_inputs["target_tokens"].shape.extend([3, 1])
    w = d.loss_fn_inputs["weights"]
    w.dtype = pb.DTYPE_FLOAT32
    w.shape.extend([3, 1])
    w.sparse_csr.values = np.asarray([1.0], dtype="<f4").tobytes()
    w.sparse_csr.crow_indices = np.asarray([0, 0, 0, 1], dtype="<i8").tobytes()
    w.sparse_csr.col_indices = np.asarray([0], dtype="<i8").tobytes()
    r = h.post(
        "forward_backward",
        raw=msg.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert r.status == 200, r.content
    out = decode_fwdbwd(h.result(r.json["request_id"], proto=True))
    logprobs = out.loss_fn_outputs[0]["logprobs"].tolist()
    # cross_entropy = -sum(w * lp): only the one listed weight (row 2) is non-zero
    assert out.loss_fn_outputs[0]["logprobs"].shape == [3, 1]
    assert out.metrics["loss:sum"] == pytest.approx(-logprobs[2][0], rel=1e-5)
