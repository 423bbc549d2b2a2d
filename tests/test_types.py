"""Tests of tinker_sync.types: construction, validation, helpers
(docs/design/behavior.md#strict-converter, docs/design/behavior.md#data-helpers)."""

import base64
import dataclasses
import datetime as dt
import pickle
import subprocess
import sys
import threading
import warnings
from typing import Any

import attrs
import numpy as np
import pytest

from tinker_sync import types as T
from tinker_sync.exceptions import RequestErrorCategory

# -- construction rules ----------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (T.SamplingParams, {}),
        (T.LoraConfig, {"rank": 4}),
        (T.AdamParams, {}),
        (T.GetInfoRequest, {"model_id": "m"}),
    ],
)
def test_unknown_kwargs_rejected(cls, kwargs):
    """Request and input types reject an unknown keyword as pydantic's extra_forbidden: a
    ValueError (and a TypeError, what earlier versions raised) naming it."""
    cls(**kwargs)
    with pytest.raises(ValueError) as raised:
        cls(**kwargs, not_a_field=1)
    assert isinstance(raised.value, TypeError)
    assert raised.value.errors() == [  # type: ignore[attr-defined]
        {
            "type": "extra_forbidden",
            "loc": ("not_a_field",),
            "msg": "Extra inputs are not permitted",
            "input": 1,
        }
    ]
    assert str(raised.value) == f"{cls.__name__}.not_a_field: Extra inputs are not permitted"


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (T.CreateSessionResponse, {"session_id": "s"}),
        (
            T.Checkpoint,
            {
                "checkpoint_id": "weights/a",
                "checkpoint_type": "training",
                "time": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
                "tinker_path": "tinker://r/weights/a",
            },
        ),
    ],
)
def test_unknown_kwargs_of_response_types_are_dropped_with_a_warning(cls, kwargs):
    """As the official response types do (pydantic extra="ignore"), plus a warning."""
    with pytest.warns(UserWarning, match="ignores unknown keyword argument.*'not_a_field'"):
        obj = cls(**kwargs, not_a_field=1)
    assert obj == cls(**kwargs)


def test_positional_construction_rejected():
    with pytest.raises(TypeError):
        T.LoraConfig(4)  # type: ignore[misc]


def test_frozen():
    params = T.SamplingParams(max_tokens=3)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        params.max_tokens = 4  # type: ignore[misc]
    td = T.TensorData(data=[1], dtype="int64")
    with pytest.raises(AttributeError):
        td.dtype = "float32"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs,kind,fragment",
    [
        ({"max_tokens": 1.9}, "int_from_float", "SamplingParams.max_tokens"),
        ({"max_tokens": float("nan")}, "finite_number", "SamplingParams.max_tokens"),
        ({"top_k": "five"}, "int_parsing", "SamplingParams.top_k"),
        ({"top_k": "3e2"}, "int_parsing", "SamplingParams.top_k"),
        ({"temperature": "warm"}, "float_parsing", "SamplingParams.temperature"),
        ({"temperature": None}, "float_type", "SamplingParams.temperature"),
        ({"stop": [1, "a"]}, "type_error", "SamplingParams.stop"),
        ({"stop": 5}, "type_error", "SamplingParams.stop"),
    ],
)
def test_rejected_values_raise_a_value_error_naming_the_field(kwargs, kind, fragment):
    with pytest.raises(ValueError, match=fragment) as info:
        T.SamplingParams(**kwargs)
    assert isinstance(info.value, TypeError)  # what earlier versions raised
    [error] = info.value.errors()
    assert error["type"] == kind and error["loc"] == (next(iter(kwargs)),)
    assert error["input"] is next(iter(kwargs.values())) and error["msg"]


@pytest.mark.parametrize(
    "kwargs,field,expected",
    [
        ({"max_tokens": 512 / 2}, "max_tokens", 256),
        ({"max_tokens": True}, "max_tokens", 1),
        ({"max_tokens": " 8 "}, "max_tokens", 8),
        ({"max_tokens": "8.0"}, "max_tokens", 8),
        ({"max_tokens": b"8"}, "max_tokens", 8),
        ({"max_tokens": np.float64(8.0)}, "max_tokens", 8),
        ({"max_tokens": np.array(8)}, "max_tokens", 8),
        ({"top_k": "5"}, "top_k", 5),
        ({"temperature": "1.0"}, "temperature", 1.0),
        ({"temperature": "3e-4"}, "temperature", 3e-4),
        ({"temperature": False}, "temperature", 0.0),
        ({"temperature": np.float32(0.5)}, "temperature", 0.5),
        ({"stop": [True]}, "stop", [1]),
        ({"stop": [1.0, "2"]}, "stop", [1, 2]),
        ({"stop": ("a",)}, "stop", ["a"]),
    ],
)
def test_pydantic_lax_coercions(kwargs, field, expected):
    value = getattr(T.SamplingParams(**kwargs), field)
    assert value == expected and type(value) is type(expected)
    if isinstance(value, list):
        assert [type(v) for v in value] == [type(v) for v in expected]


def test_coercions_of_every_scalar_kind():
    lora = T.LoraConfig(rank="8", train_mlp="false", train_attn=0, train_unembed="YES")
    assert (lora.rank, lora.train_mlp, lora.train_attn, lora.train_unembed) == (
        8,
        False,
        False,
        True,
    )
    assert T.AdamParams(learning_rate="3e-4").learning_rate == 3e-4
    assert T.GetInfoRequest(model_id=b"m").model_id == "m"
    assert T.DimuonOptimizerConfig(version=1.0).version == 1  # type: ignore[arg-type]
    chunk = T.EncodedTextChunk(tokens=[1, 2.0, "3", np.int64(4)])  # type: ignore[list-item]
    assert chunk.tokens == [1, 2, 3, 4] and {type(t) for t in chunk.tokens} == {int}
    for bad in ({"train_mlp": "maybe"}, {"train_mlp": 2}, {"rank": "8.5"}):
        with pytest.raises(ValueError):
            T.LoraConfig(**{"rank": 4, **bad})
    with pytest.raises(ValueError, match=r"EncodedTextChunk.tokens\[1\]"):
        T.EncodedTextChunk(tokens=[1, 2.5])
    with pytest.raises(ValueError, match="GetInfoRequest.model_id"):
        T.GetInfoRequest(model_id=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="GetInfoRequest.type"):
        T.GetInfoRequest(model_id="m", type="other")  # type: ignore[arg-type]


def test_torch_scalars_coerce_without_torch_being_imported_by_the_types():
    torch = pytest.importorskip("torch")
    params = T.AdamParams(learning_rate=torch.tensor(3e-4), beta1=torch.tensor(0.5))
    assert type(params.learning_rate) is float and abs(params.learning_rate - 3e-4) < 1e-9
    assert T.SamplingParams(max_tokens=torch.tensor(64)).max_tokens == 64
    with pytest.raises(ValueError, match="int_from_float|fractional"):
        T.SamplingParams(max_tokens=torch.tensor(2.5))
    with pytest.raises(ValueError):
        T.SamplingParams(max_tokens=torch.tensor([1, 2]))


def test_nested_errors_carry_the_field_path():
    with pytest.raises(ValueError) as info:
        T.ModelInput(
            chunks=[T.EncodedTextChunk(tokens=[1]), {"type": "image", "data": b"", "format": "gif"}]
        )
    [error] = info.value.errors()
    assert error["loc"] == ("chunks", 1, "format") and error["type"] == "literal_error"
    assert str(info.value).startswith("ModelInput.chunks[1].format: ")
    again = pickle.loads(pickle.dumps(info.value))
    assert again.errors() == info.value.errors() and str(again) == str(info.value)


def test_numeric_widening():
    params = T.SamplingParams(temperature=1, top_p=np.float64(0.5), top_k=np.int64(3))
    assert params.temperature == 1.0 and type(params.temperature) is float
    assert type(params.top_p) is float and params.top_p == 0.5
    assert type(params.top_k) is int and params.top_k == 3


