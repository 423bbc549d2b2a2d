"""Model input: the four chunk kinds and ``ModelInput``.

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

import attrs

from tinker_sync._lazynp import is_ndarray
from tinker_sync.types._base import TinkerRequest, checked
from tinker_sync.types._coerce import Invalid, to_int

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "DmelChunk",
    "EncodedTextChunk",
    "ImageAssetPointerChunk",
    "ImageChunk",
    "ModelInput",
    "ModelInputChunk",
    "tensor_container_shape",
]

_INT_ONLY = {int}
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def _tokens(value: Any) -> Sequence[int]:
    """Validate and copy a token sequence (the chunk never shares the caller's list or array).

    A read-only numpy integer array is kept as is (nobody can change it); a writable one is
    copied into a read-only array.
    """
    if is_ndarray(value):
        if value.dtype.kind not in "iu":
            raise TypeError(
                f"EncodedTextChunk.tokens: expected an integer array, got dtype {value.dtype}"
            )
        if value.ndim != 1:
            raise ValueError(f"EncodedTextChunk.tokens: expected a 1-D array, got {value.ndim}-D")
        if value.flags.writeable:
            value = value.copy()
            value.flags.writeable = False
        return cast(Sequence[int], value)
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        raise TypeError(
            f"EncodedTextChunk.tokens: expected a sequence of ints, got {type(value).__name__}"
        )
    seq = list(value)
    if not seq or set(map(type, seq)) == _INT_ONLY:
        return seq
    out: list[int] = []
    for i, t in enumerate(seq):
        try:
            out.append(to_int(t))  # pydantic's lax int rule, as the official list[int]
        except Invalid as exc:
            raise exc.at(f"EncodedTextChunk.tokens[{i}]", t) from None
    return out


def _tokens_eq(a: Sequence[int], b: Sequence[int]) -> bool:
    if is_ndarray(a) or is_ndarray(b):
        import numpy as np

        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return list(a) == list(b)


@attrs.frozen(kw_only=True, field_transformer=checked)
class EncodedTextChunk(TinkerRequest):
    """A run of token ids: ``EncodedTextChunk(tokens=[1, 2, 3])``.

    ``tokens`` may be a list or a 1-D integer numpy array; either is copied, so changing the
    caller's list afterwards never changes the chunk (a read-only array is kept as is).
    """

    tokens: Sequence[int] = attrs.field(
        converter=_tokens, eq=attrs.cmp_using(eq=_tokens_eq, require_same_type=False), hash=False
    )
    type: Literal["encoded_text"] = "encoded_text"

    @property
    def length(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    @property
    def tokens_np(self) -> "npt.NDArray[np.int32] | npt.NDArray[np.int64]":
        """The tokens as an int32 or int64 numpy array (no copy when given one)."""
        import numpy as np

        t = self.tokens
        if isinstance(t, np.ndarray) and t.dtype in (np.int32, np.int64):
            if t.flags.writeable:
                t = t.view()
                t.flags.writeable = False
            return t
        arr = np.asarray(t, dtype=np.int64)
        if arr.size and int(arr.min()) >= _INT32_MIN and int(arr.max()) <= _INT32_MAX:
            return arr.astype(np.int32)
        return arr


@attrs.frozen(kw_only=True, field_transformer=checked)
class ImageChunk(TinkerRequest):
    """An inline image: ``ImageChunk(data=png_bytes, format="png", expected_tokens=256)``.

    ``data`` is bytes (a base64 ``str`` is decoded); JSON carries it as base64.
    """

    data: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    format: Literal["png", "jpeg"]
    expected_tokens: int | None = None
    type: Literal["image"] = "image"

    @property
    def length(self) -> int:
        """``expected_tokens``; raises ValueError when it is unset."""
        if self.expected_tokens is None:
            raise ValueError(
                "ImageChunk.expected_tokens needs to be set in order to compute the length"
            )
        return self.expected_tokens


@attrs.frozen(kw_only=True, field_transformer=checked)
class ImageAssetPointerChunk(TinkerRequest):
    """An image by reference (sampling prompts only; rejected in forward/backward data)."""

    format: Literal["png", "jpeg"]
    location: str
    expected_tokens: int | None = None
    type: Literal["image_asset_pointer"] = "image_asset_pointer"

    @property
    def length(self) -> int:
        """``expected_tokens``; raises ValueError when it is unset."""
        if self.expected_tokens is None:
            raise ValueError(
                "ImageAssetPointerChunk.expected_tokens needs to be set in order to compute the "
                "length"
            )
        return self.expected_tokens


_CONSTANT_MARKER = 254
_MAX_DTYPE_BYTE = 7


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise ValueError("DmelChunk.dmel: truncated TensorContainer header")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 63:
            raise ValueError("DmelChunk.dmel: TensorContainer varint is too long")


def tensor_container_shape(data: bytes) -> tuple[int, ...]:
    """Read the shape from a serialized TensorContainer header without decoding the payload.

    Header: optional marker byte 254, dtype byte 0..7, LEB128 ``ndim``, then ``ndim`` dims.
    """
    if not data:
        raise ValueError("DmelChunk.dmel: TensorContainer bytes are empty")
    offset = 0
    if data[0] == _CONSTANT_MARKER:
        offset = 1
        if offset >= len(data):
            raise ValueError("DmelChunk.dmel: truncated TensorContainer header")
    dtype_byte = data[offset]
    if dtype_byte > _MAX_DTYPE_BYTE:
        raise ValueError(f"DmelChunk.dmel: unknown TensorContainer dtype byte {dtype_byte}")
    ndim, offset = _varint(data, offset + 1)
    dims: list[int] = []
    for _ in range(ndim):
        dim, offset = _varint(data, offset)
        dims.append(dim)
    return tuple(dims)


@attrs.frozen(kw_only=True, field_transformer=checked)
class DmelChunk(TinkerRequest):
    """A serialized TensorContainer of DMel tokens; ``length`` is its dim 0."""

    dmel: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    type: Literal["dmel"] = "dmel"

    @property
    def length(self) -> int:
        """Dimension 0 of the serialized tensor."""
        shape = tensor_container_shape(self.dmel)
        if not shape:
            raise ValueError("DmelChunk.dmel: TensorContainer tensor has no dimension 0")
        return shape[0]


ModelInputChunk: TypeAlias = EncodedTextChunk | ImageChunk | ImageAssetPointerChunk | DmelChunk
"""One chunk of a ``ModelInput``; tagged by ``type`` on the wire."""

_CHUNK_TYPES = (EncodedTextChunk, ImageChunk, ImageAssetPointerChunk, DmelChunk)


@attrs.frozen(kw_only=True, field_transformer=checked)
class ModelInput(TinkerRequest):
    """A prompt or training input: ``ModelInput.from_ints([1, 2, 3])``."""

    chunks: list[ModelInputChunk]

    @classmethod
    def from_ints(cls, tokens: "Sequence[int] | npt.NDArray[np.integer[Any]]") -> "ModelInput":
        """One text chunk from an int sequence or a 1-D integer numpy array (copied)."""
        return cls(chunks=[EncodedTextChunk(tokens=tokens)])

    def to_ints(self) -> list[int]:
        """All tokens as a list; ValueError if any chunk is not text."""
        out: list[int] = []
        for chunk in self.chunks:
            if not isinstance(chunk, EncodedTextChunk):
                raise ValueError(
                    "to_ints only supports a ModelInput made of EncodedTextChunks, got "
                    f"{[type(c).__name__ for c in self.chunks]}"
                )
            t = chunk.tokens
            out.extend(t.tolist() if is_ndarray(t) else t)
        return out

    @property
    def length(self) -> int:
        """Total token length (sum of the chunk lengths)."""
        return sum(chunk.length for chunk in self.chunks)

    @classmethod
    def empty(cls) -> "ModelInput":
        """A ModelInput with no chunks."""
        return cls(chunks=[])

    def append(self, chunk: ModelInputChunk) -> "ModelInput":
        """Return a new ModelInput with ``chunk`` added at the end."""
        return ModelInput(chunks=[*self.chunks, chunk])

    def append_int(self, token: int) -> "ModelInput":
        """Return a new ModelInput with a one-token text chunk added at the end."""
        return self.append(EncodedTextChunk(tokens=[token]))
