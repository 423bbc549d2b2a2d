"""gspo and stable_reinforce through the SDK against the local server's tiny backend.

stable_reinforce trains on sequences sampled with ``record_stability_info=True`` and named by
provenance spans (``Datum.with_provenance``); a datum without them is refused with a message
naming the loss. gspo needs no provenance.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync.exceptions import RequestFailedError
from tinker_sync.local import LocalServer

HANG = 60.0


@pytest.fixture
def tiny() -> Iterator[Any]:
    with (
        LocalServer(backend="tiny") as server,
        tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service,
    ):
        yield service


def rollout(service: Any) -> tuple[Any, types.Datum, types.Datum]:
    """One sampled sequence as an RL datum, without and with provenance."""
    training = service.create_lora_training_client("tinker-sync/tiny", rank=4)
    sampler = training.save_weights_and_get_sampling_client(record_stability_info=True)
    prompt = list(b"Q: sky?\nA:")
    seq = (
        sampler.sample(
            types.ModelInput.from_ints(prompt),
            1,
            types.SamplingParams(max_tokens=6, temperature=1.0, seed=1),
        )
        .result(HANG)
        .sequences[0]
    )
    assert seq.sequence_id and seq.logprobs is not None
    tokens = prompt + list(seq.tokens)
    n_prompt, n_sampled = len(prompt), len(seq.tokens)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * (n_prompt - 1) + list(seq.logprobs),
            "advantages": [0.0] * (n_prompt - 1) + [1.0] * n_sampled,
        },
    )
    spanned = datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=seq.sequence_id, length=n_prompt),
            types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=n_sampled - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=1, length=n_prompt - 1),
            types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=n_sampled),
        ],
    )
    return training, datum, spanned


def test_stable_reinforce_trains_on_recorded_sequences_and_needs_provenance(tiny: Any) -> None:
    training, datum, spanned = rollout(tiny)
    out = training.forward_backward([spanned], "stable_reinforce").result(HANG)
    assert out.metrics["loss:sum"] != 0.0
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result(HANG)
    with pytest.raises(RequestFailedError, match="stable_reinforce' needs provenance"):
        training.forward_backward([datum], "stable_reinforce").result(HANG)


def test_gspo_trains_without_provenance(tiny: Any) -> None:
    training, datum, _ = rollout(tiny)
    first = training.forward_backward([datum], "gspo").result(HANG)
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result(HANG)
    second = training.forward_backward([datum], "gspo", {"clip_high_threshold": 5.0})
    assert first.metrics["loss:sum"] != second.result(HANG).metrics["loss:sum"]
