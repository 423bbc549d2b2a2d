"""Results of sampling and of ``forward`` / ``forward_backward``, and a future's first reply.

The results of the other operations are in ``_opresults`` (loaded on first use, so a first
sample does not build them: docs/scale-out.md#start-up); their old names here still work.

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

import array
import dataclasses
import math
from collections.abc import Sequence
from functools import cached_property
from typing import Any, ClassVar

import attrs

from tinker_sync._lazynp import AnyArray, is_ndarray, np_isinstance
from tinker_sync.types._base import (
    TinkerDataclass,
    TinkerModel,
    check_for,
    checked,
    dump,
    moved_names,
)
from tinker_sync.types._params import StopReason
from tinker_sync.types._tensor import TensorData

__all__ = [
    "TOPK_SENTINEL_LOGPROB",
    "TOPK_SENTINEL_TOKEN",
    "ForwardBackwardOutput",
    "PromptAltTokens",
    "SampleResponse",
    "SampledSequence",
    "TopkLogprobs",
    "UntypedAPIFuture",
]

TOPK_SENTINEL_TOKEN = 0
"""Token id of an empty top-k slot."""
TOPK_SENTINEL_LOGPROB = -99999.0
"""Logprob of an empty top-k slot."""

TopkRows = list[list[tuple[int, float]] | None]


def _array_eq(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if not (is_ndarray(a) or is_ndarray(b)):  # decoded 1-D arrays (array.array): no numpy
        return len(a) == len(b) and all(
            x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
        )
    import numpy as np

    a_arr = np.asarray(a)
    b_arr = np.asarray(b)
    if a_arr.shape != b_arr.shape:
        return False
    if a_arr.dtype.kind == "f" or b_arr.dtype.kind == "f":
        return bool(np.array_equal(a_arr, b_arr, equal_nan=True))
    return bool(np.array_equal(a_arr, b_arr))


def _tensor_eq(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, TensorData) and isinstance(b, TensorData):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.sparse_crow_indices == b.sparse_crow_indices
            and a.sparse_col_indices == b.sparse_col_indices
            and _array_eq(a.data_np, b.data_np)
        )
    return a is b


def _int_array(value: Any, path: str, ndim: int, dtype: Any = "int32") -> AnyArray:
    import numpy as np

    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TypeError(f"{path}: expected an integer array, got dtype {value.dtype}")
        arr = value
    else:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(f"{path}: expected an integer array, got {type(value).__name__}")
        try:
            arr = np.asarray(value, dtype=dtype) if len(value) else np.empty(0, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: expected integers: {exc}") from None
    if arr.ndim != ndim and not (arr.size == 0 and ndim == 2):
        raise ValueError(f"{path}: expected a {ndim}-D array, got shape {arr.shape}")
    return arr


def _float_array(value: Any, path: str, ndim: int) -> AnyArray:
    import numpy as np

    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiu":
            raise TypeError(f"{path}: expected a float array, got dtype {value.dtype}")
        arr = value if value.dtype.kind == "f" else value.astype(np.float32)
    else:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(f"{path}: expected a float array, got {type(value).__name__}")
        try:
            arr = np.asarray(
                [np.nan if v is None else v for v in value] if ndim == 1 else value,
                dtype=np.float32,
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: expected numbers: {exc}") from None
        if arr.size == 0:
            arr = arr.reshape((0,) * ndim) if ndim == 1 else arr.reshape(0, 0)
    if arr.ndim != ndim:
        raise ValueError(f"{path}: expected a {ndim}-D array, got shape {arr.shape}")
    return arr


def topk_to_lists(token_ids: AnyArray, logprobs: AnyArray) -> TopkRows:
    """Convert ``(length, k)`` matrices to rows of ``(token_id, logprob)`` tuples.

    A row whose first slot is the sentinel (token 0, logprob -99999.0) becomes None; trailing
    sentinel slots are dropped.
    """
    if token_ids.ndim != 2:
        return []
    n, k = token_ids.shape
    if n == 0 or k == 0:
        return []
    ids = token_ids.ravel().tolist()
    lps = logprobs.ravel().tolist()
    rows: TopkRows = []
    for i in range(n):
        start = i * k
        if ids[start] == TOPK_SENTINEL_TOKEN and lps[start] == TOPK_SENTINEL_LOGPROB:
            rows.append(None)
            continue
        end = start + k
        while (
            end > start
            and ids[end - 1] == TOPK_SENTINEL_TOKEN
            and (lps[end - 1] == TOPK_SENTINEL_LOGPROB)
        ):
            end -= 1
        rows.append(list(zip(ids[start:end], lps[start:end], strict=True)))
    return rows


def _pairs_of(row: Any, path: str) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for j, pair in enumerate(row):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"{path}[{j}]: expected a (token_id, logprob) pair, got {pair!r}")
        tok, lp = pair
        if isinstance(tok, bool) or not (isinstance(tok, int) or np_isinstance(tok, "integer")):
            raise TypeError(f"{path}[{j}][0]: expected int token id, got {tok!r}")
        if isinstance(lp, bool) or not (
            isinstance(lp, (int, float)) or np_isinstance(lp, "number")
        ):
            raise TypeError(f"{path}[{j}][1]: expected float logprob, got {lp!r}")
        out.append((int(tok), float(lp)))
    return out


def _topk_ids(value: Any) -> AnyArray:
    return _int_array(value, "TopkLogprobs.token_ids", 2)


def _topk_lps(value: Any) -> AnyArray:
    return _float_array(value, "TopkLogprobs.logprobs", 2)


@attrs.frozen(field_transformer=checked)
class TopkLogprobs(TinkerModel):
    """Top-k tokens per position as two dense ``(length, k)`` matrices.

    Empty slots hold the sentinel (token 0, logprob -99999.0).
    """

    token_ids: AnyArray = attrs.field(
        converter=_topk_ids,
        eq=attrs.cmp_using(eq=_array_eq, require_same_type=False),
        repr=False,
    )
    logprobs: AnyArray = attrs.field(
        converter=_topk_lps,
        eq=attrs.cmp_using(eq=_array_eq, require_same_type=False),
        repr=False,
    )

    def __attrs_post_init__(self) -> None:
        if self.token_ids.shape != self.logprobs.shape:
            raise ValueError(
                f"TopkLogprobs: token_ids {self.token_ids.shape} and logprobs "
                f"{self.logprobs.shape} must have the same shape"
            )

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[Any] | None]) -> "TopkLogprobs":
        """Build the matrices from rows of ``(token_id, logprob)`` pairs (None = empty row)."""
        import numpy as np

        parsed = [None if r is None else _pairs_of(r, f"topk[{i}]") for i, r in enumerate(rows)]
        k = max((len(r) for r in parsed if r is not None), default=0)
        ids = np.full((len(parsed), k), TOPK_SENTINEL_TOKEN, dtype=np.int32)
        lps = np.full((len(parsed), k), TOPK_SENTINEL_LOGPROB, dtype=np.float32)
        for i, row in enumerate(parsed):
            if row:
                ids[i, : len(row)] = [t for t, _ in row]
                lps[i, : len(row)] = [lp for _, lp in row]
        return cls(token_ids=ids, logprobs=lps)

    def to_lists(self) -> TopkRows:
        """Rows of ``(token_id, logprob)`` tuples; sentinel rows become None."""
        return topk_to_lists(self.token_ids, self.logprobs)

    def __repr__(self) -> str:
        return f"TopkLogprobs(shape={self.token_ids.shape})"

    def _tinker_dump(self, json: bool, drop_none: bool, wire: bool) -> dict[str, Any]:
        return {"token_ids": self.token_ids.tolist(), "logprobs": self.logprobs.tolist()}


def _topk_rows_dump(topk: TopkLogprobs | None, json: bool) -> Any:
    if topk is None:
        return None
    rows = topk.to_lists()
    if json:
        return [None if r is None else [[t, lp] for t, lp in r] for r in rows]
    return rows


def _topk_arg(value: Any, path: str) -> TopkLogprobs | None:
    if value is None or isinstance(value, TopkLogprobs):
        return value
    if isinstance(value, (list, tuple)):
        try:
            return TopkLogprobs.from_lists(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{path}: {exc}") from None
    raise TypeError(f"{path}: expected TopkLogprobs or a list of rows, got {type(value).__name__}")


def _opt_tokens(value: Any) -> AnyArray | None:
    return None if value is None else _int_array(value, "SampledSequence.tokens_np", 1)


def _opt_logprobs(value: Any) -> AnyArray | None:
    return None if value is None else _float_array(value, "SampledSequence.logprobs_np", 1)


def _opt_prompt_logprobs(value: Any) -> AnyArray | None:
    return None if value is None else _float_array(value, "SampleResponse.prompt_logprobs_np", 1)


# A decoded result keeps its 1-D arrays as ``array.array`` (int32 "i", float32 "f") and builds
# the numpy field on first access, so sampling imports no numpy unless the caller reads an
# ``*_np`` field (docs/scale-out.md#start-up).
_RAW_DTYPES = {"i": "int32", "f": "float32"} if array.array("i").itemsize == 4 else {"f": "float32"}


def _set_array(obj: Any, name: str, value: Any, convert: Any, typecode: str) -> None:
    """Store field ``name``: a decoded ``array.array`` of ``typecode`` as is (its numpy
    array is built on first access), anything else through ``convert``."""
    if type(value) is array.array and value.typecode == typecode and typecode in _RAW_DTYPES:
        obj.__dict__["_raw_" + name] = value
    else:
        obj.__dict__[name] = convert(value)


def _stored(obj: Any, name: str) -> Any:
    """Field ``name`` as stored: the numpy array (or None), else the decoded ``array.array``."""
    d = obj.__dict__
    return d[name] if name in d else d.get("_raw_" + name)


class _LazyArray:
    """A numpy field of a decoded result, built from its ``array.array`` on first access.

    A non-data descriptor: once built (or when the constructor stored an array), the value in the
    instance's ``__dict__`` is read directly. Concurrent first reads all get the same array.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return None  # the dataclass default
        raw = obj.__dict__.get("_raw_" + self.name)
        if raw is None:
            return None
        import numpy as np

        arr = np.array(raw, dtype=_RAW_DTYPES[raw.typecode])
        return obj.__dict__.setdefault(self.name, arr)


