"""The local server's protobuf codecs: forward_backward request bodies in, sample and
forward/backward results out, plus the JSON result forms of ``protocol="legacy"``. The mirror
image of the client's ``tinker_sync._wire._proto`` and ``_jsonresults`` (the conformance tests
check both sides against the official SDK's descriptor).

Usage::

    model_id, seq_id, loss_fn, config, forward_only, datums = decode_forward_backward_request(body)
    reply = encode_forward_backward_output("ArrayRecord", outputs, metrics)
    reply = encode_sample_response(sample_result)
    obj = sample_result_to_json(sample_result)

Every decoder raises :class:`ValueError` naming the datum / field, which the app answers with a
400.

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from tinker_sync._wire._pbwire import (
    DTYPE_CODES,
    DTYPE_FLOAT32,
    DTYPE_INT64,
    DTYPE_NUMPY,
    LE_F4,
    LE_I4,
    LE_I8,
    NO_SPAN,
    STOP_REASON_CODES,
    TOPK_SENTINEL_LOGPROB,
    AnyArray,
    Buffer,
    Part,
    Sub,
    array_at,
    as_int32,
    fields,
    flat_le,
    ld_field,
    pack_double,
    packed_int64,
    read_tensor,
    read_varint,
    str_field,
    svarint,
    unpack_double,
    utf8_text,
    uvarint,
    uvarint_len,
)
from tinker_sync.local.backends.base import DatumArrays, SampleResult

__all__ = [
    "decode_forward_backward_request",
    "encode_forward_backward_output",
    "encode_sample_response",
    "forward_output_to_json",
    "sample_result_to_json",
]

# ----------------------------------------------------------------------------- server encoders


def _result_array(value: Any, where: str) -> tuple[int, AnyArray, tuple[int, ...]]:
    """A backend output as (wire dtype, flat LE array, trailing shape)."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    kind = arr.dtype.kind
    if kind == "f":
        return DTYPE_FLOAT32, flat_le(arr, LE_F4), tuple(arr.shape[1:])
    if kind in "iub":
        return DTYPE_INT64, flat_le(arr, LE_I8), tuple(arr.shape[1:])
    raise ValueError(f"{where}: unsupported output dtype {arr.dtype}")


def _record_parts(
    type_tag: str,
    names: list[str],
    rows: list[list[tuple[int, AnyArray, tuple[int, ...]]]],
    out: list[Part],
) -> None:
    """Append one ``loss_fn_outputs`` ArrayRecord (tag 2) holding ``rows`` to ``out``."""
    parts: list[Part] = [str_field(0x0A, type_tag)]
    size = len(parts[0])
    for column, name in enumerate(names):
        code, _, trailing = rows[0][column]
        arrays = [row[column][1] for row in rows]
        offsets = np.zeros(len(arrays) + 1, dtype=LE_I8)
        np.cumsum([arr.nbytes for arr in arrays], out=offsets[1:])
        total = int(offsets[-1])
        tail = bytes(ld_field(0x12, offsets.tobytes())) + b"\x18" + uvarint(code)
        tail += packed_int64(0x22, trailing)
        data_head = b"\x0a" + uvarint(total) if total else b""
        tensor_size = len(data_head) + total + len(tail)
        key = ld_field(0x0A, name.encode("utf-8"))
        entry_size = len(key) + 1 + uvarint_len(tensor_size) + tensor_size
        head = b"\x12" + uvarint(entry_size) + key + b"\x12" + uvarint(tensor_size) + data_head
        parts.append(head)
        parts.extend(arr for arr in arrays if arr.nbytes)
        parts.append(tail)
        size += len(head) + total + len(tail)
    count = b"\x18" + svarint(len(rows))
    parts.append(count)
    size += len(count)
    out.append(b"\x12" + uvarint(size))
    out.extend(parts)


