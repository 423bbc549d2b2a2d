"""Reduce the metrics of forward/backward chunks exactly as the official 0.38 client does.

Usage::

    merged = reduce_metrics([(chunk0.metrics, len(chunk0.loss_fn_outputs)), ...])
    output = combine_forward_backward_outputs([chunk0, chunk1])

Only the first chunk's keys count. Every key must look like ``name:reduction`` with exactly one
``:`` (otherwise :class:`ValueError`). A key missing from any chunk is dropped, as is an unknown
reduction. Weights are the number of ``loss_fn_outputs`` of each chunk. ``mean`` is the weighted
average, ``slack`` is max minus the weighted mean, ``sum``/``min``/``max`` are plain, ``hash2``
sums the 64-bit-masked integer parts (an ``int``), and ``unique`` keeps every value, the first
under the key and the others under ``<key>_1``, ``<key>_2`` and so on.

The arithmetic goes through numpy (``np.average`` / ``np.sum`` ...) like the official reducer,
so results are bit-identical to it.

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tinker_sync.types import ForwardBackwardOutput

__all__ = ["REDUCTIONS", "combine_forward_backward_outputs", "reduce_metrics"]

_MASK64 = 0xFFFF_FFFF_FFFF_FFFF

MetricValue = float | int


def _check_weights(weights: list[int], key: str) -> None:
    if sum(weights) == 0:
        raise ValueError(
            f"cannot reduce metric {key!r}: the chunks hold no loss_fn_outputs (total weight 0)"
        )


def _mean(values: list[float], weights: list[int], key: str) -> MetricValue:
    _check_weights(weights, key)
    result: MetricValue = np.average(values, weights=weights).item()
    return result


def _slack(values: list[float], weights: list[int], key: str) -> MetricValue:
    _check_weights(weights, key)
    # The official expression: max - weighted average, both in numpy float64.
    result: MetricValue = (np.max(values) - np.average(values, weights=weights)).item()
    return result


def _sum(values: list[float], weights: list[int], key: str) -> MetricValue:
    result: MetricValue = np.sum(values).item()
    return result


def _min(values: list[float], weights: list[int], key: str) -> MetricValue:
    result: MetricValue = np.min(values).item()
    return result


def _max(values: list[float], weights: list[int], key: str) -> MetricValue:
    result: MetricValue = np.max(values).item()
    return result


def _hash2(values: list[float], weights: list[int], key: str) -> MetricValue:
    total = 0
    for value in values:
        try:
            total += int(value) & _MASK64
        except (OverflowError, ValueError) as exc:
            raise ValueError(f"cannot reduce metric {key!r}: {value!r} is not finite") from exc
    return total & _MASK64


_Reducer = Callable[[list[float], list[int], str], MetricValue]

_REDUCERS: dict[str, _Reducer] = {
    "mean": _mean,
    "sum": _sum,
    "min": _min,
    "max": _max,
    "slack": _slack,
    "hash2": _hash2,
}

#: Every reduction suffix the reducer understands.
REDUCTIONS: frozenset[str] = frozenset({*_REDUCERS, "unique"})


def reduce_metrics(
    chunks: Sequence[tuple[Mapping[str, float], int]],
) -> dict[str, MetricValue]:
    """Merge per-chunk metrics into one dict.

    Usage: ``reduce_metrics([(metrics_a, 3), (metrics_b, 1)])``.

    :param chunks: ``(metrics, weight)`` per chunk in chunk order; the weight is the chunk's
        number of ``loss_fn_outputs``.
    :returns: the merged metrics (``{}`` when there are no chunks).
    :raises ValueError: a key of the first chunk without exactly one ``:``; a ``mean`` or
        ``slack`` key when the total weight is 0; a non-finite ``hash2`` value.
    """
    if not chunks:
        return {}
    first = chunks[0][0]
    weights = [int(weight) for _, weight in chunks]
    result: dict[str, MetricValue] = {}
    for key in first:
        parts = key.split(":")
        if len(parts) != 2:
            raise ValueError(
                f"metric key {key!r} must look like 'name:reduction' with exactly one ':'"
            )
        reduction = parts[1]
        if reduction not in REDUCTIONS:
            continue
        if not all(key in metrics for metrics, _ in chunks):
            continue
        values = [metrics[key] for metrics, _ in chunks]
        if reduction == "unique":
            result[key] = values[0]
            for index, value in enumerate(values[1:], start=1):
                result[f"{key}_{index}"] = value
        else:
            result[key] = _REDUCERS[reduction](values, weights, key)
    return result


def combine_forward_backward_outputs(
    outputs: Sequence[ForwardBackwardOutput],
) -> ForwardBackwardOutput:
    """Combine the results of one forward/backward's chunks (always applied, even to one).

    Usage: ``combine_forward_backward_outputs([out_chunk0, out_chunk1])``.

    The output type is the first chunk's, ``loss_fn_outputs`` are concatenated in chunk order
    and the metrics are merged with :func:`reduce_metrics`. No chunks give an empty output
    with type ``""``.
    """
    from tinker_sync.types import ForwardBackwardOutput

    if not outputs:
        return ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics={})
    combined = [datum for output in outputs for datum in output.loss_fn_outputs]
    metrics = reduce_metrics([(o.metrics, len(o.loss_fn_outputs)) for o in outputs])
    return ForwardBackwardOutput(
        loss_fn_output_type=outputs[0].loss_fn_output_type,
        loss_fn_outputs=combined,
        metrics=metrics,  # hash2 yields an int, as in the official SDK
    )
