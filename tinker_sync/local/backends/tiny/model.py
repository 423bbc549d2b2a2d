"""The tiny causal transformer: frozen random base weights, LoRA adapters, manual backward pass.

Usage::

    cfg = TinyConfig()
    lora = init_lora(cfg, LoraSpec(rank=8), np.random.default_rng(0))
    net = Net(cfg, lora, rank=8)
    logits, cache = net.forward(tokens)            # tokens: int64 [B, T]
    net.backward(cache, dlogits, grads)            # adds to grads of the LoRA tensors

Architecture (pre-norm GPT): token + learned position embeddings, ``n_layers`` blocks of
multi-head causal self-attention and a GELU MLP, each preceded by a layer norm without affine
parameters, a final layer norm and a separate unembedding. LoRA adapters ``W + (alpha/r) A B``
(``A`` random, ``B`` zero so the adapted model starts equal to the base) sit on the attention
projections ``wq wk wv wo``, the MLP ``w_up w_down`` and the ``unembed`` matrix, as the
``train_attn`` / ``train_mlp`` / ``train_unembed`` flags select. Only the adapters are trained.

Thread safety: pure functions over arrays the caller owns; base weights are cached read-only.
Fork safety: no threads or locks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from tinker_sync.local.backends.base import BYTE_VOCAB_SIZE, LoraSpec

Arr = npt.NDArray[np.floating]
Params = dict[str, npt.NDArray[np.floating]]

ATTN_MODULES = ("wq", "wk", "wv", "wo")
MLP_MODULES = ("w_up", "w_down")
UNEMBED = "unembed"
_LN_EPS = 1e-5
_GELU_C = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the tiny model. The defaults are the served ``tinker-sync/tiny``.

    Thread safety: immutable (hashable; keys the base-weight cache). Fork safety: plain data.
    """

    d_model: int = 96
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 384
    max_context: int = 512
    vocab_size: int = BYTE_VOCAB_SIZE
    #: LoRA scaling numerator: adapters contribute ``(lora_alpha / rank) * A @ B``. Chosen so
    #: that the usual LoRA learning rate (1e-3, the demo's default) trains the served model in
    #: a few dozen steps.
    lora_alpha: float = 160.0
    #: Seed of the frozen base weights.
    base_seed: int = 20240611
    #: ``"float64"`` is for gradient checks; the server uses float32.
    dtype: Literal["float32", "float64"] = "float32"

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def np_dtype(self) -> type[np.floating]:
        return np.float64 if self.dtype == "float64" else np.float32

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def module_names(cfg: TinyConfig, spec: LoraSpec) -> list[str]:
    """Names of the matrices that carry LoRA adapters, e.g. ``"layers.0.wq"``, ``"unembed"``."""
    names: list[str] = []
    for layer in range(cfg.n_layers):
        if spec.train_attn:
            names += [f"layers.{layer}.{m}" for m in ATTN_MODULES]
        if spec.train_mlp:
            names += [f"layers.{layer}.{m}" for m in MLP_MODULES]
    if spec.train_unembed:
        names.append(UNEMBED)
    return names


@functools.lru_cache(maxsize=4)
def base_weights(cfg: TinyConfig) -> Mapping[str, Arr]:
    """The frozen base weights for ``cfg`` (deterministic from ``cfg.base_seed``; read-only)."""
    rng = np.random.default_rng(cfg.base_seed)
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    resid = 1.0 / math.sqrt(2 * cfg.n_layers)
    w: dict[str, npt.NDArray[np.float64]] = {
        "embed": rng.standard_normal((v, d)),
        "pos": rng.standard_normal((cfg.max_context, d)) * 0.5,
    }
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        for name in ("wq", "wk", "wv"):
            w[p + name] = rng.standard_normal((d, d)) / math.sqrt(d)
        w[p + "wo"] = rng.standard_normal((d, d)) / math.sqrt(d) * resid
        w[p + "w_up"] = rng.standard_normal((d, f)) / math.sqrt(d)
        w[p + "w_down"] = rng.standard_normal((f, d)) / math.sqrt(f) * resid
    w[UNEMBED] = rng.standard_normal((d, v)) / math.sqrt(d)
    out: dict[str, Arr] = {}
    for name, arr in w.items():
        cast = arr.astype(cfg.np_dtype)
        cast.setflags(write=False)
        out[name] = cast
    return out


