"""Sampling prompt byte estimates for the dispatch byte gate
(docs/design/behavior.md#dispatch-gates)."""

from __future__ import annotations

import numpy as np

from tinker_sync._wire._estimates import (
    SAMPLE_BYTES_PER_TOKEN,
    estimate_chunk_bytes,
    estimate_prompt_bytes,
)
from tinker_sync.types import (
    DmelChunk,
    EncodedTextChunk,
    ImageAssetPointerChunk,
    ImageChunk,
    ModelInput,
)

_DMEL = bytes([254, 0, 1, 5, 9, 9, 9])


def test_prompt_estimate_charges_ten_bytes_per_token() -> None:
    prompt = ModelInput(
        chunks=[
            EncodedTextChunk(tokens=[1, 2, 3]),
            ImageChunk(data=b"abcd", format="png", expected_tokens=9),
            ImageAssetPointerChunk(format="png", location="loc", expected_tokens=1),
            DmelChunk(dmel=_DMEL),
        ]
    )
    assert estimate_prompt_bytes(prompt) == 30 + 4 + 3 + len(_DMEL)
    assert estimate_prompt_bytes(ModelInput.empty()) == 0


def test_numpy_prompt_and_per_chunk_charges() -> None:
    prompt = ModelInput.from_ints(np.arange(1000, dtype=np.int32))
    assert estimate_prompt_bytes(prompt) == 1000 * SAMPLE_BYTES_PER_TOKEN == 10_000
    assert estimate_chunk_bytes(DmelChunk(dmel=_DMEL)) == len(_DMEL)
    assert estimate_chunk_bytes(ImageChunk(data=b"", format="jpeg", expected_tokens=0)) == 0
