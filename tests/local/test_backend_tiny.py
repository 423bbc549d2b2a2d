"""Tests of the tiny numpy transformer backend (tinker_sync.local.backends.tiny)."""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable

import numpy as np
import pytest

from tinker_sync.local.backends import get_backend
from tinker_sync.local.backends.base import (
    BOS_TOKEN_ID,
    BYTE_TOKENIZER_ID,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    DatumArrays,
    LoraSpec,
    SampleOptions,
    UserError,
)
from tinker_sync.local.backends.tiny import TinyBackend, TinyConfig, TinyModel
from tinker_sync.local.backends.tiny.model import module_names

SMALL = TinyConfig(
    d_model=16, n_layers=2, n_heads=2, d_ff=24, max_context=32, lora_alpha=16.0, dtype="float64"
)
MODEL = "tinker-sync/tiny"


# ----------------------------------------------------------------------------------------------
# helpers


def small_model(spec: LoraSpec | None = None, *, randomize_b: bool = True) -> TinyModel:
    """A float64 model on the small config; B made non-zero so every gradient is informative."""
    model = TinyBackend(config=SMALL).new_model(MODEL, spec or LoraSpec(rank=3, seed=1), seed=0)
    if randomize_b:
        rng = np.random.default_rng(7)
        for key, value in model.params.items():
            if key.endswith(".B"):
                value[...] = rng.standard_normal(value.shape) * 0.2
    return model


def rl_batch(seed: int, *, lengths: tuple[int, ...] = (7, 5, 9)) -> list[DatumArrays]:
    """Random RL data whose sampler logprobs sit near the model's (ratios in ~[0.5, 2])."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        tokens = rng.integers(0, 256, n)
        targets = rng.integers(0, 256, n)
        weights = (rng.random(n) > 0.2).astype(np.float32)
        out.append(
            DatumArrays(
                tokens=tokens,
                inputs={
                    "target_tokens": targets,
                    "weights": weights,
                    "advantages": rng.standard_normal(n).astype(np.float32),
                    "logprobs": np.zeros(n, np.float32),  # filled by with_sampler_logprobs
                },
                provenance=True,  # as if built with Datum.with_provenance (stable_reinforce)
            )
        )
    return out


def with_sampler_logprobs(model: TinyModel, data: list[DatumArrays], seed: int) -> None:
    """Set ``logprobs`` inputs to the model's own logprobs plus noise of +-0.7."""
    ce = [DatumArrays(d.tokens, {"target_tokens": d.inputs["target_tokens"]}) for d in data]
    res = model.forward_backward(ce, "cross_entropy", {}, backward=False)
    rng = np.random.default_rng(seed)
    for d, out in zip(data, res.outputs):
        lp = np.asarray(out["logprobs"], dtype=np.float64)
        d.inputs["logprobs"] = (lp + rng.uniform(-0.7, 0.7, lp.shape)).astype(np.float32)


def loss_value(model: TinyModel, data: list[DatumArrays], loss_fn: str, config: dict) -> float:
    return model.forward_backward(data, loss_fn, config, backward=False).metrics["loss:sum"]


def fd_check(
    model: TinyModel,
    objective: Callable[[], float],
    analytic: dict[str, np.ndarray],
    *,
    per_tensor: int = 2,
    eps: float = 1e-6,
) -> float:
    """Worst relative error between ``analytic`` and central differences of ``objective``."""
    rng = np.random.default_rng(3)
    worst = 0.0
    for key, value in model.params.items():
        for _ in range(per_tensor):
            idx = tuple(int(rng.integers(0, s)) for s in value.shape)
            old = value[idx]
            value[idx] = old + eps
            plus = objective()
            value[idx] = old - eps
            minus = objective()
            value[idx] = old
            numeric = (plus - minus) / (2 * eps)
            got = float(analytic[key][idx])
            err = abs(numeric - got) / max(1e-7, abs(numeric) + abs(got))
            worst = max(worst, err)
    return worst


def accumulate(model: TinyModel, data: list[DatumArrays], loss_fn: str, config: dict) -> dict:
    for g in model.grads.values():
        g.fill(0.0)
    model.forward_backward(data, loss_fn, config, backward=True)
    return {k: v.copy() for k, v in model.grads.items()}


# ----------------------------------------------------------------------------------------------
# gradient checks


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        ("importance_sampling", {}),
        ("ppo", {}),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("dro", {"beta": 0.3}),
    ],
)
def test_gradient_matches_finite_differences_rl(loss_fn: str, config: dict) -> None:
    model = small_model()
    data = rl_batch(1)
    with_sampler_logprobs(model, data, seed=2)
    grads = accumulate(model, data, loss_fn, config)
    worst = fd_check(model, lambda: loss_value(model, data, loss_fn, config), grads)
    assert worst < 1e-5


def test_gradient_matches_finite_differences_cross_entropy_2d_targets() -> None:
    model = small_model()
    rng = np.random.default_rng(4)
    data = [
        DatumArrays(
            tokens=rng.integers(0, 256, 6),
            inputs={
                "target_tokens": rng.integers(0, 259, (6, 3)),
                "weights": rng.random((6, 3)).astype(np.float32),
            },
        ),
        DatumArrays(
            tokens=rng.integers(0, 256, 4), inputs={"target_tokens": rng.integers(0, 259, (4, 3))}
        ),
    ]
    grads = accumulate(model, data, "cross_entropy", {})
    assert fd_check(model, lambda: loss_value(model, data, "cross_entropy", {}), grads) < 1e-5


