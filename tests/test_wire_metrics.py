"""Metric reduction and chunk-result combination (docs/design/behavior.md#combine-chunk-results,
docs/design/behavior.md#metric-reduction)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinker_sync._wire._metrics import REDUCTIONS, combine_forward_backward_outputs, reduce_metrics
from tinker_sync.types import ForwardBackwardOutput, TensorData


def _outputs(n: int) -> list[dict[str, TensorData]]:
    return [
        {"logprobs": TensorData(data=[float(-i)], dtype="float32", shape=[1])} for i in range(n)
    ]


def _fbo(metrics: dict[str, float], n: int, kind: str = "ArrayRecord") -> ForwardBackwardOutput:
    return ForwardBackwardOutput(
        loss_fn_output_type=kind, loss_fn_outputs=_outputs(n), metrics=metrics
    )


# ------------------------------------------------------------------ each reduction


def test_mean_is_weighted_by_output_count() -> None:
    out = reduce_metrics([({"loss:mean": 1.0}, 1), ({"loss:mean": 3.0}, 3)])
    assert out == {"loss:mean": pytest.approx(2.5)}
    assert isinstance(out["loss:mean"], float)


def test_slack_is_max_minus_weighted_mean() -> None:
    out = reduce_metrics([({"t:slack": 1.0}, 3), ({"t:slack": 5.0}, 1)])
    assert out["t:slack"] == pytest.approx(5.0 - 2.0)


@pytest.mark.parametrize(("suffix", "expected"), [("sum", 6.0), ("min", -1.0), ("max", 5.0)])
def test_plain_reductions_ignore_weights(suffix: str, expected: float) -> None:
    key = f"x:{suffix}"
    out = reduce_metrics([({key: 2.0}, 100), ({key: -1.0}, 1), ({key: 5.0}, 7)])
    assert out == {key: expected}


def test_hash2_sums_masked_integer_parts_and_wraps() -> None:
    two63 = float(2**63)
    out = reduce_metrics([({"h:hash2": two63}, 1), ({"h:hash2": two63}, 1), ({"h:hash2": 5.9}, 1)])
    assert out["h:hash2"] == 5  # 2^63 + 2^63 wraps to 0; int(5.9) == 5
    assert isinstance(out["h:hash2"], int)
    out = reduce_metrics([({"h:hash2": -1.0}, 1)])
    assert out["h:hash2"] == 2**64 - 1


def test_hash2_rejects_non_finite_values() -> None:
    with pytest.raises(ValueError, match="h:hash2"):
        reduce_metrics([({"h:hash2": math.inf}, 1)])


def test_unique_keeps_every_value_under_suffixed_full_keys() -> None:
    chunks = [({"seed:unique": 7.0}, 1), ({"seed:unique": 8.0}, 1), ({"seed:unique": 7.0}, 1)]
    assert reduce_metrics(chunks) == {
        "seed:unique": 7.0,
        "seed:unique_1": 8.0,
        "seed:unique_2": 7.0,
    }


def test_reductions_table() -> None:
    assert REDUCTIONS == {"mean", "sum", "min", "max", "slack", "hash2", "unique"}


# ------------------------------------------------------------------ key handling


def test_only_first_chunk_keys_count_and_missing_keys_are_dropped() -> None:
    chunks = [
        ({"a:sum": 1.0, "b:sum": 2.0}, 1),
        ({"a:sum": 3.0, "c:sum": 9.0}, 1),
    ]
    assert reduce_metrics(chunks) == {"a:sum": 4.0}


def test_unknown_suffix_is_dropped() -> None:
    assert reduce_metrics([({"a:median": 1.0, "b:max": 2.0}, 1)]) == {"b:max": 2.0}


def test_empty_reduction_or_name_is_an_unknown_suffix() -> None:
    assert reduce_metrics([({"a:": 1.0, ":": 2.0}, 1)]) == {}


def test_no_chunks_gives_empty_dict() -> None:
    assert reduce_metrics([]) == {}


@pytest.mark.parametrize("key", ["loss", "a:b:mean", "no_colon_here"])
def test_key_without_exactly_one_colon_raises(key: str) -> None:
    with pytest.raises(ValueError, match="exactly one ':'"):
        reduce_metrics([({key: 1.0}, 1)])


def test_bad_key_raises_even_when_missing_elsewhere() -> None:
    with pytest.raises(ValueError):
        reduce_metrics([({"loss": 1.0}, 1), ({}, 1)])


@pytest.mark.parametrize("key", ["loss:mean", "loss:slack"])
def test_zero_total_weight_raises_for_weighted_reductions(key: str) -> None:
    with pytest.raises(ValueError, match="total weight 0"):
        reduce_metrics([({key: 1.0}, 0), ({key: 2.0}, 0)])


def test_zero_total_weight_is_fine_without_weighted_reductions() -> None:
    assert reduce_metrics([({"n:sum": 1.0}, 0), ({"n:sum": 2.0}, 0)]) == {"n:sum": 3.0}


def test_loss_and_loss_mean_are_unrelated_keys() -> None:
    with pytest.raises(ValueError):
        reduce_metrics([({"loss:mean": 1.0, "loss": 2.0}, 1)])
    assert reduce_metrics([({"loss:mean": 1.0, "loss:sum": 2.0}, 1)]) == {
        "loss:mean": 1.0,
        "loss:sum": 2.0,
    }


# ------------------------------------------------------------------ combine


def test_combine_concatenates_outputs_and_takes_first_type() -> None:
    a = _fbo({"loss:sum": 1.0, "acc:mean": 1.0}, 1, "pkg:First")
    b = _fbo({"loss:sum": 2.0, "acc:mean": 0.0}, 3, "Second")
    out = combine_forward_backward_outputs([a, b])
    assert out.loss_fn_output_type == "pkg:First"
    assert out.loss_fn_outputs == [*a.loss_fn_outputs, *b.loss_fn_outputs]
    assert out.metrics == {"loss:sum": 3.0, "acc:mean": pytest.approx(0.25)}


def test_combine_is_applied_to_a_single_chunk() -> None:
    single = _fbo({"loss:sum": 1.5, "x:weird": 1.0, "seed:unique": 3.0}, 2)
    out = combine_forward_backward_outputs([single])
    assert out.metrics == {"loss:sum": 1.5, "seed:unique": 3.0}
    assert out.loss_fn_outputs == single.loss_fn_outputs


def test_combine_of_nothing_is_empty() -> None:
    out = combine_forward_backward_outputs([])
    assert (out.loss_fn_output_type, out.loss_fn_outputs, out.metrics) == ("", [], {})


def test_combine_keeps_hash2_exact() -> None:
    parts = [_fbo({"h:hash2": float(2**62)}, 1), _fbo({"h:hash2": 1.0}, 1)]
    out = combine_forward_backward_outputs(parts)
    # 2^62 + 1 is not representable as a float: ForwardBackwardOutput.metrics must keep ints.
    assert out.metrics["h:hash2"] == 2**62 + 1, "ForwardBackwardOutput coerced hash2 to float"
    assert isinstance(out.metrics["h:hash2"], int)


# ------------------------------------------------------------------ properties

_values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_values, st.integers(min_value=1, max_value=50)), min_size=1, max_size=8))
def test_reductions_match_their_definitions(pairs: list[tuple[float, int]]) -> None:
    keys = ["m:mean", "s:sum", "lo:min", "hi:max", "sl:slack"]
    chunks = [(dict.fromkeys(keys, v), w) for v, w in pairs]
    out = reduce_metrics(chunks)
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs], dtype=float)
    mean = float((values * weights).sum() / weights.sum())
    assert out["m:mean"] == pytest.approx(mean, rel=1e-9, abs=1e-6)
    assert out["s:sum"] == pytest.approx(float(values.sum()), rel=1e-9, abs=1e-6)
    assert out["lo:min"] == values.min()
    assert out["hi:max"] == values.max()
    assert out["sl:slack"] == pytest.approx(values.max() - mean, rel=1e-9, abs=1e-6)
    assert out["lo:min"] <= out["m:mean"] + 1e-6 and out["m:mean"] <= out["hi:max"] + 1e-6
