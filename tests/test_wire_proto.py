"""Protobuf codecs (docs/design/behavior.md#proto-request-encoding,
docs/design/behavior.md#proto-result-decoding, docs/design/behavior.md#older-servers) against our
generated schema."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinker_sync._wire import _jsonresults, _pbwire, _proto, _zstd
from tinker_sync._wire import tinker_public_pb2 as pb
from tinker_sync.local import _protocodec as server_codec
from tinker_sync.local._wirecodec import decompress_body
from tinker_sync.local.backends.base import SampledSeq, SampleResult
from tinker_sync.types import (
    Datum,
    DmelChunk,
    EncodedTextChunk,
    ForwardBackwardOutput,
    ImageAssetPointerChunk,
    ImageChunk,
    ModelInput,
    PromptProvenanceSpan,
    SampledProvenanceSpan,
    SampleResponse,
    TensorData,
)

_DMEL = bytes([0, 2, 3, 4]) + b"payload"  # dtype 0, ndim 2, dims (3, 4)


def _parse_request(body: bytes) -> Any:
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    return msg


def _td(
    arr: Any,
    dtype: str,
    shape: list[int] | None = None,
    crow: list[int] | None = None,
    col: list[int] | None = None,
) -> TensorData:
    return TensorData(
        data=arr,
        dtype=dtype,
        shape=shape,
        sparse_crow_indices=crow,
        sparse_col_indices=col,  # type: ignore[arg-type]
    )


def _tensor_key(td: TensorData) -> tuple[Any, ...]:
    return (
        td.dtype,
        td.shape,
        td.sparse_crow_indices,
        td.sparse_col_indices,
        td.data_np.dtype.str,
        td.data_np.tobytes(),
    )


def _fbo_key(out: ForwardBackwardOutput) -> tuple[Any, ...]:
    return (
        out.loss_fn_output_type,
        [{k: _tensor_key(v) for k, v in d.items()} for d in out.loss_fn_outputs],
        out.metrics,
    )


def _simple_datum(tokens: list[int]) -> Datum:
    return Datum(
        model_input=ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": _td(np.array(tokens, np.int64), "int64", [len(tokens)]),
            "weights": _td(np.ones(len(tokens), np.float32), "float32", [len(tokens)]),
        },
    )


# ============================================================== request encoder


def test_request_top_level_fields() -> None:
    body = _proto.encode_forward_backward_request(
        "sess:train:0", 7, [_simple_datum([1, 2]), _simple_datum([3])], "cross_entropy", None, True
    )
    msg = _parse_request(body)
    assert msg.model_id == "sess:train:0"
    assert msg.seq_id == 7
    assert msg.loss_fn == "cross_entropy"
    assert msg.forward_only is True
    assert len(msg.data) == 2
    assert not msg.loss_fn_config and not msg.loss_fn_config_v2


def test_seq_id_none_is_zero_and_out_of_range_rejected() -> None:
    msg = _parse_request(_proto.encode_forward_backward_request("m", None, [], "ppo", None, False))
    assert msg.seq_id == 0 and msg.forward_only is False
    with pytest.raises(ValueError, match="int32"):
        _proto.encode_forward_backward_request("m", 2**31, [], "ppo", None, False)


def test_loss_fn_config_numbers_in_both_maps_strings_only_in_v2() -> None:
    config = {"beta": 0.5, "clip": 2, "loss_id": "abc"}
    msg = _parse_request(
        _proto.encode_forward_backward_request("m", 1, [], "custom", config, False)
    )
    assert dict(msg.loss_fn_config) == {"beta": 0.5, "clip": 2.0}
    v2 = msg.loss_fn_config_v2
    assert set(v2) == {"beta", "clip", "loss_id"}
    assert v2["beta"].WhichOneof("value") == "number" and v2["beta"].number == 0.5
    assert v2["clip"].number == 2.0
    assert v2["loss_id"].WhichOneof("value") == "text" and v2["loss_id"].text == "abc"
    with pytest.raises(TypeError, match="loss_fn_config\\['bad'\\]"):
        _proto.encode_forward_backward_request("m", 1, [], "custom", {"bad": None}, False)  # type: ignore[dict-item]


def test_tokens_are_little_endian_int32_and_tensors_keep_dtype_and_shape() -> None:
    datum = Datum(
        model_input=ModelInput(chunks=[EncodedTextChunk(tokens=[1, 2, 70000])]),
        loss_fn_inputs={
            "target_tokens": _td([5, -6], "int64", [2, 1]),
            "weights": _td([0.25, 1.5], "float32"),
        },
    )
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, [datum], "x", None, False))
    (chunk,) = msg.data[0].model_input
    assert chunk.WhichOneof("chunk") == "encoded_text"
    assert chunk.encoded_text.tokens == np.array([1, 2, 70000], "<i4").tobytes()
    target = msg.data[0].loss_fn_inputs["target_tokens"]
    assert target.dtype == pb.DTYPE_INT64
    assert target.dense == np.array([5, -6], "<i8").tobytes()
    assert list(target.shape) == [2, 1]
    weights = msg.data[0].loss_fn_inputs["weights"]
    assert weights.dtype == pb.DTYPE_FLOAT32
    assert weights.dense == np.array([0.25, 1.5], "<f4").tobytes()
    assert list(weights.shape) == []  # shape None is omitted


@pytest.mark.parametrize("dtype", [">i4", ">i8", "<i8", "<i2", "<u2", "<i4"])
def test_token_arrays_of_any_integer_layout_go_out_as_int32_le(dtype: str) -> None:
    tokens = np.array([1, 300, 32000], dtype=dtype)
    datum = Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs={})
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, [datum], "x", None, False))
    assert msg.data[0].model_input[0].encoded_text.tokens == bytes(
        np.array([1, 300, 32000], "<i4").data
    )


def test_big_endian_tensor_input_goes_little_endian() -> None:
    values = np.array([1.5, -2.0, 3.25], dtype=">f4")
    targets = np.array([1, 2**40, -3], dtype=">i8")
    datum = Datum(
        model_input=ModelInput.from_ints(np.array([9, 8], dtype=">i4")),
        loss_fn_inputs={"weights": values, "target_tokens": targets},
    )
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, [datum], "x", None, False))
    inputs = msg.data[0].loss_fn_inputs
    assert inputs["weights"].dense == values.astype("<f4").tobytes()
    assert inputs["target_tokens"].dense == targets.astype("<i8").tobytes()
    assert msg.data[0].model_input[0].encoded_text.tokens == np.array([9, 8], "<i4").tobytes()


def test_token_outside_int32_is_rejected_with_datum_index() -> None:
    bad = Datum(model_input=ModelInput.from_ints(np.array([2**31], np.int64)), loss_fn_inputs={})
    with pytest.raises(ValueError, match=r"data\[1\].*int32"):
        _proto.encode_forward_backward_request("m", 1, [_simple_datum([1]), bad], "x", None, False)


def test_csr_tensor_sends_values_crow_and_col() -> None:
    sparse = _td([1.0, 2.0], "float32", [3, 4], [0, 1, 1, 2], [0, 3])
    datum = Datum(model_input=ModelInput.from_ints([1]), loss_fn_inputs={"weights": sparse})
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, [datum], "x", None, False))
    tensor = msg.data[0].loss_fn_inputs["weights"]
    assert tensor.WhichOneof("encoding") == "sparse_csr"
    assert tensor.sparse_csr.values == np.array([1.0, 2.0], "<f4").tobytes()
    assert tensor.sparse_csr.crow_indices == np.array([0, 1, 1, 2], "<i8").tobytes()
    assert tensor.sparse_csr.col_indices == np.array([0, 3], "<i8").tobytes()
    assert list(tensor.shape) == [3, 4] and tensor.dtype == pb.DTYPE_FLOAT32


def test_empty_tensor_and_empty_text_chunk_keep_their_oneof_arm() -> None:
    datum = Datum(
        model_input=ModelInput(chunks=[EncodedTextChunk(tokens=[])]),
        loss_fn_inputs={"weights": _td([], "float32", [0])},
    )
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, [datum], "x", None, False))
    assert msg.data[0].model_input[0].WhichOneof("chunk") == "encoded_text"
    tensor = msg.data[0].loss_fn_inputs["weights"]
    assert tensor.WhichOneof("encoding") == "dense" and tensor.dense == b""
    assert list(tensor.shape) == [0]


def test_image_and_dmel_chunks() -> None:
    datum = Datum(
        model_input=ModelInput(
            chunks=[
                ImageChunk(data=b"\x89PNG\r\n", format="png", expected_tokens=4),
                ImageChunk(data=b"\xff\xd8", format="jpeg"),
                DmelChunk(dmel=_DMEL),
            ]
        ),
        loss_fn_inputs={},
    )
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, [datum], "x", None, False))
    first, second, third = msg.data[0].model_input
    assert first.image.data == b"\x89PNG\r\n" and first.image.format == "png"
    assert first.image.HasField("expected_tokens") and first.image.expected_tokens == 4
    assert not first.image.HasField("override_dimensions")
    assert second.image.format == "jpeg" and not second.image.HasField("expected_tokens")
    assert third.WhichOneof("chunk") == "dmel" and third.dmel.dmel == _DMEL


def test_image_asset_pointer_is_rejected_naming_the_datum() -> None:
    pointer = ImageAssetPointerChunk(format="png", location="s3://x", expected_tokens=1)
    datum = Datum(model_input=ModelInput(chunks=[pointer]), loss_fn_inputs={})
    with pytest.raises(ValueError, match=r"data\[2\].*image_asset_pointer"):
        _proto.encode_forward_backward_request(
            "m", 1, [_simple_datum([1]), _simple_datum([2]), datum], "x", None, False
        )


def test_provenance_spans_use_the_right_arm() -> None:
    datum = Datum(model_input=ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={}).with_provenance(
        model_input=[
            PromptProvenanceSpan(sequence_id="p1", length=2),
            SampledProvenanceSpan(sequence_id="s1", offset=4, length=1),
        ],
        loss_fn_inputs=[SampledProvenanceSpan(sequence_id="s2", length=0)],
    )
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, [datum], "x", None, False))
    spans = msg.data[0].model_input_spans
    assert [s.WhichOneof("span") for s in spans] == ["prompt_tokens", "sampled_tokens"]
    assert (spans[0].prompt_tokens.sequence_id, spans[0].prompt_tokens.offset) == ("p1", 0)
    assert spans[0].prompt_tokens.length == 2
    assert (spans[1].sampled_tokens.offset, spans[1].sampled_tokens.length) == (4, 1)
    (loss_span,) = msg.data[0].loss_fn_input_spans
    assert loss_span.WhichOneof("span") == "sampled_tokens"
    assert loss_span.sampled_tokens.sequence_id == "s2"


def test_large_request_parses_back_exactly() -> None:
    rng = np.random.default_rng(0)
    data = [_simple_datum(rng.integers(0, 50_000, 3000).tolist()) for _ in range(5)]
    msg = _parse_request(_proto.encode_forward_backward_request("m", 1, data, "x", None, False))
    for datum, parsed in zip(data, msg.data, strict=True):
        tokens = np.frombuffer(parsed.model_input[0].encoded_text.tokens, "<i4")
        assert tokens.tolist() == datum.model_input.to_ints()


# ============================================================== compression


def test_maybe_compress() -> None:
    zstandard = pytest.importorskip("zstandard")
    body = b"abc" * 1000
    assert _zstd.maybe_compress(body, False) == (body, {})
    compressed, headers = _zstd.maybe_compress(body, True)
    assert headers == {"Content-Encoding": "zstd"}
    assert zstandard.ZstdDecompressor().decompress(compressed) == body
    assert decompress_body(compressed, "zstd") == body
    assert decompress_body(body, None) == body
    assert decompress_body(body, "identity") == body
    with pytest.raises(ValueError, match="Content-Encoding"):
        decompress_body(body, "br")
    with pytest.raises(ValueError, match="zstd"):
        decompress_body(b"not zstd", "zstd")
    with pytest.raises(ValueError, match="inflates beyond"):
        decompress_body(compressed, "ZSTD", max_size=len(body) - 1)
    assert decompress_body(compressed, " zstd ", max_size=len(body)) == body


# ============================================================== request decoder (server)


def test_decode_request_densifies_and_concatenates() -> None:
    datum = Datum(
        model_input=ModelInput(
            chunks=[
                EncodedTextChunk(tokens=[5, 6]),
                ImageChunk(data=b"img", format="png", expected_tokens=2),
                DmelChunk(dmel=_DMEL),
                EncodedTextChunk(tokens=[7]),
            ]
        ),
        loss_fn_inputs={
            "weights": _td([1.0, 2.0], "float32", [2, 3], [0, 1, 2], [2, 0]),
            "target_tokens": _td(list(range(6)), "int64", [2, 3]),
            "advantages": _td([0.5], "float32"),
        },
    )
    body = _proto.encode_forward_backward_request(
        "m:1", 3, [datum], "ppo", {"clip_low_threshold": 0.8, "mode": "x"}, True
    )
    model_id, seq_id, loss_fn, config, forward_only, datums = (
        server_codec.decode_forward_backward_request(body)
    )
    assert (model_id, seq_id, loss_fn, forward_only) == ("m:1", 3, "ppo", True)
    assert config == {"clip_low_threshold": 0.8, "mode": "x"}
    (arrays,) = datums
    assert arrays.tokens.dtype == np.int64
    assert arrays.tokens.tolist() == [5, 6, 0, 0, 0, 0, 0, 7]
    assert arrays.inputs["weights"].tolist() == [[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]]
    assert arrays.inputs["weights"].dtype == np.float32
    assert arrays.inputs["target_tokens"].shape == (2, 3)
    assert arrays.inputs["target_tokens"].dtype == np.int64
    assert arrays.inputs["advantages"].shape == (1,)


def test_decode_request_v2_config_wins_over_legacy() -> None:
    msg = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="dro")
    msg.loss_fn_config["beta"] = 1.0
    msg.loss_fn_config["only_legacy"] = 2.0
    msg.loss_fn_config_v2["beta"].number = 3.0
    _, _, _, config, _, _ = server_codec.decode_forward_backward_request(msg.SerializeToString())
    assert config == {"beta": 3.0, "only_legacy": 2.0}


def _request_with(datum_msg: Any) -> bytes:
    msg = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="x")
    msg.data.add().CopyFrom(datum_msg)
    return bytes(msg.SerializeToString())


def test_declared_chunk_lengths_are_bounded_before_any_allocation() -> None:
    # An image chunk declares its length in a few bytes; 2**31 - 1 placeholder tokens would be
    # a 16 GiB array. The decoder refuses it (a 400) instead of allocating.
    datum = pb.Datum()
    image = datum.model_input.add().image
    image.format = "png"
    image.expected_tokens = 2**31 - 1
    with pytest.raises(ValueError, match=r"expected_tokens 2147483647 is out of range"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    limit = server_codec.MAX_DATUM_TOKENS
    datum = pb.Datum()
    datum.model_input.add().encoded_text.tokens = np.array([1], "<i4").tobytes()
    for _ in range(2):
        image = datum.model_input.add().image
        image.format = "png"
        image.expected_tokens = limit // 2
    with pytest.raises(ValueError, match=rf"{limit + 1} model-input tokens \(at most {limit}\)"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    image.expected_tokens = limit // 2 - 1  # exactly at the bound: accepted
    (decoded,) = server_codec.decode_forward_backward_request(_request_with(datum))[5]
    assert len(decoded.tokens) == limit


def test_decode_request_errors_name_the_problem() -> None:
    datum = pb.Datum()
    datum.model_input.add().image.format = "png"
    with pytest.raises(ValueError, match=r"data\[0\].*expected_tokens"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    datum = pb.Datum()
    datum.model_input.add()
    with pytest.raises(ValueError, match="no encoded_text"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    datum = pb.Datum()
    tensor = datum.loss_fn_inputs["weights"]
    tensor.dtype = pb.DTYPE_FLOAT32
    tensor.dense = np.ones(3, "<f4").tobytes()
    tensor.shape.extend([2, 2])
    with pytest.raises(ValueError, match=r"loss_fn_inputs\['weights'\].*shape"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    datum = pb.Datum()
    tensor = datum.loss_fn_inputs["w"]
    tensor.dtype = pb.DTYPE_FLOAT32
    tensor.dense = b"abc"
    with pytest.raises(ValueError, match="multiple of 4"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    datum = pb.Datum()
    tensor = datum.loss_fn_inputs["w"]
    tensor.dense = b""
    with pytest.raises(ValueError, match="dtype 0"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    datum = pb.Datum()
    tensor = datum.loss_fn_inputs["w"]
    tensor.dtype = pb.DTYPE_INT64
    tensor.shape.extend([2, 2])
    tensor.sparse_csr.values = np.ones(1, "<i8").tobytes()
    tensor.sparse_csr.crow_indices = np.array([0, 1, 1], "<i8").tobytes()
    tensor.sparse_csr.col_indices = np.array([5], "<i8").tobytes()
    with pytest.raises(ValueError, match="column index out of range"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    datum = pb.Datum()
    datum.model_input.add().dmel.dmel = bytes([9, 1, 2])
    with pytest.raises(ValueError, match="dmel"):
        server_codec.decode_forward_backward_request(_request_with(datum))

    msg = pb.ForwardBackwardRequest()
    msg.loss_fn_config_v2["k"].SetInParent()
    with pytest.raises(ValueError, match="neither number nor text"):
        server_codec.decode_forward_backward_request(msg.SerializeToString())


@pytest.mark.parametrize(
    "payload",
    [b"\x0a\x05ab", b"\x1a\x03\x0a\x05", b"\x0f", b"\x00", b"\x0a\x80", b"\x0a\x02\xff\xfe"],
)
def test_decode_request_rejects_malformed_bytes(payload: bytes) -> None:
    with pytest.raises(ValueError):
        server_codec.decode_forward_backward_request(payload)


# ---- hypothesis round trip: client encode -> server decode

_int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)


@st.composite
def _tensors(draw: st.DrawFn) -> tuple[TensorData, np.ndarray]:
    dtype = draw(st.sampled_from(["int64", "float32"]))
    np_dtype = np.int64 if dtype == "int64" else np.float32
    elements = (
        st.integers(min_value=-(2**63), max_value=2**63 - 1)
        if dtype == "int64"
        else st.floats(width=32, allow_nan=False)
    )
    if draw(st.booleans()):
        rows = draw(st.integers(min_value=0, max_value=4))
        cols = draw(st.integers(min_value=1, max_value=4))
        mask = np.array(
            draw(st.lists(st.booleans(), min_size=rows * cols, max_size=rows * cols)), dtype=bool
        )
        dense = np.zeros((rows, cols), dtype=np_dtype)
        values = np.array(
            draw(st.lists(elements, min_size=int(mask.sum()), max_size=int(mask.sum()))),
            dtype=np_dtype,
        )
        dense[mask.reshape(rows, cols)] = values
        counts = mask.reshape(rows, cols).sum(axis=1)
        crow = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        col = np.nonzero(mask.reshape(rows, cols))[1]
        td = _td(values, dtype, [rows, cols], crow.tolist(), col.tolist())
        return td, dense
    shape = draw(st.lists(st.integers(min_value=0, max_value=3), max_size=3))
    size = math.prod(shape)
    values = np.array(draw(st.lists(elements, min_size=size, max_size=size)), dtype=np_dtype)
    if draw(st.booleans()) and len(shape) == 1:
        return _td(values, dtype), values
    # An empty shape list is omitted on the wire like None: the server sees a 1-D tensor.
    return _td(values, dtype, shape), values.reshape(shape or [size])


@st.composite
def _datums(draw: st.DrawFn) -> tuple[Datum, list[int], dict[str, np.ndarray]]:
    chunks: list[Any] = []
    tokens: list[int] = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        kind = draw(st.sampled_from(["text", "text", "image", "dmel"]))
        if kind == "text":
            toks = draw(st.lists(_int32s, max_size=8))
            chunks.append(EncodedTextChunk(tokens=toks))
            tokens += toks
        elif kind == "image":
            n = draw(st.integers(min_value=0, max_value=5))
            chunks.append(
                ImageChunk(data=draw(st.binary(max_size=9)), format="png", expected_tokens=n)
            )
            tokens += [0] * n
        else:
            n = draw(st.integers(min_value=0, max_value=300))
            header = bytes([254, 3, 1]) + _pbwire.uvarint(n)
            chunks.append(DmelChunk(dmel=header + draw(st.binary(max_size=4))))
            tokens += [0] * n
    inputs: dict[str, TensorData] = {}
    dense: dict[str, np.ndarray] = {}
    for name in draw(st.lists(_names, max_size=3, unique=True)):
        td, arr = draw(_tensors())
        inputs[name] = td
        dense[name] = arr
    datum = Datum(model_input=ModelInput(chunks=chunks), loss_fn_inputs=inputs)
    return datum, tokens, dense


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_datums(), max_size=4),
    _names,
    _int32s,
    st.dictionaries(_names, st.one_of(st.floats(allow_nan=False), _names), max_size=3),
    st.booleans(),
)
def test_request_round_trip(
    datums: list[tuple[Datum, list[int], dict[str, np.ndarray]]],
    model_id: str,
    seq_id: int,
    config: dict[str, float | str],
    forward_only: bool,
) -> None:
    body = _proto.encode_forward_backward_request(
        model_id, seq_id, [d for d, _, _ in datums], "cross_entropy", config, forward_only
    )
    # Our schema parses it and serializes to the same logical message.
    again = _parse_request(body)
    assert _parse_request(again.SerializeToString()) == again
    got = server_codec.decode_forward_backward_request(body)
    assert got[:3] == (model_id, seq_id, "cross_entropy")
    assert got[3] == {k: (v if isinstance(v, str) else float(v)) for k, v in config.items()}
    assert got[4] is forward_only
    assert len(got[5]) == len(datums)
    for (_, tokens, dense), arrays in zip(datums, got[5], strict=True):
        assert arrays.tokens.dtype == np.int64
        assert arrays.tokens.tolist() == tokens
        assert set(arrays.inputs) == set(dense)
        for name, expected in dense.items():
            assert arrays.inputs[name].dtype == expected.dtype
            assert arrays.inputs[name].shape == expected.shape
            assert arrays.inputs[name].tobytes() == expected.tobytes()


# ============================================================== ForwardBackwardOutput decoder


def _batched(arrays: list[np.ndarray], code: int, trailing: list[int], wire_dtype: str) -> Any:
    bt = pb.BatchedTensor(dtype=code, trailing_shape=trailing)
    raw = [np.ascontiguousarray(a, dtype=wire_dtype).tobytes() for a in arrays]
    bt.data = b"".join(raw)
    bt.offsets = np.concatenate([[0], np.cumsum([len(r) for r in raw])]).astype("<i8").tobytes()
    return bt


def test_decode_output_slices_by_byte_offsets_with_trailing_shape() -> None:
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="tinker.losses:ArrayRecord")
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=2)
    record.fields["logprobs"].CopyFrom(
        _batched([np.arange(3), np.arange(2)], pb.DTYPE_FLOAT32, [], "<f4")
    )
    record.fields["topk"].CopyFrom(
        _batched([np.arange(6), np.arange(4)], pb.DTYPE_INT64, [2], "<i8")
    )
    msg.metrics["loss:sum"] = 1.25
    out = _proto.decode_forward_backward_output(msg.SerializeToString())
    assert out.loss_fn_output_type == "ArrayRecord"
    assert out.metrics == {"loss:sum": 1.25}
    assert len(out.loss_fn_outputs) == 2
    first, second = out.loss_fn_outputs
    assert first["logprobs"].dtype == "float32" and first["logprobs"].shape == [3]
    assert first["logprobs"].data == [0.0, 1.0, 2.0]
    assert first["topk"].shape == [3, 2] and first["topk"].dtype == "int64"
    assert second["topk"].shape == [2, 2] and second["topk"].data == [0, 1, 2, 3]
    assert second["logprobs"].to_numpy().tolist() == [0.0, 1.0]


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_decoders_accept_any_bytes_like_payload(wrap: Any) -> None:
    outputs = [{"logprobs": np.array([-1.0, -2.0], np.float32)}]
    fbo = server_codec.encode_forward_backward_output("T", outputs, {"loss:sum": 3.0})
    decoded = _proto.decode_forward_backward_output(wrap(fbo))
    assert decoded.loss_fn_outputs[0]["logprobs"].data == [-1.0, -2.0]
    assert decoded.metrics == {"loss:sum": 3.0}
    result = SampleResult(
        sequences=[
            SampledSeq(
                tokens=np.array([1, 2], np.int32),
                logprobs=np.array([-0.5, -0.25], np.float32),
                stop_reason="stop",
            )
        ]
    )
    sample = _proto.decode_sample_response(wrap(server_codec.encode_sample_response(result)), ["x"])
    assert sample.sequences[0].tokens == [1, 2]
    body = _proto.encode_forward_backward_request("m", 2, [_simple_datum([4])], "x", None, False)
    assert server_codec.decode_forward_backward_request(wrap(body))[5][0].tokens.tolist() == [4]


def test_decode_output_widens_bf16_and_int32() -> None:
    values = np.array([1.0, -2.5, 3.140625], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = msg.loss_fn_outputs.add(num_datums=1)
    record.fields["lp"].CopyFrom(_batched([bf16], pb.DTYPE_BFLOAT16, [], "<u2"))
    record.fields["ids"].CopyFrom(_batched([np.array([-7, 2**30])], pb.DTYPE_INT32, [], "<i4"))
    (datum,) = _proto.decode_forward_backward_output(msg.SerializeToString()).loss_fn_outputs
    assert datum["lp"].dtype == "float32" and datum["lp"].data_np.dtype == np.float32
    assert datum["lp"].data == values.tolist()
    assert datum["ids"].dtype == "int64" and datum["ids"].data_np.dtype == np.int64
    assert datum["ids"].data == [-7, 2**30]


def test_decode_output_concatenates_ragged_records() -> None:
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, n in ((2, 2), (3, 1)):
        record = msg.loss_fn_outputs.add(num_datums=n)
        record.fields["x"].CopyFrom(
            _batched([np.ones(k * 2) * i for i in range(n)], pb.DTYPE_FLOAT32, [k], "<f4")
        )
    outputs = _proto.decode_forward_backward_output(msg.SerializeToString()).loss_fn_outputs
    assert [d["x"].shape for d in outputs] == [[2, 2], [2, 2], [2, 3]]


def test_decode_output_without_records_uses_raw_type() -> None:
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="pkg:Custom")
    out = _proto.decode_forward_backward_output(msg.SerializeToString())
    assert (out.loss_fn_output_type, out.loss_fn_outputs, out.metrics) == ("pkg:Custom", [], {})
    out = _proto.decode_forward_backward_output(b"")
    assert out.loss_fn_output_type == "ArrayRecord"


def test_decode_output_num_datums_fallback_and_stripped_fields() -> None:
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="A")
    record = msg.loss_fn_outputs.add()  # num_datums unset: count from the first field
    record.fields["x"].CopyFrom(_batched([np.ones(1)] * 3, pb.DTYPE_FLOAT32, [], "<f4"))
    assert len(_proto.decode_forward_backward_output(msg.SerializeToString()).loss_fn_outputs) == 3
    stripped = pb.ForwardBackwardOutput(loss_fn_output_type="A")
    stripped.loss_fn_outputs.add(num_datums=4)
    out = _proto.decode_forward_backward_output(stripped.SerializeToString())
    assert out.loss_fn_outputs == [{}, {}, {}, {}]


def test_decode_output_zero_trailing_dimension() -> None:
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="A")
    record = msg.loss_fn_outputs.add(num_datums=1)
    record.fields["x"].CopyFrom(_batched([np.ones(0)], pb.DTYPE_FLOAT32, [0, 2], "<f4"))
    (datum,) = _proto.decode_forward_backward_output(msg.SerializeToString()).loss_fn_outputs
    assert datum["x"].shape == [0, 0, 2]


def test_decode_output_rejects_bad_records() -> None:
    def make(**kwargs: Any) -> bytes:
        msg = pb.ForwardBackwardOutput(loss_fn_output_type="A")
        record = msg.loss_fn_outputs.add(num_datums=kwargs.pop("num", 1))
        bt = record.fields["x"]
        bt.CopyFrom(_batched([np.ones(4)], pb.DTYPE_FLOAT32, [], "<f4"))
        for key, value in kwargs.items():
            if key == "trailing_shape":
                del bt.trailing_shape[:]
                bt.trailing_shape.extend(value)
            else:
                setattr(bt, key, value)
        return bytes(msg.SerializeToString())

    with pytest.raises(ValueError, match="dtype"):
        _proto.decode_forward_backward_output(make(dtype=0))
    with pytest.raises(ValueError, match="offsets"):
        _proto.decode_forward_backward_output(make(offsets=np.array([0, 99], "<i8").tobytes()))
    with pytest.raises(ValueError, match="offsets"):
        _proto.decode_forward_backward_output(make(offsets=np.array([0, 6], "<i8").tobytes()))
    with pytest.raises(ValueError, match="trailing shape"):
        _proto.decode_forward_backward_output(make(trailing_shape=[3]))
    with pytest.raises(ValueError, match="declare"):
        _proto.decode_forward_backward_output(make(num=2))
    with pytest.raises(ValueError):
        _proto.decode_forward_backward_output(make()[:-3])


# ============================================================== SampleResponse decoder


def _topk_msg(ids: np.ndarray, lps: np.ndarray) -> Any:
    return pb.TopkLogprobs(
        token_ids=ids.astype("<i4").tobytes(),
        logprobs=lps.astype("<f4").tobytes(),
        k=ids.shape[1],
        length=ids.shape[0],
    )


def test_sample_response_basic_fields_and_nan_prompt_logprobs() -> None:
    msg = pb.SampleResponse(prompt_cache_hit_tokens=5)
    seq = msg.sequences.add(stop_reason=pb.STOP_REASON_LENGTH)
    seq.tokens = np.array([4, 5], "<i4").tobytes()
    seq.logprobs = np.array([-0.5, -1.5], "<f4").tobytes()
    msg.sequences.add(stop_reason=pb.STOP_REASON_STOP, tokens=np.array([9], "<i4").tobytes())
    msg.prompt_logprobs = np.array([np.nan, -2.0, np.nan], "<f4").tobytes()
    response = _proto.decode_sample_response(msg.SerializeToString(), ["a", "b"])
    first, second = response.sequences
    assert (first.stop_reason, first.sequence_id, first.tokens) == ("length", "a", [4, 5])
    assert first.tokens_np.dtype == np.int32
    assert first.logprobs == [-0.5, -1.5]
    assert (second.stop_reason, second.sequence_id, second.logprobs) == ("stop", "b", None)
    assert response.prompt_logprobs == [None, -2.0, None]
    assert response.prompt_cache_hit_tokens == 5
    assert response.topk_prompt_logprobs is None and response.prompt_alt_tokens is None
    assert response.target_prompt_logprobs is None


def test_sample_response_arrays_are_writable_copies() -> None:
    msg = pb.SampleResponse()
    msg.sequences.add(tokens=np.array([1], "<i4").tobytes())
    response = _proto.decode_sample_response(msg.SerializeToString(), ["x"])
    assert response.sequences[0].tokens_np.flags.writeable


def test_topk_sentinel_rows_are_none_and_trailing_sentinels_dropped() -> None:
    ids = np.array([[0, 0], [7, 0], [3, 4]])
    lps = np.array([[-99999.0, -99999.0], [-1.0, -99999.0], [-0.1, -0.2]])
    msg = pb.SampleResponse()
    seq = msg.sequences.add()
    seq.topk_sampled_logprobs.CopyFrom(_topk_msg(ids, lps))
    msg.topk_prompt_logprobs.CopyFrom(_topk_msg(ids, lps))
    response = _proto.decode_sample_response(msg.SerializeToString(), ["s"])
    expected = [None, [(7, -1.0)], [(3, pytest.approx(-0.1)), (4, pytest.approx(-0.2))]]
    assert response.topk_prompt_logprobs == expected
    assert response.sequences[0].topk_logprobs == expected
    assert response.sequences[0].topk_logprobs_np is not None
    assert response.sequences[0].topk_logprobs_np.token_ids.shape == (3, 2)


@pytest.mark.parametrize(("k", "length"), [(0, 3), (2, 0), (0, 0)])
def test_topk_with_zero_k_or_length_is_absent(k: int, length: int) -> None:
    msg = pb.SampleResponse()
    msg.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(k=k, length=length))
    seq = msg.sequences.add()
    seq.topk_sampled_logprobs.CopyFrom(pb.TopkLogprobs(k=k, length=length))
    response = _proto.decode_sample_response(msg.SerializeToString(), ["s"])
    assert response.topk_prompt_logprobs_np is None
    assert response.topk_prompt_logprobs is None
    assert response.sequences[0].topk_logprobs is None


def test_topk_with_too_few_bytes_is_rejected() -> None:
    msg = pb.SampleResponse()
    msg.topk_prompt_logprobs.CopyFrom(
        pb.TopkLogprobs(k=2, length=2, token_ids=b"\x00" * 12, logprobs=b"\x00" * 16)
    )
    with pytest.raises(ValueError, match="top-k"):
        _proto.decode_sample_response(msg.SerializeToString(), [])


def test_unknown_stop_reason_is_an_error() -> None:
    msg = pb.SampleResponse()
    msg.sequences.add(stop_reason=2)
    with pytest.raises(ValueError, match="stop_reason"):
        _proto.decode_sample_response(msg.SerializeToString(), ["x"])


def test_sequence_id_count_mismatch_is_an_error() -> None:
    msg = pb.SampleResponse()
    msg.sequences.add()
    msg.sequences.add()
    with pytest.raises(ValueError, match="2 sequences"):
        _proto.decode_sample_response(msg.SerializeToString(), ["only-one"])
    with pytest.raises(ValueError):
        _proto.decode_sample_response(msg.SerializeToString(), ["a", "b", "c"])


def test_missing_sequence_ids_leave_sequence_id_none() -> None:
    msg = pb.SampleResponse()
    msg.sequences.add(tokens=np.array([1, 2], "<i4").tobytes())
    response = _proto.decode_sample_response(msg.SerializeToString(), None)
    assert response.sequences[0].sequence_id is None
    assert response.sequences[0].tokens == [1, 2]


def test_target_prompt_logprobs_and_prompt_alt_tokens() -> None:
    msg = pb.SampleResponse()
    target = msg.target_prompt_logprobs
    target.dtype = pb.DTYPE_FLOAT32
    target.dense = np.array([0.0, -1.0, -2.0, 0.0], "<f4").tobytes()
    target.shape.extend([2, 2])
    alt = msg.prompt_alt_tokens
    alt.tokens.dtype = pb.DTYPE_INT64
    alt.tokens.dense = np.array([1, 2, 3], "<i8").tobytes()
    alt.tokens.shape.extend([1, 3])
    alt.logprobs.dtype = pb.DTYPE_BFLOAT16
    alt.logprobs.dense = (
        (np.array([-1.0, -2.0, -0.5], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    )
    alt.logprobs.shape.extend([1, 3])
    response = _proto.decode_sample_response(msg.SerializeToString(), [])
    assert response.target_prompt_logprobs is not None
    assert response.target_prompt_logprobs.shape == [2, 2]
    assert response.target_prompt_logprobs.to_numpy().tolist() == [[0.0, -1.0], [-2.0, 0.0]]
    assert response.prompt_alt_tokens is not None
    assert response.prompt_alt_tokens.tokens.dtype == "int64"
    assert response.prompt_alt_tokens.tokens.shape == [1, 3]
    assert response.prompt_alt_tokens.logprobs.dtype == "float32"
    assert response.prompt_alt_tokens.logprobs.data == [-1.0, -2.0, -0.5]


def test_sparse_target_prompt_logprobs_stay_sparse() -> None:
    msg = pb.SampleResponse()
    target = msg.target_prompt_logprobs
    target.dtype = pb.DTYPE_FLOAT32
    target.shape.extend([2, 3])
    target.sparse_csr.values = np.array([-1.0], "<f4").tobytes()
    target.sparse_csr.crow_indices = np.array([0, 0, 1], "<i8").tobytes()
    target.sparse_csr.col_indices = np.array([2], "<i8").tobytes()
    response = _proto.decode_sample_response(msg.SerializeToString(), [])
    td = response.target_prompt_logprobs
    assert td is not None and td.is_sparse
    assert td.to_numpy().tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, -1.0]]


# ============================================================== generic wire reader


def test_unknown_fields_groups_and_unpacked_repeated_are_tolerated() -> None:
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="A")
    record = msg.loss_fn_outputs.add(num_datums=1)
    record.fields["x"].CopyFrom(_batched([np.ones(4)], pb.DTYPE_FLOAT32, [], "<f4"))
    body = bytes(msg.SerializeToString())
    # unknown varint (field 20), fixed32 (21), fixed64 (22), bytes (23) and a group (24)
    junk = b"\xa0\x01\x05" + b"\xad\x01abcd" + b"\xb1\x01" + b"12345678" + b"\xba\x01\x02hi"
    junk += b"\xc3\x01" + b"\x08\x01" + b"\xc4\x01"
    out = _proto.decode_forward_backward_output(junk + body + junk)
    assert out.loss_fn_outputs[0]["x"].shape == [4]
    # trailing_shape written unpacked (wire type 0) is accepted like packed.
    bt = _batched([np.ones(4)], pb.DTYPE_FLOAT32, [], "<f4")
    raw = bytes(bt.SerializeToString()) + b"\x20\x02"
    entry = b"\x0a\x01x" + b"\x12" + _pbwire.uvarint(len(raw)) + raw
    rec = b"\x12" + _pbwire.uvarint(len(entry)) + entry + b"\x18\x01"
    out = _proto.decode_forward_backward_output(b"\x12" + _pbwire.uvarint(len(rec)) + rec)
    assert out.loss_fn_outputs[0]["x"].shape == [2, 2]


def test_repeated_singular_submessages_merge() -> None:
    ids = np.array([[1, 2]])
    lps = np.array([[-1.0, -2.0]])
    part1 = pb.SampleResponse()
    part1.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(token_ids=ids.astype("<i4").tobytes()))
    part2 = pb.SampleResponse()
    part2.topk_prompt_logprobs.CopyFrom(
        pb.TopkLogprobs(logprobs=lps.astype("<f4").tobytes(), k=2, length=1)
    )
    body = part1.SerializeToString() + part2.SerializeToString()
    official = pb.SampleResponse()
    official.ParseFromString(body)
    assert official.topk_prompt_logprobs.k == 2 and official.topk_prompt_logprobs.token_ids
    response = _proto.decode_sample_response(body, [])
    assert response.topk_prompt_logprobs == [[(1, -1.0), (2, -2.0)]]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_decoders_raise_only_value_error_on_garbage(payload: bytes) -> None:
    for decode in (
        _proto.decode_forward_backward_output,
        lambda b: _proto.decode_sample_response(b, None),
        server_codec.decode_forward_backward_request,
    ):
        try:
            decode(payload)
        except ValueError:
            pass


# ============================================================== server encode -> client decode


_floats32 = st.floats(width=32, allow_nan=False)


@st.composite
def _outputs(draw: st.DrawFn) -> list[dict[str, np.ndarray]]:
    names = draw(st.lists(st.sampled_from(["logprobs", "elementwise_loss", "ids"]), unique=True))
    outputs = []
    for _ in range(draw(st.integers(min_value=0, max_value=5))):
        datum: dict[str, np.ndarray] = {}
        for name in names:
            rows = draw(st.integers(min_value=0, max_value=4))
            trailing = draw(st.sampled_from([(), (2,), (1, 3)]))
            shape = (rows, *trailing)
            size = math.prod(shape)
            if name == "ids":
                values = draw(
                    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=size, max_size=size)
                )
                datum[name] = np.array(values, dtype=np.int64).reshape(shape)
            else:
                values = draw(st.lists(_floats32, min_size=size, max_size=size))
                datum[name] = np.array(values, dtype=np.float32).reshape(shape)
        outputs.append(datum)
    return outputs


def _expected_tensor(arr: np.ndarray) -> tuple[Any, ...]:
    dtype = "float32" if arr.dtype.kind == "f" else "int64"
    np_dtype = np.float32 if dtype == "float32" else np.int64
    return (
        dtype,
        list(arr.shape),
        None,
        None,
        np.dtype(np_dtype).str,
        arr.astype(np_dtype).tobytes(),
    )


@settings(max_examples=150, deadline=None)
@given(
    _outputs(),
    st.dictionaries(st.sampled_from(["loss:sum", "acc:mean", "x:max"]), st.floats(allow_nan=False)),
)
def test_forward_output_server_to_client_round_trip(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> None:
    body = server_codec.encode_forward_backward_output("ArrayRecord", outputs, metrics)
    decoded = _proto.decode_forward_backward_output(body)
    assert decoded.loss_fn_output_type == "ArrayRecord"
    assert decoded.metrics == metrics
    assert [{k: _tensor_key(v) for k, v in d.items()} for d in decoded.loss_fn_outputs] == [
        {k: _expected_tensor(v) for k, v in d.items()} for d in outputs
    ]
    via_json = _jsonresults.forward_backward_output_from_json(
        server_codec.forward_output_to_json("ArrayRecord", outputs, metrics)
    )
    assert _fbo_key(via_json) == _fbo_key(decoded)
    # Our own schema agrees on the structure.
    msg = pb.ForwardBackwardOutput()
    msg.ParseFromString(body)
    assert sum(r.num_datums for r in msg.loss_fn_outputs) == len(outputs)


def test_forward_output_encoder_groups_rectangular_records_and_casts() -> None:
    outputs = [
        {"lp": np.zeros(3, np.float64), "ids": np.zeros((3, 2), np.int32)},
        {"lp": np.zeros(2, np.float64), "ids": np.zeros((2, 2), np.int32)},
        {"lp": np.zeros(1, np.float64), "ids": np.zeros((1, 5), np.int32)},
        {"lp": np.float32(1.5), "ids": np.zeros((0, 5), np.int8)},
    ]
    msg = pb.ForwardBackwardOutput()
    msg.ParseFromString(server_codec.encode_forward_backward_output("T", outputs, {}))
    assert [r.num_datums for r in msg.loss_fn_outputs] == [2, 2]
    first = msg.loss_fn_outputs[0]
    assert first.type_tag == "T"
    assert first.fields["lp"].dtype == pb.DTYPE_FLOAT32
    assert first.fields["ids"].dtype == pb.DTYPE_INT64
    assert list(first.fields["ids"].trailing_shape) == [2]
    assert np.frombuffer(first.fields["ids"].offsets, "<i8").tolist() == [0, 48, 80]
    decoded = _proto.decode_forward_backward_output(msg.SerializeToString())
    assert decoded.loss_fn_outputs[3]["lp"].shape == [1]
    with pytest.raises(ValueError, match="dtype"):
        server_codec.encode_forward_backward_output("T", [{"x": np.array(["a"])}], {})
    with pytest.raises(ValueError, match="same output fields"):
        server_codec.encode_forward_backward_output("T", [{"x": np.ones(1)}, {"y": np.ones(1)}], {})


@st.composite
def _sample_results(draw: st.DrawFn) -> SampleResult:
    def topk(n: int) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
        if not draw(st.booleans()):
            return None, None
        k = draw(st.integers(min_value=1, max_value=3))
        ids = np.array(
            draw(st.lists(st.integers(0, 100), min_size=n * k, max_size=n * k)), np.int32
        )
        lps = np.array(draw(st.lists(_floats32, min_size=n * k, max_size=n * k)), np.float32)
        return ids.reshape(n, k), lps.reshape(n, k)

    sequences = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        n = draw(st.integers(min_value=0, max_value=5))
        ids, lps = topk(n)
        sequences.append(
            SampledSeq(
                tokens=np.array(
                    draw(st.lists(st.integers(0, 258), min_size=n, max_size=n)), np.int32
                ),
                logprobs=np.array(draw(st.lists(_floats32, min_size=n, max_size=n)), np.float32),
                stop_reason=draw(st.sampled_from(["stop", "length"])),
                topk_ids=ids,
                topk_logprobs=lps,
            )
        )
    p = draw(st.integers(min_value=1, max_value=5))
    prompt = None
    if draw(st.booleans()):
        prompt = np.array(draw(st.lists(_floats32, min_size=p, max_size=p)), np.float32)
        prompt[0] = np.nan
    ids, lps = topk(p)
    target = np.zeros((p - 1, 2), np.float32) if draw(st.booleans()) else None
    alt = draw(st.booleans())
    return SampleResult(
        sequences=sequences,
        prompt_logprobs=prompt,
        topk_prompt_ids=ids,
        topk_prompt_logprobs=lps,
        target_prompt_logprobs=target,
        prompt_alt_tokens=np.ones((p - 1, 3), np.int64) if alt else None,
        prompt_alt_logprobs=np.full((p - 1, 3), -0.5, np.float32) if alt else None,
        prompt_cache_hit_tokens=draw(st.integers(min_value=0, max_value=1000)),
    )


def _response_key(response: SampleResponse) -> tuple[Any, ...]:
    return (
        [
            # protobuf cannot tell empty logprobs from absent ones; JSON can.
            (s.stop_reason, s.sequence_id, s.tokens, s.logprobs or None, s.topk_logprobs or None)
            for s in response.sequences
        ],
        response.prompt_logprobs or None,
        response.topk_prompt_logprobs or None,
        None
        if response.target_prompt_logprobs is None
        else _tensor_key(response.target_prompt_logprobs),
        None
        if response.prompt_alt_tokens is None
        else (
            _tensor_key(response.prompt_alt_tokens.tokens),
            _tensor_key(response.prompt_alt_tokens.logprobs),
        ),
        response.prompt_cache_hit_tokens,
    )


@settings(max_examples=150, deadline=None)
@given(_sample_results())
def test_sample_result_server_to_client_round_trip(result: SampleResult) -> None:
    ids = [f"s:{i}" for i in range(len(result.sequences))]
    decoded = _proto.decode_sample_response(server_codec.encode_sample_response(result), ids)
    for seq, got in zip(result.sequences, decoded.sequences, strict=True):
        assert got.stop_reason == seq.stop_reason
        assert got.tokens_np.tobytes() == seq.tokens.tobytes()
        if len(seq.tokens):
            assert got.logprobs_np is not None
            assert got.logprobs_np.tobytes() == seq.logprobs.tobytes()
        else:
            assert got.logprobs is None  # empty bytes decode as "not requested"
        if seq.topk_ids is not None and seq.topk_ids.size:
            assert got.topk_logprobs_np is not None
            assert got.topk_logprobs_np.token_ids.tolist() == seq.topk_ids.tolist()
        else:
            assert got.topk_logprobs_np is None
    assert [s.sequence_id for s in decoded.sequences] == ids
    if result.prompt_logprobs is None:
        assert decoded.prompt_logprobs is None
    else:
        assert decoded.prompt_logprobs is not None and decoded.prompt_logprobs[0] is None
        assert decoded.prompt_logprobs_np is not None
        assert decoded.prompt_logprobs_np.tobytes() == result.prompt_logprobs.tobytes()
    assert decoded.prompt_cache_hit_tokens == result.prompt_cache_hit_tokens
    if result.target_prompt_logprobs is not None and result.target_prompt_logprobs.size:
        assert decoded.target_prompt_logprobs is not None
        assert decoded.target_prompt_logprobs.shape == list(result.target_prompt_logprobs.shape)
    assert (decoded.prompt_alt_tokens is None) == (result.prompt_alt_tokens is None)
    via_json = _jsonresults.sample_response_from_json(
        server_codec.sample_result_to_json(result), ids
    )
    assert _response_key(via_json) == _response_key(decoded)


def test_encode_sample_response_rejects_bad_stop_reason_and_topk() -> None:
    seq = SampledSeq(
        tokens=np.zeros(1, np.int32), logprobs=np.zeros(1, np.float32), stop_reason="x"
    )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stop_reason"):
        server_codec.encode_sample_response(SampleResult(sequences=[seq]))
    bad = SampleResult(
        sequences=[],
        topk_prompt_ids=np.zeros((2, 2), np.int32),
        topk_prompt_logprobs=np.zeros((2, 3), np.float32),
    )
    with pytest.raises(ValueError, match="matrices"):
        server_codec.encode_sample_response(bad)


# ============================================================== JSON fallbacks


def test_sample_response_from_json_legacy_shape() -> None:
    obj = {
        "type": "sample",
        "sequences": [
            {"stop_reason": "stop", "tokens": [1, 2], "logprobs": [-0.5, -1.0]},
            {"stop_reason": "length", "tokens": [3], "logprobs": None, "extra": 1},
        ],
        "prompt_logprobs": [None, -1.25],
        "topk_prompt_logprobs": [None, [[5, -0.25], [6, -2.0]]],
    }
    response = _jsonresults.sample_response_from_json(obj, None)
    assert [s.sequence_id for s in response.sequences] == [None, None]
    assert response.sequences[0].logprobs == [-0.5, -1.0]
    assert response.sequences[1].logprobs is None
    assert response.prompt_logprobs == [None, -1.25]
    assert response.topk_prompt_logprobs == [None, [(5, -0.25), (6, -2.0)]]
    assert response.prompt_cache_hit_tokens == 0


def test_sample_response_from_json_errors() -> None:
    with pytest.raises(ValueError, match="stop_reason"):
        _jsonresults.sample_response_from_json(
            {"sequences": [{"stop_reason": "eos", "tokens": []}]}, None
        )
    with pytest.raises(ValueError, match="sample_sequence_ids"):
        _jsonresults.sample_response_from_json({"sequences": []}, ["a"])
    with pytest.raises(TypeError, match="sequences"):
        _jsonresults.sample_response_from_json({}, None)
    with pytest.raises(TypeError, match="tokens"):
        _jsonresults.sample_response_from_json(
            {"sequences": [{"stop_reason": "stop", "tokens": ["a"]}]}, None
        )
    with pytest.raises(TypeError, match="integers"):
        _jsonresults.sample_response_from_json(
            {"sequences": [{"stop_reason": "stop", "tokens": [1.9]}]}, None
        )
    with pytest.raises(ValueError, match="tokens"):
        _jsonresults.sample_response_from_json(
            {"sequences": [{"stop_reason": "stop", "tokens": [2**40]}]}, None
        )
    with pytest.raises(TypeError, match="prompt_cache_hit_tokens"):
        _jsonresults.sample_response_from_json(
            {"sequences": [], "prompt_cache_hit_tokens": 1.5}, None
        )


def test_forward_backward_output_from_json() -> None:
    obj = {
        "loss_fn_output_type": "ArrayRecord",
        "loss_fn_outputs": [
            {"logprobs": {"data": [-1.0, -2.0], "dtype": "float32", "shape": [2]}},
            {
                "logprobs": {
                    "data": [-3.0],
                    "dtype": "float32",
                    "shape": [2, 2],
                    "sparse_crow_indices": [0, 1, 1],
                    "sparse_col_indices": [1],
                }
            },
        ],
        "metrics": {"loss:sum": 3},
    }
    out = _jsonresults.forward_backward_output_from_json(obj)
    assert out.metrics == {"loss:sum": 3.0}
    assert out.loss_fn_outputs[0]["logprobs"].data == [-1.0, -2.0]
    assert out.loss_fn_outputs[1]["logprobs"].to_numpy().tolist() == [[0.0, -3.0], [0.0, 0.0]]
    legacy = _jsonresults.forward_backward_output_from_json({"loss_fn_outputs": []})
    assert (legacy.loss_fn_output_type, legacy.metrics) == ("ArrayRecord", {})
    with pytest.raises(ValueError, match="dtype"):
        _jsonresults.forward_backward_output_from_json(
            {"loss_fn_outputs": [{"x": {"data": [1], "dtype": "int32"}}]}
        )
    with pytest.raises(TypeError, match="metrics"):
        _jsonresults.forward_backward_output_from_json(
            {"loss_fn_outputs": [], "metrics": {"a:sum": "1"}}
        )
    with pytest.raises(ValueError, match="shape"):
        _jsonresults.forward_backward_output_from_json(
            {"loss_fn_outputs": [{"x": {"data": [1, 2], "dtype": "int64", "shape": [3]}}]}
        )


def test_bf16_signalling_nan_is_quieted_like_the_official_cast() -> None:
    """Regression (found by the conformance fuzzer): bf16 0x7f81 widens to 0x7fc10000."""
    from tinker_sync._wire._pbwire import DTYPE_BFLOAT16, widen

    raw = np.array([0x7F81, 0x3F80, 0x7FC0, 0xFF81, 0x7F80], dtype=np.uint16)
    bits = widen(raw, DTYPE_BFLOAT16).view(np.uint32)
    assert [hex(b) for b in bits] == [
        "0x7fc10000",
        "0x3f800000",
        "0x7fc00000",
        "0xffc10000",
        "0x7f800000",
    ]


def test_each_decoded_datum_array_is_its_own_allocation() -> None:
    """As in the official SDK, no datum's array is a view into a buffer shared with another
    datum: reductions over a view at an odd offset take another SIMD path and differ in the
    last bit (the cookbook's train_mean_nll differed from the official client's that way)."""
    outputs = [{"logprobs": np.linspace(-3, -1, n).astype(np.float32)} for n in (5, 7, 3)]
    body = server_codec.encode_forward_backward_output("ArrayRecord", outputs, {})
    decoded = _proto.decode_forward_backward_output(body)
    arrays = [d["logprobs"].to_numpy() for d in decoded.loss_fn_outputs]

    def root(arr: np.ndarray) -> object:
        while isinstance(arr.base, np.ndarray):
            arr = arr.base
        return arr.base if arr.base is not None else arr

    roots = [id(root(arr)) for arr in arrays]
    assert len(set(roots)) == len(arrays)
    for arr in arrays:
        assert arr.ctypes.data % 16 == 0  # numpy's own allocation, not an offset into another
    assert [a.tolist() for a in arrays] == [o["logprobs"].tolist() for o in outputs]