def test_cispo_gradient_stops_at_the_clipped_ratio() -> None:
    """cispo's gradient equals that of sum(-sg(clip(r)) * A * lp): a weighted cross-entropy."""
    model = small_model()
    data = rl_batch(5)
    with_sampler_logprobs(model, data, seed=6)
    grads = accumulate(model, data, "cispo", {})
    ce = []
    fwd = model.forward_backward(data, "cispo", {}, backward=False)
    for d, out in zip(data, fwd.outputs):
        lp = np.asarray(out["logprobs"], np.float64)
        ratio = np.exp(lp - d.inputs["logprobs"].astype(np.float64))
        frozen = np.clip(ratio, 0.8, 1.2) * d.inputs["advantages"] * (d.inputs["weights"] != 0)
        ce.append(
            DatumArrays(
                d.tokens,
                {"target_tokens": d.inputs["target_tokens"], "weights": frozen.astype(np.float64)},
            )
        )
    assert fd_check(model, lambda: loss_value(model, ce, "cross_entropy", {}), grads) < 1e-5
    # and the stop-gradient matters: the full derivative of the cispo value differs somewhere
    assert fd_check(model, lambda: loss_value(model, data, "cispo", {}), grads) > 1e-3


@pytest.mark.parametrize(
    "flags",
    [
        {"train_attn": True, "train_mlp": False, "train_unembed": False},
        {"train_attn": False, "train_mlp": True, "train_unembed": False},
        {"train_attn": False, "train_mlp": False, "train_unembed": True},
    ],
)
def test_gradient_per_lora_placement(flags: dict) -> None:
    spec = LoraSpec(rank=2, seed=3, **flags)
    model = small_model(spec)
    modules = {k.rsplit(".", 1)[0] for k in model.params}
    assert modules == set(module_names(SMALL, spec))
    if flags["train_attn"]:
        assert {"layers.0.wq", "layers.1.wo"} <= modules and "layers.0.w_up" not in modules
    if flags["train_mlp"]:
        assert {"layers.0.w_up", "layers.1.w_down"} <= modules and "layers.0.wq" not in modules
    if flags["train_unembed"]:
        assert modules == {"unembed"}
    data = rl_batch(8, lengths=(6, 8))
    grads = accumulate(model, data, "cross_entropy", {})
    assert fd_check(model, lambda: loss_value(model, data, "cross_entropy", {}), grads) < 1e-5


def test_fresh_adapters_leave_the_base_model_unchanged() -> None:
    backend = TinyBackend(config=SMALL)
    a = backend.new_model(MODEL, LoraSpec(rank=4, seed=1), seed=0)
    b = backend.new_model(MODEL, LoraSpec(rank=2, seed=9, train_mlp=False), seed=0)
    data = rl_batch(2)
    la = a.forward_backward(data, "cross_entropy", {}, backward=False).outputs
    lb = b.forward_backward(data, "cross_entropy", {}, backward=False).outputs
    for x, y in zip(la, lb):
        np.testing.assert_allclose(x["logprobs"], y["logprobs"], rtol=0, atol=1e-12)
    # A is seeded by LoraSpec.seed
    c = backend.new_model(MODEL, LoraSpec(rank=4, seed=1), seed=5)
    d = backend.new_model(MODEL, LoraSpec(rank=4, seed=2), seed=0)
    np.testing.assert_array_equal(a.params["unembed.A"], c.params["unembed.A"])
    assert not np.array_equal(a.params["unembed.A"], d.params["unembed.A"])
    assert all(not v.any() for k, v in a.params.items() if k.endswith(".B"))


# ----------------------------------------------------------------------------------------------
# losses: values follow Appendix A, computed here from the returned logprobs


def gspo_ratio(lp: np.ndarray, inp: dict) -> float:
    """The official GSPO sequence ratio: the geometric mean of the token ratios over M."""
    seq_mask = inp.get("sequence_ratio_mask")
    w = inp.get("weights")
    if seq_mask is not None:
        in_ratio = seq_mask != 0
    else:
        in_ratio = np.ones(lp.shape, bool) if w is None else w != 0
    diff = lp.astype(np.float64) - inp["logprobs"].astype(np.float64)
    return float(np.exp(np.mean(diff[in_ratio])))


def frozen_weights(loss_fn: str, lp: np.ndarray, inp: dict) -> np.ndarray:
    """Per-token weights whose cross-entropy gradient is the stop-gradient loss's gradient."""
    lp = lp.astype(np.float64)
    adv = inp["advantages"].astype(np.float64)
    mask = (inp["weights"] != 0).astype(np.float64)
    if loss_fn == "gspo":
        s_val = gspo_ratio(lp, inp)
        keep = s_val * adv <= np.clip(s_val, 0.8, 1.2) * adv
        return s_val * adv * mask * keep
    ratio = np.exp(lp - inp["logprobs"].astype(np.float64))
    return np.minimum(ratio, 2.0) * adv * mask


@pytest.mark.parametrize("loss_fn", ["gspo", "stable_reinforce"])
@pytest.mark.parametrize("ratio_mask", [False, True])
def test_stop_gradient_losses_back_propagate_their_documented_surrogate(
    loss_fn: str, ratio_mask: bool
) -> None:
    """gspo (GSPO-token: the sequence ratio's value, each token's own gradient) and
    stable_reinforce (capped stop-gradient importance weight) back-propagate exactly a
    weighted cross-entropy with weights frozen at the forward values."""
    model = small_model()
    data = rl_batch(21)
    with_sampler_logprobs(model, data, seed=22)
    if ratio_mask:
        for i, d in enumerate(data):
            d.inputs["sequence_ratio_mask"] = (np.arange(len(d.tokens)) % (i + 2) == 0).astype(
                np.float32
            )
    grads = accumulate(model, data, loss_fn, {})
    fwd = model.forward_backward(data, loss_fn, {}, backward=False)
    ce = [
        DatumArrays(
            d.tokens,
            {
                "target_tokens": d.inputs["target_tokens"],
                "weights": frozen_weights(loss_fn, np.asarray(out["logprobs"]), d.inputs),
            },
        )
        for d, out in zip(data, fwd.outputs)
    ]
    assert fd_check(model, lambda: loss_value(model, ce, "cross_entropy", {}), grads) < 1e-4
    expected = sum(
        reference_loss(loss_fn, out["logprobs"], d.inputs, {}) for d, out in zip(data, fwd.outputs)
    )
    # the outputs are float32 and lp enters these losses linearly: float32 rounding shows
    assert math.isclose(fwd.metrics["loss:sum"], expected, rel_tol=1e-5)


