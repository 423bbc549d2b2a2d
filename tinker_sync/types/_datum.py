"""Training data: provenance spans, ``Datum``, loss function names, ``ForwardBackwardInput``.

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

import dataclasses
import sys
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

from tinker_sync._lazynp import is_ndarray
from tinker_sync.types._base import _MISSING, TinkerDataclass, TinkerRequest, from_official
from tinker_sync.types._input import ImageAssetPointerChunk, ModelInput
from tinker_sync.types._tensor import TensorData, TensorDtype

__all__ = [
    "LOSS_FN_INPUT_DTYPES",
    "LOSS_FN_TYPES",
    "Datum",
    "ForwardBackwardInput",
    "ForwardBackwardRequest",
    "ForwardRequest",
    "LossFnInputs",
    "LossFnOutput",
    "LossFnType",
    "PromptProvenanceSpan",
    "ProvenanceSpans",
    "SampledProvenanceSpan",
    "coerce_loss_fn_input",
    "validate_loss_fn",
]

LossFnType: TypeAlias = Literal[
    "cross_entropy",
    "importance_sampling",
    "ppo",
    "cispo",
    "dro",
    "gspo",
    "stable_reinforce",
    "custom",
]
LOSS_FN_TYPES: tuple[LossFnType, ...] = typing.get_args(LossFnType)
"""Every valid ``loss_fn`` name, read from :data:`LossFnType` (the one list of them)."""


def validate_loss_fn(name: Any) -> LossFnType:
    """Return ``name`` if it is a valid loss function name, else raise ``ValueError``."""
    if not isinstance(name, str) or name not in LOSS_FN_TYPES:
        raise ValueError(
            f"loss_fn: unknown loss function {name!r}; expected one of {list(LOSS_FN_TYPES)}"
        )
    return name


_RL_INPUTS = ("target_tokens", "logprobs", "advantages")
LOSS_FN_REQUIRED_INPUTS: Mapping[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": _RL_INPUTS,
    "ppo": _RL_INPUTS,
    "cispo": _RL_INPUTS,
    "dro": _RL_INPUTS,
    "gspo": _RL_INPUTS,
    "stable_reinforce": _RL_INPUTS,
}
"""The ``loss_fn_inputs`` each built-in loss needs (client-side checks and the local server)."""
PER_TOKEN_INPUTS = (
    "weights",
    "logprobs",
    "advantages",
    "clip_low_threshold",
    "clip_high_threshold",
    "sequence_ratio_mask",
)
"""Inputs that, when present, have the shape of ``target_tokens`` (one row per input token)."""


LOSS_FN_INPUT_DTYPES: Mapping[str, TensorDtype] = {
    "target_tokens": "int64",
    "weights": "float32",
    "advantages": "float32",
    "logprobs": "float32",
    "clip_low_threshold": "float32",
    "clip_high_threshold": "float32",
    "sequence_ratio_mask": "float32",
}
"""Dtype given to a plain Python list under each known ``loss_fn_inputs`` key."""

_SPARSE_KEYS = frozenset({"target_tokens", "weights"})

LossFnInputs: TypeAlias = dict[str, TensorData]
LossFnOutput: TypeAlias = dict[str, TensorData]


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def coerce_loss_fn_input(key: str, value: Any) -> TensorData:
    """Convert one ``loss_fn_inputs`` value to ``TensorData`` (see the key -> dtype table).

    Raises ``KeyError`` for a list under an unknown key, ``ValueError`` for ragged lists or
    unsupported dtypes and ``TypeError`` for other value types; every message names the key.
    """
    if isinstance(value, TensorData):
        return value
    if is_ndarray(value):
        try:
            return TensorData.from_numpy(value)
        except ValueError as exc:
            raise ValueError(f"loss_fn_inputs[{key!r}]: {exc}") from None
    if _is_torch_tensor(value):
        try:
            if key in _SPARSE_KEYS and value.ndim == 2:
                return TensorData.from_torch_sparse(value)
            return TensorData.from_torch(value)
        except ValueError as exc:
            raise ValueError(f"loss_fn_inputs[{key!r}]: {exc}") from None
    if isinstance(value, (list, tuple)):
        dtype = LOSS_FN_INPUT_DTYPES.get(key)
        if dtype is None:
            raise KeyError(
                f"loss_fn_inputs[{key!r}]: a plain list needs a known key to pick its dtype "
                f"({sorted(LOSS_FN_INPUT_DTYPES)}); pass a numpy array or TensorData instead"
            )
        import numpy as np

        try:
            arr = np.asarray(value)
        except ValueError:
            raise ValueError(
                f"loss_fn_inputs[{key!r}] must be a rectangular numeric array; ragged nested "
                "lists are not supported"
            ) from None
        if arr.dtype.kind == "O" or (arr.ndim > 1 and arr.dtype.kind not in "biuf"):
            raise ValueError(
                f"loss_fn_inputs[{key!r}] must be a rectangular numeric array; ragged nested "
                "lists are not supported"
            )
        if arr.dtype.kind not in "biuf":
            raise TypeError(
                f"loss_fn_inputs[{key!r}]: expected numbers, got values of dtype {arr.dtype}"
            )
        if arr.size == 0 and arr.ndim == 1:
            return TensorData(data=[], dtype=dtype, shape=[0])
        return TensorData.from_numpy(arr.astype(np.int64 if dtype == "int64" else np.float32))
    converted = from_official(value, (TensorData,), f"loss_fn_inputs[{key!r}]")
    if converted is not _MISSING:  # an official tinker.TensorData
        return cast(TensorData, converted)
    raise TypeError(
        f"loss_fn_inputs[{key!r}]: unsupported value type {type(value).__name__}; use a list, "
        "numpy array, torch tensor or TensorData"
    )


def _coerce_inputs(value: Any) -> dict[str, TensorData]:
    if not isinstance(value, Mapping):
        raise TypeError(f"Datum.loss_fn_inputs: expected a dict, got {type(value).__name__}")
    out: dict[str, TensorData] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"Datum.loss_fn_inputs: keys must be str, got {key!r}")
        value_ = TensorData.model_validate(item) if isinstance(item, Mapping) else item
        out[key] = coerce_loss_fn_input(key, value_)
    return out


def _check_span(span: "PromptProvenanceSpan | SampledProvenanceSpan") -> None:
    name = type(span).__name__
    if not span.sequence_id:
        raise ValueError(f"{name}.sequence_id must be non-empty")
    for attr in ("offset", "length"):
        value = getattr(span, attr)
        if value < 0:
            raise ValueError(f"{name}.{attr} must be >= 0, got {value}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptProvenanceSpan(TinkerDataclass, TinkerRequest):
    """A run of datum positions equal to ``[offset, offset+length)`` of a sampled request's prompt.

    A frozen stdlib dataclass, as in the official SDK (``dataclasses.replace`` works).
    """

    sequence_id: str
    offset: int = 0
    length: int
    type: Literal["prompt_tokens"] = "prompt_tokens"
    """JSON tag of this span kind (the proto oneof name); not needed when constructing."""

    def _tinker_validate(self) -> None:
        _check_span(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampledProvenanceSpan(TinkerDataclass, TinkerRequest):
    """A run of datum positions equal to ``[offset, offset+length)`` of a sampled sequence.

    A frozen stdlib dataclass, as in the official SDK (``dataclasses.replace`` works).
    """

    sequence_id: str
    offset: int = 0
    length: int
    type: Literal["sampled_tokens"] = "sampled_tokens"
    """JSON tag of this span kind (the proto oneof name); not needed when constructing."""

    def _tinker_validate(self) -> None:
        _check_span(self)


ProvenanceSpans: TypeAlias = list[PromptProvenanceSpan | SampledProvenanceSpan]
"""Consecutive runs tiling one Datum field; see ``Datum.with_provenance``."""


def _check_tiling(kwarg: str, spans: ProvenanceSpans, expected: int) -> None:
    total = sum(span.length for span in spans)
    if total != expected:
        raise ValueError(
            f"with_provenance {kwarg} spans cover {total} positions but the field has "
            f"{expected}; the runs must tile it exactly"
        )


@dataclasses.dataclass(frozen=True)
class Datum(TinkerDataclass):
    """One training example: ``Datum(model_input=mi, loss_fn_inputs={"target_tokens": [...]})``.

    ``loss_fn_inputs`` values are coerced by key: TensorData kept, numpy arrays and torch
    tensors converted, plain lists typed by key (``target_tokens`` int64; ``weights``,
    ``advantages``, ``logprobs``, ``clip_*_threshold``, ``sequence_ratio_mask`` float32).
    A frozen stdlib dataclass, as in the official SDK (``dataclasses.replace`` works).
    """

    model_input: ModelInput
    loss_fn_inputs: LossFnInputs = dataclasses.field(
        default_factory=dict, metadata={"convert": _coerce_inputs}
    )
    model_input_spans: ProvenanceSpans | None = None
    loss_fn_input_spans: ProvenanceSpans | None = None

    if TYPE_CHECKING:
        # The generated constructor also takes lists, numpy arrays and torch tensors as
        # ``loss_fn_inputs`` values (converted by key, see above).
        def __init__(
            self,
            model_input: ModelInput,
            loss_fn_inputs: Mapping[str, Any] = ...,
            model_input_spans: ProvenanceSpans | None = None,
            loss_fn_input_spans: ProvenanceSpans | None = None,
        ) -> None: ...

    def _tinker_validate(self) -> None:
        if (self.model_input_spans is None) != (self.loss_fn_input_spans is None):
            raise ValueError(
                "Datum: provenance comes as a pair: set both model_input_spans and "
                "loss_fn_input_spans, or neither"
            )

    def with_provenance(
        self, model_input: ProvenanceSpans, loss_fn_inputs: ProvenanceSpans
    ) -> "Datum":
        """Return a copy carrying provenance spans, after checking each list tiles its field.

        ``model_input`` spans tile the input tokens; ``loss_fn_inputs`` spans tile
        ``loss_fn_inputs["target_tokens"]`` (when it is 1-D).
        """
        _check_tiling("model_input", model_input, self.model_input.length)
        target = self.loss_fn_inputs.get("target_tokens")
        if target is not None and target.shape is not None and len(target.shape) == 1:
            _check_tiling("loss_fn_inputs", loss_fn_inputs, target.shape[0])
        return dataclasses.replace(
            self, model_input_spans=model_input, loss_fn_input_spans=loss_fn_inputs
        )


@dataclasses.dataclass(frozen=True)
class ForwardBackwardInput(TinkerDataclass, TinkerRequest):
    """The logical forward/backward request (sent as protobuf, see ``_wire``).

    Construction checks the loss name and rejects ``image_asset_pointer`` chunks in the data.
    A frozen stdlib dataclass, as in the official SDK.
    """

    data: list[Datum]
    loss_fn: LossFnType = dataclasses.field(metadata={"convert": validate_loss_fn})
    loss_fn_config: dict[str, float | str] | None = None

    def _tinker_validate(self) -> None:
        for i, datum in enumerate(self.data):
            for chunk in datum.model_input.chunks:
                if isinstance(chunk, ImageAssetPointerChunk):
                    raise ValueError(
                        f"ForwardBackwardInput.data[{i}]: image_asset_pointer chunks are only "
                        "valid in sampling prompts, not in forward/backward data"
                    )


@dataclasses.dataclass(frozen=True)
class ForwardBackwardRequest(TinkerDataclass, TinkerRequest):
    """A forward/backward call as the official SDK models it: input, model id, sequence id.

    tinker_sync encodes forward_backward bodies straight from the training client; this type
    exists so code written for the official SDK can build and inspect one.
    """

    forward_backward_input: ForwardBackwardInput
    model_id: str
    seq_id: int | None = None


@dataclasses.dataclass(frozen=True)
class ForwardRequest(TinkerDataclass, TinkerRequest):
    """A forward (no backward) call as the official SDK models it."""

    forward_input: ForwardBackwardInput
    model_id: str
    seq_id: int | None = None