def encode_forward_backward_output(
    output_type: str,
    outputs: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, float],
) -> bytes:
    """Serialize a ``ForwardBackwardOutput`` result (local server side).

    Usage: ``encode_forward_backward_output("ArrayRecord", result.outputs, result.metrics)``.

    Consecutive datums whose fields share dtypes and trailing shapes (``shape[1:]``) go into
    one rectangular ``ArrayRecord``; float arrays travel as float32, integer and bool arrays as
    int64; a 0-d array travels as ``[1]``.

    :param output_type: ``loss_fn_output_type`` (also each record's ``type_tag``).
    :raises ValueError: an array of another dtype kind, or datums with different field names
        (the official client pairs fields across records by position).
    """
    out: list[Part] = [str_field(0x0A, output_type)]
    names: list[str] = []
    signature: tuple[Any, ...] | None = None
    rows: list[list[tuple[int, AnyArray, tuple[int, ...]]]] = []
    for index, datum in enumerate(outputs):
        row_names = sorted(datum)
        if index and row_names != names:
            raise ValueError(
                f"outputs[{index}] has fields {row_names}, outputs[0] has {names}: every datum "
                "must carry the same output fields"
            )
        row = [_result_array(datum[n], f"outputs[{index}][{n!r}]") for n in row_names]
        row_signature = tuple((n, c[0], c[2]) for n, c in zip(row_names, row, strict=True))
        if row_signature != signature:
            if rows:
                _record_parts(output_type, names, rows, out)
            names = row_names
            signature = row_signature
            rows = []
        rows.append(row)
    if rows:
        _record_parts(output_type, names, rows, out)
    for name, value in metrics.items():
        entry = ld_field(0x0A, name.encode("utf-8")) + b"\x11" + pack_double(float(value))
        out.append(ld_field(0x1A, entry))
    return b"".join(cast("list[bytes]", out))


def _array_bytes(arr: Any, dtype: np.dtype[Any]) -> bytes:
    return flat_le(np.asarray(arr), dtype).tobytes()


def _topk_bytes(ids: Any, logprobs: Any) -> bytes:
    ids_arr = np.asarray(ids)
    lps_arr = np.asarray(logprobs)
    if ids_arr.ndim != 2 or ids_arr.shape != lps_arr.shape:
        raise ValueError(
            f"top-k ids and logprobs must be equal [length, k] matrices, "
            f"got {ids_arr.shape} and {lps_arr.shape}"
        )
    length, k = ids_arr.shape
    body = b""
    if ids_arr.size:
        body += ld_field(0x0A, _array_bytes(ids_arr, LE_I4))
        body += ld_field(0x12, _array_bytes(lps_arr, LE_F4))
    if k:
        body += b"\x18" + uvarint(k)
    if length:
        body += b"\x20" + uvarint(length)
    return body


def _tensor_bytes(arr: Any, public: str) -> bytes:
    array = np.asarray(arr)
    body = ld_field(0x0A, _array_bytes(array, DTYPE_NUMPY[public]))
    body += b"\x18" + uvarint(DTYPE_CODES[public])
    return body + packed_int64(0x22, list(array.shape))


def encode_sample_response(result: SampleResult) -> bytes:
    """Serialize a backend :class:`~tinker_sync.local.backends.base.SampleResult` as a
    protobuf ``SampleResponse`` (local server side).

    Usage: ``encode_sample_response(sampler.sample(prompt, opts))``.

    :raises ValueError: an unknown stop reason or inconsistent top-k matrices.
    """
    out: list[bytes] = []
    for index, seq in enumerate(result.sequences):
        code = STOP_REASON_CODES.get(seq.stop_reason)
        if code is None:
            raise ValueError(f"sequences[{index}]: unknown stop_reason {seq.stop_reason!r}")
        body = b"\x08" + uvarint(code) if code else b""
        tokens = _array_bytes(seq.tokens, LE_I4)
        if tokens:
            body += ld_field(0x12, tokens)
        if seq.logprobs is not None:
            body += ld_field(0x1A, _array_bytes(seq.logprobs, LE_F4))
        if seq.topk_ids is not None and seq.topk_logprobs is not None:
            body += ld_field(0x22, _topk_bytes(seq.topk_ids, seq.topk_logprobs))
        out.append(ld_field(0x0A, body))
    if result.prompt_logprobs is not None:
        out.append(ld_field(0x12, _array_bytes(result.prompt_logprobs, LE_F4)))
    if result.topk_prompt_ids is not None and result.topk_prompt_logprobs is not None:
        out.append(ld_field(0x1A, _topk_bytes(result.topk_prompt_ids, result.topk_prompt_logprobs)))
    if result.prompt_cache_hit_tokens:
        out.append(b"\x20" + svarint(int(result.prompt_cache_hit_tokens)))
    if result.target_prompt_logprobs is not None:
        out.append(ld_field(0x2A, _tensor_bytes(result.target_prompt_logprobs, "float32")))
    if result.prompt_alt_tokens is not None and result.prompt_alt_logprobs is not None:
        alt = ld_field(0x0A, _tensor_bytes(result.prompt_alt_tokens, "int64"))
        alt += ld_field(0x12, _tensor_bytes(result.prompt_alt_logprobs, "float32"))
        out.append(ld_field(0x32, alt))
    return b"".join(out)


