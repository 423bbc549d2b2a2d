"""Sampling from the tiny model: one prefill, then KV-cached decoding of all samples at once.

Usage::

    sampler = TinySampler(cfg, merge(cfg, lora, rank))     # or base_weights(cfg)
    result = sampler.sample(np.array(prompt_ids), SampleOptions(max_tokens=20, temperature=0))

Semantics:

* ``temperature == 0`` is greedy (ties go to the smaller id); otherwise logits are divided by
  the temperature, cut to the ``top_k`` best (``-1``: no cut) and to the smallest set whose
  probability reaches ``top_p``, and sampled with ``numpy.random.default_rng(seed)`` (fresh
  entropy when ``seed`` is None), so a given seed reproduces the same sequences.
* Reported logprobs (sampled tokens, top-k tables, prompt scores, alt tokens) are the model's
  raw log-softmax at temperature 1, the quantity training's forward returns for the same tokens.
* Stops: ``stop_strings`` match the decoded bytes of the sampled tokens, ``stop_tokens`` the ids;
  both None means "stop at EOS". The stopping token is kept as the last token. BOS and PAD are
  never generated, nor EOS unless it is a stop token. ``max_tokens=None`` fills the context.
* Prompt scores come from the prefill: row ``t - 1`` of the prefill predicts ``prompt[t]``.
  ``prompt_alt_tokens`` are independent draws at the request's temperature.

Thread safety: a sampler is immutable; ``sample`` allocates its own buffers, so concurrent calls
are safe. Fork safety: plain data.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from tinker_sync.local.backends._blas import single_threaded_blas
from tinker_sync.local.backends._common import (
    CheckedSampleOptions,
    StopRule,
    check_sample_options,
    sentinel_table,
    topk_table,
)
from tinker_sync.local.backends.base import SampledSeq, SampleOptions, SampleResult, UserError
from tinker_sync.local.backends.tiny.model import (
    Arr,
    ForwardCache,
    KVCache,
    Net,
    TinyConfig,
    log_softmax,
    softmax_last,
)

F64 = npt.NDArray[np.float64]


def choose_tokens(
    logp: F64, chk: CheckedSampleOptions, banned: list[int], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """Pick one token per row of ``logp`` ``[n, V]`` under temperature / top-k / top-p."""
    z = logp.copy()
    z[:, banned] = -np.inf
    if chk.temperature == 0.0:
        greedy: npt.NDArray[np.int64] = np.argmax(z, axis=1).astype(np.int64)
        return greedy
    z /= chk.temperature
    vocab = z.shape[1]
    if 0 < chk.top_k < vocab:
        order = np.argsort(-z, axis=1, kind="stable")[:, : chk.top_k]
        kept = np.full_like(z, -np.inf)
        np.put_along_axis(kept, order, np.take_along_axis(z, order, axis=1), axis=1)
        z = kept
    probs = softmax_last(z)
    if chk.top_p < 1.0:
        order = np.argsort(-probs, axis=1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=1)
        keep_sorted = (np.cumsum(sorted_p, axis=1) - sorted_p) < chk.top_p
        keep_sorted[:, 0] = True
        keep = np.zeros(probs.shape, dtype=bool)
        np.put_along_axis(keep, order, keep_sorted, axis=1)
        probs = np.where(keep, probs, 0.0)
    return _draw(probs, rng.random((int(probs.shape[0]),)))


def _draw(probs: Arr, u: F64) -> npt.NDArray[np.int64]:
    """Inverse-CDF draw per row (rows need not be normalised; zero cells are never drawn)."""
    cdf = np.cumsum(probs, axis=-1)
    cdf /= cdf[..., -1:]
    out: npt.NDArray[np.int64] = (cdf <= u[..., None]).sum(axis=-1).astype(np.int64)
    return out


class TinySampler:
    """Samples from fixed (merged) tiny-model weights. See the module docstring.

    Thread safety: immutable; safe to share between threads. Fork safety: plain data.
    """

    def __init__(self, cfg: TinyConfig, weights: Mapping[str, Arr]) -> None:
        self.cfg = cfg
        self.net = Net(cfg, weights=weights)

    def cheap(self, prompt_len: int, opts: SampleOptions) -> bool:
        """Never: a forward pass per token is model work for the worker pool."""
        return False

    def sample(self, prompt: npt.NDArray[np.int64], opts: SampleOptions) -> SampleResult:
        """Generate ``opts.num_samples`` sequences; raises :class:`UserError` for bad options."""
        cfg = self.cfg
        prompt = np.asarray(prompt)
        if prompt.ndim != 1 or prompt.dtype.kind not in "iu":
            raise UserError("the prompt must be a 1-D sequence of integer token ids")
        prompt = prompt.astype(np.int64)
        if prompt.size and (int(prompt.min()) < 0 or int(prompt.max()) >= cfg.vocab_size):
            raise UserError(
                f"the prompt holds a token id outside the model's vocabulary 0..{cfg.vocab_size - 1}"
            )
        if prompt.size > cfg.max_context:
            raise UserError(
                f"the prompt has {prompt.size} tokens; the model's context is {cfg.max_context}"
            )
        room = cfg.max_context - int(prompt.size)
        chk = check_sample_options(
            opts, prompt_len=int(prompt.size), vocab_size=cfg.vocab_size, default_max_tokens=room
        )
        # seed None: fresh OS entropy; otherwise one child stream for tokens, one for alt draws
        entropy = None if opts.seed is None else int(opts.seed) & 0xFFFFFFFFFFFFFFFF
        sample_seq, alt_seq = np.random.SeedSequence(entropy).spawn(2)
        sample_rng, alt_rng = np.random.default_rng(sample_seq), np.random.default_rng(alt_seq)
        with single_threaded_blas():
            return self._sample(prompt, opts, chk, (sample_rng, alt_rng))

    def _sample(
        self,
        prompt: npt.NDArray[np.int64],
        opts: SampleOptions,
        chk: CheckedSampleOptions,
        rngs: tuple[np.random.Generator, np.random.Generator],
    ) -> SampleResult:
        sample_rng, alt_rng = rngs
        room = self.cfg.max_context - int(prompt.size)
        logits, cache = self.net.forward(prompt[None, :])
        logp = log_softmax(logits[0]).astype(np.float64)  # row t predicts position t + 1
        result = SampleResult(sequences=[])
        self._prompt_scores(prompt, logp, chk, alt_rng, result)
        max_new = min(chk.max_tokens, room)
        stop = StopRule.from_options(opts)
        result.sequences = self._generate(
            logp[-1], cache, chk=chk, stop=stop, rng=sample_rng, max_new=max_new
        )
        return result

    def _generate(
        self,
        first_logp: F64,
        cache: ForwardCache,
        *,
        chk: CheckedSampleOptions,
        stop: StopRule,
        rng: np.random.Generator,
        max_new: int,
    ) -> list[SampledSeq]:
        n = chk.num_samples
        vocab = self.cfg.vocab_size
        toks = np.zeros((n, max_new), dtype=np.int32)
        lps = np.zeros((n, max_new), dtype=np.float32)
        k = chk.topk_sample
        top_ids = np.zeros((n, max_new, k), dtype=np.int32)
        top_lps = np.zeros((n, max_new, k), dtype=np.float32)
        lengths = np.zeros(n, dtype=np.int64)
        done = np.zeros(n, dtype=bool)
        stopped = np.zeros(n, dtype=bool)
        texts = [b""] * n
        checking = bool(stop.tokens or stop.strings)
        banned = stop.banned_tokens
        cur = np.broadcast_to(first_logp, (n, vocab))
        kv: KVCache | None = None
        prompt_len = 0
        if max_new > 1:
            prompt_len = cache.length
            kv = KVCache.from_prefill(cache, n, prompt_len + max_new)
        for j in range(max_new):
            choice = choose_tokens(cur, chk, banned, rng)
            chosen_lp = cur[np.arange(n), choice]
            if k:
                ids, vals = topk_table(cur, k)
            for r in np.flatnonzero(~done).tolist():
                tok = int(choice[r])
                toks[r, j] = tok
                lps[r, j] = chosen_lp[r]
                if k:
                    top_ids[r, j], top_lps[r, j] = ids[r], vals[r]
                lengths[r] += 1
                if checking:
                    if tok < 256:
                        texts[r] += bytes([tok])
                    if stop.hit(tok, texts[r]):
                        done[r] = stopped[r] = True
            if done.all() or j == max_new - 1:
                break
            assert kv is not None
            logits = self.net.decode_step(choice, prompt_len + j, kv)
            cur = log_softmax(logits).astype(np.float64)
        out: list[SampledSeq] = []
        for r in range(n):
            length = int(lengths[r])
            seq = SampledSeq(
                tokens=toks[r, :length].copy(),
                logprobs=lps[r, :length].copy(),
                stop_reason="stop" if stopped[r] else "length",
            )
            if k:
                seq.topk_ids = top_ids[r, :length].copy()
                seq.topk_logprobs = top_lps[r, :length].copy()
            out.append(seq)
        return out

    def _prompt_scores(
        self,
        prompt: npt.NDArray[np.int64],
        logp: F64,
        chk: CheckedSampleOptions,
        rng: np.random.Generator,
        result: SampleResult,
    ) -> None:
        n = int(prompt.size)
        first = chk.first_scored
        rows = np.arange(n - 1)
        if chk.prompt_logprobs:
            out = np.full(n, np.nan, dtype=np.float32)
            if n > first:
                out[first:] = logp[rows[first - 1 :], prompt[first:]]
            result.prompt_logprobs = out
        if chk.topk_prompt > 0:
            ids, vals = sentinel_table(n, chk.topk_prompt)
            if n > first:
                ids[first:], vals[first:] = topk_table(logp[first - 1 : n - 1], chk.topk_prompt)
            result.topk_prompt_ids, result.topk_prompt_logprobs = ids, vals
        if chk.target is not None:
            target = chk.target
            scored = logp[rows[:, None], np.maximum(target, 0)]
            result.target_prompt_logprobs = np.where(target == -1, 0.0, scored).astype(np.float32)
        if chk.alt_k > 0:
            k = chk.alt_k
            head = logp[: n - 1]
            if chk.temperature == 0.0:
                alt = np.repeat(np.argmax(head, axis=1)[:, None], k, axis=1).astype(np.int64)
            else:
                probs = softmax_last(head / chk.temperature)
                alt = _draw(probs[:, None, :], rng.random((n - 1, k)))
            result.prompt_alt_tokens = alt
            result.prompt_alt_logprobs = head[rows[:, None], alt].astype(np.float32)