def test_sampling_params_defaults_and_stop_forms():
    p = T.SamplingParams()
    assert (p.max_tokens, p.seed, p.stop, p.temperature, p.top_k, p.top_p) == (
        None,
        None,
        None,
        1.0,
        -1,
        1.0,
    )
    assert T.SamplingParams(stop="\n").stop == "\n"
    assert T.SamplingParams(stop=[]).stop == []
    assert T.SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert T.SamplingParams(stop=[1, 2]).stop == [1, 2]


def test_adam_and_lora_defaults():
    a = T.AdamParams()
    assert (a.learning_rate, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_clip_norm) == (
        1e-4,
        0.9,
        0.95,
        1e-12,
        0.0,
        0.0,
    )
    lora = T.LoraConfig(rank=32)
    assert (lora.seed, lora.train_unembed, lora.train_mlp, lora.train_attn) == (
        None,
        True,
        True,
        True,
    )
    with pytest.raises(TypeError):
        T.LoraConfig()  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"learning_rate": -0.1}, "DimuonParams.learning_rate: must be >= 0"),
        ({"learning_rate": float("nan")}, "DimuonParams.learning_rate: must be finite"),
        ({"learning_rate": float("inf")}, "DimuonParams.learning_rate: must be finite"),
        ({"learning_rate": 0.1, "beta1": 1.0}, "DimuonParams.beta1: must be in"),
        ({"learning_rate": 0.1, "beta1": -0.1}, "DimuonParams.beta1: must be in"),
        (
            {"learning_rate": 0.1, "grad_clip_norm": float("nan")},
            "DimuonParams.grad_clip_norm: must be finite",
        ),
    ],
)
def test_dimuon_validation(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment) as info:
        T.DimuonParams(**kwargs)
    assert info.value.errors()[0]["loc"] == (fragment.split(".")[1].split(":")[0],)


def test_dimuon_valid_and_optimizer_configs():
    d = T.DimuonParams(learning_rate=0)
    assert (d.type, d.learning_rate, d.grad_clip_norm, d.beta1) == ("dimuon", 0.0, 0.0, 0.9)
    assert T.AdamOptimizerConfig().type == "adamw"
    cfg = T.DimuonOptimizerConfig()
    assert (cfg.type, cfg.version) == ("dimuon", 1)
    with pytest.raises(TypeError):
        T.DimuonParams()  # type: ignore[call-arg]


def test_loss_fn_validation():
    assert set(T.LOSS_FN_TYPES) == {
        "cross_entropy",
        "importance_sampling",
        "ppo",
        "cispo",
        "dro",
        "gspo",
        "stable_reinforce",
        "custom",
    }
    for name in T.LOSS_FN_TYPES:
        assert T.validate_loss_fn(name) == name
    with pytest.raises(ValueError, match="'mse'"):
        T.validate_loss_fn("mse")
    with pytest.raises(ValueError):
        T.validate_loss_fn(None)


# -- model input --------------------------------------------------------------------------------


def test_model_input_helpers():
    mi = T.ModelInput.from_ints([1, 2, 3])
    assert mi.length == 3 and mi.to_ints() == [1, 2, 3]
    mi2 = mi.append_int(4)
    assert mi.to_ints() == [1, 2, 3], "append_int must not mutate"
    assert mi2.to_ints() == [1, 2, 3, 4] and len(mi2.chunks) == 2
    img = T.ImageChunk(data=b"abc", format="png", expected_tokens=5)
    mi3 = mi2.append(img)
    assert mi3.length == 9 and len(mi2.chunks) == 2
    with pytest.raises(ValueError, match="EncodedTextChunk"):
        mi3.to_ints()
    empty = T.ModelInput.empty()
    assert empty.chunks == [] and empty.length == 0 and empty.to_ints() == []


def test_model_input_from_numpy_copies_writable_arrays_and_keeps_read_only_ones():
    arr = np.arange(10, dtype=np.int32)
    mi = T.ModelInput.from_ints(arr)
    chunk = mi.chunks[0]
    assert isinstance(chunk, T.EncodedTextChunk)
    arr[0] = 99  # the caller reuses its buffer: the chunk keeps what it was given
    assert chunk.tokens[0] == 0 and chunk.tokens_np[0] == 0
    assert chunk.tokens_np.dtype == np.int32
    frozen = np.arange(4, dtype=np.int64)
    frozen.flags.writeable = False
    kept = T.EncodedTextChunk(tokens=frozen)
    assert kept.tokens is frozen  # nobody can change a read-only array: no copy needed
    assert mi.to_ints() == list(range(10))
    assert mi.length == 10
    assert T.ModelInput.from_ints(range(3)).to_ints() == [0, 1, 2]
    assert T.ModelInput.from_ints((np.int64(5), 6)).to_ints() == [5, 6]


def test_tokens_np_from_list_is_int32_when_it_fits():
    assert T.EncodedTextChunk(tokens=[1, 2]).tokens_np.dtype == np.int32
    big = T.EncodedTextChunk(tokens=[1, 2**40]).tokens_np
    assert big.dtype == np.int64 and big.tolist() == [1, 2**40]


@pytest.mark.parametrize(
    "tokens,exc",
    [
        ([1, 2.5], ValueError),
        ([1, "one"], ValueError),
        ([1, None], TypeError),
        ("123", TypeError),
        (np.array([1.0, 2.0]), TypeError),
        (np.zeros((2, 2), dtype=np.int64), ValueError),
    ],
)
def test_bad_tokens(tokens, exc):
    with pytest.raises(exc, match="EncodedTextChunk.tokens"):
        T.EncodedTextChunk(tokens=tokens)


def test_chunk_equality_with_numpy_tokens():
    a = T.EncodedTextChunk(tokens=np.array([1, 2, 3]))
    b = T.EncodedTextChunk(tokens=[1, 2, 3])
    assert a == b
    assert a != T.EncodedTextChunk(tokens=[1, 2])


def test_image_chunk():
    raw = b"\x89PNG\r\n"
    chunk = T.ImageChunk(data=base64.b64encode(raw).decode(), format="jpeg")
    assert chunk.data == raw
    with pytest.raises(ValueError, match="expected_tokens"):
        _ = chunk.length
    assert T.ImageChunk(data=bytearray(raw), format="png", expected_tokens=3).length == 3
    with pytest.raises(ValueError, match="ImageChunk.format"):
        T.ImageChunk(data=raw, format="gif")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ImageChunk.data"):
        T.ImageChunk(data="not base64!!", format="png")
    pointer = T.ImageAssetPointerChunk(format="png", location="s3://b/k")
    with pytest.raises(ValueError, match="expected_tokens"):
        _ = pointer.length
    assert T.ImageAssetPointerChunk(format="png", location="x", expected_tokens=7).length == 7


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.mark.parametrize("marker", [b"", b"\xfe"])
@pytest.mark.parametrize("dims", [(5,), (300, 80), (1, 2, 3), (2**20,)])
def test_dmel_length_reads_header(marker, dims):
    header = marker + b"\x03" + _varint(len(dims)) + b"".join(_varint(d) for d in dims)
    chunk = T.DmelChunk(dmel=header + b"payload")
    assert chunk.length == dims[0]
    assert T.tensor_container_shape(chunk.dmel) == dims
    assert T.DmelChunk(dmel=base64.b64encode(chunk.dmel).decode()).length == dims[0]


