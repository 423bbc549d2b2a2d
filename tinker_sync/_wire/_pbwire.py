"""Protobuf wire primitives shared by every hand-written codec: varints, field readers and
writers, the dtype tables of ``tinker_public.proto``. Knows no message type.

Usage::

    head = ld_field(0x0A, payload)                 # a length-delimited field
    for number, wire, a, b in fields(buf, 0, len(buf)):
        ...                                        # varint value in ``a``; else ``buf[a:b]``

All arrays travel little-endian (see ``docs/design/protocol.md#protobuf-schema``). Readers raise
:class:`ValueError` (never another error) for malformed input. Importing this module imports no
numpy: the numpy dtype tables (``LE_I4`` ... ``WIRE_DTYPES``) are built on first access, and
:func:`int32s_at` / :func:`float32s_at` read 1-D results without numpy (docs/scale-out.md#start-up).

Thread and fork safety: pure functions; the only state is a bounded cache of encoded shapes,
which is only ever added to.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from tinker_sync.types import TensorData

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

Buffer: TypeAlias = "bytes | bytearray | memoryview"
Part: TypeAlias = "bytes | memoryview | npt.NDArray[Any]"
AnyArray: TypeAlias = "npt.NDArray[Any]"

# ----------------------------------------------------------------------------- constants

DTYPE_UNSPECIFIED = 0
DTYPE_FLOAT32 = 1
DTYPE_INT64 = 2
DTYPE_INT32 = 3
DTYPE_BFLOAT16 = 4

STOP_REASONS = {0: "stop", 1: "length"}
STOP_REASON_CODES = {"stop": 0, "length": 1}

#: Empty top-k slot: token 0 with this logprob.
TOPK_SENTINEL_LOGPROB = -99999.0

DTYPE_CODES: dict[str, int] = {"float32": DTYPE_FLOAT32, "int64": DTYPE_INT64}

if TYPE_CHECKING:  # built by numpy_tables() on first access (module __getattr__)
    LE_I4: np.dtype[Any]
    LE_I8: np.dtype[Any]
    LE_F4: np.dtype[Any]
    LE_U2: np.dtype[Any]
    DTYPE_NUMPY: dict[str, np.dtype[Any]]
    #: wire dtype -> (numpy dtype of the bytes, public TensorData dtype)
    WIRE_DTYPES: dict[int, tuple[np.dtype[Any], str]]

_NUMPY_TABLES = frozenset({"LE_I4", "LE_I8", "LE_F4", "LE_U2", "DTYPE_NUMPY", "WIRE_DTYPES"})


def numpy_tables() -> None:
    """Build the numpy dtype tables (importing numpy) into this module's globals, once."""
    if "WIRE_DTYPES" in globals():
        return
    import numpy as np

    le_i4, le_i8, le_f4, le_u2 = (np.dtype(c) for c in ("<i4", "<i8", "<f4", "<u2"))
    tables = {
        "LE_I4": le_i4,
        "LE_I8": le_i8,
        "LE_F4": le_f4,
        "LE_U2": le_u2,
        "DTYPE_NUMPY": {"float32": le_f4, "int64": le_i8},
        "WIRE_DTYPES": {
            DTYPE_FLOAT32: (le_f4, "float32"),
            DTYPE_INT64: (le_i8, "int64"),
            DTYPE_INT32: (le_i4, "int64"),
            DTYPE_BFLOAT16: (le_u2, "float32"),
        },
    }
    globals().update(tables)  # one atomic update: WIRE_DTYPES present means all are


def _table(name: str) -> Any:
    numpy_tables()
    return globals()[name]