_set = object.__setattr__
_check_stop_reason = check_for(StopReason)
_check_opt_str = check_for(str | None)
_check_opt_topk = check_for(TopkLogprobs | None)
_check_int = check_for(int)
_check_opt_tensor = check_for(TensorData | None)


def _eq_fields(a: Any, b: Any, names: Sequence[str], arrays: frozenset[str]) -> bool:
    """Field-wise equality where numpy / TensorData fields compare by value."""
    if a is b:
        return True
    if type(a) is not type(b):
        return NotImplemented  # type: ignore[no-any-return]
    for name in names:
        if name in arrays:
            x, y = _stored(a, name), _stored(b, name)
        else:
            x, y = getattr(a, name), getattr(b, name)
        if name in arrays:
            same = _tensor_eq(x, y) if isinstance(x, TensorData) else _array_eq(x, y)
            if not same:
                return False
        elif x != y:
            return False
    return True


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class SampledSequence(TinkerDataclass):
    """One sampled sequence: numpy fields plus lazy list views.

    Usage: ``seq.tokens`` (list), ``seq.tokens_np`` (int32 array), ``seq.logprobs``.
    A received sequence builds ``tokens_np`` / ``logprobs_np`` on first read (numpy is imported
    then, not by sampling).
    The constructor also accepts the list forms ``tokens=``, ``logprobs=``, ``topk_logprobs=``
    (and the official SDK's ``_tokens_list=`` spellings); given with the array, the list wins,
    so ``dataclasses.replace(seq, tokens=[...])`` works. ``sequence_id`` is None until the
    client stamps the id from the ``asample`` reply. A frozen stdlib dataclass, as in the
    official SDK.

    Thread safety: immutable (list views are computed once), safe to share. Fork safety: data.
    """

    stop_reason: StopReason
    sequence_id: str | None
    tokens_np: AnyArray | None = None
    logprobs_np: AnyArray | None = None
    topk_logprobs_np: TopkLogprobs | None = None

    _tinker_extra_init: ClassVar[frozenset[str]] = frozenset(
        {"tokens", "logprobs", "topk_logprobs"}
    )

    def __init__(
        self,
        stop_reason: StopReason,
        sequence_id: str | None = None,
        tokens_np: Any = None,
        logprobs_np: Any = None,
        topk_logprobs_np: TopkLogprobs | None = None,
        _tokens_list: Sequence[int] | None = None,
        _logprobs_list: Sequence[float] | None = None,
        _topk_logprobs_list: Sequence[Sequence[Any] | None] | None = None,
        *,
        tokens: Sequence[int] | None = None,
        logprobs: Sequence[float] | None = None,
        topk_logprobs: Sequence[Sequence[Any] | None] | None = None,
    ) -> None:
        tokens = _one_of("tokens", tokens, _tokens_list)
        logprobs = _one_of("logprobs", logprobs, _logprobs_list)
        topk_logprobs = _one_of("topk_logprobs", topk_logprobs, _topk_logprobs_list)
        # A list form wins over the array (as the official list views do), so that
        # dataclasses.replace(seq, tokens=[...]) and model_copy(update=...) work.
        if tokens is not None:
            tokens_np = tokens
        if logprobs is not None:
            logprobs_np = logprobs
        if topk_logprobs is not None:
            topk_logprobs_np = _topk_arg(topk_logprobs, "SampledSequence.topk_logprobs")
        _set(self, "stop_reason", _check_stop_reason(stop_reason, "SampledSequence.stop_reason"))
        _set(self, "sequence_id", _check_opt_str(sequence_id, "SampledSequence.sequence_id"))
        _set_array(self, "tokens_np", tokens_np, _opt_tokens, "i")
        _set_array(self, "logprobs_np", logprobs_np, _opt_logprobs, "f")
        _set(
            self,
            "topk_logprobs_np",
            _check_opt_topk(topk_logprobs_np, "SampledSequence.topk_logprobs_np"),
        )

    def __repr__(self) -> str:
        return (
            f"SampledSequence(stop_reason={self.stop_reason!r}, sequence_id={self.sequence_id!r})"
        )

    def __eq__(self, other: object) -> bool:
        return _eq_fields(self, other, _SEQ_FIELDS, _SEQ_ARRAYS)

    __hash__ = None  # type: ignore[assignment]

    @cached_property
    def tokens(self) -> list[int]:
        """Generated token ids as a list (converted once)."""
        stored = _stored(self, "tokens_np")
        if stored is None:
            return []
        out: list[int] = stored.tolist()
        return out

    @cached_property
    def logprobs(self) -> list[float] | None:
        """Per-token logprobs as a list, or None when not requested."""
        stored = _stored(self, "logprobs_np")
        if stored is None:
            return None
        out: list[float] = stored.tolist()
        return out

    @cached_property
    def topk_logprobs(self) -> TopkRows | None:
        """Top-k ``(token_id, logprob)`` rows per generated position, or None."""
        if self.topk_logprobs_np is None:
            return None
        return self.topk_logprobs_np.to_lists()

    def _tinker_dump(self, json: bool, drop_none: bool, wire: bool) -> dict[str, Any]:
        tokens, logprobs = _stored(self, "tokens_np"), _stored(self, "logprobs_np")
        out: dict[str, Any] = {
            "stop_reason": self.stop_reason,
            "sequence_id": self.sequence_id,
            "tokens": [] if tokens is None else tokens.tolist(),
            "logprobs": None if logprobs is None else logprobs.tolist(),
            "topk_logprobs": _topk_rows_dump(self.topk_logprobs_np, json),
        }
        if drop_none:
            out = {k: v for k, v in out.items() if v is not None}
        return out