@pytest.mark.parametrize(
    "data,fragment",
    [
        (b"", "empty"),
        (b"\x09\x01\x05", "dtype byte"),
        (b"\x01\x02\x05", "truncated"),
        (b"\xfe", "truncated"),
        (b"\x01\x00", "no dimension 0"),
        (b"\x01\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "too long"),
    ],
)
def test_dmel_bad_headers(data, fragment):
    with pytest.raises(ValueError, match=fragment):
        _ = T.DmelChunk(dmel=data).length


def test_model_input_accepts_chunk_dicts_by_tag():
    mi = T.ModelInput(
        chunks=[
            {"type": "encoded_text", "tokens": [1, 2]},  # type: ignore[list-item]
            {"type": "image", "data": "aGk=", "format": "png", "expected_tokens": 2},  # type: ignore[list-item]
        ]
    )
    assert isinstance(mi.chunks[0], T.EncodedTextChunk)
    assert isinstance(mi.chunks[1], T.ImageChunk) and mi.chunks[1].data == b"hi"
    with pytest.raises(TypeError, match="ModelInput.chunks"):
        T.ModelInput(chunks=[5])  # type: ignore[list-item]


# -- TensorData ----------------------------------------------------------------------------


def test_tensor_data_requires_dtype():
    with pytest.raises(TypeError, match="dtype"):
        T.TensorData(data=[1, 2])
    with pytest.raises(ValueError, match="dtype"):
        T.TensorData(data=[1, 2], dtype="int32")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "np_dtype,expected",
    [
        (np.float16, "float32"),
        (np.float32, "float32"),
        (np.float64, "float32"),
        (np.int8, "int64"),
        (np.int16, "int64"),
        (np.int32, "int64"),
        (np.int64, "int64"),
        (np.dtype(">f8"), "float32"),
        (np.dtype(">i4"), "int64"),
    ],
)
def test_from_numpy_dtype_table(np_dtype, expected):
    arr = np.arange(6).astype(np_dtype).reshape(2, 3)
    td = T.TensorData.from_numpy(arr)
    assert td.dtype == expected
    assert td.shape == [2, 3]
    assert td.data_np.dtype == np.dtype(expected)
    assert td.data_np.dtype.isnative
    assert td.data == [0, 1, 2, 3, 4, 5]
    np.testing.assert_array_equal(td.to_numpy(), arr.astype(expected))


@pytest.mark.parametrize("np_dtype", [np.uint8, np.uint32, np.uint64, np.bool_, np.complex64])
def test_from_numpy_rejects_other_kinds(np_dtype):
    with pytest.raises(ValueError, match="Unsupported numpy dtype"):
        T.TensorData.from_numpy(np.zeros(3, dtype=np_dtype))


def test_float64_narrowed():
    with np.errstate(over="ignore"):
        td = T.TensorData.from_numpy(np.array([0.1, 1e40]))
    assert td.data_np.dtype == np.float32
    assert td.data[0] == pytest.approx(0.1, rel=1e-6)
    assert np.isinf(td.data[1])


def test_zero_copy_and_read_only_views():
    arr = np.arange(6, dtype=np.int64)
    td = T.TensorData.from_numpy(arr)
    assert np.shares_memory(td.data_np, arr)
    assert not td.data_np.flags.writeable
    assert not td.to_numpy().flags.writeable
    assert arr.flags.writeable, "the caller's array is untouched"
    with pytest.raises(ValueError):
        td.data_np[0] = 5


def test_non_writable_input_is_copied():
    arr = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not arr.flags.writeable
    td = T.TensorData.from_numpy(arr)
    assert not np.shares_memory(td.data_np, arr)
    assert td.data == [0.0, 1.0, 2.0, 3.0]


def test_non_contiguous_input():
    arr = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
    td = T.TensorData.from_numpy(arr)
    assert td.shape == [3, 2] and td.data == [0, 2, 4, 6, 8, 10]
    np.testing.assert_array_equal(td.to_numpy(), arr)


def test_shape_handling():
    td = T.TensorData(data=[1, 2, 3, 4, 5, 6], dtype="int64", shape=[2, 3])
    assert td.to_numpy().shape == (2, 3) and td.tolist() == [[1, 2, 3], [4, 5, 6]]
    plain = T.TensorData(data=[1.5, 2.5], dtype="float32")
    assert plain.shape is None and plain.to_numpy().shape == (2,)
    with pytest.raises(ValueError, match="does not match"):
        T.TensorData(data=[1, 2, 3], dtype="int64", shape=[2, 2])
    with pytest.raises(ValueError, match="negative"):
        T.TensorData(data=[], dtype="int64", shape=[-1])
    with pytest.raises(ValueError, match="rectangular"):
        T.TensorData(data=[[1, 2], [3]], dtype="int64")
    empty = T.TensorData(dtype="float32")
    assert empty.data == [] and empty.shape is None


def test_csr_roundtrip_and_validation():
    dense = np.array([[0, 0, 3, 0], [0, 0, 0, 0], [1, 0, 0, 2]], dtype=np.int64)
    td = T.TensorData(
        data=[3, 1, 2],
        dtype="int64",
        shape=[3, 4],
        sparse_crow_indices=[0, 1, 1, 3],
        sparse_col_indices=[2, 0, 3],
    )
    assert td.is_sparse
    assert td.crow_np.tolist() == [0, 1, 1, 3] and td.col_np.tolist() == [2, 0, 3]
    assert td.sparse_crow_indices == [0, 1, 1, 3]
    np.testing.assert_array_equal(td.to_numpy(), dense)
    padded = td.to_numpy(pad_value=-1)
    assert padded[1].tolist() == [-1, -1, -1, -1] and padded[0].tolist() == [-1, -1, 3, -1]
    assert td.tolist() == dense.tolist()

    with pytest.raises(ValueError, match="shape"):
        T.TensorData(data=[1], dtype="int64", sparse_crow_indices=[0, 1], sparse_col_indices=[0])
    with pytest.raises(ValueError, match="together"):
        T.TensorData(data=[1], dtype="int64", shape=[1, 1], sparse_crow_indices=[0, 1])
    with pytest.raises(ValueError, match="entries"):
        T.TensorData(
            data=[1],
            dtype="int64",
            shape=[2, 2],
            sparse_crow_indices=[0, 1],
            sparse_col_indices=[0],
        )
    with pytest.raises(ValueError, match="do not match"):
        T.TensorData(
            data=[1, 2],
            dtype="int64",
            shape=[1, 2],
            sparse_crow_indices=[0, 1],
            sparse_col_indices=[0],
        )
    with pytest.raises(ValueError, match="out of range"):
        T.TensorData(
            data=[1],
            dtype="int64",
            shape=[1, 2],
            sparse_crow_indices=[0, 1],
            sparse_col_indices=[5],
        )


@pytest.mark.parametrize("pad", [0, -1, 7])
def test_from_numpy_sparse_threshold(pad):
    rows, cols = 4, 10
    arr = np.full((rows, cols), pad, dtype=np.int64)
    # dense = 40 cells; CSR = 5 + 2*nnz; CSR iff 5 + 2*nnz < 40  <=>  nnz <= 17
    flat = arr.reshape(-1)
    flat[:17] = np.arange(100, 117)
    td = T.TensorData.from_numpy_sparse(arr, pad_value=pad)
    assert td.is_sparse and len(td.data) == 17
    np.testing.assert_array_equal(td.to_numpy(pad_value=pad), arr)
    flat[17] = 999
    td_dense = T.TensorData.from_numpy_sparse(arr, pad_value=pad)
    assert not td_dense.is_sparse and td_dense.shape == [rows, cols]
    np.testing.assert_array_equal(td_dense.to_numpy(), arr)


def test_from_numpy_sparse_one_d_and_floats():
    one_d = T.TensorData.from_numpy_sparse(np.zeros(100))
    assert not one_d.is_sparse and one_d.shape == [100]
    arr = np.zeros((10, 10), dtype=np.float64)
    arr[3, 4] = 0.5
    td = T.TensorData.from_numpy_sparse(arr)
    assert td.is_sparse and td.dtype == "float32" and td.data == [0.5]
    assert td.to_numpy()[3, 4] == 0.5


@pytest.mark.parametrize("bad", [0.0, 1.5, True, "0", None])
def test_pad_value_must_be_int(bad):
    td = T.TensorData(data=[1], dtype="int64")
    with pytest.raises(TypeError, match="pad_value"):
        td.to_numpy(pad_value=bad)
    with pytest.raises(TypeError, match="pad_value"):
        td.tolist(pad_value=bad)
    with pytest.raises(TypeError, match="pad_value"):
        T.TensorData.from_numpy_sparse(np.zeros((2, 2), dtype=np.int64), pad_value=bad)
    assert td.to_numpy(pad_value=np.int32(3)).tolist() == [1]


