"""The OFFICIAL ``tinker`` SDK (0.38.0) as a client of ``tinker_sync.local``
(docs/design/local-server.md).

The official client's sync API runs its own event-loop thread; it talks to a real LocalServer on
127.0.0.1. These tests prove the local server speaks the protocol the official SDK expects:
protobuf fwd/bwd bodies (optionally zstd), protobuf results, long polls, the session futures
poller, JWT auth, create-via-load, and the REST surface.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _oracle import require

tinker = require("tinker")
from tinker import types as T  # noqa: E402

from tinker_sync.local.server import LocalServer  # noqa: E402

KEY = "tml-conformance"

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _base(backend: str) -> str:
    return "tinker-sync/tiny" if backend == "tiny" else "Qwen/Qwen3-8B"


def _datum(text: bytes) -> Any:
    tokens = list(text)
    return T.Datum(
        model_input=T.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "weights": np.ones(len(tokens) - 1, dtype=np.float32),
        },
    )


def _resolve(obj: Any) -> Any:
    """Creation methods return futures in 0.38 (their direct use is deprecated)."""
    result = getattr(obj, "result", None)
    return result() if callable(result) else obj


@pytest.fixture(params=["instant", "tiny"], scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    with LocalServer(request.param, api_key=KEY, long_poll_s=5.0) as srv:
        yield srv


@pytest.fixture
def service(server: LocalServer) -> Iterator[Any]:
    sc = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    yield sc
    sc.close("success").result()


def _backend(server: LocalServer) -> str:
    return str(server.state()["backend"])


def test_training_and_sampling_flow(server: LocalServer, service: Any) -> None:
    backend = _backend(server)
    tc = _resolve(service.create_lora_training_client(base_model=_base(backend), rank=4))
    info = tc.get_info()
    assert info.model_data.model_name == _base(backend)
    assert info.model_data.tokenizer_id == "tinker-sync/byte"
    data = [_datum(b"hello world"), _datum(b"tinker sync!")]

    fb = tc.forward_backward(data, "cross_entropy").result()
    assert len(fb.loss_fn_outputs) == 2
    assert [o["logprobs"].shape for o in fb.loss_fn_outputs] == [[10], [11]]
    assert "loss:sum" in fb.metrics
    opt = tc.optim_step(T.AdamParams(learning_rate=1e-2)).result()
    assert opt.metrics is None or all(":" in k for k in opt.metrics)
    fwd = tc.forward(data, "cross_entropy").result()
    assert fwd.metrics["loss:sum"] != fb.metrics["loss:sum"]  # the step changed the weights

    state = tc.save_state("ck1").result()
    assert state.path == f"tinker://{tc.model_id}/weights/ck1"
    sampler_path = tc.save_weights_for_sampler("samp1").result().path
    assert sampler_path == f"tinker://{tc.model_id}/sampler_weights/samp1"

    sc = _resolve(tc.save_weights_and_get_sampling_client())
    prompt = T.ModelInput.from_ints(list(b"hel"))
    resp = sc.sample(
        prompt,
        num_samples=3,
        sampling_params=T.SamplingParams(max_tokens=6, temperature=1.0),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=3,
    ).result()
    assert len(resp.sequences) == 3
    assert len({s.sequence_id for s in resp.sequences}) == 3
    assert all(
        1 <= len(s.tokens) <= 6 and s.stop_reason in ("stop", "length") for s in resp.sequences
    )
    assert resp.prompt_logprobs[0] is None and len(resp.prompt_logprobs) == 3
    assert len(resp.topk_prompt_logprobs[1]) == 3
    logprobs = sc.compute_logprobs(T.ModelInput.from_ints(list(b"hello"))).result()
    assert logprobs[0] is None and all(lp is not None and lp <= 0 for lp in logprobs[1:])

    # the sampled logprobs agree with the trained model's forward pass
    np.testing.assert_allclose(
        logprobs[1:],
        tc.forward([_datum(b"hello")], "cross_entropy")
        .result()
        .loss_fn_outputs[0]["logprobs"]
        .tolist(),
        rtol=1e-4,
        atol=1e-4,
    )

    tc2 = _resolve(service.create_training_client_from_state_with_optimizer(state.path))
    assert tc2.model_id != tc.model_id and tc2.get_info().lora_rank == 4
    again = tc2.forward(data, "cross_entropy").result()
    np.testing.assert_allclose(again.metrics["loss:sum"], fwd.metrics["loss:sum"], rtol=1e-5)
    tc2.forward_backward(data, "cross_entropy").result()
    tc2.optim_step(T.AdamParams(learning_rate=1e-2)).result()

    sc2 = _resolve(service.create_sampling_client(model_path=sampler_path))
    out = sc2.sample(prompt, num_samples=1, sampling_params=T.SamplingParams(max_tokens=3)).result()
    assert len(out.sequences) == 1

    base = _resolve(service.create_sampling_client(base_model=_base(backend)))
    assert (
        base.sample(prompt, num_samples=2, sampling_params=T.SamplingParams(max_tokens=2))
        .result()
        .sequences
    )

    # the server saw protobuf bodies and answered fwd/bwd and sample polls with protobuf
    fwdbwd = server.requests.filter(endpoint="forward_backward")
    assert fwdbwd and all(r.headers.get("content-type") == "application/x-protobuf" for r in fwdbwd)
    assert all(r.status == 200 for r in fwdbwd)
    applied = server.state()["models"][tc.model_id]["applied"]
    assert [k for _, k in applied][:4] == ["CreateModel", "ForwardBackward", "OptimStep", "Forward"]


def test_rest_client(server: LocalServer, service: Any) -> None:
    backend = _backend(server)
    tc = _resolve(
        service.create_lora_training_client(
            base_model=_base(backend), rank=4, user_metadata={"k": "v"}
        )
    )
    tc.forward_backward([_datum(b"abcdef")], "cross_entropy").result()
    path = tc.save_state("rest1").result().path
    spath = tc.save_weights_for_sampler("rest1s").result().path
    rc = tinker.RestClient(base_url=server.url, api_key=KEY)

    runs = rc.list_training_runs(limit=100).result()
    assert tc.model_id in [r.training_run_id for r in runs.training_runs]
    assert runs.cursor.total_count >= 1
    run = rc.get_training_run(tc.model_id).result()
    assert (
        run.base_model == _base(backend) and run.lora_rank == 4 and run.user_metadata == {"k": "v"}
    )
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == path
    assert (
        run.last_sampler_checkpoint is not None and run.last_sampler_checkpoint.tinker_path == spath
    )
    ids = [c.checkpoint_id for c in rc.list_checkpoints(tc.model_id).result().checkpoints]
    assert set(ids) == {"weights/rest1", "sampler_weights/rest1s"}

    rc.publish_checkpoint_from_tinker_path(path).result()
    assert next(
        c for c in rc.list_checkpoints(tc.model_id).result().checkpoints if c.tinker_path == path
    ).public
    rc.unpublish_checkpoint_from_tinker_path(path).result()
    rc.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    ck = next(
        c for c in rc.list_checkpoints(tc.model_id).result().checkpoints if c.tinker_path == path
    )
    assert ck.expires_at is not None and not ck.public
    info = rc.get_weights_info_by_tinker_path(path).result()
    assert info.base_model == _base(backend) and info.lora_rank == 4 and info.is_lora

    user_ckpts = rc.list_user_checkpoints().result().checkpoints
    assert {path, spath} <= {c.tinker_path for c in user_ckpts}
    rc.delete_checkpoint_from_tinker_path(spath).result()
    assert spath not in {c.tinker_path for c in rc.list_user_checkpoints().result().checkpoints}

    sessions = rc.list_sessions().result().sessions
    session_id = tc.model_id.split(":train:")[0]
    assert session_id in sessions
    assert tc.model_id in rc.get_session(session_id).result().training_run_ids
    url = rc.export_session_trace(session_id).result()
    assert url.startswith(server.url)

    sampler = _resolve(tc.save_weights_and_get_sampling_client())
    got = rc.get_sampler(sampler._sampling_session_id).result()
    assert got.base_model == _base(backend)


def test_compressed_bodies_futures_poller_and_jwt() -> None:
    config = {
        "proto_compress_fwdbwd": True,
        "sample_use_retrieve_futures": True,
        "pjwt_auth_enabled": True,
    }
    with LocalServer("instant", api_key=KEY, long_poll_s=2.0, client_config=config) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = _resolve(sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2))
            out = tc.forward_backward([_datum(b"compressed body")], "cross_entropy").result()
            assert out.metrics["loss:sum"] > 0
            sampler = _resolve(tc.save_weights_and_get_sampling_client())
            futures = [
                sampler.sample(
                    T.ModelInput.from_ints([1, 2, 3]),
                    num_samples=2,
                    sampling_params=T.SamplingParams(max_tokens=3),
                )
                for _ in range(4)
            ]
            assert all(len(f.result().sequences) == 2 for f in futures)
            who = tinker.RestClient(base_url=srv.url, api_key=KEY).whoami().result()
            assert "local" in str(who)
        finally:
            sc.close("success").result()
        fwdbwd = srv.requests.filter(endpoint="forward_backward")
        assert fwdbwd and all(r.headers.get("content-encoding") == "zstd" for r in fwdbwd)
        assert srv.requests.count("retrieve_futures") >= 1
        assert srv.requests.count("auth/token") >= 1
        # after the exchange every request carried the JWT, which the server accepted
        assert not srv.requests.filter(status=401)


def test_tiny_supervised_loop_loss_falls() -> None:
    with LocalServer("tiny", api_key=KEY, long_poll_s=5.0) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = _resolve(sc.create_lora_training_client(base_model="tinker-sync/tiny", rank=8))
            data = [_datum(b"the quick brown fox"), _datum(b"jumps over the lazy dog")]
            losses = []
            for _ in range(12):
                fb = tc.forward_backward(data, "cross_entropy")
                tc.optim_step(T.AdamParams(learning_rate=5e-3))
                losses.append(fb.result().metrics["loss:sum"])
            assert losses[-1] < 0.7 * losses[0], losses
            sampler = _resolve(tc.save_weights_and_get_sampling_client())
            text = sampler.sample(
                T.ModelInput.from_ints(list(b"the quick")),
                num_samples=1,
                sampling_params=T.SamplingParams(max_tokens=6, temperature=0.0),
            ).result()
            assert text.sequences[0].tokens
        finally:
            sc.close("success").result()


def test_close_finishes_the_session() -> None:
    with LocalServer("instant", api_key=KEY, long_poll_s=2.0) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        _resolve(sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2))
        sc.close("success").result()
        (session,) = srv.state()["sessions"].values()
        assert session["status"] == {
            "type": "client_finished",
            "reason": {"type": "success"},
            "detail": None,
        }


def test_user_errors_and_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4xx from the server surfaces as the SDK's error; its telemetry report is accepted."""
    monkeypatch.setenv("TINKER_TELEMETRY", "1")  # the suite's conftest turns it off
    with LocalServer("instant", api_key=KEY, long_poll_s=2.0, accept_any_model=False) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            with pytest.raises(tinker.BadRequestError, match="unknown base model"):
                _resolve(sc.create_lora_training_client(base_model="nope/nope", rank=2))
            # the SDK reports the user error (flushed at once or by its 10 s timer)
            srv.requests.wait_for("telemetry", count=1, timeout=30.0)
        finally:
            sc.close("errored").result()
        posts = srv.requests.filter(endpoint="telemetry")
        assert posts and all(r.status == 200 for r in posts)
        assert srv.state()["telemetry_events"] >= 2  # SESSION_START + GENERIC_EVENT user_error
