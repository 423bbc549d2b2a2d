"""Split forward/backward data into request chunks exactly like the official 0.38 client.

Usage::

    ranges = chunk_ranges(data)                      # [(0, 1024), (1024, 1500)]
    chunks = [data[start:stop] for start, stop in ranges]

Datums are taken in order. A new chunk starts when the current one already holds ``max_len`` datums,
or when it is non-empty and adding the next datum would push its estimated size past ``max_bytes``;
a single oversized datum forms a chunk of its own (docs/design/behavior.md#fwdbwd-chunking,
docs/design/protocol.md#chunking).

The estimate (:func:`estimate_datum_bytes`) is the protobuf size: each model-input chunk as
``_estimates.estimate_chunk_bytes`` charges it with 4 bytes per text token, plus each
loss_fn_input's raw array size in its dtype and 8 bytes per CSR index.

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

from collections.abc import Sequence

from tinker_sync._wire._estimates import PROTO_BYTES_PER_TOKEN, estimate_chunk_bytes
from tinker_sync.types import Datum, TensorData

__all__ = [
    "DEFAULT_MAX_CHUNK_BYTES",
    "DEFAULT_MAX_CHUNK_LEN",
    "chunk_plan",
    "chunk_ranges",
    "chunk_ranges_from_sizes",
    "estimate_datum_bytes",
]

#: Server config ``fwdbwd_max_chunk_len`` default.
DEFAULT_MAX_CHUNK_LEN = 1024
#: Server config ``fwdbwd_max_chunk_bytes_count`` default.
DEFAULT_MAX_CHUNK_BYTES = 5_000_000
_SPARSE_INDEX_BYTES = 8


def _tensor_bytes(tensor: TensorData) -> int:
    total = int(tensor.data_np.nbytes)
    crow = tensor.crow_np
    if crow is not None:
        total += _SPARSE_INDEX_BYTES * len(crow)
    col = tensor.col_np
    if col is not None:
        total += _SPARSE_INDEX_BYTES * len(col)
    return total


def estimate_datum_bytes(datum: Datum) -> int:
    """Estimated protobuf size of one datum, as the official client computes it.

    Usage: ``estimate_datum_bytes(datum)`` -> ``int``.
    """
    total = 0
    for chunk in datum.model_input.chunks:
        total += estimate_chunk_bytes(chunk, PROTO_BYTES_PER_TOKEN)
    for tensor in datum.loss_fn_inputs.values():
        total += _tensor_bytes(tensor)
    return total


def chunk_ranges_from_sizes(
    sizes: Sequence[int],
    max_len: int = DEFAULT_MAX_CHUNK_LEN,
    max_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
) -> list[tuple[int, int]]:
    """Chunk boundaries over precomputed per-datum byte estimates.

    Usage: ``chunk_ranges_from_sizes([10, 10, 10], max_len=2)`` -> ``[(0, 2), (2, 3)]``.

    :param sizes: estimated bytes per datum, in order.
    :param max_len: most datums per chunk (>= 1).
    :param max_bytes: byte budget per chunk; a lone datum may exceed it.
    :returns: half-open ``(start, stop)`` index ranges covering every datum, in order.
    :raises ValueError: ``max_len`` < 1.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    ranges: list[tuple[int, int]] = []
    start = 0
    count = 0
    total = 0
    for index, size in enumerate(sizes):
        if (count > 0 and total + size > max_bytes) or count == max_len:
            ranges.append((start, index))
            start = index
            count = 0
            total = 0
        count += 1
        total += size
    if count > 0:
        ranges.append((start, start + count))
    return ranges


def chunk_ranges(
    data: Sequence[Datum],
    max_len: int = DEFAULT_MAX_CHUNK_LEN,
    max_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
) -> list[tuple[int, int]]:
    """Chunk boundaries for ``data`` (see the module docstring).

    Usage: ``[data[a:b] for a, b in chunk_ranges(data)]``; the estimated bytes of a chunk are
    ``sum(estimate_datum_bytes(d) for d in data[a:b])``.

    :raises ValueError: ``max_len`` < 1.
    """
    return chunk_ranges_from_sizes([estimate_datum_bytes(d) for d in data], max_len, max_bytes)


def chunk_plan(
    data: Sequence[Datum],
    max_len: int = DEFAULT_MAX_CHUNK_LEN,
    max_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
) -> list[tuple[int, int, int]]:
    """Like :func:`chunk_ranges`, with each chunk's estimated bytes (for the byte gate,
    docs/design/behavior.md#fwdbwd-byte-gate).

    Usage: ``for start, stop, nbytes in chunk_plan(data): ...``.

    :raises ValueError: ``max_len`` < 1.
    """
    sizes = [estimate_datum_bytes(d) for d in data]
    return [
        (start, stop, sum(sizes[start:stop]))
        for start, stop in chunk_ranges_from_sizes(sizes, max_len, max_bytes)
    ]