def test_tensor_equality_is_identity_and_pickle():
    a = T.TensorData(data=[1, 2], dtype="int64", shape=[2])
    b = T.TensorData(data=[1, 2], dtype="int64", shape=[2])
    assert a == a and a != b
    c = pickle.loads(pickle.dumps(a))
    assert c.data == [1, 2] and c.shape == [2] and c.dtype == "int64"
    sparse = T.TensorData.from_numpy_sparse(np.eye(8, dtype=np.int64))
    d = pickle.loads(pickle.dumps(sparse))
    assert d.is_sparse and d.tolist() == np.eye(8, dtype=np.int64).tolist()
    unshaped = T.TensorData(data=np.ones((2, 2), dtype=np.float32), dtype="float32")
    assert pickle.loads(pickle.dumps(unshaped)).to_numpy().shape == (2, 2)


def test_tensor_model_copy_and_repr():
    td = T.TensorData(data=list(range(20)), dtype="int64", shape=[4, 5])
    copy = td.model_copy(update={"shape": [5, 4]})
    assert copy.shape == [5, 4] and td.shape == [4, 5]
    assert copy.to_numpy().shape == (5, 4)
    assert "..." in repr(td) and "int64" in repr(td)


def test_torch_methods_need_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes ``import torch`` raise ImportError
    td = T.TensorData(data=[1], dtype="int64")
    with pytest.raises(ImportError):
        td.to_torch()
    with pytest.raises(ImportError):
        T.TensorData.from_torch_sparse(object())  # type: ignore[arg-type]
    # a Datum never needs torch for lists and numpy arrays
    T.Datum(model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={"weights": [1.0]})


# -- fake torch: exercises the torch code paths without installing torch ---------------------------


class _FakeDtype:
    def __init__(self, name: str, np_dtype, floating: bool) -> None:
        self.name = name
        self.np_dtype = np.dtype(np_dtype)
        self.is_floating_point = floating


class _FakeTorchModule:
    float32 = _FakeDtype("float32", np.float32, True)
    float64 = _FakeDtype("float64", np.float64, True)
    bfloat16 = _FakeDtype("bfloat16", np.float32, True)
    int64 = _FakeDtype("int64", np.int64, False)
    int32 = _FakeDtype("int32", np.int32, False)
    bool_ = _FakeDtype("bool", np.bool_, False)

    class Tensor:
        def __init__(self, arr, dtype) -> None:
            self._arr = np.asarray(arr, dtype=dtype.np_dtype)
            self.dtype = dtype
            self.device = type("Device", (), {"type": "cpu"})()

        @property
        def ndim(self) -> int:
            return self._arr.ndim

        def detach(self):
            return self

        def float(self):
            return _FakeTorchModule.Tensor(self._arr, _FakeTorchModule.float32)

        def cpu(self):
            return self

        def contiguous(self):
            return self

        def numpy(self):
            return self._arr

    @staticmethod
    def from_numpy(arr):
        return ("tensor", arr)


@pytest.fixture
def fake_torch(monkeypatch):
    fake = _FakeTorchModule()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_fake_torch_conversions(fake_torch):
    t = fake_torch.Tensor([[1.0, 2.0], [3.0, 4.0]], fake_torch.bfloat16)
    td = T.TensorData.from_torch(t)
    assert td.dtype == "float32" and td.shape == [2, 2]
    kind, arr = td.to_torch()
    assert kind == "tensor" and arr.tolist() == [[1.0, 2.0], [3.0, 4.0]]

    sparse_src = np.zeros((6, 6), dtype=np.int64)
    sparse_src[1, 2] = 9
    st = T.TensorData.from_torch_sparse(fake_torch.Tensor(sparse_src, fake_torch.int64))
    assert st.is_sparse and st.dtype == "int64" and st.data == [9]
    dense_bool = T.TensorData.from_torch_sparse(
        fake_torch.Tensor(np.ones((2, 2)), fake_torch.bool_)
    )
    assert dense_bool.dtype == "int64" and not dense_bool.is_sparse
    with pytest.raises(TypeError, match="pad_value"):
        T.TensorData.from_torch_sparse(fake_torch.Tensor([1], fake_torch.int64), pad_value=0.5)


def test_datum_coerces_torch_tensors_by_key(fake_torch):
    weights = np.zeros((4, 8), dtype=np.float32)
    weights[0, 0] = 1.0
    datum = T.Datum(
        model_input=T.ModelInput.from_ints([1]),
        loss_fn_inputs={
            "weights": fake_torch.Tensor(weights, fake_torch.float32),
            "advantages": fake_torch.Tensor(weights, fake_torch.float32),
        },
    )
    assert datum.loss_fn_inputs["weights"].is_sparse
    assert not datum.loss_fn_inputs["advantages"].is_sparse


# -- Datum --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,dtype",
    [
        ("target_tokens", "int64"),
        ("weights", "float32"),
        ("advantages", "float32"),
        ("logprobs", "float32"),
        ("clip_low_threshold", "float32"),
        ("clip_high_threshold", "float32"),
        ("sequence_ratio_mask", "float32"),
    ],
)
def test_datum_list_dtype_table(key, dtype):
    datum = T.Datum(model_input=T.ModelInput.from_ints([1, 2]), loss_fn_inputs={key: [1, 2]})
    td = datum.loss_fn_inputs[key]
    assert td.dtype == dtype and td.shape == [2] and td.data == [1, 2]
    nested = T.Datum(
        model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={key: [[1, 2], [3, 4]]}
    )
    assert nested.loss_fn_inputs[key].shape == [2, 2]


def test_datum_list_under_unknown_key():
    with pytest.raises(KeyError, match="mystery"):
        T.Datum(model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={"mystery": [1.0]})
    ok = T.Datum(
        model_input=T.ModelInput.from_ints([1]),
        loss_fn_inputs={"mystery": np.array([1.0])},
    )
    assert ok.loss_fn_inputs["mystery"].dtype == "float32"


def test_datum_ragged_and_bad_values():
    with pytest.raises(ValueError, match="weights"):
        T.Datum(
            model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={"weights": [[1.0], [1.0, 2.0]]}
        )
    with pytest.raises(ValueError, match="target_tokens"):
        T.Datum(
            model_input=T.ModelInput.from_ints([1]),
            loss_fn_inputs={"target_tokens": np.array([1], dtype=np.uint8)},
        )
    with pytest.raises(TypeError, match="weights"):
        T.Datum(model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={"weights": "abc"})
    with pytest.raises(TypeError, match="weights"):
        T.Datum(model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={"weights": ["a"]})


def test_datum_keeps_tensor_data_and_accepts_mapping():
    td = T.TensorData(data=[1], dtype="int64")
    datum = T.Datum(
        model_input=T.ModelInput.from_ints([1]),
        loss_fn_inputs={"target_tokens": td, "x": {"data": [1.0], "dtype": "float32"}},
    )
    assert datum.loss_fn_inputs["target_tokens"] is td
    assert datum.loss_fn_inputs["x"].dtype == "float32"
    assert T.Datum(model_input=T.ModelInput.from_ints([1])).loss_fn_inputs == {}


def test_provenance_spans():
    datum = T.Datum(
        model_input=T.ModelInput.from_ints([1, 2, 3, 4]),
        loss_fn_inputs={"target_tokens": [2, 3, 4, 5]},
    )
    prompt = T.PromptProvenanceSpan(sequence_id="s1", length=2)
    sampled = T.SampledProvenanceSpan(sequence_id="s2", offset=1, length=2)
    with_spans = datum.with_provenance(
        model_input=[prompt, sampled], loss_fn_inputs=[sampled, prompt]
    )
    assert with_spans.model_input_spans == [prompt, sampled]
    assert datum.model_input_spans is None
    with pytest.raises(ValueError, match="cover 3 positions"):
        datum.with_provenance(
            model_input=[T.PromptProvenanceSpan(sequence_id="a", length=3)],
            loss_fn_inputs=[prompt, sampled],
        )
    with pytest.raises(ValueError, match="loss_fn_inputs"):
        datum.with_provenance(model_input=[prompt, sampled], loss_fn_inputs=[prompt])
    with pytest.raises(ValueError, match="pair"):
        T.Datum(model_input=T.ModelInput.from_ints([1]), model_input_spans=[prompt])
    with pytest.raises(ValueError, match="length must be >= 0"):
        T.PromptProvenanceSpan(sequence_id="a", length=-1)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        T.SampledProvenanceSpan(sequence_id="a", offset=-1, length=1)
    with pytest.raises(ValueError, match="sequence_id"):
        T.SampledProvenanceSpan(sequence_id="", length=1)