def reference_loss(loss_fn: str, lp: np.ndarray, inp: dict, config: dict) -> float:
    lp = lp.astype(np.float64)
    w = inp.get("weights")
    if loss_fn == "cross_entropy":
        return float(np.sum(-(np.ones_like(lp) if w is None else w) * lp))
    mask = np.ones_like(lp) if w is None else (w != 0).astype(np.float64)
    q = inp["logprobs"].astype(np.float64)
    adv = inp["advantages"].astype(np.float64)
    r = np.exp(lp - q)
    lo = config.get("clip_low_threshold", 0.8)
    hi = config.get("clip_high_threshold", 1.2)
    if loss_fn == "importance_sampling":
        per = -r * adv
    elif loss_fn == "ppo":
        per = -np.minimum(r * adv, np.clip(r, lo, hi) * adv)
    elif loss_fn == "cispo":
        per = -np.clip(r, lo, hi) * lp * adv
    elif loss_fn == "dro":
        beta = config.get("beta", 0.05)
        per = -(lp * adv - beta / 2 * (lp - q) ** 2)
    elif loss_fn == "gspo":
        per = -np.minimum(gspo_ratio(lp, inp) * adv, np.clip(gspo_ratio(lp, inp), lo, hi) * adv)
    elif loss_fn == "stable_reinforce":
        per = -np.minimum(r, 2.0) * lp * adv
    else:
        raise AssertionError(loss_fn)
    return float(np.sum(per * mask))


@pytest.mark.parametrize(
    "loss_fn",
    ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"],
)
def test_loss_values_follow_appendix_a(loss_fn: str) -> None:
    model = small_model()
    data = rl_batch(11)
    with_sampler_logprobs(model, data, seed=12)
    config = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3, "beta": 0.2}
    res = model.forward_backward(data, loss_fn, config, backward=False)
    expected = sum(
        reference_loss(loss_fn, out["logprobs"], d.inputs, config)
        for d, out in zip(data, res.outputs)
    )
    # outputs are float32, the server's loss uses the float64 logprobs
    assert math.isclose(res.metrics["loss:sum"], expected, rel_tol=1e-6, abs_tol=1e-6)
    assert all(key.count(":") == 1 for key in res.metrics)
    for d, out in zip(data, res.outputs):
        assert out["logprobs"].dtype == np.float32
        assert out["logprobs"].shape == d.tokens.shape


def test_per_token_clip_thresholds_override_config() -> None:
    model = small_model()
    data = rl_batch(13)
    with_sampler_logprobs(model, data, seed=14)
    for d in data:
        n = d.tokens.shape[0]
        d.inputs["clip_low_threshold"] = np.full(n, 0.75, np.float32)
        d.inputs["clip_high_threshold"] = np.full(n, 1.25, np.float32)
    tensor = model.forward_backward(data, "ppo", {"clip_low_threshold": 0.1}, backward=False)
    for d in data:
        del d.inputs["clip_low_threshold"], d.inputs["clip_high_threshold"]
    config = {"clip_low_threshold": 0.75, "clip_high_threshold": 1.25}
    scalar = model.forward_backward(data, "ppo", config, backward=False)
    assert math.isclose(tensor.metrics["loss:sum"], scalar.metrics["loss:sum"], rel_tol=1e-12)


@pytest.mark.parametrize(
    ("loss_fn", "message"),
    [
        ("custom", "forward_backward_custom"),
        ("nonsense", "unknown loss_fn"),
    ],
)
def test_unsupported_losses_are_user_errors(loss_fn: str, message: str) -> None:
    model = small_model()
    data = rl_batch(1)
    with pytest.raises(UserError, match=message):
        model.forward_backward(data, loss_fn, {}, backward=True)


def test_stable_reinforce_needs_provenance_on_every_datum() -> None:
    model = small_model()
    data = rl_batch(1)
    data[1].provenance = False
    with pytest.raises(UserError, match="stable_reinforce' needs provenance"):
        model.forward_backward(data, "stable_reinforce", {}, backward=False)
    model.forward_backward(data, "importance_sampling", {}, backward=False)  # others don't


@pytest.mark.parametrize("missing", ["advantages", "logprobs", "target_tokens"])
def test_missing_inputs_name_the_key(missing: str) -> None:
    model = small_model()
    data = rl_batch(1)
    del data[1].inputs[missing]
    with pytest.raises(UserError, match=f"datum 1: .*'{missing}'"):
        model.forward_backward(data, "ppo", {}, backward=True)