def init_lora(cfg: TinyConfig, spec: LoraSpec, rng: np.random.Generator) -> Params:
    """Fresh adapters: ``A`` uniform in +-1/sqrt(fan_in), ``B`` zero (keys ``<module>.A/.B``)."""
    base = base_weights(cfg)
    params: Params = {}
    for name in module_names(cfg, spec):
        fan_in, fan_out = base[name].shape
        bound = 1.0 / math.sqrt(fan_in)
        params[name + ".A"] = rng.uniform(-bound, bound, (fan_in, spec.rank)).astype(cfg.np_dtype)
        params[name + ".B"] = np.zeros((spec.rank, fan_out), dtype=cfg.np_dtype)
    return params


def lora_scale(cfg: TinyConfig, rank: int) -> float:
    return cfg.lora_alpha / rank


def merge(cfg: TinyConfig, lora: Mapping[str, Arr], rank: int) -> dict[str, Arr]:
    """Base weights with the adapters folded in (``W + scale * A @ B``), for sampling."""
    base = base_weights(cfg)
    scale = lora_scale(cfg, rank)
    merged: dict[str, Arr] = dict(base)
    for key, a in lora.items():
        if key.endswith(".A"):
            name = key[:-2]
            merged[name] = (base[name] + scale * (a @ lora[name + ".B"])).astype(cfg.np_dtype)
    return merged


# ---------------------------------------------------------------------------------------------
# building blocks


def layer_norm(x: Arr) -> tuple[Arr, Arr]:
    """Normalise the last axis; returns ``(xhat, rstd)``."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + _LN_EPS)
    return xc * rstd, rstd


def layer_norm_back(dxhat: Arr, xhat: Arr, rstd: Arr) -> Arr:
    mean_d = dxhat.mean(axis=-1, keepdims=True)
    mean_dx = (dxhat * xhat).mean(axis=-1, keepdims=True)
    out: Arr = rstd * (dxhat - mean_d - xhat * mean_dx)
    return out


def gelu(u: Arr) -> tuple[Arr, Arr]:
    """tanh-approximated GELU; returns ``(gelu(u), t)`` where ``t`` is the tanh term."""
    t = u * u
    t *= 0.044715
    t += 1.0
    t *= u
    t *= _GELU_C
    np.tanh(t, out=t)
    g = t + 1.0
    g *= u
    g *= 0.5
    return g, t


def gelu_back(du: Arr, u: Arr, t: Arr) -> Arr:
    """``du * gelu'(u)`` given the tanh term ``t`` from :func:`gelu`."""
    # gelu'(u) = 0.5 * (1 + t + (1 - t^2) * C * u * (1 + 3 * 0.044715 * u^2))
    a = u * u
    a *= 3 * 0.044715
    a += 1.0
    a *= u
    a *= _GELU_C
    b = t * t
    np.subtract(1.0, b, out=b)
    b *= a
    b += t
    b += 1.0
    b *= 0.5
    b *= du
    return b


def softmax_last(s: Arr) -> Arr:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out: Arr = e / e.sum(axis=-1, keepdims=True)
    return out


def log_softmax(logits: Arr) -> Arr:
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    out: Arr = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return out


@functools.lru_cache(maxsize=16)
def _causal_bias(t: int, dtype: str) -> Arr:
    bias = np.triu(np.full((t, t), -np.inf, dtype=dtype), k=1)
    bias.setflags(write=False)
    return bias


# ---------------------------------------------------------------------------------------------
# forward / backward


@dataclass
class _Linear:
    """What a LoRA linear layer keeps for its backward pass."""

    x: Arr
    xa: Arr | None


@dataclass
class _Layer:
    """One block's activations."""

    x_in: Arr
    h1: Arr
    rstd1: Arr
    lin: dict[str, _Linear]
    q: Arr
    k: Arr
    v: Arr
    p: Arr
    h2: Arr
    rstd2: Arr
    u: Arr
    t: Arr