def test_forward_backward_input_validation():
    good = T.Datum(model_input=T.ModelInput.from_ints([1]))
    fbi = T.ForwardBackwardInput(data=[good], loss_fn="cross_entropy")
    assert fbi.loss_fn_config is None
    with pytest.raises(ValueError, match="unknown loss"):
        T.ForwardBackwardInput(data=[good], loss_fn="bogus")  # type: ignore[arg-type]
    bad = T.Datum(
        model_input=T.ModelInput(chunks=[T.ImageAssetPointerChunk(format="png", location="x")])
    )
    with pytest.raises(ValueError, match="image_asset_pointer"):
        T.ForwardBackwardInput(data=[good, bad], loss_fn="cross_entropy")
    cfg = T.ForwardBackwardInput(
        data=[good], loss_fn="custom", loss_fn_config={"loss_id": "x", "b": 1}
    )
    assert cfg.loss_fn_config == {"loss_id": "x", "b": 1.0}


# -- results ------------------------------------------------------------------------------------------


def test_sampled_sequence_lazy_views():
    seq = T.SampledSequence(
        stop_reason="length",
        sequence_id="s:1",
        tokens_np=np.array([5, 6], dtype=np.int32),
        logprobs_np=np.array([-0.5, -1.0], dtype=np.float32),
    )
    assert seq.tokens == [5, 6] and seq.tokens is seq.tokens, "cached"
    assert seq.logprobs == [-0.5, -1.0]
    assert seq.topk_logprobs is None
    bare = T.SampledSequence(stop_reason="stop", sequence_id="x")
    assert bare.tokens == [] and bare.logprobs is None
    with pytest.raises(ValueError, match="stop_reason"):
        T.SampledSequence(stop_reason="eos", sequence_id="x")  # type: ignore[arg-type]
    from_lists = T.SampledSequence(stop_reason="stop", sequence_id="x", tokens=[1], logprobs=[-1.0])
    assert from_lists == T.SampledSequence(
        stop_reason="stop",
        sequence_id="x",
        tokens_np=np.array([1], dtype=np.int32),
        logprobs_np=np.array([-1.0], dtype=np.float32),
    )


def test_topk_sentinel_rows():
    ids = np.array([[0, 0], [7, 0], [3, 4]], dtype=np.int32)
    lps = np.array([[-99999.0, -99999.0], [-0.5, -99999.0], [-0.1, -0.2]], dtype=np.float32)
    topk = T.TopkLogprobs(token_ids=ids, logprobs=lps)
    rows = topk.to_lists()
    assert rows[0] is None
    assert rows[1] == [(7, -0.5)]
    assert [t for t, _ in rows[2]] == [3, 4]
    # a real token 0 with a real logprob is not the sentinel
    real_zero = T.TopkLogprobs(token_ids=[[0]], logprobs=[[-0.25]]).to_lists()
    assert real_zero == [[(0, -0.25)]]
    assert (
        T.TopkLogprobs(
            token_ids=np.zeros((0, 3), np.int32), logprobs=np.zeros((0, 3), np.float32)
        ).to_lists()
        == []
    )
    assert (
        T.TopkLogprobs(
            token_ids=np.zeros((2, 0), np.int32), logprobs=np.zeros((2, 0), np.float32)
        ).to_lists()
        == []
    )
    with pytest.raises(ValueError, match="same shape"):
        T.TopkLogprobs(token_ids=np.zeros((2, 2), np.int32), logprobs=np.zeros((2, 3), np.float32))
    back = T.TopkLogprobs.from_lists(rows)
    assert back.to_lists() == rows


def test_sample_response_nan_prompt_logprobs():
    resp = T.SampleResponse(
        sequences=[],
        prompt_logprobs_np=np.array([np.nan, -1.5, np.nan], dtype=np.float32),
        topk_prompt_logprobs_np=T.TopkLogprobs(
            token_ids=[[0], [4], [0]], logprobs=[[-99999.0], [-0.5], [-99999.0]]
        ),
    )
    assert resp.prompt_logprobs == [None, -1.5, None]
    assert resp.topk_prompt_logprobs == [None, [(4, -0.5)], None]
    assert resp.prompt_cache_hit_tokens == 0
    none = T.SampleResponse(sequences=[])
    assert none.prompt_logprobs is None and none.topk_prompt_logprobs is None
    listed = T.SampleResponse(sequences=[], prompt_logprobs=[None, -1.5, None])
    assert listed.prompt_logprobs == [None, -1.5, None]
    assert np.isnan(listed.prompt_logprobs_np[0])
    assert listed == resp.model_copy(update={"topk_prompt_logprobs_np": None})


def test_forward_backward_output_and_misc_results():
    out = T.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord",
        loss_fn_outputs=[{"logprobs": T.TensorData(data=[-1.0], dtype="float32")}],
    )
    assert out.metrics == {}
    assert T.OptimStepResponse().metrics is None
    info = T.GetInfoResponse(model_id="m", model_data=T.ModelData(model_name="Qwen"))
    assert info.optimizer_config == T.AdamOptimizerConfig()
    assert info.model_data.tokenizer_id is None
    assert (
        T.RequestFailedResponse(error="x", category="SERVER").category
        is RequestErrorCategory.Server
    )  # type: ignore[arg-type]
    assert T.RequestFailedResponse(error="x").category is RequestErrorCategory.Unknown
    assert (
        T.RequestFailedResponse(error="x", category="junk").category is RequestErrorCategory.Unknown
    )  # type: ignore[arg-type]
    assert T.RequestErrorCategory is RequestErrorCategory


def test_a_non_text_error_category_is_unknown_without_comparing_it_to_each_member():
    # numpy 1.x warns (FutureWarning) when an array is compared to each member's str value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        failed = T.RequestFailedResponse(error="x", category=np.array([1, 2]))  # type: ignore[arg-type]
    assert failed.category is RequestErrorCategory.Unknown


def test_client_config_defaults():
    cfg = T.ClientConfigResponse()
    assert cfg.sample_dispatch_bytes_semaphore_size == 10485760
    assert cfg.inflight_response_bytes_semaphore_size == 52428800
    assert cfg.parallel_fwdbwd_chunks is True and cfg.proto_compress_fwdbwd is False
    assert cfg.fwdbwd_max_chunk_len == 1024 and cfg.fwdbwd_max_chunk_bytes_count == 5000000
    assert cfg.fwdbwd_dispatch_bytes_semaphore_size == 50000000
    assert cfg.billing_exception_max_pause_duration_sec == 3600
    assert cfg.sample_max_concurrent_requests == 2000
    assert cfg.use_pyqwest_transport is True and cfg.sample_enable_stuck_detection is True
    assert not (
        cfg.pjwt_auth_enabled
        or cfg.sample_no_retries
        or cfg.sample_use_retrieve_futures
        or cfg.custom_loss_server_side
        or cfg.sample_join_sampling_session
    )
    assert cfg.credential_default_source == "api_key"
    dyn = T.ClientDynamicConfigResponse()
    assert (
        dyn.refresh_interval_sec,
        dyn.sample_cancel_enabled,
        dyn.sample_cancel_max_batch_size,
    ) == (300, False, 64)


def test_optim_step_request_aliases():
    adam = T.AdamParams()
    for kw in ("optim_params", "adam_params", "optimizer_params"):
        req = T.OptimStepRequest(model_id="m", **{kw: adam})
        assert req.optim_params is adam
    with pytest.raises(TypeError, match="exactly one"):
        T.OptimStepRequest(model_id="m")
    with pytest.raises(TypeError, match="exactly one"):
        T.OptimStepRequest(model_id="m", optim_params=adam, adam_params=adam)
    with pytest.raises(TypeError, match="optim_params"):
        T.OptimStepRequest(model_id="m", optim_params=T.LoraConfig(rank=1))  # type: ignore[arg-type]