_SEQ_FIELDS = ("stop_reason", "sequence_id", "tokens_np", "logprobs_np", "topk_logprobs_np")
_SEQ_ARRAYS = frozenset({"tokens_np", "logprobs_np"})
setattr(SampledSequence, "tokens_np", _LazyArray("tokens_np"))  # noqa: B010
setattr(SampledSequence, "logprobs_np", _LazyArray("logprobs_np"))  # noqa: B010


def _one_of(name: str, public: Any, private: Any) -> Any:
    if private is None:
        return public
    if public is not None:
        raise TypeError(f"pass {name} or _{name}_list, not both")
    return private


@dataclasses.dataclass(frozen=True)
class PromptAltTokens(TinkerDataclass):
    """Alternative draws at every prompt position after the first: two ``[len(prompt)-1, k]``
    tensors (``tokens`` int64, ``logprobs`` float32). A frozen stdlib dataclass, as in the
    official SDK; equality compares the tensors' values.
    """

    tokens: TensorData
    logprobs: TensorData

    def __eq__(self, other: object) -> bool:
        return _eq_fields(self, other, ("tokens", "logprobs"), _ALT_ARRAYS)

    __hash__ = None  # type: ignore[assignment]


_ALT_ARRAYS = frozenset({"tokens", "logprobs"})


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class SampleResponse(TinkerDataclass):
    """Result of ``sample`` / ``compute_logprobs``: sequences and optional prompt logprobs.

    ``prompt_logprobs_np`` is float32 with NaN where nothing was computed; the lazy list view
    ``prompt_logprobs`` has None there. The constructor also accepts the list forms
    ``prompt_logprobs=`` and ``topk_prompt_logprobs=`` (and the official SDK's
    ``_prompt_logprobs_list=`` spellings). A frozen stdlib dataclass, as in the official SDK.

    Thread safety: immutable (list views are computed once), safe to share. Fork safety: data.
    """

    sequences: list[SampledSequence]
    prompt_logprobs_np: AnyArray | None = None
    topk_prompt_logprobs_np: TopkLogprobs | None = None
    target_prompt_logprobs: TensorData | None = None
    prompt_cache_hit_tokens: int = 0
    prompt_alt_tokens: PromptAltTokens | None = None

    _tinker_extra_init: ClassVar[frozenset[str]] = frozenset(
        {"prompt_logprobs", "topk_prompt_logprobs"}
    )

    def __init__(
        self,
        sequences: Sequence[SampledSequence],
        prompt_logprobs_np: Any = None,
        topk_prompt_logprobs_np: TopkLogprobs | None = None,
        target_prompt_logprobs: TensorData | None = None,
        prompt_cache_hit_tokens: int = 0,
        prompt_alt_tokens: PromptAltTokens | None = None,
        _prompt_logprobs_list: Sequence[float | None] | None = None,
        _topk_prompt_logprobs_list: Sequence[Sequence[Any] | None] | None = None,
        *,
        prompt_logprobs: Sequence[float | None] | None = None,
        topk_prompt_logprobs: Sequence[Sequence[Any] | None] | None = None,
    ) -> None:
        prompt_logprobs = _one_of("prompt_logprobs", prompt_logprobs, _prompt_logprobs_list)
        topk_prompt_logprobs = _one_of(
            "topk_prompt_logprobs", topk_prompt_logprobs, _topk_prompt_logprobs_list
        )
        if prompt_logprobs is not None:  # the list form wins (see SampledSequence)
            prompt_logprobs_np = prompt_logprobs
        if topk_prompt_logprobs is not None:
            topk_prompt_logprobs_np = _topk_arg(
                topk_prompt_logprobs, "SampleResponse.topk_prompt_logprobs"
            )
        _set(self, "sequences", _check_sequences(sequences, "SampleResponse.sequences"))
        _set_array(self, "prompt_logprobs_np", prompt_logprobs_np, _opt_prompt_logprobs, "f")
        _set(
            self,
            "topk_prompt_logprobs_np",
            _check_opt_topk(topk_prompt_logprobs_np, "SampleResponse.topk_prompt_logprobs_np"),
        )
        _set(
            self,
            "target_prompt_logprobs",
            _check_opt_tensor(target_prompt_logprobs, "SampleResponse.target_prompt_logprobs"),
        )
        _set(
            self,
            "prompt_cache_hit_tokens",
            _check_int(prompt_cache_hit_tokens, "SampleResponse.prompt_cache_hit_tokens"),
        )
        _set(
            self,
            "prompt_alt_tokens",
            _check_opt_alt(prompt_alt_tokens, "SampleResponse.prompt_alt_tokens"),
        )

    def __repr__(self) -> str:
        return (
            f"SampleResponse(sequences={self.sequences!r}, "
            f"target_prompt_logprobs={self.target_prompt_logprobs!r}, "
            f"prompt_cache_hit_tokens={self.prompt_cache_hit_tokens!r}, "
            f"prompt_alt_tokens={self.prompt_alt_tokens!r})"
        )

    def __eq__(self, other: object) -> bool:
        return _eq_fields(self, other, _RESP_FIELDS, _RESP_ARRAYS)

    __hash__ = None  # type: ignore[assignment]

    @cached_property
    def prompt_logprobs(self) -> list[float | None] | None:
        """Prompt logprobs as a list (None where not computed), or None when not requested."""
        stored = _stored(self, "prompt_logprobs_np")
        if stored is None:
            return None
        values: list[float] = stored.tolist()
        return [None if math.isnan(v) else v for v in values]

    @cached_property
    def topk_prompt_logprobs(self) -> TopkRows | None:
        """Top-k ``(token_id, logprob)`` rows per prompt position, or None."""
        if self.topk_prompt_logprobs_np is None:
            return None
        return self.topk_prompt_logprobs_np.to_lists()

    def _tinker_dump(self, json: bool, drop_none: bool, wire: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sequences": [s._tinker_dump(json, drop_none, wire) for s in self.sequences],
            "prompt_logprobs": self.prompt_logprobs,
            "topk_prompt_logprobs": _topk_rows_dump(self.topk_prompt_logprobs_np, json),
            "target_prompt_logprobs": dump(self.target_prompt_logprobs, json, drop_none, wire),
            "prompt_cache_hit_tokens": self.prompt_cache_hit_tokens,
            "prompt_alt_tokens": dump(self.prompt_alt_tokens, json, drop_none, wire),
        }
        if drop_none:
            out = {k: v for k, v in out.items() if v is not None}
        return out


