"""The ``tiny`` backend: a real (small) causal transformer trained through LoRA adapters.

Usage::

    backend = TinyBackend()
    model = backend.new_model("tinker-sync/tiny", LoraSpec(rank=8, seed=0), seed=0)
    out = model.forward_backward(data, "cross_entropy", {}, backward=True)
    model.optim_step({"learning_rate": 2e-2})
    sampler = backend.sampler("tinker-sync/tiny", model.sampler_weights())
    result = sampler.sample(prompt, SampleOptions(max_tokens=20, temperature=0.0))

Losses (:data:`TINY_LOSSES`, maths in docs/design/local-server.md#loss-semantics): every
``LossFnType`` of the protocol. ``custom`` (client-side only) and unknown names are refused with
:class:`UserError`, as is any optimizer other than AdamW (e.g. Dimuon). Gradients of the summed
loss accumulate over ``forward_backward`` calls until ``optim_step``.

Thread safety: a :class:`TinyModel` is used from one thread at a time; :class:`TinySampler` and
the backend are safe to share. Fork safety: plain numpy data, no threads or locks.
"""

from __future__ import annotations

import json

import numpy as np
import numpy.typing as npt

from tinker_sync.local.backends._blas import single_threaded_blas
from tinker_sync.local.backends._common import (
    KNOWN_MODELS,
    SERVER_LOSSES,
    check_lora,
    check_model_name,
    npz_bytes,
    npz_load,
    parse_adam_params,
)
from tinker_sync.local.backends._losses import (
    LossInputs,
    check_config,
    check_loss_fn,
    prepare_inputs,
    token_loss,
    token_mask,
)
from tinker_sync.local.backends.base import (
    PAD_TOKEN_ID,
    DatumArrays,
    ForwardResult,
    LoraSpec,
    ModelInfo,
    UserError,
)
from tinker_sync.local.backends.tiny.model import (
    Net,
    Params,
    TinyConfig,
    base_weights,
    init_lora,
    log_softmax,
    merge,
    module_names,
)
from tinker_sync.local.backends.tiny.optimizer import AdamW
from tinker_sync.local.backends.tiny.sampling import TinySampler

__all__ = ["TINY_LOSSES", "TinyBackend", "TinyModel"]

#: Every protocol loss but the client-side ``custom`` (``types.LOSS_FN_TYPES``).
TINY_LOSSES: tuple[str, ...] = SERVER_LOSSES
_FORMAT = "tinker-sync/tiny-lora-v1"
#: Micro-batch limits for one forward/backward pass (tokens, attention-matrix cells).
_MAX_BATCH_TOKENS = 8192
_MAX_ATTN_CELLS = 1 << 23


class TinyBackend:
    """Serves ``tinker-sync/tiny`` (any name when ``accept_any_model``) with a shared base.

    ``config`` overrides the model shape (tests use small float64 models for gradient checks).

    Thread safety: immutable after construction; safe to share. Fork safety: plain data.
    """

    name = "tiny"

    def __init__(
        self, seed: int = 0, accept_any_model: bool = True, config: TinyConfig | None = None
    ) -> None:
        self.seed = int(seed)
        self.accept_any_model = accept_any_model
        self.config = config or TinyConfig()

    def model_info(self, base_model: str) -> ModelInfo:
        """Describe ``base_model``; raises :class:`UserError` when it is not served."""
        check_model_name(base_model, self.accept_any_model)
        cfg = self.config
        return ModelInfo(
            arch="tiny-transformer",
            model_name=base_model,
            max_context_length=cfg.max_context,
            extra={
                "vocab_size": cfg.vocab_size,
                "d_model": cfg.d_model,
                "n_layers": cfg.n_layers,
                "n_heads": cfg.n_heads,
            },
        )

    def supported_models(self) -> list[ModelInfo]:
        return [self.model_info(name) for name in KNOWN_MODELS]

    def new_model(self, base_model: str, lora: LoraSpec, seed: int) -> TinyModel:
        """A fresh LoRA model; ``lora.seed`` (else ``seed`` mixed with the backend seed) seeds A."""
        check_model_name(base_model, self.accept_any_model)
        check_lora(lora.rank, lora.train_attn, lora.train_mlp, lora.train_unembed)
        entropy = [int(lora.seed)] if lora.seed is not None else [self.seed, int(seed), 1]
        rng = np.random.default_rng(np.random.SeedSequence([abs(e) for e in entropy]))
        return TinyModel(self.config, base_model, lora, rng)

    def sampler(self, base_model: str, weights: bytes | None) -> TinySampler:
        """A sampler on saved sampler weights, or on the frozen base model when None."""
        check_model_name(base_model, self.accept_any_model)
        cfg = self.config
        if weights is None:
            return TinySampler(cfg, base_weights(cfg))
        arrays, meta = npz_load(weights)
        spec = _check_meta(meta, cfg)
        lora = _lora_arrays(arrays, cfg, spec)
        return TinySampler(cfg, merge(cfg, lora, spec.rank))