# -- checkpoints and paths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,run,ctype,cid",
    [
        ("tinker://run-1/weights/step1", "run-1", "training", "weights/step1"),
        ("tinker://s:train:0/sampler_weights/x", "s:train:0", "sampler", "sampler_weights/x"),
        ("tinker://r/external_weights/final", "r", "external", "external_weights/final"),
    ],
)
def test_parse_tinker_path(path, run, ctype, cid):
    parsed = T.ParsedCheckpointTinkerPath.from_tinker_path(path)
    assert (
        parsed.tinker_path,
        parsed.training_run_id,
        parsed.checkpoint_type,
        parsed.checkpoint_id,
    ) == (
        path,
        run,
        ctype,
        cid,
    )


@pytest.mark.parametrize(
    "path",
    [
        "run/weights/x",
        "http://run/weights/x",
        "tinker://run/weights",
        "tinker://run/weights/x/y",
        "tinker://run/checkpoints/x",
        "tinker://run//x",
        "tinker:///weights/x",
        "",
    ],
)
def test_bad_tinker_paths(path):
    with pytest.raises(ValueError) as info:
        T.ParsedCheckpointTinkerPath.from_tinker_path(path)
    assert repr(path) in str(info.value)


def test_console_urls():
    resp = T.SaveWeightsResponse(path="tinker://run 1/weights/step1")
    assert resp.get_console_url() == (
        "https://tinker.thinkingmachines.ai/checkpoints/run%201/weights%2Fstep1"
    )
    sampler = T.SaveWeightsForSamplerResponse(path="tinker://r/sampler_weights/s")
    assert sampler.get_playground_url() == (
        "https://tinker.thinkingmachines.ai/playground?mode=checkpoint&checkpoint="
        "tinker%3A%2F%2Fr%2Fsampler_weights%2Fs"
    )
    eph = T.SaveWeightsForSamplerResponse(sampling_session_id="s:sample:1")
    with pytest.raises(ValueError, match="no path"):
        eph.get_console_url()
    ext = T.SaveWeightsExternalResponse(path="tinker://r/external_weights/e", size_bytes=10)
    assert ext.get_console_url().endswith("/r/external_weights%2Fe")
    assert "checkpoint=tinker" in ext.get_playground_url()


def test_datetimes_are_utc_aware():
    naive = dt.datetime(2024, 5, 1, 12, 0)
    ck = T.Checkpoint(
        checkpoint_id="weights/a",
        checkpoint_type="training",
        time=naive,
        tinker_path="tinker://r/weights/a",
    )
    assert ck.time.tzinfo is dt.timezone.utc and ck.time.hour == 12
    plus2 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    ck2 = ck.model_copy(update={"time": plus2, "expires_at": "2024-05-02T00:00:00Z"})
    assert ck2.time.hour == 10 and ck2.time.tzinfo is dt.timezone.utc
    assert ck2.expires_at == dt.datetime(2024, 5, 2, tzinfo=dt.timezone.utc)


# -- pydantic-style helpers ------------------------------------------------------------------------------


def test_model_dump_modes():
    chunk = T.ImageChunk(data=b"hi", format="png")
    assert chunk.model_dump() == {
        "data": b"hi",
        "format": "png",
        "expected_tokens": None,
        "type": "image",
    }
    assert chunk.model_dump(mode="json", exclude_none=True) == {
        "data": "aGk=",
        "format": "png",
        "type": "image",
    }
    assert (
        chunk.model_dump_json(exclude_none=True) == '{"data":"aGk=","format":"png","type":"image"}'
    )
    assert '\n  "data"' in chunk.model_dump_json(indent=2)
    with pytest.raises(ValueError):
        chunk.model_dump(mode="xml")  # type: ignore[arg-type]
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=dt.timezone.utc)
    run = T.Cursor(offset=0, limit=1, total_count=2)
    assert run.model_dump() == {"offset": 0, "limit": 1, "total_count": 2}
    ck = T.Checkpoint(
        checkpoint_id="weights/a",
        checkpoint_type="training",
        time=ts,
        tinker_path="tinker://r/weights/a",
    )
    assert ck.model_dump()["time"] is ts
    assert ck.model_dump(mode="json")["time"] == "2024-01-02T03:04:05.600000Z"
    cat = T.RequestFailedResponse(error="e", category=RequestErrorCategory.User)
    assert cat.model_dump()["category"] is RequestErrorCategory.User
    assert cat.model_dump(mode="json")["category"] == "user"


def test_model_validate_and_copy():
    params = T.SamplingParams.model_validate({"max_tokens": 5, "stop": ["x"]})
    assert params == T.SamplingParams(max_tokens=5, stop=["x"])
    assert T.SamplingParams.model_validate(params) is params
    changed = params.model_copy(update={"temperature": 0.5})
    assert changed.temperature == 0.5 and params.temperature == 1.0
    with pytest.raises(ValueError, match="SamplingParams.top_k"):
        params.model_copy(update={"top_k": 1.5})
    deep = T.ModelInput.from_ints([1, 2]).model_copy(deep=True)
    assert deep.to_ints() == [1, 2]
    assert T.SamplingParams.model_validate({"max_tokens": "5"}).max_tokens == 5  # as pydantic
    with pytest.raises(ValueError, match="max_tokens") as info:
        T.SamplingParams.model_validate({"max_tokens": "five"})
    assert info.value.errors()[0]["loc"] == ("max_tokens",)


def test_model_validate_takes_nested_instances():
    chunk = T.EncodedTextChunk(tokens=[1, 2])
    mi = T.ModelInput.model_validate({"chunks": [chunk, {"type": "encoded_text", "tokens": [3]}]})
    assert mi.chunks[0] is chunk and mi.to_ints() == [1, 2, 3]
    req = T.SampleRequest.model_validate(
        {"prompt": mi, "sampling_params": T.SamplingParams(max_tokens=4), "num_samples": 2.0}
    )
    assert req.prompt is mi and req.num_samples == 2
    datum = T.Datum.model_validate(
        {
            "model_input": mi,
            "loss_fn_inputs": {"target_tokens": T.TensorData.from_numpy(np.arange(3))},
        }
    )
    assert datum.model_input is mi
    with pytest.raises(ValueError) as info:
        T.ModelInput.model_validate({"chunks": [chunk, {"type": "encoded_text", "tokens": [0.5]}]})
    assert info.value.errors()[0]["loc"] == ("chunks", 1, "tokens", 0)


def test_nested_mapping_construction():
    req = T.SampleRequest(
        prompt={"chunks": [{"type": "encoded_text", "tokens": [1]}]},  # type: ignore[arg-type]
        sampling_params={"max_tokens": 4},  # type: ignore[arg-type]
    )
    assert req.prompt.to_ints() == [1] and req.sampling_params.max_tokens == 4
    assert req.prompt_logprobs is False and req.record_stability_info is False
    resp = T.GetInfoResponse(model_id="m", model_data={"model_name": "x", "future": 1})  # type: ignore[arg-type]
    assert resp.model_data.model_name == "x"
    with pytest.raises(TypeError):
        T.CreateModelRequest(
            session_id="s", model_seq_id=0, base_model="b", lora_config={"rank": 1, "junk": True}
        )  # type: ignore[arg-type]


def test_finish_and_ttl_requests():
    fin = T.FinishSessionRequest(reason="errored", detail="boom")
    assert fin.reason == T.SessionFinishReason(type="errored")
    with pytest.raises(ValueError):
        T.FinishSessionRequest(reason="bad")
    assert T.SetCheckpointTTLRequest().ttl_seconds is None


