"""Persistence of the local server: SQLite metadata and checkpoint files across restarts."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from app_helpers import BASE_MODEL, Harness, decode_fwdbwd, decode_sample

from tinker_sync.local._store import (
    CheckpointFiles,
    CheckpointRow,
    RunRow,
    SamplerRow,
    SessionRow,
    Store,
)


def _logprobs(h: Harness, model_id: str, seq: int) -> list[float]:
    r = h.fwdbwd(model_id, seq, forward_only=True)
    assert r.status == 200, r.content
    return list(
        decode_fwdbwd(h.result(r.json["request_id"], proto=True))
        .loss_fn_outputs[0]["logprobs"]
        .tolist()
    )


def _sample_tokens(h: Harness, sampler_id: str, seq: int) -> list[int]:
    r = h.asample(sampler_id, seq, sampling_params={"max_tokens": 6, "seed": 11})
    assert r.status == 200, r.content
    return list(decode_sample(h.result(r.json["request_id"], proto=True)).sequences[0].tokens)


@pytest.mark.parametrize("backend", ["instant", "tiny"])
def test_restart_on_the_same_data_dir_resumes(tmp_path: Path, backend: str) -> None:
    base = BASE_MODEL if backend == "instant" else "tinker-sync/tiny"
    with Harness(tmp_path, backend=backend) as h1:
        sid = h1.new_session(display_name="first")
        mid = h1.new_model(sid, base_model=base)
        for step in range(3):
            h1.result(h1.fwdbwd(mid, 1 + 2 * step).json["request_id"], proto=True)
            h1.result_json(h1.optim(mid, 2 + 2 * step, lr=0.05).json["request_id"])
        weights_path = h1.save(mid, 7, "trained")
        r = h1.post("save_weights_for_sampler", {"model_id": mid, "seq_id": 8, "path": "samp"})
        sampler_path = h1.result_json(r.json["request_id"])["path"]
        r = h1.post(
            "save_weights_for_sampler", {"model_id": mid, "seq_id": 9, "sampling_session_seq_id": 0}
        )
        ephemeral = h1.result_json(r.json["request_id"])["sampling_session_id"]
        persistent_sampler = h1.sampler(sid, 1, model_path=sampler_path)
        expected_lp = _logprobs(h1, mid, 10)
        expected_tokens = _sample_tokens(h1, persistent_sampler, 0)
        jwt = h1.ok("POST", "auth/token", {})["jwt"]

    with Harness(tmp_path, backend=backend) as h2:
        runs = h2.ok("GET", "training_runs")
        assert [r["training_run_id"] for r in runs["training_runs"]] == [mid]
        assert runs["training_runs"][0]["last_checkpoint"]["tinker_path"] == weights_path
        ids = {
            c["checkpoint_id"]
            for c in h2.ok("GET", f"training_runs/{mid}/checkpoints")["checkpoints"]
        }
        assert ids == {"weights/trained", "sampler_weights/samp"}
        assert h2.ok("GET", "sessions")["sessions"] == [sid]
        assert h2.ok("POST", "session_heartbeat", {"session_id": sid}) == {
            "type": "session_heartbeat"
        }
        assert h2.ok("POST", "get_info", {"model_id": mid})["model_data"]["model_name"] == base
        gone = h2.fwdbwd(mid, 11)
        assert gone.status == 404 and "not loaded" in gone.json["detail"]
        assert (
            h2.post(
                "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "x"}, key=jwt
            ).status
            == 200
        )

        # create-via-load in the old session continues where training stopped
        r = h2.post(
            "load_weights",
            {"session_id": sid, "model_seq_id": 1, "path": weights_path, "optimizer": True},
        )
        assert r.status == 200, r.content
        h2.result_json(r.json["request_id"])
        assert _logprobs(h2, f"{sid}:train:1", 1) == expected_lp
        assert "metrics" in h2.result_json(h2.optim(f"{sid}:train:1", 2).json["request_id"])

        # the legacy flow: weights_info -> create_model -> load_weights(model_id, seq_id)
        info = h2.ok("POST", "weights_info", {"tinker_path": weights_path})
        new_sid = h2.new_session()
        new_mid = h2.new_model(new_sid, base_model=info["base_model"], rank=info["lora_rank"])
        r = h2.post(
            "load_weights",
            {"model_id": new_mid, "seq_id": 1, "path": weights_path, "optimizer": False},
        )
        h2.result_json(r.json["request_id"])
        assert _logprobs(h2, new_mid, 2) == expected_lp

        # samplers: the persisted one reloads lazily; a new one on the saved weights agrees
        assert _sample_tokens(h2, persistent_sampler, 1) == expected_tokens
        fresh = h2.sampler(new_sid, 0, model_path=sampler_path)
        assert _sample_tokens(h2, fresh, 0) == expected_tokens
        assert h2.ok("GET", f"samplers/{ephemeral}")["model_path"] is None
        lost = h2.asample(ephemeral, 0)
        assert lost.status == 404 and "earlier server process" in lost.json["detail"]


def test_expired_checkpoints_disappear(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        mid = h.new_model(h.new_session())
        path = h.save(mid, 1, "short", ttl_seconds=3600)
        row = h.app._store.get_checkpoint(mid, "weights/short")
        assert row is not None
        row.expires_at = 1.0  # long ago
        h.app._store.put_checkpoint(row)
        assert h.ok("GET", f"training_runs/{mid}/checkpoints")["checkpoints"] == []
        assert not h.app._files.exists(mid, "weights/short")
        assert h.post("weights_info", {"tinker_path": path}).status == 404


def test_temporary_data_dir_is_removed_on_close() -> None:
    with Harness(None) as h:
        data_dir = h.app.data_dir
        assert (data_dir / "tinker.sqlite3").exists()
    assert not data_dir.exists()


# ---------------------------------------------------------------------------- store unit


def test_store_roundtrip_and_wal(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite3")
    try:
        store.insert_session(
            SessionRow("s1", 1.0, tags=["a"], user_metadata={"x": 1}, project_id="p")
        )
        store.insert_run(
            RunRow("s1:train:0", "s1", 0, "m", {"rank": 4}, {"type": "adamw"}, None, 2.0, 2.0)
        )
        store.insert_sampler(SamplerRow("s1:sample:0", "s1", 0, "m", None, 3.0, ephemeral=True))
        store.put_checkpoint(
            CheckpointRow("s1:train:0", "weights/a", "training", 4.0, size_bytes=10)
        )
        store.put_checkpoint(
            CheckpointRow("s1:train:0", "weights/b", "training", 5.0, expires_at=6.0)
        )
        assert store.get_session("s1") == SessionRow(
            "s1", 1.0, ["a"], {"x": 1}, "", "p", None, {"type": "active"}
        )
        runs, total = store.list_runs(limit=10, offset=0, project_id="p")
        assert total == 1 and runs[0].lora == {"rank": 4}
        assert store.list_runs(limit=10, offset=0, project_id="q") == ([], 0)
        assert store.get_sampler("s1:sample:0") == SamplerRow(
            "s1:sample:0", "s1", 0, "m", None, 3.0, True
        )
        assert [c.checkpoint_id for c in store.checkpoints_of_run("s1:train:0")] == [
            "weights/b",
            "weights/a",
        ]
        assert [c.checkpoint_id for c in store.expired_checkpoints(6.0)] == ["weights/b"]
        assert store.delete_checkpoint("s1:train:0", "weights/b") and not store.delete_checkpoint(
            "s1:train:0", "weights/b"
        )
        assert store.setdefault_meta("k", "v1") == "v1" and store.setdefault_meta("k", "v2") == "v1"
        store.put_copy("key", "tinker://x/weights/y", 1.0)
        assert store.get_copy("key") == "tinker://x/weights/y"
    finally:
        store.close()
    store.close()  # idempotent
    with pytest.raises(RuntimeError):
        store.get_session("s1")
    mode = sqlite3.connect(tmp_path / "db.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_checkpoint_files_atomic_replace_and_escape(tmp_path: Path) -> None:
    files = CheckpointFiles(tmp_path)
    assert files.write("r:train:0", "weights/a b", {"x.bin": b"123", "sub/y.bin": b"4"}) == 4
    assert files.list_files("r:train:0", "weights/a b") == ["sub/y.bin", "x.bin"]
    assert files.write("r:train:0", "weights/a b", {"z.bin": b"9"}) == 1
    assert files.list_files("r:train:0", "weights/a b") == ["z.bin"]
    with pytest.raises(ValueError):
        files.write("r:train:0", "weights/c", {"../../evil": b"x"})
    assert not files.exists("r:train:0", "weights/c")
    with pytest.raises(FileNotFoundError):
        files.read("r:train:0", "weights/a b", "../../x")
    assert files.copy(("r:train:0", "weights/a b"), ("q:train:0", "weights/a b")) == 1
    files.delete("r:train:0", "weights/a b")
    assert not files.exists("r:train:0", "weights/a b")
    assert [p.name for p in (tmp_path / "r%3Atrain%3A0" / "weights").iterdir()] == []


def test_old_ephemeral_samplers_are_evicted(tmp_path: Path) -> None:
    with Harness(tmp_path, max_ephemeral_samplers=2) as h:
        sid = h.new_session()
        mid = h.new_model(sid)
        ids = []
        for i in range(3):
            body = {"model_id": mid, "seq_id": i + 1, "sampling_session_seq_id": i}
            ids.append(
                h.result_json(h.post("save_weights_for_sampler", body).json["request_id"])[
                    "sampling_session_id"
                ]
            )
        assert h.asample(ids[0], 0).status == 404
        for sampler_id in ids[1:]:
            assert decode_sample(
                h.result(h.asample(sampler_id, 0).json["request_id"], proto=True)
            ).sequences
