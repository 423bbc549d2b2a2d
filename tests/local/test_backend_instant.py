"""Tests of the deterministic instant backend (tinker_sync.local.backends.instant)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from tinker_sync.local.backends import get_backend
from tinker_sync.local.backends._common import checkpoint_info
from tinker_sync.local.backends.base import (
    BYTE_TOKENIZER_ID,
    EOS_TOKEN_ID,
    DatumArrays,
    LoraSpec,
    SampleOptions,
    UserError,
)
from tinker_sync.local.backends.instant import DEFAULT_MAX_TOKENS, InstantBackend

MODEL = "Qwen/Qwen3-8B"
PROMPT = np.array(list(b"Hello there, how are"), dtype=np.int64)


def batch(seed: int = 0) -> list[DatumArrays]:
    rng = np.random.default_rng(seed)
    out = []
    for n in (5, 9, 3):
        out.append(
            DatumArrays(
                tokens=rng.integers(0, 150000, n),
                inputs={
                    "target_tokens": rng.integers(0, 150000, n),
                    "weights": (rng.random(n) > 0.3).astype(np.float32),
                    "logprobs": -rng.random(n).astype(np.float32) * 3,
                    "advantages": rng.standard_normal(n).astype(np.float32),
                },
                provenance=True,  # as if built with Datum.with_provenance (stable_reinforce)
            )
        )
    return out


def test_backend_info_and_model_names() -> None:
    backend = get_backend("instant")
    assert isinstance(backend, InstantBackend) and backend.name == "instant"
    info = backend.model_info(MODEL)
    assert info.model_name == MODEL and info.tokenizer_id == BYTE_TOKENIZER_ID
    strict = InstantBackend(accept_any_model=False)
    for name in ("tinker-sync/tiny", "tinker-sync/instant"):
        strict.model_info(name)
    with pytest.raises(UserError, match="unknown base model"):
        strict.new_model(MODEL, LoraSpec(rank=8), seed=0)
    with pytest.raises(UserError):
        strict.sampler(MODEL, None)
    names = [m.model_name for m in strict.supported_models()]
    assert names == ["tinker-sync/tiny", "tinker-sync/instant"]
    with pytest.raises(UserError, match="rank"):
        backend.new_model(MODEL, LoraSpec(rank=0), seed=0)


@pytest.mark.parametrize(
    "loss_fn",
    ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"],
)
def test_forward_is_deterministic_for_every_loss(loss_fn: str) -> None:
    a = InstantBackend(seed=1).new_model(MODEL, LoraSpec(rank=8), seed=0)
    b = InstantBackend(seed=1).new_model(MODEL, LoraSpec(rank=8), seed=3)
    c = InstantBackend(seed=2).new_model(MODEL, LoraSpec(rank=8), seed=0)
    ra = a.forward_backward(batch(), loss_fn, {}, backward=True)
    rb = b.forward_backward(batch(), loss_fn, {}, backward=False)
    rc = c.forward_backward(batch(), loss_fn, {}, backward=False)
    assert ra.metrics == rb.metrics
    assert all(key.count(":") == 1 for key in ra.metrics) and "loss:sum" in ra.metrics
    assert math.isfinite(ra.metrics["loss:sum"])
    for x, y, z, d in zip(ra.outputs, rb.outputs, rc.outputs, batch()):
        np.testing.assert_array_equal(x["logprobs"], y["logprobs"])
        assert not np.array_equal(x["logprobs"], z["logprobs"])
        assert x["logprobs"].dtype == np.float32 and x["logprobs"].shape == d.tokens.shape
        assert np.all(x["logprobs"] < 0) and np.all(x["logprobs"] > -10)


def test_loss_sum_follows_appendix_a() -> None:
    model = InstantBackend().new_model(MODEL, LoraSpec(rank=8), seed=0)
    data = batch(4)
    ce = model.forward_backward(data, "cross_entropy", {}, backward=False)
    expected = sum(
        float(np.sum(-d.inputs["weights"].astype(np.float64) * o["logprobs"]))
        for d, o in zip(data, ce.outputs)
    )
    assert math.isclose(ce.metrics["loss:sum"], expected, rel_tol=1e-6)
    assert ce.metrics["num_tokens:sum"] == sum(np.count_nonzero(d.inputs["weights"]) for d in data)
    ppo = model.forward_backward(data, "ppo", {"clip_high_threshold": 1.5}, backward=False)
    expected = 0.0
    for d, o in zip(data, ppo.outputs):
        r = np.exp(o["logprobs"].astype(np.float64) - d.inputs["logprobs"])
        adv = d.inputs["advantages"].astype(np.float64)
        per = -np.minimum(r * adv, np.clip(r, 0.8, 1.5) * adv) * (d.inputs["weights"] != 0)
        expected += float(per.sum())
    assert math.isclose(ppo.metrics["loss:sum"], expected, rel_tol=1e-5)
    # 2-D targets give 2-D logprobs
    two_d = DatumArrays(np.arange(4), {"target_tokens": np.arange(12).reshape(4, 3)})
    out = model.forward_backward([two_d], "cross_entropy", {}, backward=False)
    assert out.outputs[0]["logprobs"].shape == (4, 3)


def test_errors_are_user_errors() -> None:
    model = InstantBackend().new_model(MODEL, LoraSpec(rank=8), seed=0)
    with pytest.raises(UserError, match="forward_backward_custom"):
        model.forward_backward(batch(), "custom", {"loss_id": "x"}, backward=True)
    with pytest.raises(UserError, match="unknown loss_fn"):
        model.forward_backward(batch(), "mse", {}, backward=True)
    data = batch()
    del data[0].inputs["advantages"]
    with pytest.raises(UserError, match="'advantages'"):
        model.forward_backward(data, "importance_sampling", {}, backward=True)
    with pytest.raises(UserError, match="target_tokens"):
        model.forward_backward([DatumArrays(np.arange(3), {})], "cross_entropy", {}, backward=True)
    with pytest.raises(UserError):
        model.optim_step({"type": "dimuon", "learning_rate": 0.1})


def test_optim_step_changes_later_forwards_deterministically() -> None:
    def run() -> tuple[list[np.ndarray], dict[str, float]]:
        model = InstantBackend().new_model(MODEL, LoraSpec(rank=8), seed=0)
        before = model.forward_backward(batch(), "cross_entropy", {}, backward=True)
        metrics = model.optim_step({"learning_rate": 1e-3})
        after = model.forward_backward(batch(), "cross_entropy", {}, backward=False)
        assert after.metrics["loss:sum"] < before.metrics["loss:sum"]
        return [o["logprobs"] for o in after.outputs], metrics

    first, metrics = run()
    second, _ = run()
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)
    assert metrics["step:max"] == 1.0 and all(k.count(":") == 1 for k in metrics)
    base = InstantBackend().new_model(MODEL, LoraSpec(rank=8), seed=0)
    untouched = base.forward_backward(batch(), "cross_entropy", {}, backward=False).outputs
    diffs = [np.max(np.abs(x - u["logprobs"])) for x, u in zip(first, untouched)]
    assert 0 < max(diffs) < 0.1


def test_state_round_trip_and_sampler_weights() -> None:
    backend = InstantBackend()
    model = backend.new_model(MODEL, LoraSpec(rank=4, train_mlp=False), seed=0)
    for _ in range(3):
        model.forward_backward(batch(), "cross_entropy", {}, backward=True)
        model.optim_step({"learning_rate": 1e-2})
    blob = model.state_bytes(include_optimizer=True)
    info = checkpoint_info(blob)
    assert info["base_model"] == MODEL and info["lora_rank"] == 4 and info["train_mlp"] is False
    twin = backend.new_model(MODEL, LoraSpec(rank=4), seed=0)
    twin.load_state_bytes(blob, include_optimizer=True)
    for m in (model, twin):
        m.forward_backward(batch(), "cross_entropy", {}, backward=True)
        m.optim_step({"learning_rate": 1e-2})
    a = model.forward_backward(batch(), "cross_entropy", {}, backward=False)
    b = twin.forward_backward(batch(), "cross_entropy", {}, backward=False)
    assert a.metrics == b.metrics
    with pytest.raises(UserError, match="no optimizer state"):
        twin.load_state_bytes(model.state_bytes(False), include_optimizer=True)
    with pytest.raises(UserError):
        twin.load_state_bytes(b"garbage", include_optimizer=False)

    opts = SampleOptions(num_samples=2, prompt_logprobs=True, seed=1)
    trained = backend.sampler(MODEL, model.sampler_weights()).sample(PROMPT, opts)
    again = backend.sampler(MODEL, model.sampler_weights()).sample(PROMPT, opts)
    base = backend.sampler(MODEL, None).sample(PROMPT, opts)
    np.testing.assert_array_equal(trained.prompt_logprobs, again.prompt_logprobs)
    assert not np.allclose(trained.prompt_logprobs[1:], base.prompt_logprobs[1:])
    assert any(
        not np.array_equal(x.tokens, y.tokens) for x, y in zip(trained.sequences, base.sequences)
    )
    files = model.export_files()
    assert json.loads(files["adapter_config.json"])["step"] == 4
    assert checkpoint_info(files["adapter_model.npz"])["lora_rank"] == 4


def test_sampler_logprobs_agree_with_training_forward() -> None:
    backend = InstantBackend(seed=5)
    model = backend.new_model(MODEL, LoraSpec(rank=8), seed=0)
    model.forward_backward(batch(), "cross_entropy", {}, backward=True)
    model.optim_step({"learning_rate": 0.05})
    res = backend.sampler(MODEL, model.sampler_weights()).sample(
        PROMPT, SampleOptions(max_tokens=10, stop_strings=[], prompt_logprobs=True)
    )
    seq = res.sequences[0]
    full = np.concatenate([PROMPT, seq.tokens.astype(np.int64)])
    fwd = model.forward_backward(
        [DatumArrays(full[:-1], {"target_tokens": full[1:]})], "cross_entropy", {}, False
    ).outputs[0]["logprobs"]
    np.testing.assert_allclose(res.prompt_logprobs[1:], fwd[: len(PROMPT) - 1], rtol=1e-6)
    np.testing.assert_allclose(seq.logprobs, fwd[len(PROMPT) - 1 :], rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# sampling options


@pytest.fixture
def sampler():
    return InstantBackend(seed=3).sampler(MODEL, None)


def text(tokens: np.ndarray) -> bytes:
    return bytes(int(t) for t in tokens if t < 256)


def test_sampling_is_deterministic_and_seeded(sampler) -> None:
    opts = SampleOptions(num_samples=4, max_tokens=20, stop_strings=[], seed=7)
    a, b = sampler.sample(PROMPT, opts), sampler.sample(PROMPT, opts)
    assert [s.tokens.tolist() for s in a.sequences] == [s.tokens.tolist() for s in b.sequences]
    assert len({s.tokens.tobytes() for s in a.sequences}) == 4
    c = sampler.sample(PROMPT, SampleOptions(num_samples=4, max_tokens=20, stop_strings=[], seed=8))
    assert [s.tokens.tolist() for s in a.sequences] != [s.tokens.tolist() for s in c.sequences]
    greedy = sampler.sample(
        PROMPT, SampleOptions(num_samples=3, max_tokens=20, temperature=0.0, stop_strings=[])
    )
    top1 = sampler.sample(
        PROMPT, SampleOptions(num_samples=3, max_tokens=20, top_k=1, seed=99, stop_strings=[])
    )
    assert len({s.tokens.tobytes() for s in greedy.sequences}) == 1
    assert greedy.sequences[0].tokens.tolist() == top1.sequences[0].tokens.tolist()


def test_stop_semantics(sampler) -> None:
    # stop None: EOS is the stop token, kept last; never elsewhere
    res = sampler.sample(PROMPT, SampleOptions(num_samples=16, max_tokens=24, seed=1))
    reasons = {s.stop_reason for s in res.sequences}
    assert reasons == {"stop", "length"}
    for s in res.sequences:
        eos = np.flatnonzero(s.tokens == EOS_TOKEN_ID).tolist()
        if s.stop_reason == "stop":
            assert eos == [len(s.tokens) - 1]
        else:
            assert eos == [] and len(s.tokens) == 24
        assert s.tokens.dtype == np.int32 and s.logprobs.shape == s.tokens.shape
    # explicit []: no stop at all
    res = sampler.sample(PROMPT, SampleOptions(num_samples=8, max_tokens=40, stop_strings=[]))
    assert all(len(s.tokens) == 40 and s.stop_reason == "length" for s in res.sequences)
    assert all(s.tokens.max() < 256 for s in res.sequences)
    # default max_tokens
    res = sampler.sample(PROMPT, SampleOptions(stop_strings=[]))
    assert len(res.sequences[0].tokens) == DEFAULT_MAX_TOKENS
    # stop strings: the output ends with one and contains none earlier
    stops = ["\n\n", "ab", "END"]
    res = sampler.sample(
        PROMPT, SampleOptions(num_samples=16, max_tokens=64, stop_strings=stops, seed=2)
    )
    assert {s.stop_reason for s in res.sequences} == {"stop"}
    for s in res.sequences:
        out = text(s.tokens)
        hits = [st for st in stops if out.endswith(st.encode())]
        assert hits, out
        assert not any(st.encode() in out[: -len(hits[0])] for st in stops)
    # stop tokens
    res = sampler.sample(
        PROMPT, SampleOptions(num_samples=16, max_tokens=64, stop_tokens=[10, 151645])
    )
    for s in res.sequences:
        assert s.stop_reason == "stop" and s.tokens[-1] in (10, 151645)
        assert 10 not in s.tokens[:-1]
    # max_tokens cuts a stop string short
    res = sampler.sample(PROMPT, SampleOptions(num_samples=16, max_tokens=3, stop_strings=["END"]))
    assert all(len(s.tokens) <= 3 for s in res.sequences)
    assert sampler.sample(PROMPT, SampleOptions(max_tokens=0)).sequences[0].tokens.size == 0


def test_logprob_shapes(sampler) -> None:
    n = len(PROMPT)
    target = np.full((n - 1, 2), -1, np.int64)
    target[:, 0] = PROMPT[1:]
    target[3, 1] = 151000
    res = sampler.sample(
        PROMPT,
        SampleOptions(
            num_samples=2, max_tokens=5, stop_strings=[], topk_sample_logprobs=3,
            prompt_logprobs=True, topk_prompt_logprobs=4, target_prompt_logprobs=target,
            prompt_alt_tokens_k=2,
        ),
    )  # fmt: skip
    for s in res.sequences:
        assert s.topk_ids.shape == s.topk_logprobs.shape == (5, 3)
        np.testing.assert_array_equal(s.topk_ids[:, 0], s.tokens)
        assert np.all(np.diff(s.topk_logprobs, axis=1) < 0)
    assert res.prompt_logprobs.shape == (n,) and np.isnan(res.prompt_logprobs[0])
    assert not np.isnan(res.prompt_logprobs[1:]).any()
    assert res.topk_prompt_ids.shape == (n, 4)
    assert res.topk_prompt_ids[0].tolist() == [0] * 4
    assert res.topk_prompt_logprobs[0].tolist() == [-99999.0] * 4
    np.testing.assert_array_equal(res.topk_prompt_ids[1:, 0], PROMPT[1:])
    tp = res.target_prompt_logprobs
    assert tp.shape == (n - 1, 2) and tp.dtype == np.float32
    np.testing.assert_allclose(tp[:, 0], res.prompt_logprobs[1:])
    assert tp[3, 1] < 0 and np.all(np.delete(tp[:, 1], 3) == 0.0)
    assert res.prompt_alt_tokens.shape == res.prompt_alt_logprobs.shape == (n - 1, 2)

    last = sampler.sample(
        PROMPT,
        SampleOptions(prompt_logprobs=True, prompt_logprobs_last_n=4, topk_prompt_logprobs=2),
    )
    assert np.isnan(last.prompt_logprobs[: n - 4]).all()
    np.testing.assert_allclose(last.prompt_logprobs[n - 4 :], res.prompt_logprobs[n - 4 :])
    assert (last.topk_prompt_logprobs[: n - 4] == -99999.0).all()
    assert (last.topk_prompt_logprobs[n - 4 :] > -99999.0).all()


@pytest.mark.parametrize(
    "opts",
    [
        SampleOptions(prompt_logprobs_last_n=1),
        SampleOptions(prompt_logprobs=True, prompt_logprobs_last_n=0),
        SampleOptions(prompt_logprobs=True, prompt_logprobs_last_n=len(PROMPT)),
        SampleOptions(num_samples=0),
        SampleOptions(top_p=1.5),
        SampleOptions(top_k=-5),
        SampleOptions(target_prompt_logprobs=np.zeros((2, 2), np.int64)),
        SampleOptions(target_prompt_logprobs=np.full((len(PROMPT) - 1, 1), -2, np.int64)),
        SampleOptions(topk_sample_logprobs=-1),
    ],
)
def test_invalid_options_are_user_errors(sampler, opts: SampleOptions) -> None:
    with pytest.raises(UserError):
        sampler.sample(PROMPT, opts)


def test_instant_is_fast() -> None:
    model = InstantBackend().new_model(MODEL, LoraSpec(rank=8), seed=0)
    sampler = InstantBackend().sampler(MODEL, None)
    data = batch()
    cpu = time.process_time()
    for _ in range(50):
        model.forward_backward(data, "cross_entropy", {}, backward=True)
        model.optim_step({})
        sampler.sample(PROMPT, SampleOptions(num_samples=2, max_tokens=16))
    per_op = (time.process_time() - cpu) / 150
    assert per_op < 0.01
