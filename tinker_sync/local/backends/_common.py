"""Helpers shared by the local backends: model names, option checks, stop rules, top-k tables.

Usage::

    check_sample_options(opts, prompt_len=len(prompt), vocab_size=BYTE_VOCAB_SIZE)
    stops = StopRule.from_options(opts)
    ids, lps = topk_table(logp_rows, k)

Thread safety: pure functions and immutable records. Fork safety: no state.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tinker_sync.local.backends.base import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    SampleOptions,
    UserError,
)
from tinker_sync.types import LOSS_FN_TYPES

#: Model names every local backend knows, whatever ``accept_any_model`` says.
TINY_MODEL = "tinker-sync/tiny"
INSTANT_MODEL = "tinker-sync/instant"
KNOWN_MODELS: tuple[str, ...] = (TINY_MODEL, INSTANT_MODEL)

#: Sentinel for top-k cells that hold nothing (official ``TopkLogprobs`` convention).
MASK_LOGPROB = -99999.0

#: Largest LoRA rank the local backends accept.
MAX_LORA_RANK = 256

#: Every ``LossFnType`` name of the protocol (docs/design/protocol.md#loss-functions).
LOSS_FN_NAMES: tuple[str, ...] = LOSS_FN_TYPES
#: The losses a server computes: every one but ``custom`` (computed by the client).
SERVER_LOSSES: tuple[str, ...] = tuple(name for name in LOSS_FN_NAMES if name != "custom")

#: ``AdamParams`` defaults (docs/design/protocol.md#sampling-params).
ADAM_DEFAULTS: dict[str, float] = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}


def check_model_name(base_model: str, accept_any_model: bool) -> None:
    """Raise :class:`UserError` when ``base_model`` is not served.

    ``accept_any_model=False`` restricts the names to :data:`KNOWN_MODELS`.
    """
    if not isinstance(base_model, str) or not base_model:
        raise UserError("base_model must be a non-empty string")
    if not accept_any_model and base_model not in KNOWN_MODELS:
        raise UserError(
            f"unknown base model {base_model!r}; this local server serves {list(KNOWN_MODELS)}"
        )


def check_lora(rank: int, train_attn: bool, train_mlp: bool, train_unembed: bool) -> None:
    """Raise :class:`UserError` for a LoRA configuration no backend can build."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_LORA_RANK:
        raise UserError(f"LoRA rank must be an integer in 1..{MAX_LORA_RANK}, got {rank!r}")
    if not (train_attn or train_mlp or train_unembed):
        raise UserError("at least one of train_attn, train_mlp, train_unembed must be true")


