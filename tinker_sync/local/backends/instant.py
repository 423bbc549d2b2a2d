"""The ``instant`` backend: deterministic, microsecond-fast stand-in for a model.

Usage::

    backend = InstantBackend(seed=0)
    model = backend.new_model("Qwen/Qwen3-8B", LoraSpec(rank=8), seed=0)
    out = model.forward_backward(data, "cross_entropy", {}, backward=True)
    model.optim_step({"learning_rate": 1e-4})
    result = backend.sampler("Qwen/Qwen3-8B", model.sampler_weights()).sample(prompt, opts)

Every number is a fixed function of the inputs, the backend seed and the model state. The
"model" is one scalar ``drift`` (plus a step counter): the log-probability of target ``y`` after
input token ``x`` at position ``t`` is ``-log(259) * (0.05 + 0.95 * u(x, y, t)) * exp(-drift)``
with ``u`` a hash in [0, 1). ``optim_step`` moves ``drift`` by an Adam-like step in the
direction the accumulated loss gradient asks for, so training changes later forwards slightly
and deterministically, and sampler logprobs agree with training logprobs for the same state.

Sampling emits printable bytes chosen by hashing (greedy when ``temperature == 0`` or
``top_k == 1``; the candidate pool narrows with ``top_k`` / ``top_p``), ends each sequence at a
hashed "natural" length with a stop token or stop string when stops are active (EOS when the
request gave none), and honours every shape option of :class:`SampleOptions`.

Thread safety: a model is used from one thread at a time; samplers are immutable and safe to
share. Fork safety: plain data, no locks or threads.
"""

from __future__ import annotations

import json
import math

import numpy as np
import numpy.typing as npt

from tinker_sync.local.backends._common import (
    KNOWN_MODELS,
    MASK_LOGPROB,
    SERVER_LOSSES,
    CheckedSampleOptions,
    StopRule,
    check_lora,
    check_model_name,
    check_sample_options,
    npz_bytes,
    npz_load,
    parse_adam_params,
    sentinel_table,
)
from tinker_sync.local.backends._losses import (
    check_config,
    check_loss_fn,
    prepare_inputs,
    token_loss,
    token_mask,
)
from tinker_sync.local.backends.base import (
    BYTE_VOCAB_SIZE,
    DatumArrays,
    ForwardResult,
    LoraSpec,
    ModelInfo,
    SampledSeq,
    SampleOptions,
    SampleResult,
    UserError,
)

__all__ = ["InstantBackend", "InstantModel", "InstantSampler"]

#: The largest sample call the server runs on its event-loop thread (``InstantSampler.cheap``).
CHEAP_SEQUENCES = 4
CHEAP_PROMPT = 1024
#: Context length reported for every instant model.
INSTANT_CONTEXT = 32768
#: ``max_tokens`` used when a request leaves it unset.
DEFAULT_MAX_TOKENS = 16
_LOG_VOCAB = math.log(BYTE_VOCAB_SIZE)
_FORMAT = "tinker-sync/instant-state-v1"

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_M1 = _U64(0xBF58476D1CE4E5B9)
_M2 = _U64(0x94D049BB133111EB)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 finaliser, element-wise (wrapping uint64 arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> _U64(30))) * _M1
    x = (x ^ (x >> _U64(27))) * _M2
    out: npt.NDArray[np.uint64] = x ^ (x >> _U64(31))
    return out


