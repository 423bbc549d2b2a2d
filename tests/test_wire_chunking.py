"""Chunk boundaries and byte estimates of forward_backward data
(docs/design/behavior.md#fwdbwd-chunking, docs/design/behavior.md#dispatch-gates)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinker_sync._wire._chunking import (
    DEFAULT_MAX_CHUNK_BYTES,
    DEFAULT_MAX_CHUNK_LEN,
    chunk_plan,
    chunk_ranges,
    chunk_ranges_from_sizes,
    estimate_datum_bytes,
)
from tinker_sync.types import (
    Datum,
    DmelChunk,
    EncodedTextChunk,
    ImageAssetPointerChunk,
    ImageChunk,
    ModelInput,
    TensorData,
)

# A TensorContainer header: dtype byte 0, ndim 1, dim 0 = 5 (length 5 tokens), 3 payload bytes.
_DMEL = bytes([0, 1, 5, 9, 9, 9])


def _text_datum(tokens: int, extra_float32: int = 0) -> Datum:
    inputs: dict[str, TensorData] = {}
    if extra_float32:
        inputs["weights"] = TensorData(data=np.ones(extra_float32, np.float32), dtype="float32")
    return Datum(model_input=ModelInput.from_ints(list(range(tokens))), loss_fn_inputs=inputs)


# ------------------------------------------------------------------ estimates


def test_estimate_counts_every_chunk_kind_and_tensor() -> None:
    datum = Datum(
        model_input=ModelInput(
            chunks=[
                EncodedTextChunk(tokens=[1, 2, 3]),
                ImageChunk(data=b"12345", format="png", expected_tokens=2),
                DmelChunk(dmel=_DMEL),
            ]
        ),
        loss_fn_inputs={
            "target_tokens": TensorData(data=[1, 2, 3], dtype="int64"),
            "weights": TensorData(data=[0.5, 1.0], dtype="float32"),
        },
    )
    assert estimate_datum_bytes(datum) == 3 * 4 + 5 + len(_DMEL) + 3 * 8 + 2 * 4


def test_estimate_of_csr_counts_values_and_eight_bytes_per_index() -> None:
    sparse = TensorData(
        data=[1.0, 2.0],
        dtype="float32",
        shape=[3, 4],
        sparse_crow_indices=[0, 1, 1, 2],
        sparse_col_indices=[0, 3],
    )
    datum = Datum(model_input=ModelInput.from_ints([7]), loss_fn_inputs={"weights": sparse})
    assert estimate_datum_bytes(datum) == 4 + 2 * 4 + 8 * 4 + 8 * 2


def test_estimate_of_numpy_tokens() -> None:
    tokens = np.arange(100, dtype=np.int64)
    datum = Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs={})
    assert estimate_datum_bytes(datum) == 400


def test_asset_pointer_estimate_is_location_length() -> None:
    pointer = ImageAssetPointerChunk(format="jpeg", location="s3://bucket/x.jpg", expected_tokens=3)
    datum = Datum(model_input=ModelInput(chunks=[pointer]), loss_fn_inputs={})
    assert estimate_datum_bytes(datum) == len("s3://bucket/x.jpg")


# ------------------------------------------------------------------ boundaries


def test_defaults_match_server_config_defaults() -> None:
    assert (DEFAULT_MAX_CHUNK_LEN, DEFAULT_MAX_CHUNK_BYTES) == (1024, 5_000_000)


def test_1024_datums_fit_one_chunk_and_1025_need_two() -> None:
    data = [_text_datum(1)] * 1025
    assert chunk_ranges(data[:1024]) == [(0, 1024)]
    assert chunk_ranges(data) == [(0, 1024), (1024, 1025)]


def test_exactly_max_bytes_fits_and_one_more_byte_splits() -> None:
    # 2 datums of 2,500,000 bytes each: exactly 5,000,000 in one chunk.
    assert chunk_ranges_from_sizes([2_500_000, 2_500_000]) == [(0, 2)]
    assert chunk_ranges_from_sizes([2_500_000, 2_500_001]) == [(0, 1), (1, 2)]
    # Through real datums: 625,000 tokens x 4 bytes = 2,500,000 bytes.
    half = _text_datum(0, extra_float32=625_000)
    assert estimate_datum_bytes(half) == 2_500_000
    one_more = Datum(
        model_input=ModelInput.from_ints([1]),
        loss_fn_inputs={"weights": TensorData(data=np.ones(624_999, np.float32), dtype="float32")},
    )
    assert estimate_datum_bytes(one_more) == 2_500_000
    assert chunk_ranges([half, one_more]) == [(0, 2)]
    bigger = _text_datum(1, extra_float32=625_000)
    assert chunk_ranges([half, bigger]) == [(0, 1), (1, 2)]


def test_chunk_plan_reports_estimated_bytes_per_chunk() -> None:
    data = [_text_datum(10), _text_datum(20), _text_datum(5)]
    assert chunk_plan(data, max_len=2) == [(0, 2, 120), (2, 3, 20)]
    assert chunk_plan(data, max_bytes=100) == [(0, 1, 40), (1, 3, 100)]
    assert chunk_plan([]) == []


def test_oversized_datum_goes_alone() -> None:
    sizes = [10, 6_000_000, 10, 10]
    assert chunk_ranges_from_sizes(sizes) == [(0, 1), (1, 2), (2, 4)]
    assert chunk_ranges_from_sizes([6_000_000]) == [(0, 1)]


def test_empty_data_gives_no_chunks() -> None:
    assert chunk_ranges([]) == []


def test_custom_limits_and_invalid_max_len() -> None:
    assert chunk_ranges_from_sizes([1, 1, 1], max_len=2) == [(0, 2), (2, 3)]
    assert chunk_ranges_from_sizes([3, 3, 3], max_bytes=6) == [(0, 2), (2, 3)]
    assert chunk_ranges_from_sizes([0, 0, 0], max_bytes=0) == [(0, 3)]
    with pytest.raises(ValueError):
        chunk_ranges_from_sizes([1], max_len=0)


def _reference(sizes: list[int], max_len: int, max_bytes: int) -> list[tuple[int, int]]:
    """An independent greedy formulation: extend while the next datum still fits."""
    ranges = []
    i = 0
    while i < len(sizes):
        j = i + 1
        total = sizes[i]
        while j < len(sizes) and j - i < max_len and total + sizes[j] <= max_bytes:
            total += sizes[j]
            j += 1
        ranges.append((i, j))
        i = j
    return ranges


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=3_000), max_size=60),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=0, max_value=5_000),
)
def test_ranges_match_greedy_reference(sizes: list[int], max_len: int, max_bytes: int) -> None:
    ranges = chunk_ranges_from_sizes(sizes, max_len, max_bytes)
    assert ranges == _reference(sizes, max_len, max_bytes)
    flat = [i for a, b in ranges for i in range(a, b)]
    assert flat == list(range(len(sizes)))
    for a, b in ranges:
        assert b - a <= max_len
        assert b - a == 1 or sum(sizes[a:b]) <= max_bytes