def test_import_does_not_load_torch_or_cattrs():
    code = (
        "import sys, tinker_sync.types as t; "
        "t.Datum(model_input=t.ModelInput.from_ints([1]), loss_fn_inputs={'weights': [1.0]}); "
        "print('torch' in sys.modules, 'cattrs' in sys.modules, 'tinker_sync.types._rest' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_lazy_exports_resolve():
    for name in T.__all__:
        assert getattr(T, name) is not None, name
    assert T.TelemetryBatch is T.TelemetrySendRequest
    assert T.TelemetryRequest is T.TelemetrySendRequest
    assert "SampleRequest" in dir(T)
    with pytest.raises(AttributeError):
        _ = T.NoSuchType  # type: ignore[attr-defined]


def test_pickle_and_copy_of_results():
    seq = T.SampledSequence(
        stop_reason="stop", sequence_id="", tokens=[1, 2], logprobs=[-1.0, -2.0]
    )
    resp = T.SampleResponse(sequences=[seq], prompt_logprobs=[None, -1.0])
    assert resp.prompt_logprobs == [None, -1.0]  # populate the cache before pickling
    again = pickle.loads(pickle.dumps(resp))
    assert again == resp and again.prompt_logprobs == [None, -1.0]
    assert again.sequences[0].tokens == [1, 2]
    stamped = seq.model_copy(update={"sequence_id": "s:sample:0:0"})
    assert stamped.sequence_id == "s:sample:0:0" and stamped.tokens == [1, 2]
    assert seq.sequence_id == ""
    datum = T.Datum(
        model_input=T.ModelInput.from_ints(np.arange(3)), loss_fn_inputs={"weights": [1, 2, 3]}
    )
    back = pickle.loads(pickle.dumps(datum))
    assert back.loss_fn_inputs["weights"].data == [1.0, 2.0, 3.0]
    assert back.model_input.to_ints() == [0, 1, 2]
    req = T.OptimStepRequest(model_id="m", adam_params=T.AdamParams())
    assert pickle.loads(pickle.dumps(req)) == req
    assert req.model_copy(update={"seq_id": 3}).seq_id == 3


# -- constructors copy the caller's containers; the official dataclass types are dataclasses ----

_DATACLASS_TYPES = [
    "Datum",
    "ForwardBackwardInput",
    "ForwardBackwardOutput",
    "ForwardBackwardRequest",
    "ForwardRequest",
    "PromptAltTokens",
    "PromptProvenanceSpan",
    "SampleResponse",
    "SampledProvenanceSpan",
    "SampledSequence",
    "TensorData",
]


@pytest.mark.parametrize("name", _DATACLASS_TYPES)
def test_official_dataclass_types_are_frozen_stdlib_dataclasses(name: str) -> None:
    import dataclasses

    cls = getattr(T, name)
    assert dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def _tokens_list() -> list[int]:
    return [5, 6, 7]


def _span_list() -> list[Any]:
    return [T.PromptProvenanceSpan(sequence_id="s", length=3)]


def _datum(tokens: list[int] | None = None) -> Any:
    return T.Datum(
        model_input=T.ModelInput.from_ints(tokens or [1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4]},
    )


# (build(container) -> object, read(object) -> what must not change); each builder gets a fresh
# container, the test clears it afterwards, and the object must be unchanged.
_COPY_CASES: dict[str, tuple[Any, Any, Any]] = {
    "ModelInput.from_ints": (_tokens_list, T.ModelInput.from_ints, lambda o: o.to_ints()),
    "EncodedTextChunk.tokens": (
        _tokens_list,
        lambda c: T.EncodedTextChunk(tokens=c),
        lambda o: list(o.tokens),
    ),
    "ModelInput.chunks": (
        lambda: [T.EncodedTextChunk(tokens=[1])],
        lambda c: T.ModelInput(chunks=c),
        lambda o: o.to_ints(),
    ),
    "Datum.loss_fn_inputs": (
        lambda: {"target_tokens": [2, 3, 4]},
        lambda c: T.Datum(model_input=T.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs=c),
        lambda o: sorted(o.loss_fn_inputs),
    ),
    "Datum.spans": (
        _span_list,
        lambda c: T.Datum(
            model_input=T.ModelInput.from_ints([1, 2, 3]),
            model_input_spans=c,
            loss_fn_input_spans=list(c),
        ),
        lambda o: len(o.model_input_spans),
    ),
    "ForwardBackwardInput.data": (
        lambda: [_datum()],
        lambda c: T.ForwardBackwardInput(data=c, loss_fn="cross_entropy"),
        lambda o: len(o.data),
    ),
    "ForwardBackwardInput.loss_fn_config": (
        lambda: {"clip": 0.2},
        lambda c: T.ForwardBackwardInput(data=[], loss_fn="ppo", loss_fn_config=c),
        lambda o: dict(o.loss_fn_config),
    ),
    "ForwardBackwardOutput.loss_fn_outputs": (
        lambda: [{"logprobs": T.TensorData(data=[0.5], dtype="float32")}],
        lambda c: T.ForwardBackwardOutput(loss_fn_output_type="x", loss_fn_outputs=c),
        lambda o: len(o.loss_fn_outputs),
    ),
    "ForwardBackwardOutput.metrics": (
        lambda: {"loss:sum": 1.0},
        lambda c: T.ForwardBackwardOutput(loss_fn_output_type="x", loss_fn_outputs=[], metrics=c),
        lambda o: dict(o.metrics),
    ),
    "SampleResponse.sequences": (
        lambda: [T.SampledSequence(stop_reason="stop", tokens=[1])],
        lambda c: T.SampleResponse(sequences=c),
        lambda o: len(o.sequences),
    ),
    "SampledSequence.tokens": (
        _tokens_list,
        lambda c: T.SampledSequence(stop_reason="stop", tokens=c),
        lambda o: o.tokens,
    ),
    "TensorData.data+shape": (
        lambda: [1, 2, 3],
        lambda c: T.TensorData(data=c, dtype="int64", shape=[3]),
        lambda o: (o.data, o.shape),
    ),
    "SamplingParams.stop": (
        lambda: ["\n"],
        lambda c: T.SamplingParams(stop=c),
        lambda o: o.stop,
    ),
}


@pytest.mark.parametrize("case", sorted(_COPY_CASES))
def test_constructors_copy_the_callers_containers(case: str) -> None:
    make, build, read = _COPY_CASES[case]
    container = make()
    obj = build(container)
    before = read(obj)
    container.clear()
    assert read(obj) == before


def test_cookbook_pattern_build_from_list_then_clear_keeps_the_datum() -> None:
    # tinker-cookbook builds a ModelInput from its token buffer, then clears the buffer.
    buffer = [1, 2, 3, 4]
    mi = T.ModelInput.from_ints(buffer)
    chunk = T.EncodedTextChunk(tokens=buffer)
    buffer.clear()
    assert mi.length == 4 and mi.to_ints() == [1, 2, 3, 4]
    assert list(chunk.tokens) == [1, 2, 3, 4]


def test_dataclasses_replace_and_fields_work() -> None:
    import dataclasses

    span = T.PromptProvenanceSpan(sequence_id="s", offset=1, length=4)
    shorter = dataclasses.replace(span, offset=2, length=3)
    assert (shorter.offset, shorter.length, shorter.sequence_id) == (2, 3, "s")
    with pytest.raises(ValueError, match="length"):
        dataclasses.replace(span, length=-1)  # replace runs the same checks
    datum = _datum()
    weighted = dataclasses.replace(datum, loss_fn_inputs={"weights": [1.0, 0.0, 1.0]})
    assert weighted.model_input is datum.model_input
    assert weighted.loss_fn_inputs["weights"].dtype == "float32"
    assert [f.name for f in dataclasses.fields(T.Datum)] == [
        "model_input",
        "loss_fn_inputs",
        "model_input_spans",
        "loss_fn_input_spans",
    ]
    td = T.TensorData.from_numpy(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert [f.name for f in dataclasses.fields(td) if not f.name.startswith("_")] == [
        "dtype",
        "shape",
        "sparse_crow_indices",
        "sparse_col_indices",
    ]
    flat = dataclasses.replace(td, shape=[6])
    assert flat.to_numpy().tolist() == [0, 1, 2, 3, 4, 5]
    seq = T.SampledSequence(stop_reason="stop", sequence_id="a", tokens=[1, 2])
    assert dataclasses.replace(seq, sequence_id="b").tokens == [1, 2]
    with pytest.raises(dataclasses.FrozenInstanceError):
        datum.model_input = datum.model_input  # type: ignore[misc]


def test_official_positional_construction_of_dataclass_types() -> None:
    datum = T.Datum(T.ModelInput.from_ints([1]), {"target_tokens": [1]})
    fbi = T.ForwardBackwardInput([datum], "cross_entropy")
    req = T.ForwardBackwardRequest(fbi, "model-1", 3)
    assert req.forward_backward_input is fbi and req.seq_id == 3
    alt = T.PromptAltTokens(
        T.TensorData(data=[1], dtype="int64"), T.TensorData(data=[0.5], dtype="float32")
    )
    assert alt == T.PromptAltTokens(
        T.TensorData(data=[1], dtype="int64"), T.TensorData(data=[0.5], dtype="float32")
    )
    seq = T.SampledSequence("length", "seq-1", np.array([4, 5], dtype=np.int32))
    assert seq.tokens == [4, 5] and seq.stop_reason == "length"
    resp = T.SampleResponse([seq], None, None, None, 7)
    assert resp.prompt_cache_hit_tokens == 7


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(lambda: _datum(), id="Datum"),
        pytest.param(lambda: T.PromptProvenanceSpan(sequence_id="s", length=1), id="span"),
        pytest.param(
            lambda: T.SampleResponse(
                sequences=[T.SampledSequence(stop_reason="stop", tokens=[1], logprobs=[-0.5])],
                prompt_logprobs=[None, -1.0],
            ),
            id="SampleResponse",
        ),
        pytest.param(lambda: T.ForwardBackwardInput(data=[_datum()], loss_fn="ppo"), id="fbi"),
    ],
)
def test_dataclass_types_pickle_round_trip(obj: Any) -> None:
    import pickle

    value = obj()
    again = pickle.loads(pickle.dumps(value))
    assert type(again) is type(value)
    assert again.model_dump(mode="json") == value.model_dump(mode="json")