def test_bad_inputs_are_user_errors() -> None:
    model = small_model()
    ok = {"target_tokens": np.arange(1, 5)}
    cases = [
        DatumArrays(np.array([1, 2, 300, 4]), ok),  # token outside the byte vocabulary
        DatumArrays(np.arange(4), {"target_tokens": np.arange(1, 4)}),  # length mismatch
        DatumArrays(np.arange(4), {"target_tokens": np.array([1, 2, 3, 259])}),  # bad target
        DatumArrays(np.arange(4), {**ok, "weights": np.ones(3, np.float32)}),  # weights shape
        DatumArrays(np.zeros(0, np.int64), {"target_tokens": np.zeros(0, np.int64)}),
        DatumArrays(
            np.zeros(SMALL.max_context + 1, np.int64), {"target_tokens": np.zeros(33, np.int64)}
        ),
    ]
    for datum in cases:
        with pytest.raises(UserError):
            model.forward_backward([datum], "cross_entropy", {}, backward=True)
    with pytest.raises(UserError, match="at least one datum"):
        model.forward_backward([], "cross_entropy", {}, backward=True)
    with pytest.raises(UserError, match="beta"):
        model.forward_backward(rl_batch(1), "dro", {"beta": "big"}, backward=True)
    with pytest.raises(UserError, match="clip_high_threshold"):
        model.forward_backward(rl_batch(1), "ppo", {"clip_high_threshold": "x"}, backward=True)
    assert all(not g.any() for g in model.grads.values())


