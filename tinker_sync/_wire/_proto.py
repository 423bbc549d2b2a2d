"""Client-side protobuf codecs: the forward_backward request body out, the sample and
forward/backward results in (``docs/design/protocol.md#protobuf-schema``,
``docs/design/behavior.md#proto-request-encoding``,
``docs/design/behavior.md#proto-result-decoding``).

Usage::

    body = encode_forward_backward_request(model_id, seq_id, data, "cross_entropy", None, False)
    output = decode_forward_backward_output(reply_bytes)
    response = decode_sample_response(reply_bytes, sequence_ids)

The bytes are written and read by a small hand-written protobuf codec (primitives in
``_pbwire``) working directly on numpy buffers: a request body is one ``bytes.join`` over
little-endian array views (each array is copied once, into the body), and a result's arrays are
cut out of the reply with ``numpy.frombuffer`` (one copy per datum's array, each its own
allocation, as in the official SDK). A sampled sequence's tokens and logprobs and the prompt
logprobs are read into ``array.array`` instead, so sampling imports no numpy until the caller
reads an ``*_np`` field (docs/scale-out.md#start-up). The field numbers are those of ``tinker_public.proto`` (checked in next to
this module, together with its generated module, which the codec itself does not need); the
tests parse every encoding with that descriptor and with the official SDK's one. The local
server's side of the same messages lives in ``tinker_sync.local._protocodec``; the JSON forms of
the results in ``_jsonresults``; zstd bodies in ``_zstd``.

Tokens travel as int32, tensors in their declared dtype (float32 or int64), CSR indices as
int64. Every decoder raises :class:`ValueError` (never another error) for malformed input.

Thread and fork safety: pure functions without shared state; decoded arrays are writable and
owned by the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from tinker_sync._wire import _pbwire as pb
from tinker_sync._wire._pbwire import (
    DTYPE_CODES,
    DTYPE_UNSPECIFIED,
    INT32_MAX,
    INT32_MIN,
    NO_SPAN,
    SMALL_VARINTS,
    STOP_REASONS,
    AnyArray,
    Buffer,
    Part,
    Sub,
    array_at,
    as_int32,
    as_int64,
    fields,
    flat_le,
    float32s_at,
    int32s_at,
    ld_field,
    pack_double,
    packed_int64,
    read_tensor,
    repeated_int64,
    str_field,
    svarint,
    tensor_data,
    unpack_double,
    utf8_text,
    uvarint,
    uvarint_len,
    widen,
)
from tinker_sync.types import (
    DmelChunk,
    EncodedTextChunk,
    ForwardBackwardOutput,
    ImageAssetPointerChunk,
    ImageChunk,
    PromptAltTokens,
    SampledSequence,
    SampleResponse,
    TensorData,
    TopkLogprobs,
)

if TYPE_CHECKING:
    from tinker_sync.types import Datum

__all__ = [
    "decode_forward_backward_output",
    "decode_sample_response",
    "encode_forward_backward_request",
]


def _tokens_le(tokens: AnyArray, where: str) -> AnyArray:
    """Token ids as little-endian int32, refusing values that do not fit."""
    if tokens.dtype == pb.LE_I4:
        return flat_le(tokens, pb.LE_I4)
    if tokens.dtype.kind not in "iu":
        raise ValueError(f"{where}: token ids must be integers, got dtype {tokens.dtype}")
    if tokens.size and tokens.dtype.itemsize >= 4:
        low = int(tokens.min())
        high = int(tokens.max())
        if low < INT32_MIN or high > INT32_MAX:
            raise ValueError(f"{where}: token ids must fit in int32, got range [{low}, {high}]")
    return flat_le(tokens, pb.LE_I4)


# ----------------------------------------------------------------------------- request encoder


def _tensor_parts(tensor: TensorData, where: str) -> tuple[list[Part], int]:
    """Parts and size of a ``Tensor`` message."""
    code = DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{where}: unsupported TensorData dtype {tensor.dtype!r}")
    values = flat_le(tensor.data_np, pb.DTYPE_NUMPY[tensor.dtype])
    crow = tensor.crow_np
    parts: list[Part]
    if crow is not None:
        col = tensor.col_np
        if col is None:
            raise ValueError(f"{where}: sparse_col_indices required with sparse_crow_indices")
        crow = flat_le(crow, pb.LE_I8)
        col = flat_le(col, pb.LE_I8)
        parts = []
        csr_size = 0
        for tag, arr in ((0x0A, values), (0x12, crow), (0x1A, col)):
            n = arr.nbytes
            if n:
                head = bytes((tag,)) + uvarint(n)
                parts.append(head)
                parts.append(arr)
                csr_size += len(head) + n
        head = b"\x12" + uvarint(csr_size)
        parts.insert(0, head)
        size = len(head) + csr_size
    else:
        n = values.nbytes
        head = b"\x0a" + uvarint(n)
        parts = [head, values] if n else [head]
        size = len(head) + n
    tail = b"\x18" + SMALL_VARINTS[code]
    shape = tensor.shape
    if shape:
        tail += packed_int64(0x22, shape)
    parts.append(tail)
    return parts, size + len(tail)


def _span_bytes(tag: int, span: Any) -> bytes:
    from tinker_sync.types._datum import SampledProvenanceSpan  # training only: loaded by then

    sampled = isinstance(span, SampledProvenanceSpan)
    body = str_field(0x0A, span.sequence_id)
    if span.offset:
        body += b"\x10" + svarint(int(span.offset))
    if span.length:
        body += b"\x18" + svarint(int(span.length))
    return ld_field(tag, ld_field(0x12 if sampled else 0x0A, body))


def _datum_parts(index: int, datum: Datum, out: list[Part]) -> None:
    """Append the ``data`` field (tag 3) holding one Datum to ``out``."""
    parts: list[Part] = []
    size = 0
    for chunk in datum.model_input.chunks:
        if isinstance(chunk, EncodedTextChunk):
            tokens = chunk.tokens
            if type(tokens) is list:
                # One conversion straight to int32 (numpy refuses out-of-range ints).
                import numpy as np

                try:
                    arr = np.array(tokens, dtype=pb.LE_I4)
                except OverflowError as exc:
                    raise ValueError(f"data[{index}]: token ids must fit in int32") from exc
            else:
                arr = _tokens_le(chunk.tokens_np, f"data[{index}]")
            n = arr.nbytes
            if n:
                text_size = 1 + uvarint_len(n) + n
                chunk_size = 1 + uvarint_len(text_size) + text_size
                head = (
                    b"\x0a"
                    + uvarint(chunk_size)
                    + b"\x0a"
                    + uvarint(text_size)
                    + b"\x0a"
                    + uvarint(n)
                )
                parts.append(head)
                parts.append(arr)
                size += len(head) + n
            else:
                parts.append(b"\x0a\x02\x0a\x00")
                size += 4
        elif isinstance(chunk, ImageChunk):
            # The image / dmel bytes go in as their own part (copied once, into the body).
            data = chunk.data
            tail = str_field(0x12, chunk.format)
            if chunk.expected_tokens is not None:
                tail += b"\x18" + svarint(int(chunk.expected_tokens))
            data_head = b"\x0a" + uvarint(len(data)) if data else b""
            image_size = len(data_head) + len(data) + len(tail)
            chunk_size = 1 + uvarint_len(image_size) + image_size
            head = b"\x0a" + uvarint(chunk_size) + b"\x12" + uvarint(image_size) + data_head
            parts.extend((head, data, tail) if data else (head, tail))
            size += len(head) + len(data) + len(tail)
        elif isinstance(chunk, DmelChunk):
            dmel = chunk.dmel
            dmel_head = b"\x0a" + uvarint(len(dmel)) if dmel else b""
            dmel_size = len(dmel_head) + len(dmel)
            chunk_size = 1 + uvarint_len(dmel_size) + dmel_size
            head = b"\x0a" + uvarint(chunk_size) + b"\x1a" + uvarint(dmel_size) + dmel_head
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
        entry_size = 1 + uvarint_len(len(key)) + len(key) + 1 + uvarint_len(tsize) + tsize
        head = (
            b"\x12"
            + uvarint(entry_size)
            + b"\x0a"
            + uvarint(len(key))
            + key
            + b"\x12"
            + uvarint(tsize)
        )
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
    out.append(b"\x1a" + uvarint(size))
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
    if not INT32_MIN <= seq <= INT32_MAX:
        raise ValueError(f"seq_id must fit in int32, got {seq}")
    out: list[Part] = [str_field(0x0A, model_id)]
    if seq:
        out.append(b"\x10" + svarint(seq))
    for index, datum in enumerate(data):
        _datum_parts(index, datum, out)
    out.append(str_field(0x22, loss_fn))
    if loss_fn_config:
        legacy: list[bytes] = []
        current: list[bytes] = []
        for name, value in loss_fn_config.items():
            key = ld_field(0x0A, name.encode("utf-8"))
            if isinstance(value, str):
                current.append(
                    ld_field(0x3A, key + ld_field(0x12, ld_field(0x12, value.encode("utf-8"))))
                )
            else:
                try:
                    number = pack_double(float(value))
                except (TypeError, ValueError):
                    raise TypeError(
                        f"loss_fn_config[{name!r}]: expected a number or a string, "
                        f"got {type(value).__name__}"
                    ) from None
                legacy.append(ld_field(0x2A, key + b"\x11" + number))
                current.append(ld_field(0x3A, key + ld_field(0x12, b"\x09" + number)))
        out.extend(legacy)
        if forward_only:
            out.append(b"\x30\x01")
        out.extend(current)
    elif forward_only:
        out.append(b"\x30\x01")
    # numpy arrays are buffers; their stubs just do not say so.
    return b"".join(cast("list[bytes]", out))


# ----------------------------------------------------------------------------- result decoders


def _decode_batched(
    buf: Buffer, start: int, end: int, name: str
) -> tuple[list[AnyArray], str, list[int]]:
    """A BatchedTensor as per-datum flat arrays, its public dtype and its trailing shape."""
    data: tuple[int, int] = NO_SPAN
    offsets: tuple[int, int] = NO_SPAN
    code = DTYPE_UNSPECIFIED
    trailing: list[int] = []
    for field in fields(buf, start, end):
        number, wire, a, b = field
        if number == 1 and wire == 2:
            data = (a, b)
        elif number == 2 and wire == 2:
            offsets = (a, b)
        elif number == 3 and wire == 0:
            code = as_int32(a)
        elif number == 4:
            repeated_int64(buf, field, trailing)
    wire_dtype = pb.WIRE_DTYPES.get(code)
    if wire_dtype is None:
        raise ValueError(f"field {name!r}: unsupported proto dtype {code}")
    np_dtype, public = wire_dtype
    values = widen(array_at(buf, data, np_dtype, f"field {name!r} data", False), code)
    bounds = array_at(buf, offsets, pb.LE_I8, f"field {name!r} offsets", False).tolist()
    itemsize = np_dtype.itemsize
    total = data[1] - data[0]
    per_datum: list[AnyArray] = []
    previous = 0
    for i in range(len(bounds) - 1):
        lo = bounds[i]
        hi = bounds[i + 1]
        if not 0 <= lo <= hi <= total or lo < previous or lo % itemsize or hi % itemsize:
            raise ValueError(f"field {name!r}: bad byte offsets {lo}..{hi} for {total} bytes")
        previous = hi
        # Each datum gets its own allocation, as in the official SDK: a view at an arbitrary
        # offset of one shared buffer can take another SIMD path in numpy/torch reductions,
        # and then sums over it differ in the last bit from the official client's.
        per_datum.append(values[lo // itemsize : hi // itemsize].copy())
    return per_datum, public, trailing


def decode_forward_backward_output(payload: Buffer) -> ForwardBackwardOutput:
    """Decode a protobuf ``ForwardBackwardOutput`` result
    (docs/design/behavior.md#proto-result-decoding).

    Usage: ``decode_forward_backward_output(response.content)``.

    The output type is the text after the last ``:`` (the raw string, or ``"ArrayRecord"`` when
    empty, if there are no records). Each ``BatchedTensor`` is sliced per datum by its int64
    byte offsets and shaped ``[n / prod(trailing), *trailing]``; records are concatenated; bf16
    becomes float32 and int32 becomes int64. Each datum's array is its own writable copy.

    :raises ValueError: malformed protobuf, an unsupported dtype, bad offsets or shapes.
    """
    buf = payload
    output_type = ""
    records: list[tuple[int, int]] = []
    metrics: dict[str, float] = {}
    for number, wire, a, b in fields(buf, 0, len(buf)):
        if number == 1 and wire == 2:
            output_type = utf8_text(buf, a, b, "loss_fn_output_type")
        elif number == 2 and wire == 2:
            records.append((a, b))
        elif number == 3 and wire == 2:
            key = ""
            value = 0.0
            for n2, w2, a2, b2 in fields(buf, a, b):
                if n2 == 1 and w2 == 2:
                    key = utf8_text(buf, a2, b2, "metric name")
                elif n2 == 2 and w2 == 1:
                    value = unpack_double(buf, a2)[0]
            metrics[key] = value
    if not records:
        return ForwardBackwardOutput(
            loss_fn_output_type=output_type or "ArrayRecord", loss_fn_outputs=[], metrics=metrics
        )
    # Per field, the per-datum arrays of every record concatenated, with their metadata.
    columns: dict[str, tuple[list[AnyArray], list[tuple[str, list[int]]]]] = {}
    num_datums = 0
    for a, b in records:
        tensors: dict[str, tuple[int, int]] = {}
        for number, wire, a2, b2 in fields(buf, a, b):
            if number == 2 and wire == 2:
                key = ""
                span: tuple[int, int] = (a2, a2)
                for n3, w3, a3, b3 in fields(buf, a2, b2):
                    if n3 == 1 and w3 == 2:
                        key = utf8_text(buf, a3, b3, "field name")
                    elif n3 == 2 and w3 == 2:
                        span = (a3, b3)
                tensors[key] = span
            elif number == 3 and wire == 0:
                num_datums += as_int64(a2)
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
            datum[name] = tensor_data(arr, public, list(shape))
        outputs.append(datum)
    class_name = output_type.rsplit(":", 1)[-1]
    return ForwardBackwardOutput(
        loss_fn_output_type=class_name, loss_fn_outputs=outputs, metrics=metrics
    )


def _decode_topk(buf: Buffer, start: int, end: int, what: str) -> TopkLogprobs | None:
    """A ``TopkLogprobs`` message as matrices (None when ``k`` or ``length`` is 0)."""
    ids: tuple[int, int] = NO_SPAN
    lps: tuple[int, int] = NO_SPAN
    k = 0
    length = 0
    for number, wire, a, b in fields(buf, start, end):
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
    token_ids = array_at(buf, ids, pb.LE_I4, what, True).reshape(length, k)
    logprobs = array_at(buf, lps, pb.LE_F4, what, True).reshape(length, k)
    return TopkLogprobs(token_ids=token_ids, logprobs=logprobs)


def _decode_tensor(buf: Buffer, start: int, end: int, what: str) -> TensorData:
    """A ``Tensor`` message as TensorData (CSR stays CSR; arrays copied)."""
    code, values, shape, crow, col = read_tensor(buf, start, end, what)
    public = pb.WIRE_DTYPES[code][1]
    if crow is not None and col is not None:
        return tensor_data(values, public, shape, crow, col)
    return tensor_data(values, public, shape or None)


def _decode_sequence(buf: Buffer, start: int, end: int, sequence_id: str | None) -> SampledSequence:
    reason = 0
    tokens: tuple[int, int] = NO_SPAN
    logprobs: tuple[int, int] = NO_SPAN
    topk: Sub | None = None
    for number, wire, a, b in fields(buf, start, end):
        if wire == 2:
            if number == 2:
                tokens = (a, b)
            elif number == 3:
                logprobs = (a, b)
            elif number == 4:
                if topk is None:
                    topk = Sub()
                topk.add(a, b)
        elif number == 1 and wire == 0:
            reason = as_int32(a)
    stop_reason = STOP_REASONS.get(reason)
    if stop_reason is None:
        raise ValueError(f"unknown stop_reason enum value {reason}")
    return SampledSequence(
        stop_reason=stop_reason,  # type: ignore[arg-type]
        sequence_id=sequence_id,
        tokens_np=int32s_at(buf, tokens, "tokens"),
        logprobs_np=(float32s_at(buf, logprobs, "logprobs") if logprobs[1] > logprobs[0] else None),
        topk_logprobs_np=(
            None if topk is None else _decode_topk(*topk.get(buf), "topk_sampled_logprobs")
        ),
    )


def decode_sample_response(payload: Buffer, sequence_ids: Sequence[str] | None) -> SampleResponse:
    """Decode a protobuf ``SampleResponse`` result (docs/design/behavior.md#proto-result-decoding,
    docs/design/behavior.md#sampling-wire-rules, docs/design/behavior.md#older-servers).

    Usage: ``decode_sample_response(response.content, future.sample_sequence_ids)``.

    :param sequence_ids: the ``sample_sequence_ids`` of the asample reply, stamped onto the
        sequences in order; ``None`` (an older server) leaves ``sequence_id`` None.
    :raises ValueError: malformed protobuf, an unknown ``stop_reason``, or a number of
        sequence ids that differs from the number of sequences.
    """
    buf = payload
    seq_spans: list[tuple[int, int]] = []
    prompt_lp: tuple[int, int] = NO_SPAN
    topk_prompt = Sub()
    cache_hits = 0
    target = Sub()
    alt = Sub()
    for number, wire, a, b in fields(buf, 0, len(buf)):
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
            cache_hits = as_int32(a)
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
        parts: dict[int, Sub] = {1: Sub(), 2: Sub()}
        for number, wire, a, b in fields(abuf, aa, ab):
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
            float32s_at(buf, prompt_lp, "prompt_logprobs")
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
