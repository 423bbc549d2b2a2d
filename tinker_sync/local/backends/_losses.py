"""Per-token loss maths of docs/design/local-server.md#loss-semantics, shared by the local backends.

Usage::

    inputs = prepare_inputs(datum, "ppo", n_tokens=len(datum.tokens), vocab_size=259)
    loss, dloss_dlp = token_loss("ppo", lp, inputs, config)

``lp`` has the shape of ``target_tokens`` (``[N]`` or ``[N, K]``); ``loss`` is the per-token loss
(summed by the caller) and ``dloss_dlp`` its derivative with respect to ``lp`` (with the
stop-gradient of ``cispo`` applied), which the tiny model back-propagates.

Thread safety: pure functions. Fork safety: no state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tinker_sync.local.backends._common import LOSS_FN_NAMES
from tinker_sync.local.backends.base import DatumArrays, UserError
from tinker_sync.types._datum import LOSS_FN_REQUIRED_INPUTS, PER_TOKEN_INPUTS

F64 = npt.NDArray[np.float64]

#: Inputs every RL-style loss needs besides ``target_tokens``.
_RL_REQUIRED = ("logprobs", "advantages")
#: Optional float inputs that must match the shape of ``target_tokens`` when present.
_OPTIONAL_FLOATS = tuple(k for k in PER_TOKEN_INPUTS if k not in _RL_REQUIRED)

DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2
DEFAULT_DRO_BETA = 0.05


@dataclass
class LossInputs:
    """One datum's loss inputs, validated; float arrays are float64 with the targets' shape.

    Thread safety: not shared between threads. Fork safety: plain data.
    """

    targets: npt.NDArray[np.int64]
    floats: dict[str, F64]

    def get(self, key: str) -> F64 | None:
        return self.floats.get(key)


def check_loss_fn(loss_fn: str, supported: tuple[str, ...]) -> None:
    """Raise :class:`UserError` unless ``loss_fn`` is in ``supported``."""
    if loss_fn == "custom" and "custom" not in supported:
        raise UserError(
            "loss_fn 'custom' is not computed by the local server: use "
            "TrainingClient.forward_backward_custom, which runs the loss on the client"
        )
    if loss_fn not in LOSS_FN_NAMES:
        raise UserError(f"unknown loss_fn {loss_fn!r}; expected one of {list(LOSS_FN_NAMES)}")
    if loss_fn not in supported:
        raise UserError(
            f"loss_fn {loss_fn!r} is not supported by this local backend; supported: "
            f"{list(supported)}"
        )


def prepare_inputs(
    datum: DatumArrays, loss_fn: str, *, n_tokens: int, vocab_size: int | None
) -> LossInputs:
    """Validate one datum's ``loss_fn_inputs`` for ``loss_fn``; raise :class:`UserError`.

    ``vocab_size`` bounds target ids (None accepts any non-negative id).
    """
    inputs = datum.inputs
    if loss_fn == "stable_reinforce" and not datum.provenance:
        raise UserError(
            "loss_fn 'stable_reinforce' needs provenance on every datum: "
            "Datum.with_provenance(...) naming sequence_ids sampled with "
            "record_stability_info=True"
        )
    for key in LOSS_FN_REQUIRED_INPUTS.get(loss_fn, ("target_tokens",)):
        if key not in inputs:
            raise UserError(f"loss_fn {loss_fn!r} requires loss_fn_inputs[{key!r}]")
    raw_targets = np.asarray(inputs["target_tokens"])
    if raw_targets.dtype.kind == "f":
        if not bool(np.all(np.isfinite(raw_targets))) or not bool(
            np.all(raw_targets == np.round(raw_targets))
        ):
            raise UserError("loss_fn_inputs['target_tokens'] must hold integer token ids")
    elif raw_targets.dtype.kind not in "iu":
        raise UserError(
            f"loss_fn_inputs['target_tokens'] must be int64, got {raw_targets.dtype.name}"
        )
    targets = raw_targets.astype(np.int64)
    if targets.ndim not in (1, 2) or targets.shape[0] != n_tokens:
        raise UserError(
            f"loss_fn_inputs['target_tokens'] must have shape [{n_tokens}] or [{n_tokens}, K] "
            f"(one row per model_input token), got {list(targets.shape)}"
        )
    if targets.size and int(targets.min()) < 0:
        raise UserError("loss_fn_inputs['target_tokens'] holds a negative token id")
    if vocab_size is not None and targets.size and int(targets.max()) >= vocab_size:
        raise UserError(
            f"loss_fn_inputs['target_tokens'] holds id {int(targets.max())}, outside the "
            f"model's vocabulary of {vocab_size} tokens"
        )
    floats: dict[str, F64] = {}
    for key in (*_RL_REQUIRED, *_OPTIONAL_FLOATS):
        if key not in inputs:
            continue
        arr = np.asarray(inputs[key])
        if arr.dtype.kind not in "fiu":
            raise UserError(f"loss_fn_inputs[{key!r}] must be float32, got {arr.dtype.name}")
        if arr.shape != targets.shape:
            raise UserError(
                f"loss_fn_inputs[{key!r}] must have the shape of target_tokens "
                f"{list(targets.shape)}, got {list(arr.shape)}"
            )
        floats[key] = arr.astype(np.float64)
    return LossInputs(targets=targets, floats=floats)


def config_float(config: Mapping[str, float | str], key: str, default: float) -> float:
    """``loss_fn_config[key]`` as a float (``default`` when absent); UserError when not numeric."""
    if key not in config:
        return default
    value = config[key]
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise UserError(f"loss_fn_config[{key!r}] must be a number, got {value!r}") from None
    if math.isnan(out):
        raise UserError(f"loss_fn_config[{key!r}] must not be NaN")
    return out


def check_config(loss_fn: str, config: Mapping[str, float | str]) -> None:
    """Raise :class:`UserError` now for a non-numeric config value ``loss_fn`` would read."""
    keys = {"dro": ("beta",), "ppo": _CLIP_KEYS, "cispo": _CLIP_KEYS, "gspo": _CLIP_KEYS}
    for key in keys.get(loss_fn, ()):
        config_float(config, key, 0.0)


_CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")


def _clip_bounds(inp: LossInputs, config: Mapping[str, float | str]) -> tuple[F64, F64]:
    shape = inp.targets.shape
    lo_in = inp.get("clip_low_threshold")
    hi_in = inp.get("clip_high_threshold")
    lo = (
        lo_in
        if lo_in is not None
        else np.full(shape, config_float(config, "clip_low_threshold", DEFAULT_CLIP_LOW))
    )
    hi = (
        hi_in
        if hi_in is not None
        else np.full(shape, config_float(config, "clip_high_threshold", DEFAULT_CLIP_HIGH))
    )
    return lo, hi


def token_mask(loss_fn: str, inp: LossInputs) -> F64:
    """Per-token weight (cross_entropy) or 0/1 mask (RL losses; 1 where weights are absent)."""
    weights = inp.get("weights")
    if loss_fn == "cross_entropy":
        return weights if weights is not None else np.ones(inp.targets.shape)
    return np.ones(inp.targets.shape) if weights is None else (weights != 0).astype(np.float64)


#: stable_reinforce: the cap on its stop-gradient importance weight (an assumption, see
#: ``token_loss``).
STABLE_REINFORCE_CAP = 2.0


def token_loss(
    loss_fn: str, lp: F64, inp: LossInputs, config: Mapping[str, float | str]
) -> tuple[F64, F64]:
    """Per-token loss and its derivative with respect to ``lp`` (Appendix A)."""
    m = token_mask(loss_fn, inp)
    if loss_fn == "cross_entropy":
        return -m * lp, -m
    q = inp.floats["logprobs"]
    adv = inp.floats["advantages"]
    if loss_fn == "dro":
        beta = config_float(config, "beta", DEFAULT_DRO_BETA)
        diff = lp - q
        loss = -(lp * adv - 0.5 * beta * diff * diff) * m
        return loss, -(adv - beta * diff) * m
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.exp(lp - q)
    if loss_fn == "importance_sampling":
        return -ratio * adv * m, -ratio * adv * m
    if loss_fn == "stable_reinforce":
        # The official documentation describes stable_reinforce only as a REINFORCE variant
        # that stays stable off-policy using information recorded at sampling time; it does not
        # publish the formula. Assumed here: REINFORCE weighted by the importance ratio against
        # the sampler's logprobs, capped and without gradient through the weight (truncated
        # importance sampling): -stopgrad(min(r, 2)) * A * lp. Provenance spans are required
        # (prepare_inputs) but not looked up: the datum's own `logprobs` input is the sampler's.
        capped = np.nan_to_num(ratio, nan=0.0, posinf=STABLE_REINFORCE_CAP)
        weight = np.minimum(capped, STABLE_REINFORCE_CAP)
        return -weight * lp * adv * m, -weight * adv * m
    lo, hi = _clip_bounds(inp, config)
    if loss_fn == "cispo":
        clipped = np.clip(ratio, lo, hi)
        return -clipped * lp * adv * m, -clipped * adv * m
    if loss_fn == "ppo":
        unclipped = ratio * adv
        clipped_obj = np.clip(ratio, lo, hi) * adv
        use_unclipped = unclipped <= clipped_obj
        loss = -np.minimum(unclipped, clipped_obj) * m
        return loss, np.where(use_unclipped, -unclipped, 0.0) * m
    if loss_fn == "gspo":
        # GSPO-token, as the official documentation defines it: the sequence ratio s is the
        # geometric mean of the token ratios over the positions sequence_ratio_mask marks
        # (assumed: every unmasked position when the input is absent); each token carries
        # s's value with the gradient of its own logprob (d s_t / d lp_t = s), then PPO-style
        # clipping per token.
        seq_mask = inp.get("sequence_ratio_mask")
        in_ratio = (seq_mask != 0) if seq_mask is not None else (m != 0)
        log_ratio = float(np.mean((lp - q)[in_ratio])) if bool(in_ratio.any()) else 0.0
        s_val = math.exp(log_ratio)
        unclipped = s_val * adv
        clipped_obj = np.clip(s_val, lo, hi) * adv
        loss = -np.minimum(unclipped, clipped_obj) * m
        grad = np.where(unclipped <= clipped_obj, -unclipped, 0.0) * m
        return loss, grad
    raise UserError(f"loss_fn {loss_fn!r} is not supported by this local backend")
