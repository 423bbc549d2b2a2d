"""Protobuf codecs of the Tinker wire protocol (PROTOCOL §2.12-§2.14, BEHAVIOR B39/B40).

Usage (client)::

    body = encode_forward_backward_request(model_id, seq_id, data, "cross_entropy", None, False)
    body, headers = maybe_compress(body, server_config.proto_compress_fwdbwd)
    output = decode_forward_backward_output(reply_bytes)
    response = decode_sample_response(reply_bytes, sequence_ids)

Usage (local server)::

    model_id, seq_id, loss_fn, config, forward_only, datums = decode_forward_backward_request(body)
    reply = encode_forward_backward_output("ArrayRecord", outputs, metrics)
    reply = encode_sample_response(sample_result)

The bytes are written and read by a small hand-written protobuf wire codec working directly on
numpy buffers: a request body is one ``bytes.join`` over little-endian array views (each array
is copied once, into the body), and a result's arrays are cut out of the reply with
``numpy.frombuffer`` (one copy per batched field; each datum's array is a view of it). The
field numbers are those of ``tinker_public.proto`` (checked in next to this module, together
with its generated module, which the codec itself does not need); the tests parse every
encoding with that descriptor and with the official SDK's one.

All arrays travel little-endian: tokens as int32, tensors in their declared dtype (float32 or
int64), CSR indices as int64. Every protobuf decoder raises :class:`ValueError` (never another
error) for malformed input.

Thread and fork safety: pure functions without shared state (a bounded cache of encoded
shapes is only ever added to); decoded arrays are writable and owned by the result.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from tinker_sync.types import (
    Datum,
    DmelChunk,
    EncodedTextChunk,
    ForwardBackwardOutput,
    ImageAssetPointerChunk,
    ImageChunk,
    PromptAltTokens,
    SampledProvenanceSpan,
    SampledSequence,
    SampleResponse,
    TensorData,
    TopkLogprobs,
)

if TYPE_CHECKING:
    from tinker_sync.local.backends.base import DatumArrays, SampleResult

__all__ = [
    "DTYPE_BFLOAT16",
    "DTYPE_FLOAT32",
    "DTYPE_INT32",
    "DTYPE_INT64",
    "decode_forward_backward_output",
    "decode_forward_backward_request",
    "decode_sample_response",
    "decompress_body",
    "encode_forward_backward_output",
    "encode_forward_backward_request",
    "encode_sample_response",
    "forward_backward_output_from_json",
    "forward_output_to_json",
    "maybe_compress",
    "sample_response_from_json",
    "sample_result_to_json",
]

Buffer: TypeAlias = "bytes | bytearray | memoryview"
_Part: TypeAlias = "bytes | memoryview | npt.NDArray[Any]"
_AnyArray: TypeAlias = "npt.NDArray[Any]"

# ----------------------------------------------------------------------------- constants

DTYPE_UNSPECIFIED = 0
DTYPE_FLOAT32 = 1
DTYPE_INT64 = 2
DTYPE_INT32 = 3
DTYPE_BFLOAT16 = 4

_STOP_REASONS = {0: "stop", 1: "length"}
_STOP_REASON_CODES = {"stop": 0, "length": 1}

#: Empty top-k slot: token 0 with this logprob.
TOPK_SENTINEL_LOGPROB = -99999.0

_LE_I4 = np.dtype("<i4")
_LE_I8 = np.dtype("<i8")
_LE_F4 = np.dtype("<f4")
_LE_U2 = np.dtype("<u2")

_DTYPE_CODES: dict[str, int] = {"float32": DTYPE_FLOAT32, "int64": DTYPE_INT64}
_DTYPE_NUMPY: dict[str, np.dtype[Any]] = {"float32": _LE_F4, "int64": _LE_I8}
#: wire dtype -> (numpy dtype of the bytes, public TensorData dtype)
_WIRE_DTYPES: dict[int, tuple[np.dtype[Any], str]] = {
    DTYPE_FLOAT32: (_LE_F4, "float32"),
    DTYPE_INT64: (_LE_I8, "int64"),
    DTYPE_INT32: (_LE_I4, "int64"),
    DTYPE_BFLOAT16: (_LE_U2, "float32"),
}

_MASK64 = (1 << 64) - 1
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1

# ----------------------------------------------------------------------------- wire writer

_SMALL_VARINTS = tuple(bytes((i,)) for i in range(128))
_pack_double = struct.Struct("<d").pack
_unpack_double = struct.Struct("<d").unpack_from


def _uv(value: int) -> bytes:
    """Unsigned varint (``value`` >= 0)."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _sv(value: int) -> bytes:
    """Varint of a signed int32/int64 (negative values take ten bytes, two's complement)."""
    return _uv(value & _MASK64) if value < 0 else _uv(value)


def _vlen(value: int) -> int:
    """Length of the unsigned varint of ``value``."""
    if value < 0x80:
        return 1
    if value < 0x4000:
        return 2
    if value < 0x200000:
        return 3
    return (value.bit_length() + 6) // 7


def _ld(tag: int, payload: bytes) -> bytes:
    """A length-delimited field with a one-byte tag."""
    return bytes((tag,)) + _uv(len(payload)) + payload


def _str_field(tag: int, text: str) -> bytes:
    """A string field, omitted when empty (proto3 default)."""
    if not text:
        return b""
    return _ld(tag, text.encode("utf-8"))


_packed_cache: dict[tuple[int, tuple[int, ...]], bytes] = {}


def _packed_int64(tag: int, values: Sequence[int]) -> bytes:
    """A packed repeated int64 field (omitted when empty); shapes repeat, so it is cached."""
    if not values:
        return b""
    key = (tag, tuple(values))
    encoded = _packed_cache.get(key)
    if encoded is None:
        encoded = _ld(tag, b"".join(_sv(int(v)) for v in values))
        if len(_packed_cache) < 4096:
            _packed_cache[key] = encoded
    return encoded


def _flat_le(arr: _AnyArray, dtype: np.dtype[Any]) -> _AnyArray:
    """``arr`` as a flat C-contiguous little-endian array of ``dtype`` (no copy if it is one)."""
    if arr.dtype != dtype:
        arr = arr.astype(dtype)
    if arr.ndim != 1 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr).reshape(-1)
    return arr


def _tokens_le(tokens: _AnyArray, where: str) -> _AnyArray:
    """Token ids as little-endian int32, refusing values that do not fit."""
    if tokens.dtype == _LE_I4:
        return _flat_le(tokens, _LE_I4)
    if tokens.dtype.kind not in "iu":
        raise ValueError(f"{where}: token ids must be integers, got dtype {tokens.dtype}")
    if tokens.size and tokens.dtype.itemsize >= 4:
        low = int(tokens.min())
        high = int(tokens.max())
        if low < _INT32_MIN or high > _INT32_MAX:
            raise ValueError(f"{where}: token ids must fit in int32, got range [{low}, {high}]")
    return _flat_le(tokens, _LE_I4)


