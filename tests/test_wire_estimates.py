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


def test_prompt_json_and_bytes_is_to_json_and_the_estimate_in_one_pass() -> None:
    """``sample()``'s one pass gives exactly the generic wire JSON (same keys, order, values)
    and the same charge, for every chunk kind, numpy tokens and a chunk list changed later."""
    import json

    from tinker_sync._wire._converter import to_json
    from tinker_sync._wire._estimates import prompt_json_and_bytes

    mixed = ModelInput(
        chunks=[
            EncodedTextChunk(tokens=[1, 2, 3]),
            ImageChunk(data=b"abcd", format="png", expected_tokens=9),
            ImageAssetPointerChunk(format="png", location="loc", expected_tokens=1),
            DmelChunk(dmel=_DMEL),
            EncodedTextChunk(tokens=np.arange(5, dtype=np.int64)),
        ]
    )
    grown = ModelInput.from_ints([7])
    grown.chunks.append(EncodedTextChunk(tokens=[8, 9]))
    prompts = [
        ModelInput.from_ints(list(range(64))),
        ModelInput.from_ints(np.arange(10, dtype=np.int32)),
        ModelInput.empty(),
        mixed,
        grown,
    ]
    for prompt in prompts:
        wire, charge = prompt_json_and_bytes(prompt)
        assert json.dumps(wire) == json.dumps(to_json(prompt))
        assert charge == estimate_prompt_bytes(prompt)
