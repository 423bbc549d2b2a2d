"""Byte estimates of sampling prompts for the sampling dispatch byte gate (BEHAVIOR B12).

Usage: ``charge = estimate_prompt_bytes(prompt)`` (multiply by 20 while backed off).

The estimate matches the official client: 10 bytes per text token, ``len(data)`` per image,
``len(location)`` per image asset pointer and ``len(dmel)`` per dmel chunk.

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

from tinker_sync.types import (
    DmelChunk,
    ImageAssetPointerChunk,
    ImageChunk,
    ModelInput,
    ModelInputChunk,
)

__all__ = ["SAMPLE_BYTES_PER_TOKEN", "estimate_chunk_bytes", "estimate_prompt_bytes"]

#: Bytes charged per text token of a sampling prompt.
SAMPLE_BYTES_PER_TOKEN = 10


def estimate_chunk_bytes(chunk: ModelInputChunk) -> int:
    """The sampling byte charge of one prompt chunk (see the module docstring)."""
    if isinstance(chunk, DmelChunk):
        return len(chunk.dmel)
    if isinstance(chunk, ImageChunk):
        return len(chunk.data)
    if isinstance(chunk, ImageAssetPointerChunk):
        return len(chunk.location)
    return chunk.length * SAMPLE_BYTES_PER_TOKEN


def estimate_prompt_bytes(model_input: ModelInput) -> int:
    """The sampling byte charge of a whole prompt.

    Usage: ``estimate_prompt_bytes(types.ModelInput.from_ints([1, 2, 3]))`` -> ``30``.
    """
    return sum(estimate_chunk_bytes(chunk) for chunk in model_input.chunks)