def __getattr__(name: str) -> Any:
    if name in _NUMPY_TABLES:
        return _table(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MASK64 = (1 << 64) - 1
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

# ----------------------------------------------------------------------------- wire writer

SMALL_VARINTS = tuple(bytes((i,)) for i in range(128))
pack_double = struct.Struct("<d").pack
unpack_double = struct.Struct("<d").unpack_from


def uvarint(value: int) -> bytes:
    """Unsigned varint (``value`` >= 0)."""
    if value < 0x80:
        return SMALL_VARINTS[value]
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


def svarint(value: int) -> bytes:
    """Varint of a signed int32/int64 (negative values take ten bytes, two's complement)."""
    return uvarint(value & MASK64) if value < 0 else uvarint(value)


def uvarint_len(value: int) -> int:
    """Length of the unsigned varint of ``value``."""
    if value < 0x80:
        return 1
    if value < 0x4000:
        return 2
    if value < 0x200000:
        return 3
    return (value.bit_length() + 6) // 7


def ld_field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field with a one-byte tag."""
    return bytes((tag,)) + uvarint(len(payload)) + payload


def str_field(tag: int, text: str) -> bytes:
    """A string field, omitted when empty (proto3 default)."""
    if not text:
        return b""
    return ld_field(tag, text.encode("utf-8"))


_packed_cache: dict[tuple[int, tuple[int, ...]], bytes] = {}


def packed_int64(tag: int, values: Sequence[int]) -> bytes:
    """A packed repeated int64 field (omitted when empty); shapes repeat, so it is cached."""
    if not values:
        return b""
    key = (tag, tuple(values))
    encoded = _packed_cache.get(key)
    if encoded is None:
        encoded = ld_field(tag, b"".join(svarint(int(v)) for v in values))
        if len(_packed_cache) < 4096:
            _packed_cache[key] = encoded
    return encoded


def flat_le(arr: AnyArray, dtype: np.dtype[Any]) -> AnyArray:
    """``arr`` as a flat C-contiguous little-endian array of ``dtype`` (no copy if it is one)."""
    if arr.dtype != dtype:
        arr = arr.astype(dtype)
    if arr.ndim != 1 or not arr.flags.c_contiguous:
        import numpy as np

        arr = np.ascontiguousarray(arr).reshape(-1)
    return arr


# ----------------------------------------------------------------------------- wire reader

Field: TypeAlias = tuple[int, int, int, int]
"""(field number, wire type, a, b): varint value in ``a``; for the others ``buf[a:b]``."""


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
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
            return result & MASK64, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def _skip_group(buf: Buffer, pos: int, end: int, number: int, depth: int) -> int:
    if depth > 64:
        raise ValueError("groups nested too deeply")
    while True:
        tag, pos = read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if wire == 4:
            if field != number:
                raise ValueError("mismatched end-group tag")
            return pos
        pos = _skip_value(buf, pos, end, field, wire, depth + 1)


def _skip_value(buf: Buffer, pos: int, end: int, field: int, wire: int, depth: int) -> int:
    if wire == 0:
        return read_varint(buf, pos, end)[1]
    if wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    elif wire == 2:
        n, pos = read_varint(buf, pos, end)
        pos += n
    elif wire == 3:
        return _skip_group(buf, pos, end, field, depth)
    else:
        raise ValueError(f"invalid wire type {wire}")
    if pos > end:
        raise ValueError("truncated field")
    return pos


def fields(buf: Buffer, start: int, end: int) -> list[Field]:
    """Every field of the message ``buf[start:end]`` in wire order (unknown ones included)."""
    out: list[Field] = []
    append = out.append
    pos = start
    while pos < end:
        byte = buf[pos]
        if byte < 0x80:
            tag = byte
            pos += 1
        else:
            tag, pos = read_varint(buf, pos, end)
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
                append((field, 0, value & MASK64, 0))
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


def as_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def as_int64(value: int) -> int:
    return value - (1 << 64) if value & (1 << 63) else value


def utf8_text(buf: Buffer, start: int, end: int, what: str) -> str:
    try:
        return str(buf[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} is not valid UTF-8") from exc


def repeated_int64(buf: Buffer, field: Field, out: list[int]) -> None:
    """Append a (packed or unpacked) repeated int64 occurrence to ``out``."""
    _, wire, a, b = field
    if wire == 0:
        out.append(as_int64(a))
    elif wire == 2:
        pos = a
        while pos < b:
            value, pos = read_varint(buf, pos, b)
            out.append(as_int64(value))


class Sub:
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


NO_SPAN = (0, 0)
"""A bytes field not (yet) seen: ``buf[a:b]`` spans are ``(a, b)`` tuples (last one wins)."""


def array_at(
    buf: Buffer, span: tuple[int, int], dtype: np.dtype[Any], what: str, copy: bool
) -> AnyArray:
    """The bytes ``buf[a:b]`` as a flat array: a writable copy, or a read-only view."""
    import numpy as np

    a, b = span
    n = b - a
    itemsize = dtype.itemsize
    if n % itemsize:
        raise ValueError(f"{what}: {n} bytes is not a multiple of {itemsize}")
    arr: AnyArray = np.frombuffer(buf, dtype=dtype, count=n // itemsize, offset=a)
    if copy:
        arr = arr.copy()
        return arr
    if a % itemsize:  # keep views aligned
        arr = arr.copy()
        arr.flags.writeable = False
    return arr


def widen(arr: AnyArray, code: int) -> AnyArray:
    """bf16 bits -> float32 by shift (NaNs quieted, as a numeric cast does); int32 -> int64."""
    if code == DTYPE_BFLOAT16:
        import numpy as np

        bits = arr.astype(np.uint32) << 16
        nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
        if nan.any():
            bits[nan] |= 0x00400000  # the official client's cast quiets signalling NaNs
        return cast(AnyArray, bits.view(np.float32))
    if code == DTYPE_INT32:
        return arr.astype("int64")
    return arr


# array.array typecodes of 4-byte ints and floats ("i" is 4 bytes on every supported platform)
_I4_CODE = "i" if array.array("i").itemsize == 4 else None


def _array32(buf: Buffer, span: tuple[int, int], typecode: str, what: str) -> array.array[Any]:
    a, b = span
    n = b - a
    if n % 4:
        raise ValueError(f"{what}: {n} bytes is not a multiple of 4")
    out = array.array(typecode)
    out.frombytes(memoryview(buf)[a:b])
    if sys.byteorder == "big":
        out.byteswap()
    return out


def int32s_at(buf: Buffer, span: tuple[int, int], what: str) -> array.array[int] | AnyArray:
    """The little-endian int32 values ``buf[a:b]`` as an ``array.array`` (no numpy)."""
    if _I4_CODE is None:  # pragma: no cover - no 4-byte C int on this platform
        return array_at(buf, span, _table("LE_I4"), what, True)
    return _array32(buf, span, _I4_CODE, what)


def float32s_at(buf: Buffer, span: tuple[int, int], what: str) -> array.array[float]:
    """The little-endian float32 values ``buf[a:b]`` as an ``array.array`` (no numpy)."""
    return _array32(buf, span, "f", what)


# ----------------------------------------------------------------------------- types glue


def tensor_data(
    arr: AnyArray,
    dtype: str,
    shape: list[int] | None,
    crow: AnyArray | None = None,
    col: AnyArray | None = None,
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


def read_tensor(
    buf: Buffer, start: int, end: int, what: str
) -> tuple[int, AnyArray, list[int], AnyArray | None, AnyArray | None]:
    """A ``Tensor`` message: (wire dtype, widened values copy, shape, crow, col)."""
    dense: tuple[int, int] = NO_SPAN
    csr: Sub | None = None
    code = DTYPE_UNSPECIFIED
    shape: list[int] = []
    for field in fields(buf, start, end):
        number, wire, a, b = field
        if number == 1 and wire == 2:
            dense = (a, b)
            csr = None
        elif number == 2 and wire == 2:
            if csr is None:
                csr = Sub()
            csr.add(a, b)
        elif number == 3 and wire == 0:
            code = as_int32(a)
        elif number == 4:
            repeated_int64(buf, field, shape)
    wire_dtype = _table("WIRE_DTYPES").get(code)
    if wire_dtype is None:
        raise ValueError(f"{what}: unsupported proto dtype {code}")
    np_dtype = wire_dtype[0]
    if csr is None:
        values = widen(array_at(buf, dense, np_dtype, what, True), code)
        return code, values, shape, None, None
    cbuf, ca, cb = csr.get(buf)
    vals: tuple[int, int] = NO_SPAN
    crow: tuple[int, int] = NO_SPAN
    col: tuple[int, int] = NO_SPAN
    for number, wire, a, b in fields(cbuf, ca, cb):
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
        widen(array_at(cbuf, vals, np_dtype, what, True), code),
        shape,
        array_at(cbuf, crow, _table("LE_I8"), f"{what} crow_indices", True),
        array_at(cbuf, col, _table("LE_I8"), f"{what} col_indices", True),
    )