def _check_meta(meta: dict[str, object], cfg: TinyConfig) -> LoraSpec:
    if meta.get("format") != _FORMAT:
        raise UserError(
            f"checkpoint was not written by the tiny backend (format {meta.get('format')!r})"
        )
    saved = meta.get("config")
    if not isinstance(saved, dict):
        raise UserError("checkpoint metadata lacks the model configuration")
    ours = cfg.as_dict()
    diff = sorted(k for k in ours if k != "dtype" and saved.get(k) != ours[k])
    if diff:
        raise UserError(f"checkpoint was made for a different tiny model (differs in {diff})")
    rank = meta.get("lora_rank")
    if not isinstance(rank, int):
        raise UserError("checkpoint metadata lacks the LoRA rank")
    return LoraSpec(
        rank=rank,
        train_attn=bool(meta.get("train_attn")),
        train_mlp=bool(meta.get("train_mlp")),
        train_unembed=bool(meta.get("train_unembed")),
    )


def _lora_arrays(
    arrays: dict[str, npt.NDArray[np.generic]], cfg: TinyConfig, spec: LoraSpec
) -> Params:
    base = base_weights(cfg)
    out: Params = {}
    for name in module_names(cfg, spec):
        fan_in, fan_out = base[name].shape
        for part, shape in ((".A", (fan_in, spec.rank)), (".B", (spec.rank, fan_out))):
            arr = arrays.get("lora/" + name + part)
            if arr is None or arr.shape != shape or arr.dtype.kind != "f":
                raise UserError(f"checkpoint adapter {name + part} is missing or malformed")
            out[name + part] = arr.astype(cfg.np_dtype)
    return out


