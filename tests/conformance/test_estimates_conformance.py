"""Byte estimates against the official 0.38 client: the sampling charge and the chunking size.

Both come from one function (``_wire._estimates.estimate_chunk_bytes``) with two per-token
charges; each charge must match the official helper it mirrors, chunk kind by chunk kind
(``docs/design/behavior.md#dispatch-gates``, ``docs/design/behavior.md#fwdbwd-chunking``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _oracle import require

from tinker_sync import types
from tinker_sync._wire._chunking import estimate_datum_bytes
from tinker_sync._wire._estimates import estimate_prompt_bytes

tinker = require("tinker")
holder = require("tinker.lib.internal_client_holder")
official_training = require("tinker.lib.public_interfaces.training_client")

_DMEL = bytes([254, 0, 2, 3, 4]) + b"payload"  # marker, dtype 0, ndim 2, dims (3, 4)


def _chunks(t: Any, tokens: int) -> list[Any]:
    """One chunk of each kind, built with ``t`` (our ``types`` or the official ``tinker.types``)."""
    return [
        t.EncodedTextChunk(tokens=list(range(tokens))),
        t.ImageChunk(data=b"\x89PNG" * 7, format="png", expected_tokens=3),
        t.ImageAssetPointerChunk(format="jpeg", location="s3://b/k.jpg", expected_tokens=2),
        t.DmelChunk(dmel=_DMEL),
    ]


@pytest.mark.parametrize("tokens", [0, 1, 7, 1000])
def test_sampling_prompt_charge_matches_the_official_dispatch_estimate(tokens: int) -> None:
    ours = types.ModelInput(chunks=_chunks(types, tokens))
    theirs = tinker.types.ModelInput(chunks=_chunks(tinker.types, tokens))
    official = holder.InternalClientHolder.estimate_bytes_count_in_model_input
    # The official method reads nothing from its instance; call it unbound.
    assert estimate_prompt_bytes(ours) == official(_Unbound(), theirs)


@pytest.mark.parametrize("tokens", [0, 1, 7, 1000])
def test_datum_size_matches_the_official_chunking_estimate(tokens: int) -> None:
    weights = np.linspace(0.0, 1.0, tokens, dtype=np.float32)
    ours = types.Datum(
        model_input=types.ModelInput(chunks=_chunks(types, tokens)),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=list(range(tokens)), dtype="int64"),
            "weights": types.TensorData.from_numpy(weights),
        },
    )
    theirs = tinker.types.Datum(
        model_input=tinker.types.ModelInput(chunks=_chunks(tinker.types, tokens)),
        loss_fn_inputs={
            "target_tokens": tinker.types.TensorData(data=list(range(tokens)), dtype="int64"),
            "weights": tinker.types.TensorData.from_numpy(weights),
        },
    )
    assert estimate_datum_bytes(ours) == official_training._estimate_datum_bytes_count_proto(theirs)


def test_the_two_charges_differ_only_in_text_tokens() -> None:
    """Same chunks, two budgets: only the text tokens are charged differently (10 vs 4)."""
    prompt = types.ModelInput(chunks=_chunks(types, 100))
    datum = types.Datum(model_input=prompt, loss_fn_inputs={})
    assert estimate_prompt_bytes(prompt) - estimate_datum_bytes(datum) == 100 * (10 - 4)


class _Unbound:
    """Stands in for the official holder instance, whose estimate uses no state."""

    def estimate_bytes_count_in_chunk(self, chunk: Any) -> int:
        return int(holder.InternalClientHolder.estimate_bytes_count_in_chunk(self, chunk))
