"""The JSON codec of tinker_sync: one cattrs converter, built on the first parse.

Usage::

    from tinker_sync._wire._converter import from_json, to_json

    body = to_json(types.SampleRequest(...))            # the exact wire JSON (a dict)
    reply = from_json(types.CreateSessionResponse, data)  # strict, names the bad field

Rules (docs/design/behavior.md#strict-converter, docs/design/behavior.md#json-encoding-rules):

* Primitives are strict: ``1.9`` is not an int, ``"false"`` is not a bool, ``5`` is not a str and
  ``True`` is not an int. Ints are accepted (and widened) where a float is expected.
* Request types reject unknown keys; response types ignore them.
* ``to_json`` sends every default (including ``type`` discriminators) and drops None, except the
  null allowlist (finish ``detail``, checkpoint TTL ``ttl_seconds``).
* Model-input chunks are a union tagged by ``type``; other unions are tagged too (``state`` for
  future completions, ``event`` for telemetry, ``type`` for optimizer configs and params).
* Token and tensor arrays pass through numpy (no per-element cattrs work); datetimes are ISO 8601
  and come back timezone-aware in UTC; bytes travel as base64.

Errors are :class:`WireValidationError` (a ``ValueError``) whose message lists every bad field as
``message @ $.path.to[3].field``.

Each type's structure hook is generated on its first use and cached by the converter (never per
call): a process that only samples never builds the training or REST hooks, nor imports the
REST types (part of a spawned worker's start-up, docs/scale-out.md).

The converter (and cattrs) is built on the first :func:`from_json`, not at import: writing
requests (:func:`to_json`, :func:`omit_new_defaults`) needs no cattrs, so a worker that rebuilds
a sampling client from its handle and samples never imports it (docs/scale-out.md).

Thread safety: the converter is built once, under a lock, and its configuration never changes;
all functions are safe to call from any thread (two threads that first use the same type at
once may both generate its hook, and get the same behaviour). Fork safety: no process-local
state.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, cast

import attrs

from tinker_sync import types as T
from tinker_sync._lazynp import is_ndarray
from tinker_sync._runtime.causes import signal_exception
from tinker_sync._runtime.fork import make_lock
from tinker_sync.exceptions import RequestErrorCategory
from tinker_sync.types._base import (
    check_bytes,
    dump,
    is_model_class,
    parse_datetime,
    tag_of,
    to_utc,
)

if typing.TYPE_CHECKING:
    import cattrs
    import numpy as np

__all__ = ["WireValidationError", "converter", "from_json", "to_json"]

_T = TypeVar("_T")


class WireValidationError(ValueError):
    """JSON data that does not fit the expected type.

    Attributes:
        type_name: name of the target type.
        errors: one ``"message @ $.path"`` line per bad field.
    """

    def __init__(self, type_name: str, errors: list[str]) -> None:
        self.type_name = type_name
        self.errors = errors
        super().__init__(f"invalid {type_name}: " + "; ".join(errors))

    def __reduce__(self) -> tuple[Any, ...]:
        return (WireValidationError, (self.type_name, self.errors))


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


# -- strict primitive hooks -------------------------------------------------------------------


def _s_int(value: Any, _: Any) -> int:
    if type(value) is int:
        return value
    raise TypeError(f"expected int, got {_describe(value)}")


def _s_float(value: Any, _: Any) -> float:
    t = type(value)
    if t is float:
        return cast(float, value)
    if t is int:
        return float(value)
    raise TypeError(f"expected float, got {_describe(value)}")


def _s_str(value: Any, _: Any) -> str:
    if type(value) is str:
        return value
    raise TypeError(f"expected str, got {_describe(value)}")


def _s_bool(value: Any, _: Any) -> bool:
    if type(value) is bool:
        return value
    raise TypeError(f"expected bool, got {_describe(value)}")


def _s_bytes(value: Any, _: Any) -> bytes:
    return check_bytes(value, "value", strict=True)


def _s_datetime(value: Any, _: Any) -> _dt.datetime:
    if isinstance(value, str):
        return parse_datetime(value, "value")
    if isinstance(value, _dt.datetime):
        return to_utc(value)
    raise TypeError(f"expected an ISO 8601 datetime string, got {_describe(value)}")


def _s_any(value: Any, _: Any) -> Any:
    return value


def _s_category(value: Any, _: Any) -> RequestErrorCategory:
    return RequestErrorCategory(value)


_INT_ONLY = {int}


def _s_int_seq(value: Any, _: Any) -> Sequence[int]:
    """Token lists: validated in one pass, numpy arrays passed through."""
    if is_ndarray(value):
        if value.dtype.kind not in "iu":
            raise TypeError(f"expected integer tokens, got array of dtype {value.dtype}")
        return cast(Sequence[int], value)
    if type(value) is not list:
        raise TypeError(f"expected a list of int, got {_describe(value)}")
    if value and set(map(type, value)) != _INT_ONLY:
        for i, v in enumerate(value):
            if type(v) is not int:
                raise TypeError(f"expected int at index {i}, got {_describe(v)}")
    return value


def _is_ndarray_type(t: Any) -> bool:
    np = sys.modules.get("numpy")  # no type is numpy's before numpy is imported
    ndarray = getattr(np, "ndarray", None)
    return ndarray is not None and (t is ndarray or typing.get_origin(t) is ndarray)


# -- special model hooks ----------------------------------------------------------------------


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a JSON object for {what}, got {_describe(value)}")
    return value


def _s_tensor_data(value: Any, _: Any) -> T.TensorData:
    obj = _mapping(value, "TensorData")
    dtype = obj.get("dtype")
    if dtype not in ("int64", "float32"):
        raise ValueError(f"TensorData.dtype must be 'int64' or 'float32', got {dtype!r}")
    data = obj.get("data", [])
    import numpy as np

    if isinstance(data, np.ndarray):
        arr = data
    else:
        if type(data) is not list:
            raise TypeError(f"TensorData.data: expected a list of numbers, got {_describe(data)}")
        try:
            arr = np.asarray(data)
        except ValueError:
            raise ValueError("TensorData.data must be a rectangular list of numbers") from None
    if arr.size:
        kind = arr.dtype.kind
        if kind not in "iuf" or (dtype == "int64" and kind == "f"):
            raise TypeError(
                f"TensorData.data: expected {'integers' if dtype == 'int64' else 'numbers'} for "
                f"dtype {dtype}, got values of numpy kind {arr.dtype}"
            )
    shape = obj.get("shape")
    if shape is not None:
        shape = [_s_int(d, int) for d in _list(shape, "TensorData.shape")]
    crow = obj.get("sparse_crow_indices")
    col = obj.get("sparse_col_indices")
    if crow is not None:
        crow = [_s_int(d, int) for d in _list(crow, "TensorData.sparse_crow_indices")]
    if col is not None:
        col = [_s_int(d, int) for d in _list(col, "TensorData.sparse_col_indices")]
    return T.TensorData(
        data=arr,
        dtype=dtype,
        shape=shape,
        sparse_crow_indices=crow,
        sparse_col_indices=col,
    )


def _list(value: Any, what: str) -> list[Any]:
    if type(value) is not list:
        raise TypeError(f"{what}: expected a list, got {_describe(value)}")
    return value


def _float_list(value: Any, what: str) -> np.ndarray[Any, Any]:
    """A JSON list of numbers (null -> NaN) as float32."""
    import numpy as np

    items = _list(value, what)
    out = np.empty(len(items), dtype=np.float32)
    for i, v in enumerate(items):
        if v is None:
            out[i] = np.nan
        elif type(v) is float or type(v) is int:
            out[i] = v
        else:
            raise TypeError(f"{what}[{i}]: expected float or null, got {_describe(v)}")
    return out


def _topk_rows(value: Any, what: str) -> T.TopkLogprobs | None:
    """Rows of ``[token_id, logprob]`` pairs (null rows allowed); k or length 0 means absent."""
    if value is None:
        return None
    rows = _list(value, what)
    for i, row in enumerate(rows):
        if row is not None and type(row) is not list:
            raise TypeError(f"{what}[{i}]: expected a list of [token_id, logprob] or null")
    topk = T.TopkLogprobs.from_lists(rows)
    if 0 in topk.token_ids.shape:
        return None
    return topk


_SEQUENCE_KEYS = frozenset(
    {"stop_reason", "sequence_id", "tokens", "logprobs", "topk_logprobs", "tokens_np"}
)


def _s_sampled_sequence(value: Any, _: Any) -> T.SampledSequence:
    obj = _mapping(value, "SampledSequence")
    stop_reason = obj.get("stop_reason")
    if stop_reason not in ("stop", "length"):
        raise ValueError(
            f"SampledSequence.stop_reason: expected 'stop' or 'length', got {stop_reason!r}"
        )
    sequence_id = obj.get("sequence_id")
    if sequence_id is not None and type(sequence_id) is not str:
        raise TypeError(f"SampledSequence.sequence_id: expected str, got {_describe(sequence_id)}")
    import numpy as np

    tokens = np.asarray(_s_int_seq(obj.get("tokens", []), None), dtype=np.int32)
    logprobs = obj.get("logprobs")
    return T.SampledSequence(
        stop_reason=stop_reason,
        sequence_id=sequence_id,
        tokens_np=tokens,
        logprobs_np=None if logprobs is None else _float_list(logprobs, "SampledSequence.logprobs"),
        topk_logprobs_np=_topk_rows(obj.get("topk_logprobs"), "SampledSequence.topk_logprobs"),
    )


def _s_sample_response(value: Any, _: Any) -> T.SampleResponse:
    obj = _mapping(value, "SampleResponse")
    seqs = _list(obj.get("sequences"), "SampleResponse.sequences")
    sequences = [converter.structure(s, T.SampledSequence) for s in seqs]
    prompt_lp = obj.get("prompt_logprobs")
    target = obj.get("target_prompt_logprobs")
    alt = obj.get("prompt_alt_tokens")
    hits = obj.get("prompt_cache_hit_tokens", 0)
    return T.SampleResponse(
        sequences=sequences,
        prompt_logprobs_np=None
        if prompt_lp is None
        else _float_list(prompt_lp, "SampleResponse.prompt_logprobs"),
        topk_prompt_logprobs_np=_topk_rows(
            obj.get("topk_prompt_logprobs"), "SampleResponse.topk_prompt_logprobs"
        ),
        target_prompt_logprobs=None if target is None else _s_tensor_data(target, None),
        prompt_cache_hit_tokens=0 if hits is None else _s_int(hits, int),
        prompt_alt_tokens=None if alt is None else converter.structure(alt, T.PromptAltTokens),
    )


_OPTIM_STEP_KEYS = frozenset(
    {"optim_params", "adam_params", "optimizer_params", "model_id", "seq_id", "type"}
)


def _s_optim_step_request(value: Any, _: Any) -> T.OptimStepRequest:
    obj = _mapping(value, "OptimStepRequest")
    extra = set(obj) - _OPTIM_STEP_KEYS
    if extra:
        raise ValueError(f"OptimStepRequest: unknown keys {sorted(extra)}")
    keys = [k for k in ("optim_params", "adam_params", "optimizer_params") if k in obj]
    if len(keys) != 1:
        raise ValueError(
            "OptimStepRequest needs exactly one of optim_params, adam_params, optimizer_params"
        )
    params: T.OptimParams
    if keys[0] == "adam_params":
        params = converter.structure(obj["adam_params"], T.AdamParams)
    else:
        params = converter.structure(obj[keys[0]], T.OptimParams)  # type: ignore[arg-type]
    seq_id = obj.get("seq_id")
    type_ = obj.get("type", "optim_step")
    if type_ != "optim_step":
        raise ValueError(f"OptimStepRequest.type must be 'optim_step', got {type_!r}")
    return T.OptimStepRequest(
        optim_params=params,
        model_id=_s_str(obj.get("model_id"), str),
        seq_id=None if seq_id is None else _s_int(seq_id, int),
    )


def _s_optimizer_config(value: Any, _: Any) -> T.OptimizerConfig:
    obj = _mapping(value, "OptimizerConfig")
    kind = obj.get("type")
    if kind == "adamw":
        return converter.structure(obj, T.AdamOptimizerConfig)
    if kind == "dimuon":
        return converter.structure(obj, T.DimuonOptimizerConfig)
    if type(kind) is not str:
        raise TypeError(f"OptimizerConfig.type: expected str, got {_describe(kind)}")
    return T.OtherOptimizerConfig(type=kind, extra={k: v for k, v in obj.items() if k != "type"})


def _s_optim_params(value: Any, _: Any) -> T.OptimParams:
    obj = _mapping(value, "OptimParams")
    kind = obj.get("type")
    if kind is None:
        return converter.structure(obj, T.AdamParams)
    if kind == "dimuon":
        return converter.structure(obj, T.DimuonParams)
    raise ValueError(f"OptimParams.type: unknown optimizer family {kind!r}")


def _tagged_union_hook(members: tuple[type, ...]) -> Callable[[Any, Any], Any]:
    tag_field: str | None = None
    by_tag: dict[Any, type] = {}
    for cls in members:
        tag = tag_of(cls)
        if tag is not None:
            tag_field = tag[0]
            by_tag[tag[1]] = cls
    if tag_field is None or len(by_tag) != len(members):
        names = ", ".join(c.__name__ for c in members)
        raise TypeError(f"union of {names} has no constant tag field")
    field = tag_field

    def hook(value: Any, _: Any) -> Any:
        obj = _mapping(value, " | ".join(c.__name__ for c in members))
        tag = obj.get(field)
        cls = by_tag.get(tag)
        if cls is None:
            raise ValueError(f"{field}: unknown tag {tag!r}; expected one of {sorted(by_tag)}")
        return converter.structure(obj, cls)

    return hook


def _union_members(t: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(t)
    if origin is typing.Union or origin is __import__("types").UnionType:
        return typing.get_args(t)
    return None


def _is_model_union(t: Any) -> bool:
    members = [m for m in _union_members(t) or () if m is not type(None)]
    if len(members) < 2:
        return False
    return all(is_model_class(m) for m in members)


def _model_union_hook_factory(t: Any) -> Callable[[Any, Any], Any]:
    all_members = typing.get_args(t)
    members = cast(tuple[type, ...], tuple(m for m in all_members if m is not type(None)))
    hook: Callable[[Any, Any], Any]
    if set(members) == set(typing.get_args(T.OptimizerConfig)):
        hook = _s_optimizer_config
    elif set(members) == set(typing.get_args(T.OptimParams)):
        hook = _s_optim_params
    else:
        hook = _tagged_union_hook(members)
    hook = _passing_instances(members, hook)
    if len(members) == len(all_members):
        return hook
    inner = hook

    def optional_hook(value: Any, t: Any) -> Any:
        return None if value is None else inner(value, t)

    return optional_hook


def _s_stop(value: Any, _: Any) -> str | list[str] | list[int] | None:
    if value is None or type(value) is str:
        return value
    if type(value) is list and (
        all(type(v) is str for v in value) or all(type(v) is int for v in value)
    ):
        return value
    raise TypeError(f"expected null, a str, a list of str or a list of int, got {_describe(value)}")


def _is_literal(t: Any) -> bool:
    return typing.get_origin(t) is Literal


def _literal_hook_factory(t: Any) -> Callable[[Any, Any], Any]:
    allowed = typing.get_args(t)

    def hook(value: Any, _: Any) -> Any:
        for a in allowed:
            if value == a and type(value) is type(a):
                return a
        raise ValueError(f"expected one of {list(allowed)!r}, got {value!r}")

    return hook


def _s_float_or_str(value: Any, _: Any) -> float | str:
    if type(value) is str:
        return value
    return _s_float(value, float)


# By name, so that importing the converter builds no request type (OptimStepRequest lives in
# the protocol types, which a process that only samples never loads; docs/scale-out.md).
_CUSTOM: dict[str, Callable[[Any, Any], Any]] = {
    "TensorData": _s_tensor_data,
    "SampledSequence": _s_sampled_sequence,
    "SampleResponse": _s_sample_response,
    "OptimStepRequest": _s_optim_step_request,
}


def _dataclass_hook(cls: type) -> Callable[[Any, Any], Any]:
    """Structure hook of a stdlib-dataclass type: its constructor runs the strict checks."""
    names = frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    forbid = bool(getattr(cls, "_tinker_request", False))
    name = cls.__name__

    def hook(value: Any, _: Any) -> Any:
        obj = _mapping(value, name)
        extra = set(obj) - names
        if extra and forbid:
            raise ValueError(f"{name}: unknown keys {sorted(extra)}")
        return cls(**{k: v for k, v in obj.items() if k in names})

    return hook


def _passing_instances(cls: type | tuple[type, ...], hook: Callable[[Any, Any], Any]) -> Any:
    """``hook``, but an instance of ``cls`` (a nested model given as itself) is kept as is."""

    def structure(value: Any, t: Any) -> Any:
        if isinstance(value, cls):
            return value
        return hook(value, t)

    return structure


def _model_hook_factory(cls: type) -> Callable[[Any, Any], Any]:
    return cast(Callable[[Any, Any], Any], _passing_instances(cls, _model_hook(cls)))


def _model_hook(cls: type) -> Callable[[Any, Any], Any]:
    custom = _CUSTOM.get(cls.__name__)
    if custom is not None and cls is getattr(T, cls.__name__, None):
        return custom
    if dataclasses.is_dataclass(cls):
        return _dataclass_hook(cls)
    from cattrs.gen import make_dict_structure_fn

    inner: Callable[[Any, Any], Any] = make_dict_structure_fn(
        cls,
        converter,
        _cattrs_forbid_extra_keys=bool(getattr(cls, "_tinker_request", False)),
        _cattrs_detailed_validation=True,
    )
    name = cls.__name__

    def hook(value: Any, t: Any) -> Any:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a JSON object for {name}, got {_describe(value)}")
        return inner(value, t)

    return hook


def _build() -> cattrs.Converter:
    import cattrs

    c = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    c.register_structure_hook(int, _s_int)
    c.register_structure_hook(float, _s_float)
    c.register_structure_hook(str, _s_str)
    c.register_structure_hook(bool, _s_bool)
    c.register_structure_hook(bytes, _s_bytes)
    c.register_structure_hook(_dt.datetime, _s_datetime)
    c.register_structure_hook(RequestErrorCategory, _s_category)
    c.register_structure_hook_func(lambda t: t is Any or t is object, _s_any)
    c.register_structure_hook_func(_is_ndarray_type, _s_any)
    int_seq = Sequence[int]
    c.register_structure_hook_func(lambda t: t == int_seq, _s_int_seq)
    stop_type = attrs.fields(T.SamplingParams).stop.type
    c.register_structure_hook_func(lambda t: t == stop_type, _s_stop)
    c.register_structure_hook_func(lambda t: t == (float | str), _s_float_or_str)
    c.register_structure_hook(T.TensorData, _s_tensor_data)
    c.register_structure_hook_factory(_is_literal, _literal_hook_factory)
    c.register_structure_hook_factory(_is_model_union, _model_union_hook_factory)
    c.register_structure_hook_factory(is_model_class, _model_hook_factory)
    c.register_unstructure_hook_func(
        lambda t: isinstance(t, type) and is_model_class(t),
        lambda obj: dump(obj, True, True, True),
    )
    return c


converter: cattrs.Converter
"""The single cattrs converter (structure: strict JSON -> types; unstructure: wire JSON), built on
first use: reading this name or the first :func:`from_json`."""

_built: cattrs.Converter | None = None
_build_lock = make_lock()


def _converter() -> cattrs.Converter:
    global _built, converter
    if _built is None:
        with _build_lock:
            if _built is None:
                converter = _build()  # the hooks above read the module global
                _built = converter
    return _built


def __getattr__(name: str) -> Any:
    if name == "converter":
        return _converter()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _format(exc: BaseException, type_: type | None) -> str:
    import cattrs
    import cattrs.v

    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown keys {sorted(exc.extra_fields)}"
    if isinstance(exc, (TypeError, ValueError)) and str(exc):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


def _plain_untyped_future(data: Any) -> Any:
    """An :class:`UntypedAPIFuture` (every future endpoint's first reply) read without cattrs, so
    that a worker's first sample builds no converter; None when ``data`` is not plainly valid
    (the converter then reads it, and names what is wrong)."""
    if not isinstance(data, Mapping):
        return None
    request_id = data.get("request_id")
    model_id = data.get("model_id")
    ids = data.get("sample_sequence_ids")
    if type(request_id) is not str or not (model_id is None or type(model_id) is str):
        return None
    if ids is not None:
        if type(ids) is not list or any(type(i) is not str for i in ids):
            return None
        ids = list(ids)
    return T.UntypedAPIFuture(request_id=request_id, model_id=model_id, sample_sequence_ids=ids)


#: Types read without the converter when the data is plainly valid (see from_json).
_PLAIN: dict[type, Callable[[Any], Any]] = {T.UntypedAPIFuture: _plain_untyped_future}


def to_json(obj: Any) -> Any:
    """Return the exact wire JSON of ``obj`` (defaults sent, None dropped but allowlisted)."""
    return dump(obj, True, True, True)


def from_json(cls: type[_T], data: Any) -> _T:
    """Parse JSON data (already decoded) into ``cls``, strictly.

    Raises :class:`WireValidationError` naming every bad field path.
    """
    plain = _PLAIN.get(cls)
    if plain is not None:
        value = plain(data)
        if value is not None:
            return cast(_T, value)
    name = getattr(cls, "__name__", repr(cls))
    structure = _converter().structure
    import cattrs  # loaded by _converter()

    try:
        return structure(data, cls)
    except cattrs.BaseValidationError as exc:
        raised = _from_signal_handler(exc)
        if raised is not None:
            # An alarm timeout raised while decoding is the caller's, not bad data: unchanged.
            raise raised  # noqa: B904
        errors = cattrs.transform_error(exc, path="$", format_exception=_format)
        raise WireValidationError(name, errors) from None
    except (TypeError, ValueError, KeyError) as exc:
        if signal_exception(exc) is not None:
            raise
        raise WireValidationError(name, [f"{_format(exc, None)} @ $"]) from None


def _from_signal_handler(group: BaseException) -> BaseException | None:
    """The exception a Python signal handler raised among cattrs' collected errors, if any."""
    stack = [group]
    while stack:
        cur = stack.pop()
        nested = getattr(cur, "exceptions", None)
        if isinstance(nested, (list, tuple)):
            stack.extend(e for e in nested if isinstance(e, BaseException))
            continue
        raised = signal_exception(cur)
        if raised is not None:
            return raised
    return None


# -- fields newer than the oldest protocol spoken ----------------------------------------------

#: Request fields the protocol gained after 0.25, the oldest version tinker_sync speaks (the
#: one independent servers such as TuFT 0.2.2 implement, with request models that forbid
#: unknown keys): ``{request type: {field: (version it arrived in, its default)}}``.
#: :func:`omit_new_defaults` leaves such a field out of a body while it holds that default, so
#: an older server accepts the body and a newer one reads the same default
#: (docs/migration.md#older-and-independent-servers).
NEWER_REQUEST_FIELDS: Mapping[str, Mapping[str, tuple[str, Any]]] = {
    "create_session": {"display_name": ("0.34.0", None)},
    "create_model": {"optimizer_config": ("0.30.0", {"type": "adamw"})},
    "load_weights": {"optimizer_config": ("0.30.0", None)},
    "save_weights": {"user_metadata": ("0.28.0", None)},
    "save_weights_for_sampler": {
        "user_metadata": ("0.28.0", None),
        "kind": ("0.38.0", "snapshot"),
    },
    "sample": {
        "record_stability_info": ("0.26.2", False),
        "topk_sample_logprobs": ("0.29.0", 0),
        "target_prompt_logprobs": ("0.30.0", None),
        "prompt_alt_tokens_k": ("0.31.0", 0),
        "prompt_logprobs_last_n": ("0.33.0", None),
    },
}


def omit_new_defaults(body: dict[str, Any], keep: Sequence[str] = ()) -> dict[str, Any]:
    """``body`` (a request's wire JSON, tagged by ``type``) without its newer-than-0.25 fields
    that hold their default (see :data:`NEWER_REQUEST_FIELDS`).

    ``keep``: fields the caller set explicitly, sent even at their default value.
    """
    newer = NEWER_REQUEST_FIELDS.get(body.get("type", ""))
    if not newer:
        return body
    out = {}
    for key, value in body.items():
        spec = newer.get(key)
        if spec is not None and key not in keep:
            default = spec[1]
            if value is None or (type(value) is type(default) and value == default):
                continue
        out[key] = value
    return out