# ----------------------------------------------------------------------------- request decoder

_TENSOR_CONTAINER_MARKER = 254
_TENSOR_CONTAINER_MAX_DTYPE = 7


#: Most model-input tokens one datum may declare. Image and dmel chunks only *declare* their
#: length (``expected_tokens``, a dmel header), so without a bound a few bytes on the wire could
#: make the server allocate gigabytes; a million tokens is far above any real context window.
MAX_DATUM_TOKENS = 1 << 20


def _declared_length(length: int, what: str, field: str) -> int:
    """A chunk's declared token count, refused (a 400) when negative or above the bound."""
    if length < 0 or length > MAX_DATUM_TOKENS:
        raise ValueError(
            f"{what}: {field} {length} is out of range (0..{MAX_DATUM_TOKENS} tokens per datum)"
        )
    return length


def _dmel_length(dmel: Buffer, what: str) -> int:
    """Dim 0 of a serialized TensorContainer (its header only)."""
    data = bytes(dmel)
    if not data:
        raise ValueError(f"{what}: empty dmel tensor container")
    pos = 1 if data[0] == _TENSOR_CONTAINER_MARKER else 0
    if pos >= len(data) or data[pos] > _TENSOR_CONTAINER_MAX_DTYPE:
        raise ValueError(f"{what}: bad dmel tensor container header")
    try:
        ndim, pos = read_varint(data, pos + 1, len(data))
        if ndim < 1:
            raise ValueError("no dimension 0")
        dim0, _ = read_varint(data, pos, len(data))
    except ValueError as exc:
        raise ValueError(f"{what}: bad dmel tensor container header ({exc})") from exc
    return _declared_length(dim0, what, "dmel length")


def _chunk_tokens(buf: Buffer, start: int, end: int, what: str) -> AnyArray:
    """The model-input tokens of one ``Chunk`` (non-text chunks give zeros)."""
    arm = 0
    arm_spans: dict[int, Sub] = {}
    for number, wire, a, b in fields(buf, start, end):
        if wire == 2 and number in (1, 2, 3):
            if number != arm:
                arm_spans[number] = Sub()
            arm = number
            arm_spans[number].add(a, b)
    if arm == 0:
        raise ValueError(f"{what}: chunk has no encoded_text, image or dmel content")
    sbuf, sa, sb = arm_spans[arm].get(buf)
    if arm == 1:
        tokens: tuple[int, int] = NO_SPAN
        for number, wire, a, b in fields(sbuf, sa, sb):
            if number == 1 and wire == 2:
                tokens = (a, b)
        return array_at(sbuf, tokens, LE_I4, f"{what}.tokens", False).astype(np.int64)
    if arm == 2:
        expected: int | None = None
        for number, wire, a, _b in fields(sbuf, sa, sb):
            if number == 3 and wire == 0:
                expected = as_int32(a)
        if expected is None or expected < 0:
            raise ValueError(f"{what}: image chunks need a non-negative expected_tokens")
        return np.zeros(_declared_length(expected, what, "expected_tokens"), dtype=np.int64)
    dmel: tuple[int, int] = NO_SPAN
    for number, wire, a, b in fields(sbuf, sa, sb):
        if number == 1 and wire == 2:
            dmel = (a, b)
    return np.zeros(_dmel_length(sbuf[dmel[0] : dmel[1]], what), dtype=np.int64)


def _dense_input(buf: Buffer, start: int, end: int, what: str) -> AnyArray:
    """A ``Tensor`` message densified (CSR expanded with pad 0) in its declared shape."""
    _, values, shape, crow, col = read_tensor(buf, start, end, what)
    if any(s < 0 for s in shape):
        raise ValueError(f"{what}: negative dimension in shape {shape}")
    if crow is None or col is None:
        if not shape:
            return values
        if math.prod(shape) != values.size:
            raise ValueError(f"{what}: {values.size} values do not fit shape {shape}")
        return values.reshape(shape)
    if len(shape) != 2:
        raise ValueError(f"{what}: a CSR tensor needs a 2-D shape, got {shape}")
    rows, cols = shape
    if crow.size != rows + 1 or col.size != values.size:
        raise ValueError(
            f"{what}: CSR sizes do not match (rows {rows}, crow {crow.size}, "
            f"col {col.size}, values {values.size})"
        )
    counts = np.diff(crow)
    if crow[0] != 0 or crow[-1] != values.size or (counts.size and counts.min() < 0):
        raise ValueError(f"{what}: malformed CSR row pointers")
    if col.size and (col.min() < 0 or col.max() >= cols):
        raise ValueError(f"{what}: CSR column index out of range for shape {shape}")
    dense = np.zeros((rows, cols), dtype=values.dtype)
    dense[np.repeat(np.arange(rows), counts), col] = values
    return dense