# ----------------------------------------------------------------------------- request encoder


def _tensor_parts(tensor: TensorData, where: str) -> tuple[list[_Part], int]:
    """Parts and size of a ``Tensor`` message."""
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{where}: unsupported TensorData dtype {tensor.dtype!r}")
    values = _flat_le(tensor.data_np, _DTYPE_NUMPY[tensor.dtype])
    crow = tensor.crow_np
    parts: list[_Part]
    if crow is not None:
        col = tensor.col_np
        if col is None:
            raise ValueError(f"{where}: sparse_col_indices required with sparse_crow_indices")
        crow = _flat_le(crow, _LE_I8)
        col = _flat_le(col, _LE_I8)
        parts = []
        csr_size = 0
        for tag, arr in ((0x0A, values), (0x12, crow), (0x1A, col)):
            n = arr.nbytes
            if n:
                head = bytes((tag,)) + _uv(n)
                parts.append(head)
                parts.append(arr)
                csr_size += len(head) + n
        head = b"\x12" + _uv(csr_size)
        parts.insert(0, head)
        size = len(head) + csr_size
    else:
        n = values.nbytes
        head = b"\x0a" + _uv(n)
        parts = [head, values] if n else [head]
        size = len(head) + n
    tail = b"\x18" + _SMALL_VARINTS[code]
    shape = tensor.shape
    if shape:
        tail += _packed_int64(0x22, shape)
    parts.append(tail)
    return parts, size + len(tail)


def _span_bytes(tag: int, span: Any) -> bytes:
    sampled = isinstance(span, SampledProvenanceSpan)
    body = _str_field(0x0A, span.sequence_id)
    if span.offset:
        body += b"\x10" + _sv(int(span.offset))
    if span.length:
        body += b"\x18" + _sv(int(span.length))
    return _ld(tag, _ld(0x12 if sampled else 0x0A, body))


def _datum_parts(index: int, datum: Datum, out: list[_Part]) -> None:
    """Append the ``data`` field (tag 3) holding one Datum to ``out``."""
    parts: list[_Part] = []
    size = 0
    for chunk in datum.model_input.chunks:
        if isinstance(chunk, EncodedTextChunk):
            tokens = chunk.tokens
            if type(tokens) is list:
                # One conversion straight to int32 (numpy refuses out-of-range ints).
                try:
                    arr = np.array(tokens, dtype=_LE_I4)
                except OverflowError as exc:
                    raise ValueError(f"data[{index}]: token ids must fit in int32") from exc
            else:
                arr = _tokens_le(chunk.tokens_np, f"data[{index}]")
            n = arr.nbytes
            if n:
                text_size = 1 + _vlen(n) + n
                chunk_size = 1 + _vlen(text_size) + text_size
                head = b"\x0a" + _uv(chunk_size) + b"\x0a" + _uv(text_size) + b"\x0a" + _uv(n)
                parts.append(head)
                parts.append(arr)
                size += len(head) + n
            else:
                parts.append(b"\x0a\x02\x0a\x00")
                size += 4
        elif isinstance(chunk, ImageChunk):
            # The image / dmel bytes go in as their own part (copied once, into the body).
            data = chunk.data
            tail = _str_field(0x12, chunk.format)
            if chunk.expected_tokens is not None:
                tail += b"\x18" + _sv(int(chunk.expected_tokens))
            data_head = b"\x0a" + _uv(len(data)) if data else b""
            image_size = len(data_head) + len(data) + len(tail)
            chunk_size = 1 + _vlen(image_size) + image_size
            head = b"\x0a" + _uv(chunk_size) + b"\x12" + _uv(image_size) + data_head
            parts.extend((head, data, tail) if data else (head, tail))
            size += len(head) + len(data) + len(tail)
        elif isinstance(chunk, DmelChunk):
            dmel = chunk.dmel
            dmel_head = b"\x0a" + _uv(len(dmel)) if dmel else b""
            dmel_size = len(dmel_head) + len(dmel)
            chunk_size = 1 + _vlen(dmel_size) + dmel_size
            head = b"\x0a" + _uv(chunk_size) + b"\x1a" + _uv(dmel_size) + dmel_head
            parts.extend((head, dmel) if dmel else (head,))
            size += len(head) + len(dmel)
        elif isinstance(chunk, ImageAssetPointerChunk):
            raise ValueError(
                f"data[{index}]: image_asset_pointer chunks cannot be sent in forward_backward "
                "(only in sampling prompts); pass the image bytes as an ImageChunk"
            )
        else:
            kind = type(chunk).__name__
            raise ValueError(f"data[{index}]: unsupported model input chunk type {kind}")
    for name, tensor in datum.loss_fn_inputs.items():
        key = name.encode("utf-8")
        tparts, tsize = _tensor_parts(tensor, f"data[{index}].loss_fn_inputs[{name!r}]")
        entry_size = 1 + _vlen(len(key)) + len(key) + 1 + _vlen(tsize) + tsize
        head = b"\x12" + _uv(entry_size) + b"\x0a" + _uv(len(key)) + key + b"\x12" + _uv(tsize)
        parts.append(head)
        parts.extend(tparts)
        size += len(head) + tsize
    spans = datum.model_input_spans
    if spans:
        encoded = b"".join(_span_bytes(0x1A, span) for span in spans)
        parts.append(encoded)
        size += len(encoded)
    spans = datum.loss_fn_input_spans
    if spans:
        encoded = b"".join(_span_bytes(0x22, span) for span in spans)
        parts.append(encoded)
        size += len(encoded)
    out.append(b"\x1a" + _uv(size))
    out.extend(parts)


def encode_forward_backward_request(
    model_id: str,
    seq_id: int | None,
    data: Sequence[Datum],
    loss_fn: str,
    loss_fn_config: Mapping[str, float | str] | None,
    forward_only: bool,
) -> bytes:
    """Serialize a ``tinker_public.ForwardBackwardRequest`` (the forward_backward body).

    Usage: ``encode_forward_backward_request("s:train:0", 1, data, "cross_entropy", None, False)``.

    :param seq_id: the chunk's seq_id (``None`` is sent as 0, like the official client).
    :param loss_fn_config: numeric entries go to the legacy map (field 5) and, as ``number``, to
        field 7; string entries only to field 7 as ``text``.
    :raises ValueError: an image asset pointer chunk (naming the datum index), an unknown chunk
        type or dtype, a token id outside int32, or ``seq_id`` outside int32.
    :raises TypeError: a ``loss_fn_config`` value that is neither a number nor a string.
    """
    seq = 0 if seq_id is None else int(seq_id)
    if not _INT32_MIN <= seq <= _INT32_MAX:
        raise ValueError(f"seq_id must fit in int32, got {seq}")
    out: list[_Part] = [_str_field(0x0A, model_id)]
    if seq:
        out.append(b"\x10" + _sv(seq))
    for index, datum in enumerate(data):
        _datum_parts(index, datum, out)
    out.append(_str_field(0x22, loss_fn))
    if loss_fn_config:
        legacy: list[bytes] = []
        current: list[bytes] = []
        for name, value in loss_fn_config.items():
            key = _ld(0x0A, name.encode("utf-8"))
            if isinstance(value, str):
                current.append(_ld(0x3A, key + _ld(0x12, _ld(0x12, value.encode("utf-8")))))
            else:
                try:
                    number = _pack_double(float(value))
                except (TypeError, ValueError):
                    raise TypeError(
                        f"loss_fn_config[{name!r}]: expected a number or a string, "
                        f"got {type(value).__name__}"
                    ) from None
                legacy.append(_ld(0x2A, key + b"\x11" + number))
                current.append(_ld(0x3A, key + _ld(0x12, b"\x09" + number)))
        out.extend(legacy)
        if forward_only:
            out.append(b"\x30\x01")
        out.extend(current)
    elif forward_only:
        out.append(b"\x30\x01")
    # numpy arrays are buffers; their stubs just do not say so.
    return b"".join(cast("list[bytes]", out))