def _dataclass_instances() -> dict[str, Any]:
    mi = T.ModelInput.from_ints([1, 2, 3])
    td = T.TensorData(data=[1, 2, 3], dtype="int64", shape=[3])
    span = T.SampledProvenanceSpan(sequence_id="s", length=3)
    datum = T.Datum(model_input=mi, loss_fn_inputs={"target_tokens": td})
    fbi = T.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy")
    seq = T.SampledSequence(
        stop_reason="stop", sequence_id="a", tokens=[1, 2], logprobs=[-0.5, -0.25]
    )
    return {
        "TensorData": td,
        "Datum": datum.with_provenance([span], [span]),
        "ForwardBackwardInput": fbi,
        "ForwardBackwardOutput": T.ForwardBackwardOutput(
            loss_fn_output_type="x", loss_fn_outputs=[{"logprobs": td}], metrics={"loss:sum": 1.0}
        ),
        "ForwardBackwardRequest": T.ForwardBackwardRequest(
            forward_backward_input=fbi, model_id="m"
        ),
        "ForwardRequest": T.ForwardRequest(forward_input=fbi, model_id="m"),
        "PromptAltTokens": T.PromptAltTokens(tokens=td, logprobs=td),
        "PromptProvenanceSpan": T.PromptProvenanceSpan(sequence_id="p", offset=1, length=2),
        "SampledProvenanceSpan": span,
        "SampledSequence": seq,
        "SampleResponse": T.SampleResponse(sequences=[seq], prompt_logprobs=[None, -1.0]),
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, T.TensorData):  # equality is identity, as in the official SDK
        return a.model_dump() == b.model_dump()
    return bool(a == b)


@pytest.mark.parametrize("name", [n for n in T.__all__ if dataclasses.is_dataclass(getattr(T, n))])
def test_dataclasses_replace_and_model_copy_work_on_every_dataclass_type(name):
    obj = _dataclass_instances()[name]  # a new dataclass type needs an instance here
    assert type(obj) is getattr(T, name)
    assert _same(dataclasses.replace(obj), obj)
    assert _same(obj.model_copy(), obj)
    for f in dataclasses.fields(obj):
        if f.init:
            value = getattr(obj, f.name)
            assert _same(dataclasses.replace(obj, **{f.name: value}), obj), f.name
            assert _same(obj.model_copy(update={f.name: value}), obj), f.name


def test_replace_on_a_sampled_sequence_takes_the_list_forms():
    seq = _dataclass_instances()["SampledSequence"]
    for kwargs in ({"tokens": [7]}, {"_tokens_list": [7]}):
        new = dataclasses.replace(seq, **kwargs)
        assert new.tokens == [7] and new.tokens_np.tolist() == [7] and new.logprobs == seq.logprobs
    assert dataclasses.replace(seq, logprobs=[-1.0, -2.0]).logprobs == [-1.0, -2.0]
    assert seq.model_copy(update={"tokens": [9]}).tokens == [9]
    resp = _dataclass_instances()["SampleResponse"]
    assert dataclasses.replace(resp, prompt_logprobs=[None, -3.0]).prompt_logprobs == [None, -3.0]


def test_validation_errors_pickle_even_with_an_unpicklable_input():
    with pytest.raises(ValueError) as info:
        T.ModelInput(chunks=(x for x in [5]))  # a generator: iterated, then rejected per item
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value) and again.errors()[0]["loc"] == ("chunks", 0)
    with pytest.raises(ValueError) as info:
        T.LoraConfig(rank=threading.Lock())  # type: ignore[arg-type]
    again = pickle.loads(pickle.dumps(info.value))
    assert again.errors()[0]["input"] == repr(info.value.errors()[0]["input"])


def test_decimals_coerce_like_numbers_though_decimal_loads_only_with_the_callers_data():
    """A ``Decimal`` is an int when integral and a bool when 0 or 1 (pydantic's lax rules);
    ``_coerce`` recognises it without importing ``decimal`` itself (docs/scale-out.md#start-up).
    """
    from decimal import Decimal

    from tinker_sync.types._coerce import Invalid, to_bool, to_int

    assert T.SamplingParams(max_tokens=Decimal("5")).max_tokens == 5
    assert type(to_int(Decimal("7"))) is int
    with pytest.raises(Invalid):
        to_int(Decimal("5.5"))
    with pytest.raises(Invalid):
        to_int(Decimal("NaN"))
    assert to_bool(Decimal("1")) is True and to_bool(Decimal("0")) is False
    with pytest.raises(Invalid):
        to_bool(Decimal("Infinity"))
    assert to_bool(1.0) is True


def test_types_that_load_on_first_use_keep_their_old_module_paths():
    """The training parameters and the results of non-sampling operations load on first use
    (docs/scale-out.md#start-up); the module paths they had still name the same classes, so
    imports and pickles that use them keep working."""
    from tinker_sync.types import _params, _results

    for module, name in [
        (_params, "AdamParams"),
        (_params, "LoraConfig"),
        (_params, "OptimizerConfig"),
        (_results, "OptimStepResponse"),
        (_results, "GetServerCapabilitiesResponse"),
        (_results, "checkpoint_console_url"),
    ]:
        assert getattr(module, name) is getattr(T, name, None) or name.startswith("checkpoint")
    assert _results.checkpoint_console_url is not None
    with pytest.raises(AttributeError):
        _results.NoSuchName  # noqa: B018
    assert not hasattr(_params, "__path__")  # a plain module, as `from ... import` checks
    value = T.OptimStepResponse(metrics={"loss": 1.0})
    # a pickle written when the class lived in _results (protocol 2 names it in plain text)
    new = pickle.dumps(value, protocol=2)
    old = new.replace(b"tinker_sync.types._opresults\n", b"tinker_sync.types._results\n")
    assert old != new and pickle.loads(old) == value
    assert T.SaveWeightsForSamplerResponseInternal is T.SaveWeightsForSamplerResponse