def parse_adam_params(params: Mapping[str, object]) -> dict[str, float]:
    """Validate ``optim_step`` parameters and fill ``AdamParams`` defaults.

    Raises :class:`UserError` for another optimizer family (e.g. ``{"type": "dimuon"}``) and for
    values out of range.
    """
    kind = params.get("type")
    if kind is not None and str(kind).lower() not in ("adam", "adamw", "adam_params"):
        raise UserError(
            f"optimizer {kind!r} is not supported by the local backends; use AdamParams (AdamW)"
        )
    out = dict(ADAM_DEFAULTS)
    for key in ADAM_DEFAULTS:
        if key in params and params[key] is not None:
            value = params[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UserError(f"adam_params.{key} must be a number, got {value!r}")
            out[key] = float(value)
    for key, value in out.items():
        if not math.isfinite(value):
            raise UserError(f"adam_params.{key} must be finite, got {value!r}")
    if out["learning_rate"] < 0:
        raise UserError(f"adam_params.learning_rate must be >= 0, got {out['learning_rate']}")
    for key in ("beta1", "beta2"):
        if not 0.0 <= out[key] < 1.0:
            raise UserError(f"adam_params.{key} must be in [0, 1), got {out[key]}")
    for key in ("eps", "weight_decay", "grad_clip_norm"):
        if out[key] < 0:
            raise UserError(f"adam_params.{key} must be >= 0, got {out[key]}")
    return out


@dataclass(frozen=True)
class CheckedSampleOptions:
    """Sampling options after validation, with defaults resolved.

    Thread safety: immutable. Fork safety: plain data.
    """

    num_samples: int
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    prompt_logprobs: bool
    #: First prompt position whose logprobs (and top-k rows) are computed (>= 1).
    first_scored: int
    topk_prompt: int
    topk_sample: int
    target: npt.NDArray[np.int64] | None
    alt_k: int


def check_sample_options(
    opts: SampleOptions,
    *,
    prompt_len: int,
    vocab_size: int | None,
    default_max_tokens: int,
) -> CheckedSampleOptions:
    """Validate ``opts`` for a prompt of ``prompt_len`` tokens; raise :class:`UserError`.

    ``vocab_size`` bounds target ids (None: any non-negative id). ``default_max_tokens`` is
    used when ``opts.max_tokens`` is None.
    """
    if prompt_len < 1:
        raise UserError("the prompt must contain at least one token")
    n = opts.num_samples
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"num_samples must be a positive integer, got {n!r}")
    max_tokens = default_max_tokens if opts.max_tokens is None else opts.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise UserError(f"max_tokens must be a non-negative integer, got {opts.max_tokens!r}")
    temperature = float(opts.temperature)
    if not math.isfinite(temperature) or temperature < 0:
        raise UserError(f"temperature must be >= 0, got {opts.temperature!r}")
    top_p = float(opts.top_p)
    if not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
        raise UserError(f"top_p must be in (0, 1], got {opts.top_p!r}")
    top_k = int(opts.top_k)
    if top_k < -1:
        raise UserError(f"top_k must be -1 (no limit) or positive, got {opts.top_k!r}")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        value = getattr(opts, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{name} must be a non-negative integer, got {value!r}")
    first_scored = 1
    last_n = opts.prompt_logprobs_last_n
    if last_n is not None:
        if not opts.prompt_logprobs:
            raise UserError("prompt_logprobs_last_n requires prompt_logprobs")
        if isinstance(last_n, bool) or not isinstance(last_n, int) or last_n < 1:
            raise UserError(f"prompt_logprobs_last_n must be >= 1, got {last_n!r}")
        if last_n > prompt_len - 1:
            raise UserError(
                f"prompt_logprobs_last_n must be between 1 and len(prompt) - 1 = "
                f"{prompt_len - 1}, got {last_n}"
            )
        first_scored = prompt_len - last_n
    target = opts.target_prompt_logprobs
    if target is not None:
        target = np.asarray(target)
        if target.dtype.kind not in "iu":
            raise UserError(f"target_prompt_logprobs must hold int64 ids, got {target.dtype}")
        target = target.astype(np.int64, copy=False)
        if target.ndim != 2 or target.shape[0] != prompt_len - 1:
            raise UserError(
                f"target_prompt_logprobs must have shape [len(prompt) - 1, K] = "
                f"[{prompt_len - 1}, K], got {list(target.shape)}"
            )
        bad = target < -1
        if vocab_size is not None:
            bad |= target >= vocab_size
        if bool(np.any(bad)):
            limit = "" if vocab_size is None else f" and < {vocab_size}"
            raise UserError(
                f"target_prompt_logprobs ids must be -1 or >= 0{limit}, got {int(target[bad][0])}"
            )
    for tok in opts.stop_tokens or []:
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or not 0 <= tok < 2**31:
            raise UserError(f"stop tokens must be token ids (0 <= id < 2**31), got {tok!r}")
    for s in opts.stop_strings or []:
        if not isinstance(s, str):
            raise UserError(f"stop strings must be strings, got {s!r}")
    return CheckedSampleOptions(
        num_samples=n,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        prompt_logprobs=bool(opts.prompt_logprobs),
        first_scored=first_scored,
        topk_prompt=opts.topk_prompt_logprobs,
        topk_sample=opts.topk_sample_logprobs,
        target=target,
        alt_k=opts.prompt_alt_tokens_k,
    )


@dataclass(frozen=True)
class StopRule:
    """When a sampled sequence stops.

    ``stop_strings is None and stop_tokens is None`` means "stop at EOS"; any explicit list
    (even empty) replaces that implicit stop, and then EOS is never generated.

    Thread safety: immutable. Fork safety: plain data.
    """

    tokens: frozenset[int]
    strings: tuple[bytes, ...]

    @classmethod
    def from_options(cls, opts: SampleOptions) -> StopRule:
        if opts.stop_strings is None and opts.stop_tokens is None:
            return cls(frozenset({EOS_TOKEN_ID}), ())
        strings = tuple(s.encode("utf-8") for s in (opts.stop_strings or []) if s)
        return cls(frozenset(int(t) for t in (opts.stop_tokens or [])), strings)

    @property
    def banned_tokens(self) -> list[int]:
        """Special ids that are never generated: BOS, PAD, and EOS unless it is a stop token."""
        banned = [BOS_TOKEN_ID, PAD_TOKEN_ID]
        if EOS_TOKEN_ID not in self.tokens:
            banned.append(EOS_TOKEN_ID)
        return banned

    def hit(self, token: int, text: bytes) -> bool:
        """True when ``token`` (already appended; ``text`` is the decoded output so far) stops."""
        if token in self.tokens:
            return True
        return any(text.endswith(s) for s in self.strings)


def topk_table(
    logp: npt.NDArray[np.floating], k: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """Top-``k`` ids and logprobs of each row of ``logp`` ``[R, V]``, best first.

    Ties go to the smaller id. Columns beyond ``V`` hold the sentinel (id 0, -99999.0).
    """
    rows, vocab = logp.shape
    ids = np.zeros((rows, k), dtype=np.int32)
    vals = np.full((rows, k), MASK_LOGPROB, dtype=np.float32)
    kk = min(k, vocab)
    if rows == 0 or kk == 0:
        return ids, vals
    order = np.argsort(-logp, axis=1, kind="stable")[:, :kk]
    ids[:, :kk] = order
    vals[:, :kk] = np.take_along_axis(logp, order, axis=1)
    return ids, vals


def sentinel_table(rows: int, k: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """A ``[rows, k]`` table of "not computed" cells."""
    return np.zeros((rows, k), dtype=np.int32), np.full((rows, k), MASK_LOGPROB, np.float32)


def npz_bytes(arrays: Mapping[str, npt.NDArray[np.generic]], meta: Mapping[str, object]) -> bytes:
    """Serialize arrays plus a JSON-able ``meta`` dict with ``np.savez`` (no pickle)."""
    buf = io.BytesIO()
    payload: dict[str, npt.NDArray[np.generic]] = dict(arrays)
    payload["__meta__"] = np.array(json.dumps(dict(meta), sort_keys=True))
    np.savez(buf, **payload)  # type: ignore[arg-type]
    return buf.getvalue()


def npz_load(blob: bytes) -> tuple[dict[str, npt.NDArray[np.generic]], dict[str, object]]:
    """Inverse of :func:`npz_bytes`; raises :class:`UserError` for a blob it cannot read."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}
        meta = json.loads(str(arrays.pop("__meta__")))
    except Exception as exc:  # zipfile / value errors from a corrupt or foreign blob
        raise UserError(f"cannot read checkpoint data: {type(exc).__name__}: {exc}") from None
    if not isinstance(meta, dict):
        raise UserError("cannot read checkpoint data: bad metadata")
    return arrays, meta


def checkpoint_info(blob: bytes) -> dict[str, object]:
    """The metadata a backend stored in a ``state_bytes`` / ``sampler_weights`` blob.

    Keys include ``format``, ``base_model``, ``lora_rank``, ``train_attn``, ``train_mlp``,
    ``train_unembed`` (useful for ``weights_info``). Raises :class:`UserError` for a bad blob.
    """
    return npz_load(blob)[1]