# ----------------------------------------------------------------------------- compression


def maybe_compress(body: bytes, enabled: bool) -> tuple[bytes, dict[str, str]]:
    """zstd-compress a forward_backward body when the server asked for it and zstd imports.

    Usage: ``body, extra_headers = maybe_compress(body, cfg.proto_compress_fwdbwd)``.

    :returns: the (possibly compressed) body and the headers to add
        (``{"Content-Encoding": "zstd"}`` or ``{}``).
    """
    if not enabled:
        return body, {}
    try:
        import zstandard
    except ImportError:
        return body, {}
    return zstandard.ZstdCompressor().compress(body), {"Content-Encoding": "zstd"}


def decompress_body(body: bytes, content_encoding: str | None, max_size: int = 1 << 31) -> bytes:
    """Undo a request ``Content-Encoding`` (``zstd`` or none / ``identity``); server side.

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


# ----------------------------------------------------------------------------- wire reader

_Field: TypeAlias = tuple[int, int, int, int]
"""(field number, wire type, a, b): varint value in ``a``; for the others ``buf[a:b]``."""


def _read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        raise ValueError("truncated varint")
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def _skip_group(buf: Buffer, pos: int, end: int, number: int, depth: int) -> int:
    if depth > 64:
        raise ValueError("groups nested too deeply")
    while True:
        tag, pos = _read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if wire == 4:
            if field != number:
                raise ValueError("mismatched end-group tag")
            return pos
        pos = _skip_value(buf, pos, end, field, wire, depth + 1)


def _skip_value(buf: Buffer, pos: int, end: int, field: int, wire: int, depth: int) -> int:
    if wire == 0:
        return _read_varint(buf, pos, end)[1]
    if wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    elif wire == 2:
        n, pos = _read_varint(buf, pos, end)
        pos += n
    elif wire == 3:
        return _skip_group(buf, pos, end, field, depth)
    else:
        raise ValueError(f"invalid wire type {wire}")
    if pos > end:
        raise ValueError("truncated field")
    return pos


def _fields(buf: Buffer, start: int, end: int) -> list[_Field]:
    """Every field of the message ``buf[start:end]`` in wire order (unknown ones included)."""
    out: list[_Field] = []
    append = out.append
    pos = start
    while pos < end:
        byte = buf[pos]
        if byte < 0x80:
            tag = byte
            pos += 1
        else:
            tag, pos = _read_varint(buf, pos, end)
        field = tag >> 3
        wire = tag & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire in (0, 2):
            # Inline varint: the length (or value) that follows the tag.
            value = 0
            shift = 0
            while True:
                if pos >= end:
                    raise ValueError("truncated varint")
                byte = buf[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift >= 70:
                    raise ValueError("varint longer than 10 bytes")
            if wire == 0:
                append((field, 0, value & _MASK64, 0))
                continue
            stop = pos + value
            if stop > end:
                raise ValueError("truncated length-delimited field")
            append((field, 2, pos, stop))
            pos = stop
        elif wire == 1:
            if pos + 8 > end:
                raise ValueError("truncated fixed64 field")
            append((field, 1, pos, pos + 8))
            pos += 8
        elif wire == 5:
            if pos + 4 > end:
                raise ValueError("truncated fixed32 field")
            append((field, 5, pos, pos + 4))
            pos += 4
        elif wire == 3:
            pos = _skip_group(buf, pos, end, field, 0)
        else:
            raise ValueError(f"invalid wire type {wire} for field {field}")
    if pos != end:
        raise ValueError("message overruns its length")
    return out


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _int64(value: int) -> int:
    return value - (1 << 64) if value & (1 << 63) else value


def _text(buf: Buffer, start: int, end: int, what: str) -> str:
    try:
        return str(buf[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} is not valid UTF-8") from exc


def _repeated_int64(buf: Buffer, field: _Field, out: list[int]) -> None:
    """Append a (packed or unpacked) repeated int64 occurrence to ``out``."""
    _, wire, a, b = field
    if wire == 0:
        out.append(_int64(a))
    elif wire == 2:
        pos = a
        while pos < b:
            value, pos = _read_varint(buf, pos, b)
            out.append(_int64(value))


class _Sub:
    """A singular sub-message that may occur several times (occurrences merge)."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def add(self, a: int, b: int) -> None:
        self.spans.append((a, b))

    def __bool__(self) -> bool:
        return bool(self.spans)

    def get(self, buf: Buffer) -> tuple[Buffer, int, int]:
        if len(self.spans) == 1:
            a, b = self.spans[0]
            return buf, a, b
        merged = b"".join(bytes(buf[a:b]) for a, b in self.spans)
        return merged, 0, len(merged)


_NO_SPAN = (0, 0)
"""A bytes field not (yet) seen: ``buf[a:b]`` spans are ``(a, b)`` tuples (last one wins)."""