def test_forward_only_leaves_gradients_untouched_and_backward_accumulates() -> None:
    model = small_model()
    data = rl_batch(21)
    model.forward_backward(data, "cross_entropy", {}, backward=False)
    assert all(not g.any() for g in model.grads.values())
    model.forward_backward(data[:1], "cross_entropy", {}, backward=True)
    model.forward_backward(data[1:], "cross_entropy", {}, backward=True)
    split = {k: v.copy() for k, v in model.grads.items()}
    together = accumulate(model, data, "cross_entropy", {})
    for key, value in split.items():
        np.testing.assert_allclose(value, together[key], rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# AdamW


def reference_adamw(params, grad_seq, hps):
    """Plain AdamW (torch semantics) with global-norm clipping, written out independently."""
    p = {k: v.astype(np.float64).copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    norms = []
    for t, (grads, hp) in enumerate(zip(grad_seq, hps), start=1):
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        norms.append(norm)
        coef = 1.0
        if hp["grad_clip_norm"] > 0 and norm > hp["grad_clip_norm"]:
            coef = hp["grad_clip_norm"] / norm
        for k in list(p):
            g = grads[k] * coef
            m[k] = hp["beta1"] * m[k] + (1 - hp["beta1"]) * g
            v2[k] = hp["beta2"] * v2[k] + (1 - hp["beta2"]) * g * g
            m_hat = m[k] / (1 - hp["beta1"] ** t)
            v_hat = v2[k] / (1 - hp["beta2"] ** t)
            p[k] = p[k] - hp["learning_rate"] * hp["weight_decay"] * p[k]
            p[k] = p[k] - hp["learning_rate"] * m_hat / (np.sqrt(v_hat) + hp["eps"])
    return p, norms


def test_adamw_matches_reference_formula_with_decay_and_clipping() -> None:
    model = small_model()
    start = {k: v.copy() for k, v in model.params.items()}
    rng = np.random.default_rng(0)
    hps = [
        {
            "learning_rate": 0.05,
            "beta1": 0.9,
            "beta2": 0.95,
            "eps": 1e-8,
            "weight_decay": 0.1,
            "grad_clip_norm": 0.0,
        },
        {
            "learning_rate": 0.02,
            "beta1": 0.8,
            "beta2": 0.99,
            "eps": 1e-6,
            "weight_decay": 0.0,
            "grad_clip_norm": 1.0,
        },
        {
            "learning_rate": 0.01,
            "beta1": 0.5,
            "beta2": 0.9,
            "eps": 1e-12,
            "weight_decay": 0.3,
            "grad_clip_norm": 1e6,
        },
    ]
    scales = [1.0, 50.0, 0.01]
    grad_seq = []
    for hp, scale in zip(hps, scales):
        grads = {k: rng.standard_normal(v.shape) * scale for k, v in model.params.items()}
        grad_seq.append(grads)
        for k in model.grads:
            model.grads[k][...] = grads[k]
        metrics = model.optim_step(hp)
        assert all(not g.any() for g in model.grads.values()), "optim_step clears gradients"
        assert all(key.count(":") == 1 for key in metrics)
    expected, norms = reference_adamw(start, grad_seq, hps)
    for k in expected:
        np.testing.assert_allclose(model.params[k], expected[k], rtol=1e-10, atol=1e-12)
    assert math.isclose(metrics["grad_norm:mean"], norms[-1], rel_tol=1e-9)


def test_grad_clipping_scales_the_global_norm() -> None:
    clipped, unclipped = small_model(), small_model()
    rng = np.random.default_rng(1)
    for step in range(3):
        grads = {k: rng.standard_normal(v.shape) * (10.0**step) for k, v in clipped.params.items()}
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
        for k, g in grads.items():
            clipped.grads[k][...] = g
            unclipped.grads[k][...] = g * (1.0 / norm)  # the same direction at norm 1
        hp = {"learning_rate": 0.01, "grad_clip_norm": 1.0}
        metrics = clipped.optim_step(hp)
        unclipped.optim_step({"learning_rate": 0.01})
        assert math.isclose(metrics["grad_norm:mean"], norm, rel_tol=1e-9)
        assert math.isclose(metrics["clip_factor:mean"], 1.0 / norm, rel_tol=1e-9)
    for k in clipped.params:
        np.testing.assert_allclose(clipped.params[k], unclipped.params[k], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "params",
    [
        {"type": "dimuon", "learning_rate": 0.01},
        {"learning_rate": -1.0},
        {"beta1": 1.0},
        {"eps": float("nan")},
        {"learning_rate": "fast"},
    ],
)
def test_optimizer_params_are_validated(params: dict) -> None:
    model = small_model()
    with pytest.raises(UserError):
        model.optim_step(params)


# ----------------------------------------------------------------------------------------------
# checkpoints


def test_state_round_trip_with_and_without_optimizer() -> None:
    backend = TinyBackend(config=SMALL)
    model = backend.new_model(MODEL, LoraSpec(rank=3, seed=1), seed=0)
    data = rl_batch(30)
    for _ in range(3):
        model.forward_backward(data, "cross_entropy", {}, backward=True)
        model.optim_step({"learning_rate": 0.01})
    full = model.state_bytes(include_optimizer=True)
    weights_only = model.state_bytes(include_optimizer=False)
    assert len(weights_only) < len(full)

    twin = backend.new_model(MODEL, LoraSpec(rank=3, seed=99), seed=5)
    twin.load_state_bytes(full, include_optimizer=True)
    assert twin.step == model.step == 3
    for k in model.params:
        np.testing.assert_array_equal(twin.params[k], model.params[k])
    # the next step is identical on both: moments and step count were restored
    for m in (model, twin):
        m.forward_backward(data, "cross_entropy", {}, backward=True)
        m.optim_step({"learning_rate": 0.01})
    for k in model.params:
        np.testing.assert_array_equal(twin.params[k], model.params[k])

    fresh = backend.new_model(MODEL, LoraSpec(rank=3, seed=99), seed=5)
    fresh.load_state_bytes(weights_only, include_optimizer=False)
    assert fresh.opt.t == 0 and all(not v.any() for v in fresh.opt.m.values())
    with pytest.raises(UserError, match="no optimizer state"):
        fresh.load_state_bytes(weights_only, include_optimizer=True)


def test_loading_adopts_the_checkpoint_lora_shape_and_rejects_foreign_blobs() -> None:
    backend = TinyBackend(config=SMALL)
    source = small_model(LoraSpec(rank=2, seed=1, train_mlp=False))
    target = backend.new_model(MODEL, LoraSpec(rank=5, seed=1), seed=0)
    target.load_state_bytes(source.state_bytes(False), include_optimizer=False)
    assert target.lora.rank == 2 and not target.lora.train_mlp
    assert set(target.params) == set(source.params)
    data = rl_batch(3)
    a = source.forward_backward(data, "cross_entropy", {}, backward=False).metrics["loss:sum"]
    b = target.forward_backward(data, "cross_entropy", {}, backward=False).metrics["loss:sum"]
    assert a == b
    with pytest.raises(UserError):
        target.load_state_bytes(b"not a checkpoint", include_optimizer=False)
    other = TinyBackend(config=TinyConfig(d_model=8, n_layers=1, n_heads=2, d_ff=8, max_context=16))
    with pytest.raises(UserError, match="different tiny model"):
        target.load_state_bytes(
            other.new_model(MODEL, LoraSpec(rank=2), seed=0).state_bytes(False), False
        )
    instant = get_backend("instant").new_model(MODEL, LoraSpec(rank=2), seed=0)
    with pytest.raises(UserError, match="not written by the tiny backend"):
        target.load_state_bytes(instant.state_bytes(False), False)


def test_sampler_weights_and_export_files() -> None:
    backend = TinyBackend(config=SMALL)
    model = small_model()
    snapshot = model.sampler_weights()
    prompt = np.array([72, 105, 33, 32, 65])
    opts = SampleOptions(max_tokens=6, prompt_logprobs=True, seed=3)
    trained = backend.sampler(MODEL, snapshot).sample(prompt, opts)
    base = backend.sampler(MODEL, None).sample(prompt, opts)
    assert not np.allclose(trained.prompt_logprobs[1:], base.prompt_logprobs[1:])
    # the snapshot is immutable: later training does not change a sampler built from it
    model.forward_backward(rl_batch(1), "cross_entropy", {}, backward=True)
    model.optim_step({"learning_rate": 0.1})
    again = backend.sampler(MODEL, snapshot).sample(prompt, opts)
    np.testing.assert_array_equal(again.prompt_logprobs, trained.prompt_logprobs)
    np.testing.assert_array_equal(again.sequences[0].tokens, trained.sequences[0].tokens)

    files = model.export_files()
    assert set(files) == {"adapter_model.npz", "adapter_config.json"}
    config = json.loads(files["adapter_config.json"])
    assert config["r"] == 3 and config["base_model_name_or_path"] == MODEL
    with np.load(io.BytesIO(files["adapter_model.npz"])) as z:
        a = z["base_model.model.layers.0.wq.lora_A.weight"]
        b = z["base_model.model.layers.0.wq.lora_B.weight"]
    assert a.shape == (3, SMALL.d_model) and b.shape == (SMALL.d_model, 3)


def test_backend_model_names_and_info() -> None:
    strict = get_backend("tiny", accept_any_model=False)
    assert isinstance(strict, TinyBackend)
    info = strict.model_info(MODEL)
    assert info.tokenizer_id == BYTE_TOKENIZER_ID and info.max_context_length == 512
    with pytest.raises(UserError, match="unknown base model"):
        strict.model_info("Qwen/Qwen3-8B")
    with pytest.raises(UserError):
        strict.new_model("Qwen/Qwen3-8B", LoraSpec(rank=4), seed=0)
    assert get_backend("tiny").model_info("Qwen/Qwen3-8B").model_name == "Qwen/Qwen3-8B"
    assert MODEL in [m.model_name for m in strict.supported_models()]
    with pytest.raises(UserError, match="rank"):
        strict.new_model(MODEL, LoraSpec(rank=0), seed=0)
    with pytest.raises(UserError, match="at least one"):
        strict.new_model(
            MODEL, LoraSpec(rank=4, train_attn=False, train_mlp=False, train_unembed=False), 0
        )


# ----------------------------------------------------------------------------------------------
# learning (default model)

COLORS = [
    ("sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"),
    ("blood", "red"), ("lemon", "yellow"), ("carrot", "orange"), ("plum", "purple"),
    ("ash", "gray"), ("rose", "pink"), ("soil", "brown"), ("gold", "gold"),
]  # fmt: skip


def color_datum(thing: str, color: str) -> tuple[DatumArrays, bytes, bytes]:
    """Prompt "Q: what is the color of X? A:" -> " <color>\\n" then EOS; loss on the completion."""
    prompt = f"Q: what is the color of {thing}? A:".encode()
    completion = f" {color}\n".encode()
    full = np.array([*prompt, *completion, EOS_TOKEN_ID], dtype=np.int64)
    weights = np.zeros(len(full) - 1, np.float32)
    weights[len(prompt) - 1 :] = 1.0
    datum = DatumArrays(full[:-1], {"target_tokens": full[1:], "weights": weights})
    return datum, prompt, completion


@pytest.fixture(scope="module")
def trained() -> dict:
    """The default tiny model after 60 cross-entropy steps on the colour pairs."""
    backend = TinyBackend()
    model = backend.new_model(MODEL, LoraSpec(rank=8, seed=0), seed=0)
    pairs = [color_datum(x, c) for x, c in COLORS]
    data = [d for d, _, _ in pairs]

    def mean_loss() -> float:
        m = model.forward_backward(data, "cross_entropy", {}, backward=False).metrics
        return m["loss:sum"] / m["num_tokens:sum"]

    before = mean_loss()
    cpu = time.process_time()
    steps = 60
    for _ in range(steps):
        model.forward_backward(data, "cross_entropy", {}, backward=True)
        model.optim_step({"learning_rate": 2e-3})
    cpu_per_step = (time.process_time() - cpu) / steps
    after = mean_loss()
    return {
        "backend": backend,
        "model": model,
        "pairs": pairs,
        "before": before,
        "after": after,
        "cpu_per_step": cpu_per_step,
        "sampler": backend.sampler(MODEL, model.sampler_weights()),
    }


def test_cross_entropy_training_cuts_the_loss_and_memorises_completions(trained: dict) -> None:
    print(
        f"\ntiny CE: loss {trained['before']:.3f} -> {trained['after']:.4f} in 60 steps, "
        f"{1000 * trained['cpu_per_step']:.1f} ms CPU/step"
    )
    assert trained["after"] <= 0.3 * trained["before"]
    sampler = trained["sampler"]
    for _, prompt, completion in trained["pairs"]:
        res = sampler.sample(np.array(list(prompt)), SampleOptions(max_tokens=12, temperature=0.0))
        seq = res.sequences[0]
        assert bytes(seq.tokens[:-1].astype(np.uint8)) == completion
        assert seq.tokens[-1] == EOS_TOKEN_ID and seq.stop_reason == "stop"


def test_training_step_cost(trained: dict) -> None:
    # 12 sequences of ~40 tokens; generous bound for a loaded 2-core machine
    assert trained["cpu_per_step"] < 0.3


def test_stop_strings_tokens_and_max_tokens(trained: dict) -> None:
    sampler = trained["sampler"]
    prompt = np.array(list(b"Q: what is the color of sky? A:"))

    def greedy(**kw) -> tuple[bytes, str, np.ndarray]:
        seq = sampler.sample(prompt, SampleOptions(temperature=0.0, **kw)).sequences[0]
        return bytes(seq.tokens[seq.tokens < 256].astype(np.uint8)), seq.stop_reason, seq.tokens

    assert greedy(max_tokens=12, stop_strings=["\n"])[:2] == (b" blue\n", "stop")
    assert greedy(max_tokens=12, stop_strings=["zz", "lu"])[:2] == (b" blu", "stop")
    assert greedy(max_tokens=12, stop_tokens=[ord("u"), ord("e")])[:2] == (b" blu", "stop")
    assert greedy(max_tokens=3, stop_strings=["\n"])[:2] == (b" bl", "length")
    text, reason, tokens = greedy(max_tokens=10, stop_strings=[])
    assert reason == "length" and len(tokens) == 10 and text.startswith(b" blue\n")
    assert EOS_TOKEN_ID not in tokens  # EOS is not generated when it is not a stop
    empty = sampler.sample(prompt, SampleOptions(max_tokens=0))
    assert len(empty.sequences[0].tokens) == 0 and empty.sequences[0].stop_reason == "length"


def test_policy_gradient_raises_a_simple_reward() -> None:
    """importance_sampling with group-relative advantages: reward = fraction of 'a' bytes."""
    backend = TinyBackend()
    model = backend.new_model(MODEL, LoraSpec(rank=8, seed=0), seed=0)
    prompt = np.array(list(b"Write:"), dtype=np.int64)
    p = len(prompt)
    rewards = []
    for step in range(12):
        sampler = backend.sampler(MODEL, model.sampler_weights())
        res = sampler.sample(
            prompt, SampleOptions(num_samples=16, max_tokens=12, stop_strings=[], seed=step)
        )
        r = np.array([np.mean(s.tokens == ord("a")) for s in res.sequences])
        rewards.append(float(r.mean()))
        data = []
        for seq, adv in zip(res.sequences, r - r.mean()):
            full = np.concatenate([prompt, seq.tokens.astype(np.int64)])
            n = len(full) - 1
            lp = np.zeros(n, np.float32)
            lp[p - 1 :] = seq.logprobs
            a = np.zeros(n, np.float32)
            a[p - 1 :] = adv
            w = np.zeros(n, np.float32)
            w[p - 1 :] = 1.0
            data.append(
                DatumArrays(
                    full[:-1],
                    {"target_tokens": full[1:], "logprobs": lp, "advantages": a, "weights": w},
                )
            )
        model.forward_backward(data, "importance_sampling", {}, backward=True)
        model.optim_step({"learning_rate": 2e-3})
    print("\ntiny RL rewards:", " ".join(f"{x:.2f}" for x in rewards))
    assert rewards[0] < 0.1
    assert np.mean(rewards[-3:]) > 0.5


# ----------------------------------------------------------------------------------------------
# sampling semantics (base model)


@pytest.fixture(scope="module")
def base_sampler():
    return TinyBackend().sampler(MODEL, None)


PROMPT = np.array(list(b"The quick brown fox jumps over"), dtype=np.int64)


def test_seed_determinism_and_num_samples(base_sampler) -> None:
    opts = SampleOptions(num_samples=3, max_tokens=15, stop_strings=[], seed=42)
    a = base_sampler.sample(PROMPT, opts)
    b = base_sampler.sample(PROMPT, opts)
    assert len(a.sequences) == 3
    for x, y in zip(a.sequences, b.sequences):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_array_equal(x.logprobs, y.logprobs)
        assert x.tokens.dtype == np.int32 and x.logprobs.dtype == np.float32
        assert len(x.tokens) == 15 and x.stop_reason == "length"
    assert len({s.tokens.tobytes() for s in a.sequences}) == 3, "samples of one request differ"
    c = base_sampler.sample(
        PROMPT, SampleOptions(num_samples=3, max_tokens=15, stop_strings=[], seed=43)
    )
    assert any(not np.array_equal(x.tokens, y.tokens) for x, y in zip(a.sequences, c.sequences))


def test_special_tokens_are_never_generated(base_sampler) -> None:
    res = base_sampler.sample(
        PROMPT,
        SampleOptions(num_samples=8, max_tokens=40, temperature=3.0, stop_strings=[], seed=1),
    )
    tokens = np.concatenate([s.tokens for s in res.sequences])
    assert tokens.max() < 256 and tokens.min() >= 0
    res = base_sampler.sample(
        PROMPT, SampleOptions(num_samples=8, max_tokens=40, temperature=3.0, seed=1)
    )
    for s in res.sequences:
        assert BOS_TOKEN_ID not in s.tokens and PAD_TOKEN_ID not in s.tokens
        eos = np.flatnonzero(s.tokens == EOS_TOKEN_ID)
        if s.stop_reason == "stop":
            assert list(eos) == [len(s.tokens) - 1]
        else:
            assert len(eos) == 0 and len(s.tokens) == 40


def test_top_k_one_and_tiny_top_p_are_greedy(base_sampler) -> None:
    greedy = base_sampler.sample(
        PROMPT, SampleOptions(max_tokens=12, temperature=0.0, stop_strings=[])
    )
    k1 = base_sampler.sample(PROMPT, SampleOptions(max_tokens=12, top_k=1, seed=5, stop_strings=[]))
    p0 = base_sampler.sample(
        PROMPT, SampleOptions(max_tokens=12, top_p=1e-6, seed=6, stop_strings=[])
    )
    np.testing.assert_array_equal(greedy.sequences[0].tokens, k1.sequences[0].tokens)
    np.testing.assert_array_equal(greedy.sequences[0].tokens, p0.sequences[0].tokens)


def test_top_k_limits_choices_and_topk_logprobs_are_sorted(base_sampler) -> None:
    res = base_sampler.sample(
        PROMPT,
        SampleOptions(
            num_samples=4,
            max_tokens=10,
            top_k=3,
            temperature=2.0,
            seed=9,
            stop_strings=[],
            topk_sample_logprobs=6,
        ),
    )
    for s in res.sequences:
        assert s.topk_ids is not None and s.topk_logprobs is not None
        assert s.topk_ids.shape == (len(s.tokens), 6)
        for tok, row in zip(s.tokens, s.topk_ids):
            # the 3 best tokens that may be generated (special ids are never generated)
            allowed = [t for t in row if t < 256][:3]
            assert tok in allowed
        assert np.all(np.diff(s.topk_logprobs, axis=1) <= 0)
        chosen = s.topk_logprobs[s.topk_ids == s.tokens[:, None]]
        np.testing.assert_allclose(chosen, s.logprobs, atol=1e-6)


def test_logprobs_agree_with_the_training_forward() -> None:
    """KV-cached decoding and the prefill score tokens as the training forward does."""
    backend = TinyBackend()
    model = backend.new_model(MODEL, LoraSpec(rank=4, seed=3), seed=0)
    rng = np.random.default_rng(0)
    for value in model.params.values():
        value[...] += rng.standard_normal(value.shape).astype(np.float32) * 0.05
    sampler = backend.sampler(MODEL, model.sampler_weights())
    res = sampler.sample(
        PROMPT, SampleOptions(max_tokens=20, stop_strings=[], seed=1, prompt_logprobs=True)
    )
    seq = res.sequences[0]
    full = np.concatenate([PROMPT, seq.tokens.astype(np.int64)])
    fwd = model.forward_backward(
        [DatumArrays(full[:-1], {"target_tokens": full[1:]})], "cross_entropy", {}, backward=False
    ).outputs[0]["logprobs"]
    np.testing.assert_allclose(res.prompt_logprobs[1:], fwd[: len(PROMPT) - 1], atol=2e-4)
    np.testing.assert_allclose(seq.logprobs, fwd[len(PROMPT) - 1 :], atol=2e-4)
    assert np.isnan(res.prompt_logprobs[0])


def test_prompt_scores_last_n_targets_and_alt_tokens(base_sampler) -> None:
    n = len(PROMPT)
    target = np.full((n - 1, 3), -1, dtype=np.int64)
    target[:, 0] = PROMPT[1:]
    target[::2, 2] = 65
    res = base_sampler.sample(
        PROMPT,
        SampleOptions(
            max_tokens=1, prompt_logprobs=True, topk_prompt_logprobs=4,
            target_prompt_logprobs=target, prompt_alt_tokens_k=5, seed=0,
        ),
    )  # fmt: skip
    full = res.prompt_logprobs
    assert full.shape == (n,) and np.isnan(full[0]) and not np.isnan(full[1:]).any()
    assert res.target_prompt_logprobs.shape == (n - 1, 3)
    np.testing.assert_allclose(res.target_prompt_logprobs[:, 0], full[1:], atol=1e-6)
    assert np.all(res.target_prompt_logprobs[:, 1] == 0.0)
    assert np.all(res.target_prompt_logprobs[1::2, 2] == 0.0)
    assert np.all(res.target_prompt_logprobs[::2, 2] < 0.0)
    ids, vals = res.topk_prompt_ids, res.topk_prompt_logprobs
    assert ids.shape == vals.shape == (n, 4)
    assert ids[0].tolist() == [0] * 4 and vals[0].tolist() == [-99999.0] * 4
    assert np.all(vals[1:, 0] >= full[1:] - 1e-6)  # the best logprob is at least the actual one
    assert res.prompt_alt_tokens.shape == res.prompt_alt_logprobs.shape == (n - 1, 5)
    assert res.prompt_alt_tokens.dtype == np.int64 and res.prompt_alt_logprobs.dtype == np.float32
    assert res.prompt_alt_tokens.min() >= 0 and res.prompt_alt_tokens.max() < 259

    last = base_sampler.sample(
        PROMPT,
        SampleOptions(
            max_tokens=1, prompt_logprobs=True, prompt_logprobs_last_n=3, topk_prompt_logprobs=2
        ),
    )
    assert np.isnan(last.prompt_logprobs[: n - 3]).all()
    np.testing.assert_allclose(last.prompt_logprobs[n - 3 :], full[n - 3 :], atol=1e-6)
    assert (last.topk_prompt_logprobs[: n - 3] == -99999.0).all()
    assert (last.topk_prompt_logprobs[n - 3 :] > -99999.0).all()

    greedy_alt = base_sampler.sample(
        PROMPT,
        SampleOptions(max_tokens=1, temperature=0.0, prompt_alt_tokens_k=2, topk_prompt_logprobs=1),
    )
    np.testing.assert_array_equal(
        greedy_alt.prompt_alt_tokens[:, 0], greedy_alt.topk_prompt_ids[1:, 0]
    )


@pytest.mark.parametrize(
    "opts",
    [
        SampleOptions(prompt_logprobs_last_n=2),  # requires prompt_logprobs
        SampleOptions(prompt_logprobs=True, prompt_logprobs_last_n=len(PROMPT)),
        SampleOptions(temperature=-1.0),
        SampleOptions(top_p=0.0),
        SampleOptions(num_samples=0),
        SampleOptions(max_tokens=-1),
        SampleOptions(target_prompt_logprobs=np.zeros((3, 2), np.int64)),
        SampleOptions(target_prompt_logprobs=np.full((len(PROMPT) - 1, 1), 300, np.int64)),
    ],
)
def test_invalid_sampling_options_are_user_errors(base_sampler, opts: SampleOptions) -> None:
    with pytest.raises(UserError):
        base_sampler.sample(PROMPT, opts)


def test_bad_prompts_are_user_errors(base_sampler) -> None:
    for prompt in (np.array([], np.int64), np.array([1, 2, 999]), np.zeros(513, np.int64)):
        with pytest.raises(UserError):
            base_sampler.sample(prompt, SampleOptions(max_tokens=1))


def test_sampling_speed(base_sampler) -> None:
    prompt = np.arange(64, dtype=np.int64) % 200
    base_sampler.sample(prompt, SampleOptions(max_tokens=2))
    cpu = time.process_time()
    res = base_sampler.sample(prompt, SampleOptions(max_tokens=40, stop_strings=[], seed=0))
    elapsed = time.process_time() - cpu
    print(f"\ntiny sampling: 40 tokens after a 64-token prompt in {1000 * elapsed:.1f} ms CPU")
    assert len(res.sequences[0].tokens) == 40
    assert elapsed < 1.0


def test_micro_batching_and_padding_do_not_change_results(monkeypatch) -> None:
    import tinker_sync.local.backends.tiny.backend as tiny_backend

    model = small_model()
    data = rl_batch(40, lengths=(3, 30, 11, 7, 25))
    whole = model.forward_backward(data, "cross_entropy", {}, backward=True)
    grads = {k: v.copy() for k, v in model.grads.items()}
    alone = [model.forward_backward([d], "cross_entropy", {}, backward=False) for d in data]
    for out, single in zip(whole.outputs, alone):
        np.testing.assert_allclose(out["logprobs"], single.outputs[0]["logprobs"], atol=1e-10)
    monkeypatch.setattr(tiny_backend, "_MAX_BATCH_TOKENS", 40)  # forces several micro-batches
    split = accumulate(model, data, "cross_entropy", {})
    for key, value in grads.items():
        np.testing.assert_allclose(split[key], value, rtol=1e-9, atol=1e-12)
