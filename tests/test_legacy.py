"""Older protocol revisions, the training half (docs/design/behavior.md#older-servers), against
``LocalServer(protocol="legacy")``.

The legacy server sends JSON results only, empty metrics, and answers create-via-load with
422; the SDK must train, checkpoint and resume through the older flow, remembering the choice
per server.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import tinker_sync
from tinker_sync import service_client, types
from tinker_sync.local import LocalServer

HANG = 60.0


def batch(step: int) -> list[types.Datum]:
    out = []
    for i in range(4):
        tokens = (np.arange(9, dtype=np.int64) + step + i) % 200
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(8, np.float32)},
            )
        )
    return out


@pytest.fixture
def legacy():  # type: ignore[no-untyped-def]
    with LocalServer(protocol="legacy", long_poll_s=2.0) as server:
        yield server
    with service_client._legacy_lock:
        service_client._legacy_load_servers.clear()


def test_a_full_supervised_loop_runs_on_a_legacy_server(legacy) -> None:
    """Pipelined fwd/bwd + optim_step, checkpoints and a sampler, all on JSON
    (docs/design/behavior.md#older-servers)."""
    with tinker_sync.ServiceClient(base_url=legacy.url, api_key=legacy.api_key) as service:
        training = service.create_lora_training_client("base", rank=4)
        info = training.get_info()
        assert info.model_id == training.model_id
        pending = []
        for step in range(5):
            fwd = training.forward_backward(batch(step), "cross_entropy")
            opt = training.optim_step(types.AdamParams(learning_rate=1e-3))
            pending.append((fwd, opt))
        for fwd, opt in pending:
            out = fwd.result(HANG)
            assert len(out.loss_fn_outputs) == 4
            assert out.metrics == {}  # no metrics from this server: empty, not a crash
            assert isinstance(opt.result(HANG), types.OptimStepResponse)
        fwd_only = training.forward(batch(9), "cross_entropy").result(HANG)
        assert fwd_only.loss_fn_outputs[0]["logprobs"].to_numpy().shape == (8,)
        saved = training.save_state("step5").result(HANG)
        assert saved.path.startswith("tinker://") and "/weights/step5" in saved.path
        sampler_weights = training.save_weights_for_sampler("s5").result(HANG)
        assert "/sampler_weights/s5" in sampler_weights.path
        sampler = training.save_weights_and_get_sampling_client()
        assert isinstance(sampler, tinker_sync.SamplingClient)
    polls = legacy.requests.filter(endpoint="retrieve_future", status=200)
    assert polls
    applied = [s for s, _ in legacy.app.applied(training.model_id)]
    assert applied == list(range(len(applied)))


def test_resume_falls_back_to_the_older_flow_once_per_server(legacy, caplog) -> None:
    """Create-via-load answered 422 -> weights_info, create_model, load_weights
    (model_id + seq_id); the choice is remembered for the server and logged once at INFO.

    See docs/design/behavior.md#older-servers.
    """
    with tinker_sync.ServiceClient(base_url=legacy.url, api_key=legacy.api_key) as service:
        training = service.create_lora_training_client("base", rank=4, train_unembed=False)
        training.forward_backward(batch(0), "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-3))
        path = training.save_state("ckpt").result(HANG).path

        with caplog.at_level(logging.INFO, logger="tinker_sync.service"):
            resumed = service.create_training_client_from_state_with_optimizer(path)
            again = service.create_training_client_from_state(path)
        assert sum("older" in r.getMessage() for r in caplog.records) == 1

        for client in (resumed, again):
            assert client.model_id != training.model_id
            info = client.get_info()
            assert info.model_data.model_name == "base" or info.model_name == "base"
            assert info.lora_rank in (4, None)
            assert client.forward_backward(batch(1), "cross_entropy").result(HANG)
            assert client.optim_step(types.AdamParams()).result(HANG)

    loads = legacy.requests.filter(endpoint="load_weights")
    create_via_load = [r for r in loads if r.json and "session_id" in r.json]
    assert [r.status for r in create_via_load] == [422]  # tried once, then remembered
    older = [r for r in loads if r.json and "model_id" in r.json]
    assert [r.status for r in older] == [200, 200]
    assert [r.json["optimizer"] for r in older] == [True, False]
    assert all(r.json["seq_id"] == 1 for r in older)  # first op of each new model
    assert legacy.requests.count("weights_info") == 2
    creates = legacy.requests.filter(endpoint="create_model")
    assert len(creates) == 3
    assert creates[1].json["lora_config"]["rank"] == 4
    assert creates[1].json["lora_config"]["train_unembed"] is False


def test_current_servers_keep_create_via_load(server, service) -> None:
    """The fallback is per server; a current server keeps the one-request flow
    (docs/design/behavior.md#older-servers)."""
    training = service.create_lora_training_client("base", rank=4)
    path = training.save_state("ckpt").result(HANG).path
    resumed = service.create_training_client_from_state_with_optimizer(path)
    assert resumed.optim_step(types.AdamParams()).result(HANG)
    (load,) = server.requests.filter(endpoint="load_weights")
    assert load.status == 200 and load.json["session_id"] == service._session.session_id
    assert server.requests.count("weights_info") == 0


def test_bodies_leave_out_newer_fields_at_their_default(server, service) -> None:
    """Fields newer than protocol 0.25 are sent only when they differ from their default, or
    when the caller set them: servers whose 0.25 request models forbid unknown keys (TuFT)
    accept the bodies (docs/migration.md#older-and-independent-servers)."""
    training = service.create_lora_training_client("base", rank=4)
    training.save_weights_for_sampler("s").result(HANG)
    sampler = training.save_weights_and_get_sampling_client()
    sampler.sample(
        types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)
    ).result(HANG)
    sampler.sample(
        types.ModelInput.from_ints([1, 2]),
        1,
        types.SamplingParams(max_tokens=2),
        topk_sample_logprobs=2,
    ).result(HANG)
    adam = service.create_lora_training_client(
        "base", rank=4, optimizer=types.AdamOptimizerConfig()
    )

    first, explicit = (r.json for r in server.requests.filter(endpoint="create_model"))
    assert "optimizer_config" not in first
    assert explicit["optimizer_config"] == {"type": "adamw"}  # the caller asked for it
    for save in server.requests.filter(endpoint="save_weights_for_sampler"):
        assert "kind" not in save.json
    plain, topk = (r.json for r in server.requests.filter(endpoint="asample"))
    newer = ("topk_sample_logprobs", "prompt_alt_tokens_k", "record_stability_info")
    assert not set(newer) & set(plain)
    assert topk["topk_sample_logprobs"] == 2
    assert adam.get_info().model_id == adam.model_id


@pytest.mark.parametrize(
    ("detail", "falls_back"), [("Missing model_id", True), ("Checkpoint not found", False)]
)
def test_resume_falls_back_on_a_400_asking_for_model_id(
    server, service, detail: str, falls_back: bool
) -> None:
    """A server that loads weights only into an existing model (TuFT) answers create-via-load
    with 400 "Missing model_id": that is the older-server fallback too; any other 400 is the
    caller's error (docs/design/behavior.md#older-servers)."""
    training = service.create_lora_training_client("base", rank=4)
    path = training.save_state("ckpt").result(HANG).path
    server.faults.add({"endpoint": "load_weights", "status": 400, "body": {"detail": detail}})
    if not falls_back:
        with pytest.raises(tinker_sync.BadRequestError, match=detail):
            service.create_training_client_from_state(path)
        return
    try:
        resumed = service.create_training_client_from_state(path)
    finally:
        with service_client._legacy_lock:
            service_client._legacy_load_servers.clear()
    assert resumed.forward_backward(batch(1), "cross_entropy").result(HANG)
    loads = server.requests.filter(endpoint="load_weights")
    assert [(r.status, "model_id" in r.json) for r in loads] == [(400, False), (200, True)]
    assert server.requests.count("weights_info") == 1