def decode_forward_backward_request(
    payload: Buffer,
) -> tuple[str, int, str, dict[str, float | str], bool, list[DatumArrays]]:
    """Parse a forward_backward body (local server side).

    Usage::

        model_id, seq_id, loss_fn, config, forward_only, datums = (
            decode_forward_backward_request(body))

    ``config`` merges the legacy numeric map with ``loss_fn_config_v2`` (which wins). Each
    datum becomes a :class:`~tinker_sync.local.backends.base.DatumArrays`: int64 tokens (text
    chunks concatenated; an image contributes ``expected_tokens`` zeros and a dmel chunk dim 0
    of its tensor container) and densified loss_fn_inputs in their declared shapes.

    :raises ValueError: malformed protobuf or inconsistent tensors, with a message naming the
        offending datum / field (the server turns it into a 400).
    """
    buf = payload
    try:
        top = fields(buf, 0, len(buf))
    except (ValueError, IndexError) as exc:
        raise ValueError(f"malformed ForwardBackwardRequest: {exc}") from exc
    model_id = ""
    seq_id = 0
    loss_fn = ""
    forward_only = False
    legacy: dict[str, float | str] = {}
    current: dict[str, float | str] = {}
    datum_spans: list[tuple[int, int]] = []
    for number, wire, a, b in top:
        if wire == 2:
            if number == 1:
                model_id = utf8_text(buf, a, b, "model_id")
            elif number == 3:
                datum_spans.append((a, b))
            elif number == 4:
                loss_fn = utf8_text(buf, a, b, "loss_fn")
            elif number == 5:
                key, value = _config_entry(buf, a, b, False)
                legacy[key] = value
            elif number == 7:
                key, value = _config_entry(buf, a, b, True)
                current[key] = value
        elif wire == 0:
            if number == 2:
                seq_id = as_int32(a)
            elif number == 6:
                forward_only = a != 0
    config = {**legacy, **current}
    datums: list[DatumArrays] = []
    for index, (a, b) in enumerate(datum_spans):
        what = f"data[{index}]"
        try:
            datums.append(_datum_arrays(buf, a, b, what, DatumArrays))
        except IndexError as exc:
            raise ValueError(f"{what}: malformed datum ({exc})") from exc
    return model_id, seq_id, loss_fn, config, forward_only, datums


def _config_entry(buf: Buffer, start: int, end: int, v2: bool) -> tuple[str, float | str]:
    key = ""
    value: float | str = 0.0
    found = not v2
    for number, wire, a, b in fields(buf, start, end):
        if number == 1 and wire == 2:
            key = utf8_text(buf, a, b, "loss_fn_config key")
        elif number == 2 and not v2 and wire == 1:
            value = unpack_double(buf, a)[0]
        elif number == 2 and v2 and wire == 2:
            found = False
            for n2, w2, a2, b2 in fields(buf, a, b):
                if n2 == 1 and w2 == 1:
                    value = unpack_double(buf, a2)[0]
                    found = True
                elif n2 == 2 and w2 == 2:
                    value = utf8_text(buf, a2, b2, "loss_fn_config text")
                    found = True
    if not found:
        raise ValueError(f"loss_fn_config_v2[{key!r}] has neither number nor text")
    return key, value


def _datum_arrays(
    buf: Buffer, start: int, end: int, what: str, factory: type[DatumArrays]
) -> DatumArrays:
    tokens: list[AnyArray] = []
    inputs: dict[str, AnyArray] = {}
    provenance = False
    for number, wire, a, b in fields(buf, start, end):
        if wire != 2:
            continue
        if number == 4:  # loss_fn_input_spans
            provenance = True
        elif number == 1:
            tokens.append(_chunk_tokens(buf, a, b, f"{what}.model_input[{len(tokens)}]"))
        elif number == 2:
            key = ""
            tensor: tuple[int, int] = (a, a)
            for n2, w2, a2, b2 in fields(buf, a, b):
                if n2 == 1 and w2 == 2:
                    key = utf8_text(buf, a2, b2, f"{what} loss_fn_inputs key")
                elif n2 == 2 and w2 == 2:
                    tensor = (a2, b2)
            inputs[key] = _dense_input(buf, *tensor, f"{what}.loss_fn_inputs[{key!r}]")
    total = sum(len(t) for t in tokens)
    if total > MAX_DATUM_TOKENS:
        raise ValueError(f"{what}: {total} model-input tokens (at most {MAX_DATUM_TOKENS})")
    if not tokens:
        flat = np.zeros(0, dtype=np.int64)
    elif len(tokens) == 1:
        flat = tokens[0]
    else:
        flat = np.concatenate(tokens)
    return factory(tokens=flat, inputs=inputs, provenance=provenance)