def _array(
    buf: Buffer, span: tuple[int, int], dtype: np.dtype[Any], what: str, copy: bool
) -> _AnyArray:
    """The bytes ``buf[a:b]`` as a flat array: a writable copy, or a read-only view."""
    a, b = span
    n = b - a
    itemsize = dtype.itemsize
    if n % itemsize:
        raise ValueError(f"{what}: {n} bytes is not a multiple of {itemsize}")
    arr: _AnyArray = np.frombuffer(buf, dtype=dtype, count=n // itemsize, offset=a)
    if copy:
        arr = arr.copy()
        return arr
    if a % itemsize:  # keep views aligned
        arr = arr.copy()
        arr.flags.writeable = False
    return arr


def _widen(arr: _AnyArray, code: int) -> _AnyArray:
    """bf16 bits -> float32 by shift (NaNs quieted, as a numeric cast does); int32 -> int64."""
    if code == DTYPE_BFLOAT16:
        bits = arr.astype(np.uint32) << 16
        nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
        if nan.any():
            bits[nan] |= 0x00400000  # the official client's cast quiets signalling NaNs
        return cast(_AnyArray, bits.view(np.float32))
    if code == DTYPE_INT32:
        return arr.astype(np.int64)
    return arr


# ----------------------------------------------------------------------------- types glue


def _tensor_data(
    arr: _AnyArray,
    dtype: str,
    shape: list[int] | None,
    crow: _AnyArray | None = None,
    col: _AnyArray | None = None,
) -> TensorData:
    """Wrap decoded arrays (already in the public dtype) as TensorData."""
    if crow is not None and col is not None:
        return TensorData(
            data=arr,
            dtype=dtype,  # type: ignore[arg-type]
            shape=shape,
            sparse_crow_indices=crow,
            sparse_col_indices=col,
        )
    return TensorData(data=arr, dtype=dtype, shape=shape)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- result decoders


def _decode_batched(
    buf: Buffer, start: int, end: int, name: str
) -> tuple[list[_AnyArray], str, list[int]]:
    """A BatchedTensor as per-datum flat arrays, its public dtype and its trailing shape."""
    data: tuple[int, int] = _NO_SPAN
    offsets: tuple[int, int] = _NO_SPAN
    code = DTYPE_UNSPECIFIED
    trailing: list[int] = []
    for field in _fields(buf, start, end):
        number, wire, a, b = field
        if number == 1 and wire == 2:
            data = (a, b)
        elif number == 2 and wire == 2:
            offsets = (a, b)
        elif number == 3 and wire == 0:
            code = _int32(a)
        elif number == 4:
            _repeated_int64(buf, field, trailing)
    wire_dtype = _WIRE_DTYPES.get(code)
    if wire_dtype is None:
        raise ValueError(f"field {name!r}: unsupported proto dtype {code}")
    np_dtype, public = wire_dtype
    values = _widen(_array(buf, data, np_dtype, f"field {name!r} data", True), code)
    bounds = _array(buf, offsets, _LE_I8, f"field {name!r} offsets", False).tolist()
    itemsize = np_dtype.itemsize
    total = data[1] - data[0]
    per_datum: list[_AnyArray] = []
    previous = 0
    for i in range(len(bounds) - 1):
        lo = bounds[i]
        hi = bounds[i + 1]
        if not 0 <= lo <= hi <= total or lo < previous or lo % itemsize or hi % itemsize:
            raise ValueError(f"field {name!r}: bad byte offsets {lo}..{hi} for {total} bytes")
        previous = hi
        per_datum.append(values[lo // itemsize : hi // itemsize])
    return per_datum, public, trailing


def decode_forward_backward_output(payload: Buffer) -> ForwardBackwardOutput:
    """Decode a protobuf ``ForwardBackwardOutput`` result (BEHAVIOR B40).

    Usage: ``decode_forward_backward_output(response.content)``.

    The output type is the text after the last ``:`` (the raw string, or ``"ArrayRecord"`` when
    empty, if there are no records). Each ``BatchedTensor`` is sliced per datum by its int64
    byte offsets and shaped ``[n / prod(trailing), *trailing]``; records are concatenated; bf16
    becomes float32 and int32 becomes int64. The arrays are read-only views of ``payload``
    where alignment allows.

    :raises ValueError: malformed protobuf, an unsupported dtype, bad offsets or shapes.
    """
    buf = payload
    output_type = ""
    records: list[tuple[int, int]] = []
    metrics: dict[str, float] = {}
    for number, wire, a, b in _fields(buf, 0, len(buf)):
        if number == 1 and wire == 2:
            output_type = _text(buf, a, b, "loss_fn_output_type")
        elif number == 2 and wire == 2:
            records.append((a, b))
        elif number == 3 and wire == 2:
            key = ""
            value = 0.0
            for n2, w2, a2, b2 in _fields(buf, a, b):
                if n2 == 1 and w2 == 2:
                    key = _text(buf, a2, b2, "metric name")
                elif n2 == 2 and w2 == 1:
                    value = _unpack_double(buf, a2)[0]
            metrics[key] = value
    if not records:
        return ForwardBackwardOutput(
            loss_fn_output_type=output_type or "ArrayRecord", loss_fn_outputs=[], metrics=metrics
        )
    # Per field, the per-datum arrays of every record concatenated, with their metadata.
    columns: dict[str, tuple[list[_AnyArray], list[tuple[str, list[int]]]]] = {}
    num_datums = 0
    for a, b in records:
        tensors: dict[str, tuple[int, int]] = {}
        for number, wire, a2, b2 in _fields(buf, a, b):
            if number == 2 and wire == 2:
                key = ""
                span: tuple[int, int] = (a2, a2)
                for n3, w3, a3, b3 in _fields(buf, a2, b2):
                    if n3 == 1 and w3 == 2:
                        key = _text(buf, a3, b3, "field name")
                    elif n3 == 2 and w3 == 2:
                        span = (a3, b3)
                tensors[key] = span
            elif number == 3 and wire == 0:
                num_datums += _int64(a2)
        for name, (a3, b3) in tensors.items():
            arrays, public, trailing = _decode_batched(buf, a3, b3, name)
            column = columns.setdefault(name, ([], []))
            column[0].extend(arrays)
            column[1].extend([(public, trailing)] * len(arrays))
    # num_datums is authoritative (it survives servers stripping every field); encoders that
    # predate it leave it 0, and then the first field gives the count.
    if num_datums == 0 and columns:
        num_datums = len(next(iter(columns.values()))[0])
    if num_datums < 0:
        raise ValueError(f"negative num_datums {num_datums}")
    for name, (arrays, _) in columns.items():
        if len(arrays) < num_datums:
            raise ValueError(
                f"field {name!r} holds {len(arrays)} datums, the records declare {num_datums}"
            )
    outputs: list[dict[str, TensorData]] = []
    items = [(name, arrays, meta) for name, (arrays, meta) in columns.items()]
    shape_cache: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i in range(num_datums):
        datum: dict[str, TensorData] = {}
        for name, arrays, meta in items:
            arr = arrays[i]
            public, trailing = meta[i]
            size = arr.size
            cache_key = (size, tuple(trailing))
            shape = shape_cache.get(cache_key)
            if shape is None:
                inner = math.prod(trailing)
                leading = size // inner if inner else 0
                if leading * inner != size:
                    raise ValueError(
                        f"field {name!r}: {size} elements do not fit trailing shape {trailing}"
                    )
                shape = [leading, *trailing]
                shape_cache[cache_key] = shape
            datum[name] = _tensor_data(arr, public, list(shape))
        outputs.append(datum)
    class_name = output_type.rsplit(":", 1)[-1]
    return ForwardBackwardOutput(
        loss_fn_output_type=class_name, loss_fn_outputs=outputs, metrics=metrics
    )


def _decode_topk(buf: Buffer, start: int, end: int, what: str) -> TopkLogprobs | None:
    """A ``TopkLogprobs`` message as matrices (None when ``k`` or ``length`` is 0)."""
    ids: tuple[int, int] = _NO_SPAN
    lps: tuple[int, int] = _NO_SPAN
    k = 0
    length = 0
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 2:
            ids = (a, b)
        elif number == 2 and wire == 2:
            lps = (a, b)
        elif number == 3 and wire == 0:
            k = a & 0xFFFFFFFF
        elif number == 4 and wire == 0:
            length = a & 0xFFFFFFFF
    if k == 0 or length == 0:
        return None
    need = k * length * 4
    if (ids[1] - ids[0]) < need or (lps[1] - lps[0]) < need:
        raise ValueError(f"{what}: {length}x{k} top-k matrices need {need} bytes each")
    ids = (ids[0], ids[0] + need)
    lps = (lps[0], lps[0] + need)
    token_ids = _array(buf, ids, _LE_I4, what, True).reshape(length, k)
    logprobs = _array(buf, lps, _LE_F4, what, True).reshape(length, k)
    return TopkLogprobs(token_ids=token_ids, logprobs=logprobs)


def _read_tensor(
    buf: Buffer, start: int, end: int, what: str
) -> tuple[int, _AnyArray, list[int], _AnyArray | None, _AnyArray | None]:
    """A ``Tensor`` message: (wire dtype, widened values copy, shape, crow, col)."""
    dense: tuple[int, int] = _NO_SPAN
    csr: _Sub | None = None
    code = DTYPE_UNSPECIFIED
    shape: list[int] = []
    for field in _fields(buf, start, end):
        number, wire, a, b = field
        if number == 1 and wire == 2:
            dense = (a, b)
            csr = None
        elif number == 2 and wire == 2:
            if csr is None:
                csr = _Sub()
            csr.add(a, b)
        elif number == 3 and wire == 0:
            code = _int32(a)
        elif number == 4:
            _repeated_int64(buf, field, shape)
    wire_dtype = _WIRE_DTYPES.get(code)
    if wire_dtype is None:
        raise ValueError(f"{what}: unsupported proto dtype {code}")
    np_dtype = wire_dtype[0]
    if csr is None:
        values = _widen(_array(buf, dense, np_dtype, what, True), code)
        return code, values, shape, None, None
    cbuf, ca, cb = csr.get(buf)
    vals: tuple[int, int] = _NO_SPAN
    crow: tuple[int, int] = _NO_SPAN
    col: tuple[int, int] = _NO_SPAN
    for number, wire, a, b in _fields(cbuf, ca, cb):
        if wire != 2:
            continue
        if number == 1:
            vals = (a, b)
        elif number == 2:
            crow = (a, b)
        elif number == 3:
            col = (a, b)
    return (
        code,
        _widen(_array(cbuf, vals, np_dtype, what, True), code),
        shape,
        _array(cbuf, crow, _LE_I8, f"{what} crow_indices", True),
        _array(cbuf, col, _LE_I8, f"{what} col_indices", True),
    )


def _decode_tensor(buf: Buffer, start: int, end: int, what: str) -> TensorData:
    """A ``Tensor`` message as TensorData (CSR stays CSR; arrays copied)."""
    code, values, shape, crow, col = _read_tensor(buf, start, end, what)
    public = _WIRE_DTYPES[code][1]
    if crow is not None and col is not None:
        return _tensor_data(values, public, shape, crow, col)
    return _tensor_data(values, public, shape or None)


def _decode_sequence(buf: Buffer, start: int, end: int, sequence_id: str | None) -> SampledSequence:
    reason = 0
    tokens: tuple[int, int] = _NO_SPAN
    logprobs: tuple[int, int] = _NO_SPAN
    topk: _Sub | None = None
    for number, wire, a, b in _fields(buf, start, end):
        if wire == 2:
            if number == 2:
                tokens = (a, b)
            elif number == 3:
                logprobs = (a, b)
            elif number == 4:
                if topk is None:
                    topk = _Sub()
                topk.add(a, b)
        elif number == 1 and wire == 0:
            reason = _int32(a)
    stop_reason = _STOP_REASONS.get(reason)
    if stop_reason is None:
        raise ValueError(f"unknown stop_reason enum value {reason}")
    return SampledSequence(
        stop_reason=stop_reason,  # type: ignore[arg-type]
        sequence_id=sequence_id,
        tokens_np=_array(buf, tokens, _LE_I4, "tokens", True),
        logprobs_np=(
            _array(buf, logprobs, _LE_F4, "logprobs", True) if logprobs[1] > logprobs[0] else None
        ),
        topk_logprobs_np=(
            None if topk is None else _decode_topk(*topk.get(buf), "topk_sampled_logprobs")
        ),
    )


def decode_sample_response(payload: Buffer, sequence_ids: Sequence[str] | None) -> SampleResponse:
    """Decode a protobuf ``SampleResponse`` result (BEHAVIOR B40, B16, B64).

    Usage: ``decode_sample_response(response.content, future.sample_sequence_ids)``.

    :param sequence_ids: the ``sample_sequence_ids`` of the asample reply, stamped onto the
        sequences in order; ``None`` (an older server) leaves ``sequence_id`` None.
    :raises ValueError: malformed protobuf, an unknown ``stop_reason``, or a number of
        sequence ids that differs from the number of sequences.
    """
    buf = payload
    seq_spans: list[tuple[int, int]] = []
    prompt_lp: tuple[int, int] = _NO_SPAN
    topk_prompt = _Sub()
    cache_hits = 0
    target = _Sub()
    alt = _Sub()
    for number, wire, a, b in _fields(buf, 0, len(buf)):
        if wire == 2:
            if number == 1:
                seq_spans.append((a, b))
            elif number == 2:
                prompt_lp = (a, b)
            elif number == 3:
                topk_prompt.add(a, b)
            elif number == 5:
                target.add(a, b)
            elif number == 6:
                alt.add(a, b)
        elif number == 4 and wire == 0:
            cache_hits = _int32(a)
    if sequence_ids is not None and len(sequence_ids) != len(seq_spans):
        raise ValueError(
            f"the server sent {len(sequence_ids)} sample_sequence_ids "
            f"for {len(seq_spans)} sequences"
        )
    sequences: list[SampledSequence] = []
    for index, (a, b) in enumerate(seq_spans):
        try:
            sequences.append(
                _decode_sequence(buf, a, b, None if sequence_ids is None else sequence_ids[index])
            )
        except ValueError as exc:
            raise ValueError(f"sequences[{index}]: {exc}") from None
    prompt_alt = None
    if alt:
        abuf, aa, ab = alt.get(buf)
        parts: dict[int, _Sub] = {1: _Sub(), 2: _Sub()}
        for number, wire, a, b in _fields(abuf, aa, ab):
            if wire == 2 and number in parts:
                parts[number].add(a, b)
        decoded = []
        for number, label in ((1, "prompt_alt_tokens.tokens"), (2, "prompt_alt_tokens.logprobs")):
            if parts[number]:
                decoded.append(_decode_tensor(*parts[number].get(abuf), label))
            else:
                decoded.append(_decode_tensor(b"", 0, 0, label))
        prompt_alt = PromptAltTokens(tokens=decoded[0], logprobs=decoded[1])
    return SampleResponse(
        sequences=sequences,
        prompt_logprobs_np=(
            _array(buf, prompt_lp, _LE_F4, "prompt_logprobs", True)
            if (prompt_lp[1] - prompt_lp[0])
            else None
        ),
        topk_prompt_logprobs_np=(
            _decode_topk(*topk_prompt.get(buf), "topk_prompt_logprobs") if topk_prompt else None
        ),
        target_prompt_logprobs=(
            _decode_tensor(*target.get(buf), "target_prompt_logprobs") if target else None
        ),
        prompt_cache_hit_tokens=cache_hits,
        prompt_alt_tokens=prompt_alt,
    )


# ----------------------------------------------------------------------------- server encoders


def _result_array(value: Any, where: str) -> tuple[int, _AnyArray, tuple[int, ...]]:
    """A backend output as (wire dtype, flat LE array, trailing shape)."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    kind = arr.dtype.kind
    if kind == "f":
        return DTYPE_FLOAT32, _flat_le(arr, _LE_F4), tuple(arr.shape[1:])
    if kind in "iub":
        return DTYPE_INT64, _flat_le(arr, _LE_I8), tuple(arr.shape[1:])
    raise ValueError(f"{where}: unsupported output dtype {arr.dtype}")


def _record_parts(
    type_tag: str,
    names: list[str],
    rows: list[list[tuple[int, _AnyArray, tuple[int, ...]]]],
    out: list[_Part],
) -> None:
    """Append one ``loss_fn_outputs`` ArrayRecord (tag 2) holding ``rows`` to ``out``."""
    parts: list[_Part] = [_str_field(0x0A, type_tag)]
    size = len(parts[0])
    for column, name in enumerate(names):
        code, _, trailing = rows[0][column]
        arrays = [row[column][1] for row in rows]
        offsets = np.zeros(len(arrays) + 1, dtype=_LE_I8)
        np.cumsum([arr.nbytes for arr in arrays], out=offsets[1:])
        total = int(offsets[-1])
        tail = bytes(_ld(0x12, offsets.tobytes())) + b"\x18" + _uv(code)
        tail += _packed_int64(0x22, trailing)
        data_head = b"\x0a" + _uv(total) if total else b""
        tensor_size = len(data_head) + total + len(tail)
        key = _ld(0x0A, name.encode("utf-8"))
        entry_size = len(key) + 1 + _vlen(tensor_size) + tensor_size
        head = b"\x12" + _uv(entry_size) + key + b"\x12" + _uv(tensor_size) + data_head
        parts.append(head)
        parts.extend(arr for arr in arrays if arr.nbytes)
        parts.append(tail)
        size += len(head) + total + len(tail)
    count = b"\x18" + _sv(len(rows))
    parts.append(count)
    size += len(count)
    out.append(b"\x12" + _uv(size))
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
    out: list[_Part] = [_str_field(0x0A, output_type)]
    names: list[str] = []
    signature: tuple[Any, ...] | None = None
    rows: list[list[tuple[int, _AnyArray, tuple[int, ...]]]] = []
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
        entry = _ld(0x0A, name.encode("utf-8")) + b"\x11" + _pack_double(float(value))
        out.append(_ld(0x1A, entry))
    return b"".join(cast("list[bytes]", out))


def _array_bytes(arr: Any, dtype: np.dtype[Any]) -> bytes:
    return _flat_le(np.asarray(arr), dtype).tobytes()


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
        body += _ld(0x0A, _array_bytes(ids_arr, _LE_I4))
        body += _ld(0x12, _array_bytes(lps_arr, _LE_F4))
    if k:
        body += b"\x18" + _uv(k)
    if length:
        body += b"\x20" + _uv(length)
    return body


def _tensor_bytes(arr: Any, public: str) -> bytes:
    array = np.asarray(arr)
    body = _ld(0x0A, _array_bytes(array, _DTYPE_NUMPY[public]))
    body += b"\x18" + _uv(_DTYPE_CODES[public])
    return body + _packed_int64(0x22, list(array.shape))


def encode_sample_response(result: SampleResult) -> bytes:
    """Serialize a backend :class:`~tinker_sync.local.backends.base.SampleResult` as a
    protobuf ``SampleResponse`` (local server side).

    Usage: ``encode_sample_response(sampler.sample(prompt, opts))``.

    :raises ValueError: an unknown stop reason or inconsistent top-k matrices.
    """
    out: list[bytes] = []
    for index, seq in enumerate(result.sequences):
        code = _STOP_REASON_CODES.get(seq.stop_reason)
        if code is None:
            raise ValueError(f"sequences[{index}]: unknown stop_reason {seq.stop_reason!r}")
        body = b"\x08" + _uv(code) if code else b""
        tokens = _array_bytes(seq.tokens, _LE_I4)
        if tokens:
            body += _ld(0x12, tokens)
        if seq.logprobs is not None:
            body += _ld(0x1A, _array_bytes(seq.logprobs, _LE_F4))
        if seq.topk_ids is not None and seq.topk_logprobs is not None:
            body += _ld(0x22, _topk_bytes(seq.topk_ids, seq.topk_logprobs))
        out.append(_ld(0x0A, body))
    if result.prompt_logprobs is not None:
        out.append(_ld(0x12, _array_bytes(result.prompt_logprobs, _LE_F4)))
    if result.topk_prompt_ids is not None and result.topk_prompt_logprobs is not None:
        out.append(_ld(0x1A, _topk_bytes(result.topk_prompt_ids, result.topk_prompt_logprobs)))
    if result.prompt_cache_hit_tokens:
        out.append(b"\x20" + _sv(int(result.prompt_cache_hit_tokens)))
    if result.target_prompt_logprobs is not None:
        out.append(_ld(0x2A, _tensor_bytes(result.target_prompt_logprobs, "float32")))
    if result.prompt_alt_tokens is not None and result.prompt_alt_logprobs is not None:
        alt = _ld(0x0A, _tensor_bytes(result.prompt_alt_tokens, "int64"))
        alt += _ld(0x12, _tensor_bytes(result.prompt_alt_logprobs, "float32"))
        out.append(_ld(0x32, alt))
    return b"".join(out)


# ----------------------------------------------------------------------------- request decoder

_TENSOR_CONTAINER_MARKER = 254
_TENSOR_CONTAINER_MAX_DTYPE = 7


def _dmel_length(dmel: Buffer, what: str) -> int:
    """Dim 0 of a serialized TensorContainer (its header only)."""
    data = bytes(dmel)
    if not data:
        raise ValueError(f"{what}: empty dmel tensor container")
    pos = 1 if data[0] == _TENSOR_CONTAINER_MARKER else 0
    if pos >= len(data) or data[pos] > _TENSOR_CONTAINER_MAX_DTYPE:
        raise ValueError(f"{what}: bad dmel tensor container header")
    try:
        ndim, pos = _read_varint(data, pos + 1, len(data))
        if ndim < 1:
            raise ValueError("no dimension 0")
        dim0, _ = _read_varint(data, pos, len(data))
    except ValueError as exc:
        raise ValueError(f"{what}: bad dmel tensor container header ({exc})") from exc
    return dim0


def _chunk_tokens(buf: Buffer, start: int, end: int, what: str) -> _AnyArray:
    """The model-input tokens of one ``Chunk`` (non-text chunks give zeros)."""
    arm = 0
    arm_spans: dict[int, _Sub] = {}
    for number, wire, a, b in _fields(buf, start, end):
        if wire == 2 and number in (1, 2, 3):
            if number != arm:
                arm_spans[number] = _Sub()
            arm = number
            arm_spans[number].add(a, b)
    if arm == 0:
        raise ValueError(f"{what}: chunk has no encoded_text, image or dmel content")
    sbuf, sa, sb = arm_spans[arm].get(buf)
    if arm == 1:
        tokens: tuple[int, int] = _NO_SPAN
        for number, wire, a, b in _fields(sbuf, sa, sb):
            if number == 1 and wire == 2:
                tokens = (a, b)
        return _array(sbuf, tokens, _LE_I4, f"{what}.tokens", False).astype(np.int64)
    if arm == 2:
        expected: int | None = None
        for number, wire, a, _b in _fields(sbuf, sa, sb):
            if number == 3 and wire == 0:
                expected = _int32(a)
        if expected is None or expected < 0:
            raise ValueError(f"{what}: image chunks need a non-negative expected_tokens")
        return np.zeros(expected, dtype=np.int64)
    dmel: tuple[int, int] = _NO_SPAN
    for number, wire, a, b in _fields(sbuf, sa, sb):
        if number == 1 and wire == 2:
            dmel = (a, b)
    return np.zeros(_dmel_length(sbuf[dmel[0] : dmel[1]], what), dtype=np.int64)


def _dense_input(buf: Buffer, start: int, end: int, what: str) -> _AnyArray:
    """A ``Tensor`` message densified (CSR expanded with pad 0) in its declared shape."""
    _, values, shape, crow, col = _read_tensor(buf, start, end, what)
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
    from tinker_sync.local.backends.base import DatumArrays

    buf = payload
    try:
        top = _fields(buf, 0, len(buf))
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
                model_id = _text(buf, a, b, "model_id")
            elif number == 3:
                datum_spans.append((a, b))
            elif number == 4:
                loss_fn = _text(buf, a, b, "loss_fn")
            elif number == 5:
                key, value = _config_entry(buf, a, b, False)
                legacy[key] = value
            elif number == 7:
                key, value = _config_entry(buf, a, b, True)
                current[key] = value
        elif wire == 0:
            if number == 2:
                seq_id = _int32(a)
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
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 2:
            key = _text(buf, a, b, "loss_fn_config key")
        elif number == 2 and not v2 and wire == 1:
            value = _unpack_double(buf, a)[0]
        elif number == 2 and v2 and wire == 2:
            found = False
            for n2, w2, a2, b2 in _fields(buf, a, b):
                if n2 == 1 and w2 == 1:
                    value = _unpack_double(buf, a2)[0]
                    found = True
                elif n2 == 2 and w2 == 2:
                    value = _text(buf, a2, b2, "loss_fn_config text")
                    found = True
    if not found:
        raise ValueError(f"loss_fn_config_v2[{key!r}] has neither number nor text")
    return key, value


def _datum_arrays(
    buf: Buffer, start: int, end: int, what: str, factory: type[DatumArrays]
) -> DatumArrays:
    tokens: list[_AnyArray] = []
    inputs: dict[str, _AnyArray] = {}
    for number, wire, a, b in _fields(buf, start, end):
        if wire != 2:
            continue
        if number == 1:
            tokens.append(_chunk_tokens(buf, a, b, f"{what}.model_input[{len(tokens)}]"))
        elif number == 2:
            key = ""
            tensor: tuple[int, int] = (a, a)
            for n2, w2, a2, b2 in _fields(buf, a, b):
                if n2 == 1 and w2 == 2:
                    key = _text(buf, a2, b2, f"{what} loss_fn_inputs key")
                elif n2 == 2 and w2 == 2:
                    tensor = (a2, b2)
            inputs[key] = _dense_input(buf, *tensor, f"{what}.loss_fn_inputs[{key!r}]")
    if not tokens:
        flat = np.zeros(0, dtype=np.int64)
    elif len(tokens) == 1:
        flat = tokens[0]
    else:
        flat = np.concatenate(tokens)
    return factory(tokens=flat, inputs=inputs)


# ----------------------------------------------------------------------------- JSON fallbacks


def _json_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what}: expected a list, got {type(value).__name__}")
    return value


def _json_numbers(value: Any, dtype: np.dtype[Any], what: str) -> _AnyArray:
    """A flat JSON list of numbers as an array; integer dtypes accept only ints (no 1.9 -> 1)."""
    items = _json_list(value, what)
    allowed: type | tuple[type, ...] = int if dtype.kind == "i" else (int, float)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, allowed):
            expected = "integers" if dtype.kind == "i" else "numbers"
            raise TypeError(f"{what}: expected {expected}, got {type(item).__name__} {item!r}")
    try:
        return np.asarray(items, dtype=dtype).reshape(-1)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{what}: {exc}") from exc


def _tensor_from_json(obj: Any, what: str) -> TensorData:
    if not isinstance(obj, Mapping):
        raise TypeError(f"{what}: expected a TensorData object, got {type(obj).__name__}")
    dtype = obj.get("dtype")
    if dtype not in _DTYPE_NUMPY:
        raise ValueError(f"{what}.dtype: expected 'int64' or 'float32', got {dtype!r}")
    data = _json_numbers(obj.get("data", []), _DTYPE_NUMPY[dtype], f"{what}.data")
    shape_obj = obj.get("shape")
    shape = (
        None
        if shape_obj is None
        else [int(s) for s in _json_numbers(shape_obj, _LE_I8, f"{what}.shape")]
    )
    crow_obj = obj.get("sparse_crow_indices")
    col_obj = obj.get("sparse_col_indices")
    if crow_obj is not None or col_obj is not None:
        if crow_obj is None or col_obj is None or shape is None:
            raise ValueError(f"{what}: CSR needs both index lists and a shape")
        return _tensor_data(
            data,
            dtype,
            shape,
            _json_numbers(crow_obj, _LE_I8, f"{what}.sparse_crow_indices"),
            _json_numbers(col_obj, _LE_I8, f"{what}.sparse_col_indices"),
        )
    if shape is not None and math.prod(shape) != data.size:
        raise ValueError(f"{what}: {data.size} values do not fit shape {shape}")
    return _tensor_data(data, dtype, shape)


def _topk_from_json(value: Any, what: str) -> TopkLogprobs | None:

    if value is None:
        return None
    rows = _json_list(value, what)
    width = 0
    for row in rows:
        if row is not None:
            width = max(width, len(_json_list(row, what)))
    k = max(width, 1) if rows else 0
    ids = np.zeros((len(rows), k), dtype=np.int32)
    lps = np.full((len(rows), k), TOPK_SENTINEL_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        if row is None:
            continue
        for j, pair in enumerate(row):
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise TypeError(f"{what}[{i}][{j}]: expected a [token_id, logprob] pair")
            token, logprob = pair
            if isinstance(token, bool) or not isinstance(token, int):
                raise TypeError(f"{what}[{i}][{j}]: token id must be an int")
            if isinstance(logprob, bool) or not isinstance(logprob, int | float):
                raise TypeError(f"{what}[{i}][{j}]: logprob must be a number")
            ids[i, j] = token
            lps[i, j] = logprob
    return TopkLogprobs(token_ids=ids, logprobs=lps)


def sample_response_from_json(
    obj: Mapping[str, Any], sequence_ids: Sequence[str] | None
) -> SampleResponse:
    """Build a SampleResponse from a JSON result (older servers, BEHAVIOR B21 step 5).

    Usage: ``sample_response_from_json(response.json(), future.sample_sequence_ids)``.

    Accepts ``sequences`` (each ``stop_reason``, ``tokens``, optional ``logprobs`` and
    ``topk_logprobs``), ``prompt_logprobs`` (``null`` entries = not computed),
    ``topk_prompt_logprobs`` (rows of ``[token_id, logprob]`` pairs or ``null``),
    ``prompt_cache_hit_tokens``, ``target_prompt_logprobs`` (TensorData JSON) and
    ``prompt_alt_tokens`` (``{"tokens", "logprobs"}`` TensorData JSON); unknown keys are ignored.

    :raises ValueError | TypeError: a missing or ill-typed field, an unknown stop reason, or a
        sequence-id count mismatch.
    """
    if not isinstance(obj, Mapping):
        raise TypeError(f"SampleResponse: expected an object, got {type(obj).__name__}")
    raw_sequences = _json_list(obj.get("sequences"), "sequences")
    if sequence_ids is not None and len(sequence_ids) != len(raw_sequences):
        raise ValueError(
            f"the server sent {len(sequence_ids)} sample_sequence_ids "
            f"for {len(raw_sequences)} sequences"
        )
    sequences: list[SampledSequence] = []
    for index, raw in enumerate(raw_sequences):
        what = f"sequences[{index}]"
        if not isinstance(raw, Mapping):
            raise TypeError(f"{what}: expected an object")
        stop_reason = raw.get("stop_reason")
        if stop_reason not in _STOP_REASON_CODES:
            raise ValueError(f"{what}.stop_reason: unknown value {stop_reason!r}")
        logprobs = raw.get("logprobs")
        sequences.append(
            SampledSequence(
                stop_reason=stop_reason,
                sequence_id=None if sequence_ids is None else sequence_ids[index],
                tokens_np=_json_numbers(raw.get("tokens"), _LE_I4, f"{what}.tokens").astype(
                    np.int32
                ),
                logprobs_np=(
                    None
                    if logprobs is None
                    else _json_numbers(
                        [math.nan if v is None else v for v in _json_list(logprobs, what)],
                        _LE_F4,
                        f"{what}.logprobs",
                    ).astype(np.float32)
                ),
                topk_logprobs_np=_topk_from_json(raw.get("topk_logprobs"), f"{what}.topk_logprobs"),
            )
        )
    prompt_logprobs = obj.get("prompt_logprobs")
    prompt_np = None
    if prompt_logprobs is not None:
        prompt_np = _json_numbers(
            [math.nan if v is None else v for v in _json_list(prompt_logprobs, "prompt_logprobs")],
            _LE_F4,
            "prompt_logprobs",
        ).astype(np.float32)
    target = obj.get("target_prompt_logprobs")
    alt = obj.get("prompt_alt_tokens")
    prompt_alt = None
    if alt is not None:
        if not isinstance(alt, Mapping):
            raise TypeError("prompt_alt_tokens: expected an object")
        prompt_alt = PromptAltTokens(
            tokens=_tensor_from_json(alt.get("tokens"), "prompt_alt_tokens.tokens"),
            logprobs=_tensor_from_json(alt.get("logprobs"), "prompt_alt_tokens.logprobs"),
        )
    hits = obj.get("prompt_cache_hit_tokens", 0)
    if hits is None:
        hits = 0
    if isinstance(hits, bool) or not isinstance(hits, int):
        raise TypeError("prompt_cache_hit_tokens: expected an int")
    return SampleResponse(
        sequences=sequences,
        prompt_logprobs_np=prompt_np,
        topk_prompt_logprobs_np=_topk_from_json(
            obj.get("topk_prompt_logprobs"), "topk_prompt_logprobs"
        ),
        target_prompt_logprobs=(
            None if target is None else _tensor_from_json(target, "target_prompt_logprobs")
        ),
        prompt_cache_hit_tokens=hits,
        prompt_alt_tokens=prompt_alt,
    )


def forward_backward_output_from_json(obj: Mapping[str, Any]) -> ForwardBackwardOutput:
    """Build a ForwardBackwardOutput from a JSON result (older servers, BEHAVIOR B21 step 5).

    Usage: ``forward_backward_output_from_json(response.json())``.

    Accepts ``loss_fn_output_type`` (default ``"ArrayRecord"``), ``loss_fn_outputs`` (a list of
    ``{name: TensorData JSON}``) and ``metrics`` (missing or null = ``{}``, B64).

    :raises ValueError | TypeError: a missing or ill-typed field.
    """
    if not isinstance(obj, Mapping):
        raise TypeError(f"ForwardBackwardOutput: expected an object, got {type(obj).__name__}")
    output_type = obj.get("loss_fn_output_type", "ArrayRecord")
    if not isinstance(output_type, str):
        raise TypeError("loss_fn_output_type: expected a string")
    outputs: list[dict[str, TensorData]] = []
    for index, raw in enumerate(_json_list(obj.get("loss_fn_outputs", []), "loss_fn_outputs")):
        if not isinstance(raw, Mapping):
            raise TypeError(f"loss_fn_outputs[{index}]: expected an object")
        outputs.append(
            {
                str(name): _tensor_from_json(value, f"loss_fn_outputs[{index}][{name!r}]")
                for name, value in raw.items()
            }
        )
    raw_metrics = obj.get("metrics") or {}
    if not isinstance(raw_metrics, Mapping):
        raise TypeError("metrics: expected an object")
    metrics: dict[str, float] = {}
    for name, value in raw_metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"metrics[{name!r}]: expected a number")
        metrics[str(name)] = float(value)
    return ForwardBackwardOutput(
        loss_fn_output_type=output_type, loss_fn_outputs=outputs, metrics=metrics
    )


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
