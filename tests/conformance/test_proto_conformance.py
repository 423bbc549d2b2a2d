"""Our protobuf codecs against the official SDK (docs/design/behavior.md#proto-request-encoding,
docs/design/behavior.md#proto-result-decoding).

* Requests: our bytes, parsed with the OFFICIAL descriptor, equal the message the official
  request converter builds from the equivalent official types.
* Results: messages built and serialized with the official schema decode in ours to the same
  values the official response converter produces; our server encoders decode in the
  official client to the same values as in ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from _oracle import require
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinker_sync import types as ours
from tinker_sync._wire import _proto
from tinker_sync.local import _protocodec as server_codec
from tinker_sync.local.backends.base import SampledSeq, SampleResult

tinker = require("tinker")
opb = require("tinker.proto.tinker_public_pb2")
request_conv = require("tinker.proto.request_conv")
response_conv = require("tinker.proto.response_conv")
ot = tinker.types

_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ============================================================== request side


@dataclass
class TensorSpec:
    dtype: str
    values: list[Any]
    shape: list[int] | None
    crow: list[int] | None = None
    col: list[int] | None = None


@dataclass
class DatumSpec:
    chunks: list[tuple[str, Any]]
    inputs: dict[str, TensorSpec]
    spans: tuple[list[tuple[str, str, int, int]], list[tuple[str, str, int, int]]] | None = None


@dataclass
class RequestSpec:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, Any] | None
    forward_only: bool
    data: list[DatumSpec] = field(default_factory=list)


def _np_dtype(dtype: str) -> Any:
    return np.int64 if dtype == "int64" else np.float32


def _official_tensor(spec: TensorSpec) -> Any:
    return ot.TensorData(
        data=np.array(spec.values, dtype=_np_dtype(spec.dtype)),
        dtype=spec.dtype,
        shape=spec.shape,
        sparse_crow_indices=spec.crow,
        sparse_col_indices=spec.col,
    )


def _our_tensor(spec: TensorSpec) -> ours.TensorData:
    return ours.TensorData(
        data=np.array(spec.values, dtype=_np_dtype(spec.dtype)),
        dtype=spec.dtype,  # type: ignore[arg-type]
        shape=spec.shape,
        sparse_crow_indices=spec.crow,
        sparse_col_indices=spec.col,
    )


def _official_chunk(kind: str, value: Any) -> Any:
    if kind == "text":
        return ot.EncodedTextChunk(tokens=value)
    if kind == "image":
        data, fmt, expected = value
        return ot.ImageChunk(data=data, format=fmt, expected_tokens=expected)
    return ot.DmelChunk(dmel=value)


def _our_chunk(kind: str, value: Any) -> Any:
    if kind == "text":
        return ours.EncodedTextChunk(tokens=np.array(value, dtype=np.int64))
    if kind == "image":
        data, fmt, expected = value
        return ours.ImageChunk(data=data, format=fmt, expected_tokens=expected)
    return ours.DmelChunk(dmel=value)


def _spans(module: Any, spans: list[tuple[str, str, int, int]]) -> list[Any]:
    return [
        (module.SampledProvenanceSpan if kind == "sampled" else module.PromptProvenanceSpan)(
            sequence_id=seq, offset=offset, length=length
        )
        for kind, seq, offset, length in spans
    ]


def _official_request_message(spec: RequestSpec) -> Any:
    data = []
    for d in spec.data:
        data.append(
            ot.Datum(
                model_input=ot.ModelInput(chunks=[_official_chunk(k, v) for k, v in d.chunks]),
                loss_fn_inputs={k: _official_tensor(v) for k, v in d.inputs.items()},
                model_input_spans=None if d.spans is None else _spans(ot, d.spans[0]),
                loss_fn_input_spans=None if d.spans is None else _spans(ot, d.spans[1]),
            )
        )
    request = ot.ForwardBackwardRequest(
        forward_backward_input=ot.ForwardBackwardInput(
            data=data, loss_fn=spec.loss_fn, loss_fn_config=spec.config
        ),
        model_id=spec.model_id,
        seq_id=spec.seq_id,
    )
    msg = request_conv.forward_backward_request_to_proto(request)
    msg.forward_only = spec.forward_only  # set by the official resource layer
    return msg


def _our_request_bytes(spec: RequestSpec) -> bytes:
    data = [
        ours.Datum(
            model_input=ours.ModelInput(chunks=[_our_chunk(k, v) for k, v in d.chunks]),
            loss_fn_inputs={k: _our_tensor(v) for k, v in d.inputs.items()},
            model_input_spans=None if d.spans is None else _spans(ours, d.spans[0]),
            loss_fn_input_spans=None if d.spans is None else _spans(ours, d.spans[1]),
        )
        for d in spec.data
    ]
    return _proto.encode_forward_backward_request(
        spec.model_id, spec.seq_id, data, spec.loss_fn, spec.config, spec.forward_only
    )


def _assert_same_request(spec: RequestSpec) -> None:
    expected = _official_request_message(spec)
    body = _our_request_bytes(spec)
    parsed = opb.ForwardBackwardRequest()
    parsed.ParseFromString(body)
    assert parsed == expected
    # And the official bytes decode in our server-side decoder like ours do (images without
    # expected_tokens are refused by the local server in both cases).
    try:
        theirs = server_codec.decode_forward_backward_request(expected.SerializeToString())
    except ValueError as exc:
        # Refused (an image without expected_tokens, or declared lengths over the server's
        # bound): our bytes are refused for the same reason.
        with pytest.raises(ValueError) as ours_refused:
            server_codec.decode_forward_backward_request(body)
        assert str(ours_refused.value) == str(exc)
        return
    mine = server_codec.decode_forward_backward_request(body)
    assert theirs[:5] == mine[:5]
    for a, b in zip(theirs[5], mine[5], strict=True):
        assert a.tokens.tolist() == b.tokens.tolist()
        assert {k: v.tobytes() for k, v in a.inputs.items()} == {
            k: v.tobytes() for k, v in b.inputs.items()
        }


def test_request_with_every_feature_matches_official() -> None:
    dmel = bytes([254, 1, 2, 6, 2]) + b"\x00" * 8
    spec = RequestSpec(
        model_id="sess-1:train:0",
        seq_id=42,
        loss_fn="ppo",
        config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "loss_id": "abc", "n": 3},
        forward_only=True,
        data=[
            DatumSpec(
                chunks=[
                    ("text", [1, 2, 3]),
                    ("image", (b"\x89PNG\r\n\x1a\n", "png", 4)),
                    ("image", (b"\xff\xd8\xff", "jpeg", None)),
                    ("dmel", dmel),
                    ("text", []),
                ],
                inputs={
                    "target_tokens": TensorSpec("int64", [5, 6, 7, -1], [4]),
                    "weights": TensorSpec("float32", [1.0, 0.5], [2, 3], [0, 1, 2], [0, 2]),
                    "advantages": TensorSpec("float32", [0.25], None),
                    "logprobs": TensorSpec("float32", [], [0]),
                },
                spans=(
                    [("prompt", "seq-a", 0, 3), ("sampled", "seq-b", 2, 4)],
                    [("sampled", "seq-b", 0, 4)],
                ),
            ),
            DatumSpec(chunks=[], inputs={}),
        ],
    )
    _assert_same_request(spec)


def test_numeric_config_only_and_no_config() -> None:
    for config in (None, {}, {"beta": 0.1}, {"s": "only-text"}):
        _assert_same_request(
            RequestSpec("m", 1, "dro", config, False, [DatumSpec([("text", [9])], {})])
        )


_int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_text = st.text(max_size=5)


@st.composite
def _tensor_specs(draw: st.DrawFn) -> TensorSpec:
    dtype = draw(st.sampled_from(["int64", "float32"]))
    elem = (
        st.integers(min_value=-(2**63), max_value=2**63 - 1)
        if dtype == "int64"
        else st.floats(width=32, allow_nan=False)
    )
    if draw(st.booleans()):
        rows = draw(st.integers(1, 4))
        cols = draw(st.integers(1, 4))
        counts = [draw(st.integers(0, cols)) for _ in range(rows)]
        crow = [0, *np.cumsum(counts).tolist()]
        col = [
            c
            for n in counts
            for c in sorted(draw(st.sets(st.integers(0, cols - 1), min_size=n, max_size=n)))
        ]
        values = draw(st.lists(elem, min_size=len(col), max_size=len(col)))
        return TensorSpec(dtype, values, [rows, cols], crow, col)
    shape = draw(st.none() | st.lists(st.integers(0, 3), min_size=1, max_size=3))
    size = math.prod(shape) if shape is not None else draw(st.integers(0, 6))
    return TensorSpec(dtype, draw(st.lists(elem, min_size=size, max_size=size)), shape)


@st.composite
def _datum_specs(draw: st.DrawFn) -> DatumSpec:
    chunks: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["text", "text", "image", "dmel"]))
        if kind == "text":
            chunks.append(("text", draw(st.lists(_int32, max_size=6))))
        elif kind == "image":
            chunks.append(
                (
                    "image",
                    (
                        draw(st.binary(max_size=6)),
                        draw(st.sampled_from(["png", "jpeg"])),
                        draw(st.none() | st.integers(0, 2**31 - 1)),
                    ),
                )
            )
        else:
            chunks.append(
                ("dmel", bytes([0, 1, draw(st.integers(0, 127))]) + draw(st.binary(max_size=4)))
            )
    inputs = draw(st.dictionaries(_text, _tensor_specs(), max_size=3))
    spans = None
    if draw(st.booleans()):
        span = st.tuples(
            st.sampled_from(["prompt", "sampled"]),
            st.text(min_size=1, max_size=4),
            st.integers(0, 2**40),
            st.integers(0, 2**40),
        )
        spans = (draw(st.lists(span, max_size=3)), draw(st.lists(span, max_size=3)))
    return DatumSpec(chunks, inputs, spans)


@_SETTINGS
@given(
    st.builds(
        RequestSpec,
        model_id=_text,
        seq_id=st.integers(0, 2**31 - 1),
        loss_fn=st.sampled_from(["cross_entropy", "ppo", "custom"]),
        config=st.none()
        | st.dictionaries(
            _text, st.floats(allow_nan=False) | st.integers(-100, 100) | _text, max_size=4
        ),
        forward_only=st.booleans(),
        data=st.lists(_datum_specs(), max_size=4),
    )
)
def test_random_requests_match_official(spec: RequestSpec) -> None:
    _assert_same_request(spec)


# ============================================================== result side: helpers


def _official_td_key(td: Any) -> tuple[Any, ...]:
    return (
        td.dtype,
        list(td.shape) if td.shape is not None else None,
        td.sparse_crow_indices,
        td.sparse_col_indices,
        _as_seen(np.asarray(td.data, dtype=_np_dtype(td.dtype))),
    )


def _as_seen(values: np.ndarray) -> bytes:
    """The bytes a user sees: floats widened to float64 (which quiets signalling NaNs).

    The official decoder goes through Python floats, so a float32 signalling NaN comes back
    quiet; ours keeps the float32 bits until they are read as Python floats. Both agree once
    widened; every other bit pattern (payloads, signs, infinities) must still match exactly.
    """
    if values.dtype.kind == "f":
        return values.astype(np.float64).tobytes()
    return values.tobytes()


def _our_td_key(td: ours.TensorData) -> tuple[Any, ...]:
    return (
        td.dtype,
        td.shape,
        td.sparse_crow_indices,
        td.sparse_col_indices,
        _as_seen(np.asarray(td.data_np, dtype=_np_dtype(td.dtype))),
    )


def _assert_same_fbo(official: Any, mine: ours.ForwardBackwardOutput) -> None:
    assert mine.loss_fn_output_type == official.loss_fn_output_type
    assert mine.metrics == official.metrics
    assert [{k: _our_td_key(v) for k, v in d.items()} for d in mine.loss_fn_outputs] == [
        {k: _official_td_key(v) for k, v in d.items()} for d in official.loss_fn_outputs
    ]
    for d in mine.loss_fn_outputs:
        for v in d.values():
            assert v.data_np.dtype == _np_dtype(v.dtype)


def _topk_key(topk: Any) -> Any:
    if topk is None:
        return None
    return (topk.token_ids.tolist(), topk.logprobs.tobytes())


def _assert_same_sample(official: Any, mine: ours.SampleResponse) -> None:
    assert len(mine.sequences) == len(official.sequences)
    for a, b in zip(official.sequences, mine.sequences, strict=True):
        assert b.stop_reason == a.stop_reason
        assert b.tokens_np.dtype == a.tokens_np.dtype and b.tokens == a.tokens
        if a.logprobs_np is None:
            assert b.logprobs_np is None
        else:
            assert b.logprobs_np is not None
            assert b.logprobs_np.tobytes() == a.logprobs_np.tobytes()
        assert _topk_key(b.topk_logprobs_np) == _topk_key(a.topk_logprobs_np)
        assert repr(b.topk_logprobs) == repr(a.topk_logprobs)
    if official.prompt_logprobs_np is None:
        assert mine.prompt_logprobs_np is None
    else:
        assert mine.prompt_logprobs_np is not None
        assert mine.prompt_logprobs_np.tobytes() == official.prompt_logprobs_np.tobytes()
    assert repr(mine.prompt_logprobs) == repr(official.prompt_logprobs)
    assert _topk_key(mine.topk_prompt_logprobs_np) == _topk_key(official.topk_prompt_logprobs_np)
    assert repr(mine.topk_prompt_logprobs) == repr(official.topk_prompt_logprobs)
    assert mine.prompt_cache_hit_tokens == official.prompt_cache_hit_tokens
    if official.target_prompt_logprobs is None:
        assert mine.target_prompt_logprobs is None
    else:
        assert mine.target_prompt_logprobs is not None
        assert _our_td_key(mine.target_prompt_logprobs) == _official_td_key(
            official.target_prompt_logprobs
        )
    if official.prompt_alt_tokens is None:
        assert mine.prompt_alt_tokens is None
    else:
        assert mine.prompt_alt_tokens is not None
        assert _our_td_key(mine.prompt_alt_tokens.tokens) == _official_td_key(
            official.prompt_alt_tokens.tokens
        )
        assert _our_td_key(mine.prompt_alt_tokens.logprobs) == _official_td_key(
            official.prompt_alt_tokens.logprobs
        )


def _ids(payload: bytes) -> list[str]:
    msg = opb.SampleResponse()
    msg.ParseFromString(payload)
    return [f"seq-{i}" for i in range(len(msg.sequences))]


# ============================================================== official-schema results


_WIRE = {
    opb.DTYPE_FLOAT32: "<f4",
    opb.DTYPE_INT64: "<i8",
    opb.DTYPE_INT32: "<i4",
    opb.DTYPE_BFLOAT16: "<u2",
}


@st.composite
def _official_fbo_bytes(draw: st.DrawFn) -> bytes:
    msg = opb.ForwardBackwardOutput(
        loss_fn_output_type=draw(st.sampled_from(["", "ArrayRecord", "a.b:Rec", "x:y:Z"]))
    )
    names = draw(st.lists(st.sampled_from(["logprobs", "loss", "ids"]), unique=True, max_size=3))
    for _ in range(draw(st.integers(0, 3))):
        n = draw(st.integers(0, 4))
        record = msg.loss_fn_outputs.add(type_tag="ArrayRecord")
        if draw(st.booleans()):
            record.num_datums = n
        for name in names:
            code = draw(st.sampled_from(sorted(_WIRE)))
            trailing = draw(st.sampled_from([[], [2], [1, 3]]))
            inner = math.prod(trailing)
            chunks = []
            for _ in range(n):
                rows = draw(st.integers(0, 3))
                raw = draw(
                    st.binary(
                        min_size=rows * inner * np.dtype(_WIRE[code]).itemsize,
                        max_size=rows * inner * np.dtype(_WIRE[code]).itemsize,
                    )
                )
                chunks.append(raw)
            bt = record.fields[name]
            bt.dtype = code
            bt.trailing_shape.extend(trailing)
            bt.data = b"".join(chunks)
            bt.offsets = (
                np.concatenate([[0], np.cumsum([len(c) for c in chunks])]).astype("<i8").tobytes()
            )
    for key in draw(st.lists(st.sampled_from(["loss:sum", "acc:mean", "h:hash2"]), unique=True)):
        msg.metrics[key] = draw(st.floats(allow_nan=False))
    return bytes(msg.SerializeToString())


def _same_float_bits(a: ours.ForwardBackwardOutput, official: Any) -> None:
    # NaN payloads survive both decoders (up to quieting, see _as_seen); compare bytes.
    _assert_same_fbo(official, a)


@_SETTINGS
@given(_official_fbo_bytes())
def test_official_forward_outputs_decode_identically(payload: bytes) -> None:
    try:
        official = response_conv.deserialize_forward_backward_output(payload)
    except IndexError:
        # The official client crashes when a field holds fewer datums than declared; we
        # raise a ValueError naming the field instead.
        with pytest.raises(ValueError, match="declare"):
            _proto.decode_forward_backward_output(payload)
        return
    mine = _proto.decode_forward_backward_output(payload)
    _same_float_bits(mine, official)


def _official_topk(draw: st.DrawFn, target: Any) -> None:
    length = draw(st.integers(0, 4))
    k = draw(st.integers(0, 3))
    ids = np.array(
        draw(st.lists(st.integers(0, 5), min_size=length * k, max_size=length * k)), "<i4"
    )
    lps = np.array(
        draw(
            st.lists(
                st.sampled_from([-99999.0, -0.5, -1.25]), min_size=length * k, max_size=length * k
            )
        ),
        "<f4",
    )
    target.token_ids = ids.tobytes()
    target.logprobs = lps.tobytes()
    target.k = k
    target.length = length


def _official_tensor_msg(draw: st.DrawFn, target: Any, code: int) -> None:
    target.dtype = code
    rows = draw(st.integers(0, 3))
    cols = draw(st.integers(1, 3))
    target.shape.extend([rows, cols])
    dtype = _WIRE[code]
    if code == opb.DTYPE_FLOAT32 and draw(st.booleans()):
        counts = [draw(st.integers(0, cols)) for _ in range(rows)]
        nnz = sum(counts)
        target.sparse_csr.values = np.array(
            draw(st.lists(st.floats(width=32, allow_nan=False), min_size=nnz, max_size=nnz)), dtype
        ).tobytes()
        target.sparse_csr.crow_indices = np.array([0, *np.cumsum(counts).tolist()], "<i8").tobytes()
        target.sparse_csr.col_indices = np.array(
            [c for n in counts for c in range(n)], "<i8"
        ).tobytes()
        return
    size = rows * cols
    if code == opb.DTYPE_FLOAT32:
        values = draw(st.lists(st.floats(width=32, allow_nan=False), min_size=size, max_size=size))
    else:
        values = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=size, max_size=size))
    target.dense = np.array(values, dtype).tobytes()


@st.composite
def _official_sample_bytes(draw: st.DrawFn) -> bytes:
    msg = opb.SampleResponse()
    for _ in range(draw(st.integers(0, 3))):
        seq = msg.sequences.add(stop_reason=draw(st.sampled_from([0, 1])))
        n = draw(st.integers(0, 5))
        seq.tokens = np.array(
            draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)), "<i4"
        ).tobytes()
        if draw(st.booleans()):
            seq.logprobs = np.array(
                draw(st.lists(st.floats(width=32), min_size=n, max_size=n)), "<f4"
            ).tobytes()
        if draw(st.booleans()):
            _official_topk(draw, seq.topk_sampled_logprobs)
    if draw(st.booleans()):
        p = draw(st.integers(0, 5))
        values = draw(st.lists(st.floats(width=32) | st.just(math.nan), min_size=p, max_size=p))
        msg.prompt_logprobs = np.array(values, "<f4").tobytes()
    if draw(st.booleans()):
        _official_topk(draw, msg.topk_prompt_logprobs)
    msg.prompt_cache_hit_tokens = draw(st.integers(0, 2**31 - 1))
    if draw(st.booleans()):
        _official_tensor_msg(draw, msg.target_prompt_logprobs, opb.DTYPE_FLOAT32)
    if draw(st.booleans()):
        _official_tensor_msg(
            draw,
            msg.prompt_alt_tokens.tokens,
            draw(st.sampled_from([opb.DTYPE_INT64, opb.DTYPE_INT32])),
        )
        _official_tensor_msg(draw, msg.prompt_alt_tokens.logprobs, opb.DTYPE_FLOAT32)
    return bytes(msg.SerializeToString())


@_SETTINGS
@given(_official_sample_bytes())
def test_official_sample_responses_decode_identically(payload: bytes) -> None:
    official = response_conv.deserialize_sample_response(payload)
    mine = _proto.decode_sample_response(payload, _ids(payload))
    _assert_same_sample(official, mine)
    assert [s.sequence_id for s in mine.sequences] == _ids(payload)


def test_official_sample_response_error_cases_agree() -> None:
    msg = opb.SampleResponse()
    msg.sequences.add(stop_reason=7)
    payload = msg.SerializeToString()
    with pytest.raises(ValueError):
        response_conv.deserialize_sample_response(payload)
    with pytest.raises(ValueError):
        _proto.decode_sample_response(payload, ["a"])


# ============================================================== our server encoders, their client


@st.composite
def _backend_outputs(draw: st.DrawFn) -> list[dict[str, np.ndarray]]:
    names = draw(st.lists(st.sampled_from(["logprobs", "loss", "ids"]), unique=True, min_size=1))
    out = []
    for _ in range(draw(st.integers(0, 5))):
        datum = {}
        for name in names:
            shape = (draw(st.integers(0, 4)), *draw(st.sampled_from([(), (2,)])))
            size = math.prod(shape)
            if name == "ids":
                datum[name] = np.array(
                    draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=size, max_size=size)),
                    np.int64,
                ).reshape(shape)
            else:
                datum[name] = np.array(
                    draw(
                        st.lists(st.floats(width=32, allow_nan=False), min_size=size, max_size=size)
                    ),
                    np.float32,
                ).reshape(shape)
        out.append(datum)
    return out


@_SETTINGS
@given(
    _backend_outputs(),
    st.dictionaries(st.sampled_from(["loss:sum", "a:mean"]), st.floats(allow_nan=False)),
)
def test_our_forward_output_encoding_decodes_in_official_client(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> None:
    payload = server_codec.encode_forward_backward_output("ArrayRecord", outputs, metrics)
    _assert_same_fbo(
        response_conv.deserialize_forward_backward_output(payload),
        _proto.decode_forward_backward_output(payload),
    )


def test_our_sample_encoding_decodes_in_official_client() -> None:
    result = SampleResult(
        sequences=[
            SampledSeq(
                tokens=np.array([5, 6, 256], np.int32),
                logprobs=np.array([-0.1, -0.2, -0.3], np.float32),
                stop_reason="stop",
                topk_ids=np.array([[5, 1], [6, 0], [0, 0]], np.int32),
                topk_logprobs=np.array(
                    [[-0.1, -3.0], [-0.2, -99999.0], [-99999.0, -99999.0]], np.float32
                ),
            ),
            SampledSeq(
                tokens=np.array([], np.int32),
                logprobs=np.array([], np.float32),
                stop_reason="length",
            ),
        ],
        prompt_logprobs=np.array([np.nan, -1.0, -2.0], np.float32),
        topk_prompt_ids=np.array([[0, 0], [3, 4], [5, 6]], np.int32),
        topk_prompt_logprobs=np.array(
            [[-99999.0, -99999.0], [-1.0, -2.0], [-0.5, -0.75]], np.float32
        ),
        target_prompt_logprobs=np.array([[-1.0, 0.0], [-2.0, -3.0]], np.float32),
        prompt_alt_tokens=np.array([[7, 8], [9, 10]], np.int64),
        prompt_alt_logprobs=np.array([[-0.1, -0.2], [-0.3, -0.4]], np.float32),
        prompt_cache_hit_tokens=3,
    )
    payload = server_codec.encode_sample_response(result)
    _assert_same_sample(
        response_conv.deserialize_sample_response(payload),
        _proto.decode_sample_response(payload, _ids(payload)),
    )