_check_sequences = check_for(list[SampledSequence])
_check_opt_alt = check_for(PromptAltTokens | None)
_RESP_FIELDS = (
    "sequences",
    "prompt_logprobs_np",
    "topk_prompt_logprobs_np",
    "target_prompt_logprobs",
    "prompt_cache_hit_tokens",
    "prompt_alt_tokens",
)
_RESP_ARRAYS = frozenset({"prompt_logprobs_np", "target_prompt_logprobs"})
setattr(SampleResponse, "prompt_logprobs_np", _LazyArray("prompt_logprobs_np"))  # noqa: B010


@dataclasses.dataclass(frozen=True)
class ForwardBackwardOutput(TinkerDataclass):
    """Result of ``forward`` / ``forward_backward``: per-datum outputs and reduced metrics.

    ``loss_fn_outputs[i]`` maps a name (typically ``logprobs``) to a TensorData; metric keys
    look like ``name:reduction`` (e.g. ``loss:sum``). A frozen stdlib dataclass, as in the
    official SDK (equality compares TensorData by identity, like the official type).
    """

    loss_fn_output_type: str
    loss_fn_outputs: list[dict[str, TensorData]]
    #: ``hash2`` reductions are exact ints (they may exceed 2**53); the rest are floats.
    metrics: dict[str, int | float] = dataclasses.field(default_factory=dict)


@attrs.frozen(kw_only=True, field_transformer=checked)
class UntypedAPIFuture(TinkerModel):
    """Immediate reply of a future endpoint."""

    request_id: str
    model_id: str | None = None
    sample_sequence_ids: list[str] | None = None


#: The names that moved to ``_opresults`` (for imports and pickles that name this module).
__getattr__ = moved_names(
    __name__,
    "tinker_sync.types._opresults",
    (
        "GetInfoResponse",
        "GetServerCapabilitiesResponse",
        "LoadWeightsResponse",
        "ModelData",
        "OptimStepResponse",
        "SaveWeightsExternalResponse",
        "SaveWeightsForSamplerResponse",
        "SaveWeightsResponse",
        "SupportedModel",
        "WeightsInfoResponse",
        "checkpoint_console_url",
        "checkpoint_playground_url",
    ),
)