# ----------------------------------------------------------------------------- JSON results (legacy servers)


def _json_tensor(arr: Any) -> dict[str, Any]:
    array = np.asarray(arr)
    if array.ndim == 0:
        array = array.reshape(1)
    kind = array.dtype.kind
    if kind == "f":
        dtype = "float32"
        values = array.astype(np.float32).ravel().tolist()
    elif kind in "iub":
        dtype = "int64"
        values = array.astype(np.int64).ravel().tolist()
    else:
        raise ValueError(f"unsupported output dtype {array.dtype}")
    return {"data": values, "dtype": dtype, "shape": list(array.shape)}


def _json_floats(arr: Any) -> list[float | None]:
    values: list[float | None] = np.asarray(arr, dtype=np.float32).ravel().tolist()
    return [None if v is not None and math.isnan(v) else v for v in values]


def _json_topk(ids: Any, logprobs: Any) -> list[list[list[float]] | None]:
    ids_arr = np.asarray(ids, dtype=np.int64)
    lps_arr = np.asarray(logprobs, dtype=np.float32)
    rows: list[list[list[float]] | None] = []
    for id_row, lp_row in zip(ids_arr.tolist(), lps_arr.tolist(), strict=True):
        pairs = [[i, lp] for i, lp in zip(id_row, lp_row, strict=True)]
        while pairs and pairs[-1][0] == 0 and pairs[-1][1] == TOPK_SENTINEL_LOGPROB:
            pairs.pop()
        rows.append(pairs or None)
    return rows


def sample_result_to_json(result: SampleResult) -> dict[str, Any]:
    """The JSON form of a backend SampleResult (local server ``protocol="legacy"``).

    Usage: ``json.dumps(sample_result_to_json(result))``; read back by
    :func:`sample_response_from_json`.
    """
    sequences: list[dict[str, Any]] = []
    for seq in result.sequences:
        item: dict[str, Any] = {
            "stop_reason": seq.stop_reason,
            "tokens": np.asarray(seq.tokens, dtype=np.int64).ravel().tolist(),
            "logprobs": (
                None
                if seq.logprobs is None
                else np.asarray(seq.logprobs, dtype=np.float32).ravel().tolist()
            ),
        }
        if seq.topk_ids is not None and seq.topk_logprobs is not None:
            item["topk_logprobs"] = _json_topk(seq.topk_ids, seq.topk_logprobs)
        sequences.append(item)
    obj: dict[str, Any] = {
        "sequences": sequences,
        "type": "sample",
        "prompt_logprobs": (
            None if result.prompt_logprobs is None else _json_floats(result.prompt_logprobs)
        ),
        "topk_prompt_logprobs": (
            _json_topk(result.topk_prompt_ids, result.topk_prompt_logprobs)
            if result.topk_prompt_ids is not None and result.topk_prompt_logprobs is not None
            else None
        ),
    }
    if result.prompt_cache_hit_tokens:
        obj["prompt_cache_hit_tokens"] = int(result.prompt_cache_hit_tokens)
    if result.target_prompt_logprobs is not None:
        target = _json_tensor(np.asarray(result.target_prompt_logprobs, dtype=np.float32))
        obj["target_prompt_logprobs"] = target
    if result.prompt_alt_tokens is not None and result.prompt_alt_logprobs is not None:
        obj["prompt_alt_tokens"] = {
            "tokens": _json_tensor(np.asarray(result.prompt_alt_tokens, dtype=np.int64)),
            "logprobs": _json_tensor(np.asarray(result.prompt_alt_logprobs, dtype=np.float32)),
        }
    return obj


def forward_output_to_json(
    output_type: str,
    outputs: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, float],
) -> dict[str, Any]:
    """The JSON form of a forward/backward result (local server ``protocol="legacy"``).

    Usage: ``forward_output_to_json("ArrayRecord", result.outputs, result.metrics)``; read back
    by :func:`forward_backward_output_from_json`.
    """
    return {
        "loss_fn_output_type": output_type,
        "loss_fn_outputs": [
            {name: _json_tensor(value) for name, value in datum.items()} for datum in outputs
        ],
        "metrics": {name: float(value) for name, value in metrics.items()},
    }