@dataclass
class ForwardCache:
    """Activations of one :meth:`Net.forward` call (per-layer ``k``/``v`` seed the KV cache).

    Thread safety: owned by the caller of ``forward``. Fork safety: plain data.
    """

    batch: int
    length: int
    layers: list[_Layer]
    hf: Arr
    rstdf: Arr
    unembed: _Linear


@dataclass
class KVCache:
    """Per-layer key/value buffers ``[n, H, T, dh]`` for incremental decoding.

    Thread safety: owned by one ``sample`` call. Fork safety: plain data.
    """

    keys: list[Arr]
    values: list[Arr]

    @classmethod
    def from_prefill(cls, cache: ForwardCache, n: int, capacity: int) -> KVCache:
        """Copy the keys/values of a batch-1 prefill into ``n`` rows of ``capacity`` positions."""
        keys, values = [], []
        t = cache.length
        for rec in cache.layers:
            _, h, _, dh = rec.k.shape
            kb = np.empty((n, h, capacity, dh), dtype=rec.k.dtype)
            vb = np.empty((n, h, capacity, dh), dtype=rec.v.dtype)
            kb[:, :, :t] = rec.k[0]
            vb[:, :, :t] = rec.v[0]
            keys.append(kb)
            values.append(vb)
        return cls(keys, values)


