"""The contract between the local server and its model backends (``instant`` and ``tiny``).

The server turns wire requests into these plain numpy records, calls a backend, and turns the
results back into wire replies. Backends know nothing of HTTP, JSON or protobuf.

Thread safety: the server calls one :class:`TrainableModel` from one worker thread at a time
(each model applies its requests strictly in seq_id order); a :class:`Sampler` may be called
from several threads at once and must not mutate shared state without a lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

#: The byte-level tokenizer every local backend reports (``get_info.model_data.tokenizer_id``).
BYTE_TOKENIZER_ID = "tinker-sync/byte"
#: Byte tokenizer layout: ids 0..255 are raw bytes, then three special tokens.
EOS_TOKEN_ID = 256
BOS_TOKEN_ID = 257
PAD_TOKEN_ID = 258
BYTE_VOCAB_SIZE = 259


class UserError(Exception):
    """A request the backend refuses for a reason the user can fix (category ``user``)."""


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True


@dataclass
class DatumArrays:
    """One training datum, decoded.

    ``tokens``: int64 ``[N]`` model-input tokens (text chunks concatenated in order; a non-text
    chunk contributes ``length`` tokens of id 0). ``inputs``: the loss_fn_inputs, densified
    (CSR expanded with pad 0), as float32 or int64 arrays with their declared shapes.
    ``provenance``: the datum carries ``loss_fn_input_spans`` (``Datum.with_provenance``).
    """

    tokens: npt.NDArray[np.int64]
    inputs: dict[str, npt.NDArray[np.generic]]
    provenance: bool = False


@dataclass
class ForwardResult:
    """``outputs[i]`` holds at least ``"logprobs"`` (float32 ``[N_i]``) for datum i.

    Every metric key carries exactly one ``:reduction`` suffix (e.g. ``"loss:sum"``).
    """

    outputs: list[dict[str, npt.NDArray[np.generic]]]
    metrics: dict[str, float]


@dataclass
class SampleOptions:
    num_samples: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    #: None means "stop at EOS"; [] means "no stop at all" (generate to max_tokens).
    stop_strings: list[str] | None = None
    stop_tokens: list[int] | None = None
    prompt_logprobs: bool = False
    prompt_logprobs_last_n: int | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    #: int64 ``[len(prompt)-1, K]``; -1 marks an unused cell.
    target_prompt_logprobs: npt.NDArray[np.int64] | None = None
    prompt_alt_tokens_k: int = 0


@dataclass
class SampledSeq:
    tokens: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32]
    stop_reason: Literal["stop", "length"]
    #: ``[len(tokens), k]`` when top-k sample logprobs were asked for.
    topk_ids: npt.NDArray[np.int32] | None = None
    topk_logprobs: npt.NDArray[np.float32] | None = None


@dataclass
class SampleResult:
    sequences: list[SampledSeq]
    #: float32 ``[len(prompt)]``, NaN where not computed (always at position 0).
    prompt_logprobs: npt.NDArray[np.float32] | None = None
    #: ``[len(prompt), k]``; rows not computed hold token 0 / logprob -99999.0.
    topk_prompt_ids: npt.NDArray[np.int32] | None = None
    topk_prompt_logprobs: npt.NDArray[np.float32] | None = None
    #: float32 with the request's shape, 0.0 where the request had -1.
    target_prompt_logprobs: npt.NDArray[np.float32] | None = None
    #: int64 / float32 ``[len(prompt)-1, k]``.
    prompt_alt_tokens: npt.NDArray[np.int64] | None = None
    prompt_alt_logprobs: npt.NDArray[np.float32] | None = None
    prompt_cache_hit_tokens: int = 0


@dataclass
class ModelInfo:
    arch: str
    model_name: str
    max_context_length: int
    tokenizer_id: str = BYTE_TOKENIZER_ID
    extra: dict[str, object] = field(default_factory=dict)


class TrainableModel(Protocol):
    """A LoRA training run's model. Called from one thread at a time."""

    def forward_backward(
        self,
        data: list[DatumArrays],
        loss_fn: str,
        config: dict[str, float | str],
        backward: bool,
    ) -> ForwardResult:
        """Compute per-datum outputs and metrics; when ``backward``, accumulate gradients.

        Raises :class:`UserError` for unsupported losses, missing inputs or bad shapes.
        """
        ...

    def optim_step(self, params: dict[str, float]) -> dict[str, float]:
        """Apply AdamW with ``AdamParams`` fields, clear gradients, return metrics."""
        ...

    def state_bytes(self, include_optimizer: bool) -> bytes:
        """Serialize adapter weights (and optimizer moments when asked)."""
        ...

    def load_state_bytes(self, blob: bytes, include_optimizer: bool) -> None: ...

    def sampler_weights(self) -> bytes:
        """An immutable snapshot of the current weights for :meth:`Backend.sampler`."""
        ...

    def export_files(self) -> dict[str, bytes]:
        """Files for ``save_weights_external``: relative path -> content."""
        ...


class Sampler(Protocol):
    def sample(self, prompt: npt.NDArray[np.int64], opts: SampleOptions) -> SampleResult:
        """Raises :class:`UserError` for invalid options."""
        ...

    def cheap(self, prompt_len: int, opts: SampleOptions) -> bool:
        """True when this call (and its encoding) takes well under a millisecond: the server
        then runs it on its event-loop thread instead of the worker pool
        (docs/design/local-server.md#model-work)."""
        ...


class Backend(Protocol):
    name: str

    def model_info(self, base_model: str) -> ModelInfo:
        """Raises :class:`UserError` for an unknown model."""
        ...

    def supported_models(self) -> list[ModelInfo]: ...

    def new_model(self, base_model: str, lora: LoraSpec, seed: int) -> TrainableModel: ...

    def sampler(self, base_model: str, weights: bytes | None) -> Sampler:
        """A sampler on saved sampler weights, or on the frozen base model when None."""
        ...
