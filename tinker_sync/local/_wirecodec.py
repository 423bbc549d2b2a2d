"""Server-side wire codec of the local server: requests in, results out
(docs/design/protocol.md#body-encodings).

Usage::

    req = decode_forward_backward(body, content_type, content_encoding)   # proto, zstd or JSON
    raw = decompress_body(body, headers.get("Content-Encoding"))   # zstd or identity
    summary = proto_summary(body)                      # model_id, seq_id, ... for logs/faults
    blob = encode_forward_output_proto(result)         # ForwardResult -> proto bytes
    obj = forward_output_to_json(result)               # the JSON (legacy) form
    blob = encode_sample_proto(sample_result)
    obj = sample_result_to_json(sample_result, sequence_ids)

Protobuf and JSON result encoding are delegated to ``_protocodec`` (validated against the
official SDK by its conformance tests); this module adds JSON request
decoding (0.2x shapes, ModelInput, TensorData incl. CSR), validation errors that name the field,
and metric-key hygiene. Every decoder raises
:class:`WireError` (a ``ValueError``), which the app answers with a 400.

Thread safety: pure functions, safe from any thread. Fork safety: no state.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tinker_sync._wire import _pbwire
from tinker_sync.local import _protocodec
from tinker_sync.local.backends.base import DatumArrays, ForwardResult, SampleResult

#: ``ForwardBackwardOutput.loss_fn_output_type``; the SDK keeps the part after the last ``:``.
OUTPUT_TYPE = "tinker_sync.local:ArrayRecord"
_JSON_OUTPUT_TYPE = "ArrayRecord"


class WireError(ValueError):
    """A malformed request body; the message names the field. Plain exception; thread-safe."""


@dataclass
class FwdBwdRequest:
    """A decoded forward/backward submission. Plain data owned by one request."""

    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    datums: list[DatumArrays]


# ---------------------------------------------------------------------------- decoding helpers


def _dmel_length(blob: bytes) -> int:
    """Dim 0 of a serialized TensorContainer header (docs/design/protocol.md#model-input)."""
    pos = 0
    if blob[:1] == b"\xfe":
        pos = 1
    if pos >= len(blob) or blob[pos] > 7:
        raise WireError("dmel chunk: bad TensorContainer header")
    pos += 1

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            if pos >= len(blob) or shift > 63:
                raise WireError("dmel chunk: truncated varint")
            byte = blob[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    ndim = varint()
    if ndim < 1:
        raise WireError("dmel chunk: zero-dimensional container")
    return varint()


def _densify(
    values: npt.NDArray[Any],
    *,
    shape: list[int] | None,
    crow: npt.NDArray[np.int64] | None,
    col: npt.NDArray[np.int64] | None,
    pad: float,
    what: str,
) -> npt.NDArray[Any]:
    if any(s < 0 for s in shape or []):
        raise WireError(f"{what}: negative dimension in shape {shape}")
    if crow is None:
        if shape is None:
            return values
        if int(np.prod(shape, dtype=np.int64)) != values.size:
            raise WireError(f"{what}: {values.size} values do not fill shape {shape}")
        return values.reshape(shape)
    if col is None:
        raise WireError(f"{what}: sparse_crow_indices given without sparse_col_indices")
    if shape is None or len(shape) != 2:
        raise WireError(f"{what}: a CSR tensor needs a 2-D shape")
    rows, cols = shape
    if crow.size != rows + 1 or col.size != values.size:
        raise WireError(f"{what}: inconsistent CSR index lengths")
    if values.size and (
        crow[0] != 0
        or crow[-1] != values.size
        or np.any(np.diff(crow) < 0)
        or np.any(col < 0)
        or np.any(col >= cols)
    ):
        raise WireError(f"{what}: CSR indices out of range")
    dense = np.full((rows, cols), pad, dtype=values.dtype)
    row_ids = np.repeat(np.arange(rows, dtype=np.int64), np.diff(crow))
    dense[row_ids, col] = values
    return dense


def decode_forward_backward_proto(payload: bytes) -> FwdBwdRequest:
    """Decode a serialized ``tinker_public.ForwardBackwardRequest``."""
    try:
        model_id, seq_id, loss_fn, config, forward_only, datums = (
            _protocodec.decode_forward_backward_request(payload)
        )
    except (ValueError, IndexError, OverflowError) as exc:
        raise WireError(str(exc)) from None
    return FwdBwdRequest(model_id, seq_id, loss_fn, dict(config), forward_only, list(datums))


def decompress_body(body: bytes, content_encoding: str | None, max_size: int = 1 << 31) -> bytes:
    """Undo a request ``Content-Encoding`` (``zstd`` or none / ``identity``).

    Usage: ``body = decompress_body(raw, headers.get("Content-Encoding"))``.

    :param max_size: refuse to inflate beyond this many bytes (a decompression bomb).
    :raises ValueError: an unsupported encoding, a corrupt zstd frame, or an oversized body.
    """
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "zstd":
        raise ValueError(f"unsupported Content-Encoding {content_encoding!r}")
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - zstandard is a test dependency
        raise ValueError("Content-Encoding zstd needs the zstandard package") from exc
    pieces: list[bytes] = []
    total = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            while True:
                piece = reader.read(1 << 20)
                if not piece:
                    break
                total += len(piece)
                if total > max_size:
                    raise ValueError(f"zstd body inflates beyond {max_size} bytes")
                pieces.append(piece)
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupt zstd body: {exc}") from exc
    return b"".join(pieces)


def decode_forward_backward(
    body: bytes, content_type: str | None, content_encoding: str | None
) -> FwdBwdRequest:
    """Decode a forward_backward body: protobuf (optionally zstd), or JSON."""
    try:
        raw = decompress_body(body, content_encoding)
    except ValueError as exc:
        raise WireError(str(exc)) from None
    if "json" in (content_type or "").lower():
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise WireError(f"malformed JSON body: {exc}") from None
        return decode_forward_backward_json(obj)
    return decode_forward_backward_proto(raw)


def proto_summary(payload: bytes) -> dict[str, Any]:
    """``model_id``, ``seq_id``, ``loss_fn``, ``forward_only`` and datum count of a proto body.

    Reads only the top-level fields of ``ForwardBackwardRequest`` with the project's own wire
    reader (the last value of a field wins, as in protobuf); the datums are counted, not parsed.
    """
    summary: dict[str, Any] = {
        "model_id": "",
        "seq_id": 0,
        "loss_fn": "",
        "forward_only": False,
        "datums": 0,
    }
    try:
        for number, wire, a, b in _pbwire.fields(payload, 0, len(payload)):
            if wire == 2 and number == 1:
                summary["model_id"] = _pbwire.utf8_text(payload, a, b, "model_id")
            elif wire == 0 and number == 2:
                summary["seq_id"] = _pbwire.as_int32(a)
            elif wire == 2 and number == 3:
                summary["datums"] += 1
            elif wire == 2 and number == 4:
                summary["loss_fn"] = _pbwire.utf8_text(payload, a, b, "loss_fn")
            elif wire == 0 and number == 6:
                summary["forward_only"] = bool(a)
    except (ValueError, IndexError) as exc:
        raise WireError(f"malformed protobuf body: {exc}") from None
    return summary


# ---------------------------------------------------------------------------- JSON decoding


def _expect(obj: Any, typ: type | tuple[type, ...], what: str) -> Any:
    if isinstance(obj, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise WireError(f"{what}: expected {getattr(typ, '__name__', typ)}, got bool")
    if not isinstance(obj, typ):
        raise WireError(
            f"{what}: expected {getattr(typ, '__name__', typ)}, got {type(obj).__name__}"
        )
    return obj


def _int_list(obj: Any, what: str) -> npt.NDArray[np.int64]:
    _expect(obj, list, what)
    for v in obj:
        if isinstance(v, bool) or not isinstance(v, int):
            raise WireError(f"{what}: expected a list of integers")
    try:
        return np.asarray(obj, dtype=np.int64).reshape(-1)
    except OverflowError:
        raise WireError(f"{what}: integer out of range") from None


def tensor_from_json(obj: Any, what: str, *, pad: float = 0) -> npt.NDArray[Any]:
    """Decode a JSON TensorData (dense or CSR) into a dense numpy array."""
    _expect(obj, dict, what)
    dtype = obj.get("dtype")
    if dtype not in ("int64", "float32"):
        raise WireError(f"{what}.dtype: expected 'int64' or 'float32', got {dtype!r}")
    data = _expect(obj.get("data"), list, f"{what}.data")
    flat: list[Any] = []
    stack: list[Any] = [data]
    # Accept nested lists (legacy) by flattening in row-major order.
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, bool) or not isinstance(item, (int, float)):
            raise WireError(f"{what}.data: expected numbers")
        else:
            flat.append(item)
    try:
        values = np.asarray(flat, dtype=np.int64 if dtype == "int64" else np.float32)
    except (OverflowError, ValueError):
        raise WireError(f"{what}.data: value out of range for {dtype}") from None
    shape_obj = obj.get("shape")
    shape = None if shape_obj is None else [int(s) for s in _int_list(shape_obj, f"{what}.shape")]
    crow_obj, col_obj = obj.get("sparse_crow_indices"), obj.get("sparse_col_indices")
    crow = None if crow_obj is None else _int_list(crow_obj, f"{what}.sparse_crow_indices")
    col = None if col_obj is None else _int_list(col_obj, f"{what}.sparse_col_indices")
    if col is not None and crow is None:
        raise WireError(f"{what}: sparse_col_indices given without sparse_crow_indices")
    return _densify(values, shape=shape, crow=crow, col=col, pad=pad, what=what)


def tokens_from_model_input_json(obj: Any, what: str) -> npt.NDArray[np.int64]:
    """Concatenate the tokens of a JSON ModelInput (non-text chunks count as zeros)."""
    _expect(obj, dict, what)
    chunks = _expect(obj.get("chunks"), list, f"{what}.chunks")
    parts: list[npt.NDArray[np.int64]] = []
    for i, chunk in enumerate(chunks):
        where = f"{what}.chunks[{i}]"
        _expect(chunk, dict, where)
        kind = chunk.get("type", "encoded_text")
        if kind == "encoded_text":
            parts.append(_int_list(chunk.get("tokens"), f"{where}.tokens"))
        elif kind in ("image", "image_asset_pointer"):
            n = chunk.get("expected_tokens")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise WireError(f"{where}.expected_tokens: required non-negative int")
            if kind == "image":
                data = _expect(chunk.get("data"), str, f"{where}.data")
                try:
                    base64.b64decode(data, validate=True)
                except ValueError:
                    raise WireError(f"{where}.data: invalid base64") from None
            parts.append(np.zeros(n, dtype=np.int64))
        elif kind == "dmel":
            data = _expect(chunk.get("dmel"), str, f"{where}.dmel")
            try:
                blob = base64.b64decode(data, validate=True)
            except ValueError:
                raise WireError(f"{where}.dmel: invalid base64") from None
            parts.append(np.zeros(_dmel_length(blob), dtype=np.int64))
        else:
            raise WireError(f"{where}.type: unknown chunk type {kind!r}")
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def decode_forward_backward_json(obj: Any) -> FwdBwdRequest:
    """Decode a JSON forward/backward request (0.2x shape, or a flat variant).

    Accepted shapes: ``{"model_id", "seq_id", "forward_backward_input": {...}}``,
    ``{"model_id", "seq_id", "forward_input": {...}}`` (forward only), or the input fields
    (``data``, ``loss_fn``, ``loss_fn_config``, ``forward_only``) at the top level.
    """
    _expect(obj, dict, "body")
    model_id = _expect(obj.get("model_id"), str, "model_id")
    seq_id = obj.get("seq_id", 0)
    if seq_id is None:
        seq_id = 0
    _expect(seq_id, int, "seq_id")
    forward_only = bool(obj.get("forward_only", False))
    if "forward_backward_input" in obj:
        inner = _expect(obj["forward_backward_input"], dict, "forward_backward_input")
    elif "forward_input" in obj:
        inner = _expect(obj["forward_input"], dict, "forward_input")
        forward_only = True
    else:
        inner = obj
    loss_fn = _expect(inner.get("loss_fn", "cross_entropy"), str, "loss_fn")
    raw_config = inner.get("loss_fn_config") or {}
    _expect(raw_config, dict, "loss_fn_config")
    config: dict[str, float | str] = {}
    for key, value in raw_config.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise WireError(f"loss_fn_config.{key}: expected a number or string")
        config[key] = value if isinstance(value, str) else float(value)
    data = _expect(inner.get("data"), list, "data")
    datums = []
    for i, d in enumerate(data):
        _expect(d, dict, f"data[{i}]")
        tokens = tokens_from_model_input_json(d.get("model_input"), f"data[{i}].model_input")
        raw_inputs = _expect(d.get("loss_fn_inputs", {}), dict, f"data[{i}].loss_fn_inputs")
        inputs = {
            name: tensor_from_json(t, f"data[{i}].loss_fn_inputs.{name}")
            for name, t in raw_inputs.items()
        }
        provenance = bool(d.get("loss_fn_input_spans"))
        datums.append(DatumArrays(tokens=tokens, inputs=inputs, provenance=provenance))
    return FwdBwdRequest(
        model_id=model_id,
        seq_id=seq_id,
        loss_fn=loss_fn,
        config=config,
        forward_only=forward_only,
        datums=datums,
    )


# ---------------------------------------------------------------------------- encoding


def fix_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Ensure every key has exactly one ``:reduction`` suffix (the SDK splits on ``:``)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = key if key.count(":") == 1 else key.replace(":", "_") + ":sum"
        out[name] = float(value)
    return out


def encode_forward_output_proto(result: ForwardResult, *, with_metrics: bool = True) -> bytes:
    """Serialize a backend :class:`ForwardResult` as ``tinker_public.ForwardBackwardOutput``."""
    metrics = fix_metrics(result.metrics) if with_metrics else {}
    return _protocodec.encode_forward_backward_output(OUTPUT_TYPE, result.outputs, metrics)


def encode_sample_proto(result: SampleResult) -> bytes:
    """Serialize a backend :class:`SampleResult` as ``tinker_public.SampleResponse``."""
    return _protocodec.encode_sample_response(result)


def forward_output_to_json(result: ForwardResult, *, with_metrics: bool = True) -> dict[str, Any]:
    """The JSON form of a ForwardBackwardOutput (``with_metrics=False``: empty metrics)."""
    metrics = fix_metrics(result.metrics) if with_metrics else {}
    return _protocodec.forward_output_to_json(_JSON_OUTPUT_TYPE, result.outputs, metrics)


def sample_result_to_json(
    result: SampleResult, sequence_ids: Sequence[str] | None = None
) -> dict[str, Any]:
    """The JSON form of a SampleResponse; ``sequence_ids`` (when given) are added to the
    sequences as ``sequence_id`` (clients that know them from the asample reply ignore it)."""
    obj = _protocodec.sample_result_to_json(result)
    if sequence_ids is not None:
        for seq, seq_id in zip(obj["sequences"], sequence_ids, strict=False):
            seq["sequence_id"] = seq_id
    return obj
