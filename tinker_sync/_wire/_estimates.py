"""Byte estimates of model-input chunks: one function, two per-token charges.

Usage::

    charge = estimate_prompt_bytes(prompt)                           # sampling byte gate
    wire, charge = prompt_json_and_bytes(prompt)                     # both, in one pass
    size = estimate_chunk_bytes(chunk, PROTO_BYTES_PER_TOKEN)        # forward_backward chunking

A chunk is charged ``len(data)`` per image, ``len(location)`` per image asset pointer,
``len(dmel)`` per dmel chunk, and ``bytes_per_token`` per text token. The per-token charge is two
different facts of the official client, each with its own budget: the sampling dispatch gate
charges 10 bytes per prompt token (``docs/design/behavior.md#dispatch-gates``), while the
forward/backward chunker estimates the protobuf size, 4 bytes per int32 token
(``docs/design/behavior.md#fwdbwd-chunking``). ``tests/conformance/test_estimates_conformance.py``
checks both against the official SDK.

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

from typing import Any

from tinker_sync.types import (
    DmelChunk,
    EncodedTextChunk,
    ImageAssetPointerChunk,
    ImageChunk,
    ModelInput,
    ModelInputChunk,
)
from tinker_sync.types._base import dump

__all__ = [
    "PROTO_BYTES_PER_TOKEN",
    "SAMPLE_BYTES_PER_TOKEN",
    "estimate_chunk_bytes",
    "estimate_prompt_bytes",
    "prompt_json_and_bytes",
]

#: Bytes charged per text token of a sampling prompt (the dispatch byte gate).
SAMPLE_BYTES_PER_TOKEN = 10
#: Estimated protobuf bytes per text token of forward_backward data (int32 on the wire).
PROTO_BYTES_PER_TOKEN = 4


def estimate_chunk_bytes(
    chunk: ModelInputChunk, bytes_per_token: int = SAMPLE_BYTES_PER_TOKEN
) -> int:
    """The byte charge of one model-input chunk (see the module docstring).

    Usage: ``estimate_chunk_bytes(EncodedTextChunk(tokens=[1, 2]), PROTO_BYTES_PER_TOKEN)`` -> 8.
    """
    if isinstance(chunk, DmelChunk):
        return len(chunk.dmel)
    if isinstance(chunk, ImageChunk):
        return len(chunk.data)
    if isinstance(chunk, ImageAssetPointerChunk):
        return len(chunk.location)
    return chunk.length * bytes_per_token


def estimate_prompt_bytes(model_input: ModelInput) -> int:
    """The sampling byte charge of a whole prompt.

    Usage: ``estimate_prompt_bytes(types.ModelInput.from_ints([1, 2, 3]))`` -> ``30``.
    """
    return sum(estimate_chunk_bytes(chunk) for chunk in model_input.chunks)


def prompt_json_and_bytes(model_input: ModelInput) -> tuple[Any, int]:
    """The prompt's wire JSON (exactly ``to_json(model_input)``) and its sampling byte charge.

    One pass over the chunks, for ``sample()``'s request body and byte gate together.
    Usage: ``prompt_json_and_bytes(types.ModelInput.from_ints([1, 2, 3]))`` ->
    ``({"chunks": [{"tokens": [1, 2, 3], "type": "encoded_text"}]}, 30)``.
    """
    chunks = model_input.chunks
    if type(model_input) is not ModelInput or type(chunks) is not list:
        return dump(model_input, True, True, True), estimate_prompt_bytes(model_input)
    wire: list[Any] = []
    charge = 0
    for chunk in chunks:
        if type(chunk) is EncodedTextChunk and type(chunk.type) is str:
            # The generic dump of this model, field by field (tokens are never None).
            tokens = chunk.tokens
            wire.append({"tokens": dump(tokens, True, True, True), "type": chunk.type})
            charge += len(tokens) * SAMPLE_BYTES_PER_TOKEN
        else:
            wire.append(dump(chunk, True, True, True))
            charge += estimate_chunk_bytes(chunk)
    return {"chunks": wire}, charge