class Net:
    """The transformer with a set of adapters.

    ``Net(cfg, lora, rank)`` runs base + adapters; ``Net(cfg, weights=merge(...))`` runs merged
    weights without adapters (sampling).

    Thread safety: holds references only; concurrent calls are safe as long as nobody mutates
    the arrays. Fork safety: plain data.
    """

    def __init__(
        self,
        cfg: TinyConfig,
        lora: Mapping[str, Arr] | None = None,
        rank: int = 1,
        *,
        weights: Mapping[str, Arr] | None = None,
    ) -> None:
        self.cfg = cfg
        self.w = weights if weights is not None else base_weights(cfg)
        self.lora: Mapping[str, Arr] = lora or {}
        self.scale = lora_scale(cfg, rank)

    def _lin(self, x: Arr, name: str) -> tuple[Arr, _Linear]:
        y: Arr = x @ self.w[name]
        a = self.lora.get(name + ".A")
        if a is None:
            return y, _Linear(x, None)
        xa = x @ a
        y += self.scale * (xa @ self.lora[name + ".B"])
        return y, _Linear(x, xa)

    def _lin_back(self, dy: Arr, rec: _Linear, name: str, grads: Params) -> Arr:
        dx: Arr = dy @ self.w[name].T
        if rec.xa is not None:
            a, b = self.lora[name + ".A"], self.lora[name + ".B"]
            dyb = dy @ b.T
            grads[name + ".A"] += self.scale * (rec.x.T @ dyb)
            grads[name + ".B"] += self.scale * (rec.xa.T @ dy)
            dx += self.scale * (dyb @ a.T)
        return dx

    def forward(self, tokens: npt.NDArray[np.int64]) -> tuple[Arr, ForwardCache]:
        """Logits ``[B, T, V]`` for ``tokens`` ``[B, T]`` and the cache for :meth:`backward`."""
        cfg, w = self.cfg, self.w
        bsz, t = tokens.shape
        d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
        x: Arr = (w["embed"][tokens] + w["pos"][:t]).reshape(bsz * t, d)
        bias = _causal_bias(t, cfg.dtype)
        att_scale = 1.0 / math.sqrt(dh)
        layers: list[_Layer] = []
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            h1, rstd1 = layer_norm(x)
            lin: dict[str, _Linear] = {}
            heads = []
            for m in ("wq", "wk", "wv"):
                y, lin[m] = self._lin(h1, p + m)
                heads.append(y.reshape(bsz, t, h, dh).transpose(0, 2, 1, 3))
            q, k, v = heads
            scores = (q @ k.transpose(0, 1, 3, 2)) * att_scale + bias
            probs = softmax_last(scores)
            o = (probs @ v).transpose(0, 2, 1, 3).reshape(bsz * t, d)
            attn_out, lin["wo"] = self._lin(o, p + "wo")
            x_mid = x + attn_out
            h2, rstd2 = layer_norm(x_mid)
            u, lin["w_up"] = self._lin(h2, p + "w_up")
            g, tanh_term = gelu(u)
            mlp_out, lin["w_down"] = self._lin(g, p + "w_down")
            layers.append(_Layer(x, h1, rstd1, lin, q, k, v, probs, h2, rstd2, u, tanh_term))
            x = x_mid + mlp_out
        hf, rstdf = layer_norm(x)
        logits, un = self._lin(hf, UNEMBED)
        cache = ForwardCache(bsz, t, layers, hf, rstdf, un)
        return logits.reshape(bsz, t, cfg.vocab_size), cache

    def backward(self, cache: ForwardCache, dlogits: Arr, grads: Params) -> None:
        """Add to ``grads`` (keys of ``lora``) the gradient of ``sum(dlogits * logits)``."""
        cfg = self.cfg
        bsz, t = cache.batch, cache.length
        d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
        att_scale = 1.0 / math.sqrt(dh)
        dy = dlogits.reshape(bsz * t, cfg.vocab_size)
        dhf = self._lin_back(dy, cache.unembed, UNEMBED, grads)
        dx = layer_norm_back(dhf, cache.hf, cache.rstdf)
        for layer in reversed(range(cfg.n_layers)):
            p = f"layers.{layer}."
            rec = cache.layers[layer]
            # MLP branch
            dg = self._lin_back(dx, rec.lin["w_down"], p + "w_down", grads)
            dh2 = self._lin_back(gelu_back(dg, rec.u, rec.t), rec.lin["w_up"], p + "w_up", grads)
            dx = dx + layer_norm_back(dh2, rec.h2, rec.rstd2)
            # attention branch
            do = self._lin_back(dx, rec.lin["wo"], p + "wo", grads)
            do4 = do.reshape(bsz, t, h, dh).transpose(0, 2, 1, 3)
            dprobs = do4 @ rec.v.transpose(0, 1, 3, 2)
            dv = rec.p.transpose(0, 1, 3, 2) @ do4
            ds = rec.p * (dprobs - (dprobs * rec.p).sum(axis=-1, keepdims=True)) * att_scale
            dq = ds @ rec.k
            dk = ds.transpose(0, 1, 3, 2) @ rec.q
            dh1 = np.zeros_like(rec.h1)
            for m, dm in (("wq", dq), ("wk", dk), ("wv", dv)):
                dflat = dm.transpose(0, 2, 1, 3).reshape(bsz * t, d)
                dh1 += self._lin_back(dflat, rec.lin[m], p + m, grads)
            dx = dx + layer_norm_back(dh1, rec.h1, rec.rstd1)

    def decode_step(self, tokens: npt.NDArray[np.int64], pos: int, kv: KVCache) -> Arr:
        """Logits ``[n, V]`` for ``tokens`` ``[n]`` at position ``pos`` (merged weights only);
        writes this step's keys/values into ``kv``."""
        cfg, w = self.cfg, self.w
        n = tokens.shape[0]
        h, dh = cfg.n_heads, cfg.d_head
        att_scale = 1.0 / math.sqrt(dh)
        x = w["embed"][tokens] + w["pos"][pos]
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            h1, _ = layer_norm(x)
            q = (h1 @ w[p + "wq"]).reshape(n, h, dh)
            kv.keys[layer][:, :, pos] = (h1 @ w[p + "wk"]).reshape(n, h, dh)
            kv.values[layer][:, :, pos] = (h1 @ w[p + "wv"]).reshape(n, h, dh)
            scores = (kv.keys[layer][:, :, : pos + 1] @ q[..., None])[..., 0] * att_scale
            probs = softmax_last(scores)
            o = (probs[:, :, None, :] @ kv.values[layer][:, :, : pos + 1])[:, :, 0, :]
            x = x + o.reshape(n, cfg.d_model) @ w[p + "wo"]
            h2, _ = layer_norm(x)
            x = x + gelu(h2 @ w[p + "w_up"])[0] @ w[p + "w_down"]
        hf, _ = layer_norm(x)
        out: Arr = hf @ w[UNEMBED]
        return out