class TinyModel:
    """One LoRA training run on the tiny transformer.

    Thread safety: one thread at a time (the server applies a model's requests in order).
    Fork safety: plain numpy data.
    """

    def __init__(
        self, cfg: TinyConfig, base_model: str, lora: LoraSpec, rng: np.random.Generator
    ) -> None:
        self.cfg = cfg
        self.base_model = base_model
        self.lora = lora
        self.params: Params = init_lora(cfg, lora, rng)
        self.grads: Params = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.opt = AdamW(self.params)
        self.step = 0

    # -- training ---------------------------------------------------------------------------

    def forward_backward(
        self,
        data: list[DatumArrays],
        loss_fn: str,
        config: dict[str, float | str],
        backward: bool,
    ) -> ForwardResult:
        """Per-datum ``logprobs`` and ``loss:sum``; accumulates gradients when ``backward``."""
        check_loss_fn(loss_fn, TINY_LOSSES)
        check_config(loss_fn, config)
        if not data:
            raise UserError("forward_backward needs at least one datum")
        cfg = self.cfg
        prepared: list[tuple[npt.NDArray[np.int64], LossInputs]] = []
        for i, datum in enumerate(data):
            tokens = np.asarray(datum.tokens)
            if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
                raise UserError(f"datum {i}: model_input must be a 1-D sequence of token ids")
            tokens = tokens.astype(np.int64)
            n = tokens.shape[0]
            if n == 0:
                raise UserError(f"datum {i} has an empty model_input")
            if n > cfg.max_context:
                raise UserError(
                    f"datum {i} has {n} tokens; the model's context is {cfg.max_context}"
                )
            if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size:
                raise UserError(
                    f"datum {i}: model_input holds a token id outside 0..{cfg.vocab_size - 1}"
                )
            try:
                inp = prepare_inputs(datum, loss_fn, n_tokens=n, vocab_size=cfg.vocab_size)
            except UserError as exc:
                raise UserError(f"datum {i}: {exc}") from None
            prepared.append((tokens, inp))
        with single_threaded_blas():
            return self._run(prepared, loss_fn, config, backward)

    def _run(
        self,
        prepared: list[tuple[npt.NDArray[np.int64], LossInputs]],
        loss_fn: str,
        config: dict[str, float | str],
        backward: bool,
    ) -> ForwardResult:
        cfg = self.cfg
        net = Net(cfg, self.params, self.lora.rank)
        outputs: list[dict[str, npt.NDArray[np.generic]]] = [{} for _ in prepared]
        total_loss = 0.0
        n_tokens = 0.0
        for group in _micro_batches([len(t) for t, _ in prepared], cfg.n_heads):
            t_max = max(len(prepared[i][0]) for i in group)
            batch = np.full((len(group), t_max), PAD_TOKEN_ID, dtype=np.int64)
            for row, i in enumerate(group):
                batch[row, : len(prepared[i][0])] = prepared[i][0]
            logits, cache = net.forward(batch)
            logp = log_softmax(logits)
            dlogits = np.zeros_like(logits) if backward else None
            for row, i in enumerate(group):
                tokens, inp = prepared[i]
                n = len(tokens)
                targets = inp.targets.reshape(n, -1)
                lp = logp[row, np.arange(n)[:, None], targets]
                loss, coef = token_loss(
                    loss_fn, lp.astype(np.float64).reshape(inp.targets.shape), inp, config
                )
                total_loss += float(loss.sum())
                n_tokens += float(np.count_nonzero(token_mask(loss_fn, inp)))
                outputs[i] = {"logprobs": lp.reshape(inp.targets.shape).astype(np.float32)}
                if dlogits is not None:
                    c = coef.reshape(n, -1).astype(logp.dtype)
                    d = -c.sum(axis=1, keepdims=True) * np.exp(logp[row, :n])
                    if c.shape[1] == 1:
                        d[np.arange(n), targets[:, 0]] += c[:, 0]
                    else:
                        np.add.at(d, (np.arange(n)[:, None], targets), c)
                    dlogits[row, :n] = d
            if dlogits is not None:
                net.backward(cache, dlogits, self.grads)
        return ForwardResult(
            outputs=outputs, metrics={"loss:sum": total_loss, "num_tokens:sum": n_tokens}
        )

    def optim_step(self, params: dict[str, float]) -> dict[str, float]:
        """AdamW on the adapters with every ``AdamParams`` field; clears the gradients."""
        hp = parse_adam_params(params)
        stats = self.opt.step(self.params, self.grads, hp)
        for g in self.grads.values():
            g.fill(0.0)
        self.step += 1
        return {
            "grad_norm:mean": stats["grad_norm"],
            "clip_factor:mean": stats["clip_factor"],
            "learning_rate:mean": hp["learning_rate"],
            "step:max": float(self.step),
        }

    # -- checkpoints ------------------------------------------------------------------------

    def _meta(self) -> dict[str, object]:
        return {
            "format": _FORMAT,
            "config": self.cfg.as_dict(),
            "base_model": self.base_model,
            "lora_rank": self.lora.rank,
            "lora_alpha": self.cfg.lora_alpha,
            "train_attn": self.lora.train_attn,
            "train_mlp": self.lora.train_mlp,
            "train_unembed": self.lora.train_unembed,
            "step": self.step,
        }

    def state_bytes(self, include_optimizer: bool) -> bytes:
        """Adapters (and AdamW moments + step when asked) as ``.npz`` bytes."""
        arrays: dict[str, npt.NDArray[np.generic]] = {
            "lora/" + k: v for k, v in self.params.items()
        }
        if include_optimizer:
            for k in self.params:
                arrays["adam_m/" + k] = self.opt.m[k]
                arrays["adam_v/" + k] = self.opt.v[k]
            arrays["adam_t"] = np.array(self.opt.t, dtype=np.int64)
        return npz_bytes(arrays, self._meta())

    def load_state_bytes(self, blob: bytes, include_optimizer: bool) -> None:
        """Restore adapters (and optimizer state when asked; otherwise the optimizer restarts).

        The checkpoint's LoRA rank and train flags replace this model's. Pending gradients are
        dropped.
        """
        arrays, meta = npz_load(blob)
        spec = _check_meta(meta, self.cfg)
        params = _lora_arrays(arrays, self.cfg, spec)
        opt = AdamW(params)
        if include_optimizer:
            if "adam_t" not in arrays:
                raise UserError("this checkpoint holds no optimizer state")
            for k in params:
                m, v = arrays.get("adam_m/" + k), arrays.get("adam_v/" + k)
                if m is None or v is None or m.shape != params[k].shape or v.shape != m.shape:
                    raise UserError(f"checkpoint optimizer state for {k} is missing or malformed")
                opt.m[k] = m.astype(self.cfg.np_dtype)
                opt.v[k] = v.astype(self.cfg.np_dtype)
            opt.t = int(arrays["adam_t"])
        self.lora = LoraSpec(
            rank=spec.rank,
            seed=self.lora.seed,
            train_attn=spec.train_attn,
            train_mlp=spec.train_mlp,
            train_unembed=spec.train_unembed,
        )
        self.params = params
        self.grads = {k: np.zeros_like(v) for k, v in params.items()}
        self.opt = opt
        step = meta.get("step")
        self.step = step if isinstance(step, int) else 0

    def sampler_weights(self) -> bytes:
        """The adapters as an immutable ``.npz`` snapshot for :meth:`TinyBackend.sampler`."""
        return self.state_bytes(include_optimizer=False)

    def export_files(self) -> dict[str, bytes]:
        """PEFT-style files: ``adapter_model.npz`` (``lora_A`` ``[r, in]``, ``lora_B``
        ``[out, r]`` per module) and ``adapter_config.json``."""
        tensors: dict[str, npt.NDArray[np.generic]] = {}
        for name in module_names(self.cfg, self.lora):
            prefix = f"base_model.model.{name}"
            tensors[prefix + ".lora_A.weight"] = self.params[name + ".A"].T.astype(np.float32)
            tensors[prefix + ".lora_B.weight"] = self.params[name + ".B"].T.astype(np.float32)
        config = {
            "peft_type": "LORA",
            "base_model_name_or_path": self.base_model,
            "r": self.lora.rank,
            "lora_alpha": self.cfg.lora_alpha,
            "target_modules": sorted(
                {n.rsplit(".", 1)[-1] for n in module_names(self.cfg, self.lora)}
            ),
            "tinker_sync_tiny_config": self.cfg.as_dict(),
            "step": self.step,
        }
        return {
            "adapter_model.npz": npz_bytes(tensors, {"format": "peft-like-npz"}),
            "adapter_config.json": json.dumps(config, indent=2, sort_keys=True).encode(),
        }


def _micro_batches(lengths: list[int], n_heads: int) -> list[list[int]]:
    """Group datum indices (longest first) under the token and attention-size budgets."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    t_max = 0
    for i in order:
        t = max(t_max, lengths[i]) if current else lengths[i]
        size = len(current) + 1
        if current and (size * t > _MAX_BATCH_TOKENS or size * n_heads * t * t > _MAX_ATTN_CELLS):
            groups.append(current)
            current, t = [], lengths[i]
        current.append(i)
        t_max = t
    if current:
        groups.append(current)
    return groups
