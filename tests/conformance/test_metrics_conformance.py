"""Metric reduction against the official 0.38 reducer
(docs/design/behavior.md#combine-chunk-results, docs/design/behavior.md#metric-reduction).

Golden fixtures carry hand-computed expectations; each is also run through the official
``combine_fwd_bwd_output_results`` so that ours and theirs must agree value for value and type
for type.
"""

from __future__ import annotations

from typing import Any

import pytest
from _oracle import require
from hypothesis import given, settings
from hypothesis import strategies as st

from tinker_sync._wire._metrics import combine_forward_backward_outputs, reduce_metrics
from tinker_sync.types import ForwardBackwardOutput, TensorData

tinker = require("tinker")
official_helpers = require("tinker.lib.chunked_fwdbwd_helpers")

Chunks = list[tuple[dict[str, float], int]]


def _official(chunks: Chunks, kind: str = "ArrayRecord") -> Any:
    outputs = [
        tinker.types.ForwardBackwardOutput(
            loss_fn_output_type=kind,
            loss_fn_outputs=[
                {"logprobs": tinker.types.TensorData(data=[float(i)], dtype="float32")}
                for i in range(weight)
            ],
            metrics=dict(metrics),
        )
        for metrics, weight in chunks
    ]
    return official_helpers.combine_fwd_bwd_output_results(outputs)


def _ours(chunks: Chunks, kind: str = "ArrayRecord") -> ForwardBackwardOutput:
    return combine_forward_backward_outputs(
        [
            ForwardBackwardOutput(
                loss_fn_output_type=kind,
                loss_fn_outputs=[
                    {"logprobs": TensorData(data=[float(i)], dtype="float32")}
                    for i in range(weight)
                ],
                metrics=dict(metrics),
            )
            for metrics, weight in chunks
        ]
    )


def _typed(metrics: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    return {k: (type(v), v) for k, v in metrics.items()}


GOLDEN: list[tuple[str, Chunks, dict[str, Any]]] = [
    (
        "mean_unequal_weights",
        [({"loss:mean": 1.0}, 1), ({"loss:mean": 4.0}, 2)],
        {"loss:mean": 3.0},
    ),
    (
        "slack_unequal_weights",
        [({"t:slack": 2.0}, 3), ({"t:slack": 6.0}, 1)],
        {"t:slack": 6.0 - 3.0},
    ),
    ("sum", [({"n:sum": 1.5}, 5), ({"n:sum": 2.5}, 1)], {"n:sum": 4.0}),
    ("min", [({"n:min": 1.5}, 5), ({"n:min": -2.5}, 1)], {"n:min": -2.5}),
    ("max", [({"n:max": 1.5}, 5), ({"n:max": -2.5}, 1)], {"n:max": 1.5}),
    (
        "hash2_wrap",
        [({"h:hash2": float(2**63)}, 1), ({"h:hash2": float(2**63)}, 1), ({"h:hash2": 3.7}, 1)],
        {"h:hash2": 3},
    ),
    ("hash2_negative", [({"h:hash2": -1.0}, 1), ({"h:hash2": 2.0}, 1)], {"h:hash2": 1}),
    (
        "hash2_exact_beyond_float",
        [({"h:hash2": float(2**62)}, 1), ({"h:hash2": 1.0}, 1)],
        {"h:hash2": 2**62 + 1},
    ),
    (
        "unique_names",
        [({"seed:unique": 1.0}, 1), ({"seed:unique": 2.0}, 1), ({"seed:unique": 1.0}, 1)],
        {"seed:unique": 1.0, "seed:unique_1": 2.0, "seed:unique_2": 1.0},
    ),
    (
        "missing_and_unknown_dropped",
        [({"a:sum": 1.0, "b:sum": 1.0, "c:median": 1.0}, 1), ({"a:sum": 2.0, "d:sum": 5.0}, 1)],
        {"a:sum": 3.0},
    ),
    (
        "single_chunk_still_reduced",
        [({"loss:sum": 2.0, "x:p50": 1.0, "seed:unique": 9.0}, 4)],
        {"loss:sum": 2.0, "seed:unique": 9.0},
    ),
    (
        "moe_metrics",
        [
            ({"e_frac_with_tokens:mean": 0.5, "e_max_violation:max": 2.0}, 2),
            ({"e_frac_with_tokens:mean": 1.0, "e_max_violation:max": 1.0}, 6),
        ],
        {"e_frac_with_tokens:mean": 0.875, "e_max_violation:max": 2.0},
    ),
    ("no_metrics", [({}, 1), ({"a:sum": 1.0}, 1)], {}),
]


@pytest.mark.parametrize(("name", "chunks", "expected"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_fixture(name: str, chunks: Chunks, expected: dict[str, Any]) -> None:
    official = _official(chunks)
    assert _typed(official.metrics) == _typed(expected), "fixture disagrees with official SDK"
    assert _typed(reduce_metrics(chunks)) == _typed(expected)
    # Through ForwardBackwardOutput: hash2 must stay an int, exactly like the official SDK.
    assert _typed(_ours(chunks).metrics) == _typed(expected)


def test_output_type_and_concatenation_match_official() -> None:
    chunks: Chunks = [({"loss:sum": 1.0}, 2), ({"loss:sum": 1.0}, 3)]
    official = _official(chunks, "pkg:Rec")
    ours = _ours(chunks, "pkg:Rec")
    assert ours.loss_fn_output_type == official.loss_fn_output_type == "pkg:Rec"
    assert [d["logprobs"].data for d in ours.loss_fn_outputs] == [
        d["logprobs"].data for d in official.loss_fn_outputs
    ]


@pytest.mark.parametrize("key", ["loss", "a:b:mean"])
def test_bad_keys_raise_value_error_like_official(key: str) -> None:
    chunks: Chunks = [({key: 1.0}, 1)]
    with pytest.raises(ValueError):
        _official(chunks)
    with pytest.raises(ValueError):
        reduce_metrics(chunks)


def test_zero_weight_mean_fails_in_both() -> None:
    chunks: Chunks = [({"loss:mean": 1.0}, 0)]
    with pytest.raises(ZeroDivisionError):
        _official(chunks)
    with pytest.raises(ValueError):  # ours names the metric instead of dividing by zero
        reduce_metrics(chunks)


_suffixes = st.sampled_from(["mean", "sum", "min", "max", "slack", "hash2", "unique", "p99"])
_metric_values = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), _suffixes), min_size=0, max_size=5),
    st.lists(
        st.tuples(st.lists(_metric_values, min_size=5, max_size=5), st.integers(1, 9)),
        min_size=1,
        max_size=5,
    ),
    st.lists(st.booleans(), min_size=25, max_size=25),
)
def test_random_metrics_match_official(
    keys: list[tuple[str, str]],
    rows: list[tuple[list[float], int]],
    present: list[bool],
) -> None:
    names = list(dict.fromkeys(f"{n}:{s}" for n, s in keys))
    chunks: Chunks = []
    for c, (values, weight) in enumerate(rows):
        metrics = {
            name: values[i]
            for i, name in enumerate(names)
            if c == 0 or present[(c * 5 + i) % len(present)]
        }
        chunks.append((metrics, weight))
    assert _typed(reduce_metrics(chunks)) == _typed(_official(chunks).metrics)