def _hash(*parts: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """Hash broadcastable integer arrays (or ints) into uint64 values."""
    h = np.zeros((), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for part in parts:
            arr = np.asarray(part)
            if arr.dtype != np.uint64:
                arr = arr.astype(np.int64).view(np.uint64) if arr.ndim else _as_u64(int(arr))
            h = _mix(h ^ arr)
    out: npt.NDArray[np.uint64] = np.asarray(h, dtype=np.uint64)
    return out


def _as_u64(value: int) -> npt.NDArray[np.uint64]:
    return np.array(value & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)


def _unit(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """Map hashes to floats in [0, 1)."""
    out: npt.NDArray[np.float64] = (h >> _U64(11)).astype(np.float64) * 2.0**-53
    return out


def _seq_hash(tokens: npt.NDArray[np.int64]) -> int:
    """An order-sensitive hash of a token sequence."""
    if tokens.size == 0:
        return 0
    h = _hash(tokens, np.arange(tokens.size, dtype=np.int64))
    return int(np.bitwise_xor.reduce(h)) ^ int(tokens.size)


class _Weights:
    """The instant model's "weights": a scalar drift and the optimizer step that produced it."""

    __slots__ = ("drift", "step")

    def __init__(self, drift: float = 0.0, step: int = 0) -> None:
        self.drift = drift
        self.step = step


def _logprob(
    seed: int, drift: float, prev: npt.ArrayLike, target: npt.ArrayLike, pos: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """The model's log-probability of ``target`` after input ``prev`` at position ``pos``."""
    u = _unit(_hash(seed, prev, target, pos))
    out: npt.NDArray[np.float64] = -_LOG_VOCAB * (0.05 + 0.95 * u) * math.exp(-drift)
    return out


class InstantBackend:
    """Deterministic fake model backend (see the module docstring).

    Thread safety: stateless apart from construction arguments; safe to share.
    Fork safety: plain data.
    """

    name = "instant"

    def __init__(self, seed: int = 0, accept_any_model: bool = True) -> None:
        self.seed = int(seed)
        self.accept_any_model = accept_any_model

    def model_info(self, base_model: str) -> ModelInfo:
        """Describe ``base_model``; raises :class:`UserError` when it is not served."""
        check_model_name(base_model, self.accept_any_model)
        return ModelInfo(
            arch="instant",
            model_name=base_model,
            max_context_length=INSTANT_CONTEXT,
            extra={"vocab_size": BYTE_VOCAB_SIZE},
        )

    def supported_models(self) -> list[ModelInfo]:
        return [self.model_info(name) for name in KNOWN_MODELS]

    def new_model(self, base_model: str, lora: LoraSpec, seed: int) -> InstantModel:
        """A fresh training model; raises :class:`UserError` for a bad name or LoRA config."""
        check_model_name(base_model, self.accept_any_model)
        check_lora(lora.rank, lora.train_attn, lora.train_mlp, lora.train_unembed)
        del seed  # the instant model has no random initialisation
        return InstantModel(base_model, lora, self.seed)

    def sampler(self, base_model: str, weights: bytes | None) -> InstantSampler:
        """A sampler on ``weights`` (from :meth:`InstantModel.sampler_weights`) or the base."""
        check_model_name(base_model, self.accept_any_model)
        state = _Weights()
        if weights is not None:
            arrays, meta = npz_load(weights)
            _check_format(meta)
            state = _Weights(float(arrays["drift"]), int(arrays["step"]))
        return InstantSampler(self.seed, state.drift, state.step)


def _check_format(meta: dict[str, object]) -> None:
    if meta.get("format") != _FORMAT:
        raise UserError(
            f"checkpoint was not written by the instant backend (format {meta.get('format')!r})"
        )


class InstantModel:
    """A training run on the instant backend.

    Thread safety: one thread at a time (the server serializes each model's requests).
    Fork safety: plain data.
    """

    def __init__(self, base_model: str, lora: LoraSpec, backend_seed: int) -> None:
        self.base_model = base_model
        self.lora = lora
        self.seed = backend_seed
        self.weights = _Weights()
        self._grad_sum = 0.0
        self._grad_count = 0
        self._m = 0.0
        self._v = 0.0
        self._opt_step = 0

    def forward_backward(
        self,
        data: list[DatumArrays],
        loss_fn: str,
        config: dict[str, float | str],
        backward: bool,
    ) -> ForwardResult:
        """Hash-based logprobs and Appendix A losses; ``backward`` accumulates a pseudo-gradient."""
        check_loss_fn(loss_fn, SERVER_LOSSES)
        check_config(loss_fn, config)
        if not data:
            raise UserError("forward_backward needs at least one datum")
        outputs: list[dict[str, npt.NDArray[np.generic]]] = []
        total_loss = 0.0
        n_tokens = 0.0
        grad_sum = 0.0
        grad_count = 0
        for i, datum in enumerate(data):
            tokens = np.asarray(datum.tokens, dtype=np.int64)
            n = tokens.shape[0]
            if n == 0:
                raise UserError(f"datum {i} has an empty model_input")
            if n > INSTANT_CONTEXT:
                raise UserError(f"datum {i} has {n} tokens, more than the {INSTANT_CONTEXT} limit")
            if int(tokens.min()) < 0:
                raise UserError(f"datum {i} has a negative token id")
            inp = prepare_inputs(datum, loss_fn, n_tokens=n, vocab_size=None)
            pos = np.arange(n, dtype=np.int64)
            prev = tokens
            if inp.targets.ndim == 2:
                prev, pos = prev[:, None], pos[:, None]
            lp = _logprob(self.seed, self.weights.drift, prev, inp.targets, pos)
            loss, coef = token_loss(loss_fn, lp, inp, config)
            total_loss += float(loss.sum())
            n_tokens += float(np.count_nonzero(token_mask(loss_fn, inp)))
            grad_sum += float(coef.sum())
            grad_count += int(coef.size)
            outputs.append({"logprobs": lp.astype(np.float32)})
        if backward:
            self._grad_sum += grad_sum
            self._grad_count += grad_count
        return ForwardResult(
            outputs=outputs, metrics={"loss:sum": total_loss, "num_tokens:sum": n_tokens}
        )

    def optim_step(self, params: dict[str, float]) -> dict[str, float]:
        """Adam-like update of the drift scalar; clears the accumulated gradient."""
        hp = parse_adam_params(params)
        grad = -self._grad_sum / self._grad_count if self._grad_count else 0.0
        grad = max(-1.0, min(1.0, grad))
        grad_norm = abs(grad)
        if hp["grad_clip_norm"] > 0 and grad_norm > hp["grad_clip_norm"]:
            grad *= hp["grad_clip_norm"] / grad_norm
        self._opt_step += 1
        b1, b2 = hp["beta1"], hp["beta2"]
        self._m = b1 * self._m + (1 - b1) * grad
        self._v = b2 * self._v + (1 - b2) * grad * grad
        m_hat = self._m / (1 - b1**self._opt_step)
        v_hat = self._v / (1 - b2**self._opt_step)
        lr = hp["learning_rate"]
        drift = self.weights.drift * (1 - lr * hp["weight_decay"])
        drift += lr * m_hat / (math.sqrt(v_hat) + hp["eps"]) if v_hat > 0 else 0.0
        self.weights = _Weights(drift, self.weights.step + 1)
        self._grad_sum, self._grad_count = 0.0, 0
        return {
            "grad_norm:mean": grad_norm,
            "learning_rate:mean": lr,
            "step:max": float(self.weights.step),
        }

    def _arrays(self, include_optimizer: bool) -> dict[str, npt.NDArray[np.generic]]:
        arrays: dict[str, npt.NDArray[np.generic]] = {
            "drift": np.array(self.weights.drift, dtype=np.float64),
            "step": np.array(self.weights.step, dtype=np.int64),
        }
        if include_optimizer:
            arrays["opt_m"] = np.array(self._m, dtype=np.float64)
            arrays["opt_v"] = np.array(self._v, dtype=np.float64)
            arrays["opt_step"] = np.array(self._opt_step, dtype=np.int64)
        return arrays

    def _meta(self) -> dict[str, object]:
        return {
            "format": _FORMAT,
            "base_model": self.base_model,
            "lora_rank": self.lora.rank,
            "train_attn": self.lora.train_attn,
            "train_mlp": self.lora.train_mlp,
            "train_unembed": self.lora.train_unembed,
        }

    def state_bytes(self, include_optimizer: bool) -> bytes:
        """The drift/step (and optimizer moments when asked) as ``.npz`` bytes."""
        return npz_bytes(self._arrays(include_optimizer), self._meta())

    def load_state_bytes(self, blob: bytes, include_optimizer: bool) -> None:
        """Restore :meth:`state_bytes`; without ``include_optimizer`` the optimizer restarts."""
        arrays, meta = npz_load(blob)
        _check_format(meta)
        if include_optimizer and "opt_step" not in arrays:
            raise UserError("this checkpoint holds no optimizer state")
        self.weights = _Weights(float(arrays["drift"]), int(arrays["step"]))
        if include_optimizer:
            self._m = float(arrays["opt_m"])
            self._v = float(arrays["opt_v"])
            self._opt_step = int(arrays["opt_step"])
        else:
            self._m, self._v, self._opt_step = 0.0, 0.0, 0
        self._grad_sum, self._grad_count = 0.0, 0

    def sampler_weights(self) -> bytes:
        return npz_bytes(self._arrays(False), self._meta())

    def export_files(self) -> dict[str, bytes]:
        config = {
            "base_model_name_or_path": self.base_model,
            "peft_type": "LORA",
            "r": self.lora.rank,
            "backend": "instant",
            "step": self.weights.step,
        }
        return {
            "adapter_model.npz": self.sampler_weights(),
            "adapter_config.json": json.dumps(config, indent=2, sort_keys=True).encode(),
        }


class InstantSampler:
    """Deterministic sampler of the instant backend.

    Thread safety: immutable; safe to call from many threads. Fork safety: plain data.
    """

    def __init__(self, seed: int, drift: float, step: int) -> None:
        self.seed = seed
        self.drift = drift
        self.step = step

    def cheap(self, prompt_len: int, opts: SampleOptions) -> bool:
        """Up to :data:`CHEAP_SEQUENCES` sequences on a prompt of up to :data:`CHEAP_PROMPT`
        tokens: about 0.1 ms per sequence, 0.5 ms at worst (with top-k prompt logprobs)."""
        return opts.num_samples <= CHEAP_SEQUENCES and prompt_len <= CHEAP_PROMPT

    def sample(self, prompt: npt.NDArray[np.int64], opts: SampleOptions) -> SampleResult:
        """Deterministic sequences and prompt scores; raises :class:`UserError` for bad options."""
        prompt = np.asarray(prompt, dtype=np.int64)
        if prompt.ndim != 1:
            raise UserError("the prompt must be a 1-D token sequence")
        if prompt.size and int(prompt.min()) < 0:
            raise UserError("the prompt holds a negative token id")
        if prompt.size > INSTANT_CONTEXT:
            raise UserError(f"the prompt has {prompt.size} tokens, over {INSTANT_CONTEXT}")
        chk = check_sample_options(
            opts,
            prompt_len=int(prompt.size),
            vocab_size=None,
            default_max_tokens=DEFAULT_MAX_TOKENS,
        )
        stop = StopRule.from_options(opts)
        greedy = chk.temperature == 0.0 or chk.top_k == 1
        req_seed = self.seed if opts.seed is None else int(opts.seed)
        key = int(_hash(self.seed, self.step, _seq_hash(prompt), 0 if greedy else req_seed))
        sequences = [
            self._one(prompt, chk, stop, key, 0 if greedy else i) for i in range(chk.num_samples)
        ]
        result = SampleResult(sequences=sequences)
        self._prompt_scores(prompt, chk, key, result)
        return result

    def _pool_size(self, chk: CheckedSampleOptions) -> int:
        if chk.temperature == 0.0:
            return 1
        pool = 95 if chk.top_k <= 0 else min(chk.top_k, 95)
        return max(1, min(pool, math.ceil(95 * chk.top_p)))

    def _one(
        self,
        prompt: npt.NDArray[np.int64],
        chk: CheckedSampleOptions,
        stop: StopRule,
        key: int,
        index: int,
    ) -> SampledSeq:
        natural_h, tok_h, str_h = (int(h) for h in _hash(key, index, np.arange(1, 4)))
        natural = 1 + natural_h % (2 * DEFAULT_MAX_TOKENS)
        stop_tail: list[int] = []
        if stop.tokens:
            options = sorted(stop.tokens)
            stop_tail = [options[tok_h % len(options)]]
        elif stop.strings:
            stop_tail = list(stop.strings[str_h % len(stop.strings)])
        limit = chk.max_tokens if not stop_tail else min(chk.max_tokens, natural + len(stop_tail))
        steps = np.arange(limit, dtype=np.int64)
        pool = _U64(self._pool_size(chk))
        filler = ((_hash(key, steps, 4) + _hash(key, index, steps, 5) % pool) % _U64(95)).tolist()
        checking = bool(stop.tokens or stop.strings)
        tokens: list[int] = []
        text = b""
        stopped = False
        while len(tokens) < limit and not stopped:
            j = len(tokens)
            if j >= natural and stop_tail:
                tok = stop_tail[j - natural]
            else:
                found = _filler(int(filler[j]), stop, text) if checking else 32 + int(filler[j])
                if found is None:  # every printable byte would stop: stop right here
                    natural = j
                    continue
                tok = found
            tokens.append(tok)
            if checking:
                if tok < 256:
                    text += bytes([tok])
                stopped = stop.hit(tok, text)
        toks = np.array(tokens, dtype=np.int32)
        pos = np.arange(prompt.size - 1, prompt.size - 1 + toks.size, dtype=np.int64)
        prevs = np.concatenate([prompt[-1:], toks[:-1].astype(np.int64)])
        lps = _logprob(self.seed, self.drift, prevs, toks.astype(np.int64), pos)
        seq = SampledSeq(
            tokens=toks,
            logprobs=lps.astype(np.float32),
            stop_reason="stop" if stopped else "length",
        )
        if chk.topk_sample > 0:
            seq.topk_ids, seq.topk_logprobs = _topk_rows(toks, lps, chk.topk_sample)
        return seq

    def _prompt_scores(
        self,
        prompt: npt.NDArray[np.int64],
        chk: CheckedSampleOptions,
        key: int,
        result: SampleResult,
    ) -> None:
        n = int(prompt.size)
        pos = np.arange(n - 1, dtype=np.int64)
        lp_all = _logprob(self.seed, self.drift, prompt[:-1], prompt[1:], pos)  # for t = 1..n-1
        first = chk.first_scored
        if chk.prompt_logprobs:
            out = np.full(n, np.nan, dtype=np.float32)
            out[first:] = lp_all[first - 1 :]
            result.prompt_logprobs = out
        if chk.topk_prompt > 0:
            ids, vals = sentinel_table(n, chk.topk_prompt)
            if n > first:
                row_ids, row_vals = _topk_rows(
                    prompt[first:].astype(np.int32), lp_all[first - 1 :], chk.topk_prompt
                )
                ids[first:], vals[first:] = row_ids, row_vals
            result.topk_prompt_ids, result.topk_prompt_logprobs = ids, vals
        if chk.target is not None:
            target = chk.target
            scored = _logprob(self.seed, self.drift, prompt[:-1, None], target, pos[:, None])
            result.target_prompt_logprobs = np.where(target == -1, 0.0, scored).astype(np.float32)
        if chk.alt_k > 0:
            k = chk.alt_k
            pool = self._pool_size(chk)
            draw = np.arange(k) if pool > 1 else np.zeros(k, dtype=np.int64)
            base = _hash(key, pos[:, None], 6) % _U64(95)
            pick = _hash(key, pos[:, None], draw[None, :], 7) % _U64(pool)
            alt = 32 + ((base + pick) % _U64(95)).astype(np.int64)
            result.prompt_alt_tokens = alt
            result.prompt_alt_logprobs = _logprob(
                self.seed, self.drift, prompt[:-1, None], alt, pos[:, None]
            ).astype(np.float32)


def _topk_rows(
    tokens: npt.NDArray[np.int32], lps: npt.NDArray[np.float64], k: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """Rows led by the actual token, followed by byte neighbours with lower logprobs."""
    rows = tokens.size
    ids, vals = sentinel_table(rows, k)
    width = min(k, 256)
    if rows == 0 or width == 0:
        return ids, vals
    offsets = np.arange(width)
    base = tokens.astype(np.int64)[:, None]
    neighbours = np.where(base < 256, (base + offsets) % 256, np.where(offsets == 0, base, offsets))
    ids[:, :width] = neighbours
    vals[:, :width] = lps[:, None] - 0.5 * offsets[None, :]
    vals[:, :width] = np.maximum(vals[:, :width], MASK_LOGPROB + 1.0)
    return ids, vals


def _filler(first: int, stop: StopRule, text: bytes) -> int | None:
    """The first printable byte from ``first`` on that neither is nor completes a stop."""
    for shift in range(95):
        tok = 32 + (first + shift) % 95
        if tok in stop.tokens or any((text + bytes([tok])).endswith(s) for s in stop.strings):
            continue
        return tok
    return None
