"""Objects of the official ``tinker`` package given to tinker_sync (both packages installed).

A program that builds ``tinker.types`` objects (or a library that does) and hands them to
tinker_sync clients and types gets them converted through the official objects' public
``model_dump()`` / dataclass fields (docs/migration.md#mixed-packages); an object that cannot
be converted fails with a message naming both packages. The clients run against the local
server. Without the official package this fails in CI and skips elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _oracle import require

tinker = require("tinker")
OT = require("tinker.types")

from tinker_sync import types as T  # noqa: E402


def _official_datum(offset: int = 0) -> Any:
    tokens = [offset + 1, offset + 2, offset + 3]
    return OT.Datum(
        model_input=OT.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": OT.TensorData.from_numpy(np.array(tokens, dtype=np.int64)),
            "weights": np.ones(3, dtype=np.float32),
        },
    )


def test_clients_take_official_objects(service: Any) -> None:
    training = service.create_lora_training_client("base", rank=4)
    fwd = training.forward_backward([_official_datum(), _official_datum(5)], "cross_entropy")
    step = training.optim_step(OT.AdamParams(learning_rate=1e-3))
    assert len(fwd.result().loss_fn_outputs) == 2
    step.result()
    forward = training.forward([_official_datum()], "cross_entropy").result()
    assert len(forward.loss_fn_outputs) == 1
    sampler = training.save_weights_and_get_sampling_client()
    prompt = OT.ModelInput.from_ints([1, 2, 3])
    out = sampler.sample(prompt, 2, OT.SamplingParams(max_tokens=4, temperature="0.5")).result()
    assert len(out.sequences) == 2 and all(0 < len(s.tokens) <= 4 for s in out.sequences)
    assert len(sampler.compute_logprobs(prompt).result()) == 3


def test_types_take_official_objects_nested() -> None:
    datum = _official_datum()
    fbi = T.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy")
    ours = fbi.data[0]
    assert type(ours) is T.Datum and type(ours.model_input) is T.ModelInput
    assert ours.model_input.to_ints() == [1, 2, 3]
    assert ours.loss_fn_inputs["target_tokens"].tolist() == [1, 2, 3]
    assert ours.loss_fn_inputs["weights"].dtype == "float32"
    span = OT.SampledProvenanceSpan(sequence_id="s", length=3)
    with_spans = T.Datum.model_validate(datum.with_provenance([span], [span]))
    assert with_spans.model_input_spans == [T.SampledProvenanceSpan(sequence_id="s", length=3)]
    request = T.SampleRequest(
        prompt=OT.ModelInput.from_ints([4]), sampling_params=OT.SamplingParams(max_tokens=2)
    )
    assert request.prompt.to_ints() == [4] and request.sampling_params.max_tokens == 2
    sparse = OT.TensorData(
        data=[5, 6],
        dtype="int64",
        shape=[2, 2],
        sparse_crow_indices=[0, 1, 2],
        sparse_col_indices=[1, 0],
    )
    assert T.Datum(
        model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={"target_tokens": sparse}
    ).loss_fn_inputs["target_tokens"].to_numpy().tolist() == [[0, 5], [6, 0]]
    optim = T.OptimStepRequest(model_id="m", optim_params=OT.DimuonParams(learning_rate=0.1))
    assert type(optim.optim_params) is T.DimuonParams


def test_a_wrong_official_object_names_both_packages(service: Any) -> None:
    training = service.create_lora_training_client("base", rank=4)
    with pytest.raises(ValueError, match=r"tinker\..*official `tinker` package") as info:
        training.forward_backward([OT.ModelInput.from_ints([1])], "cross_entropy")
    assert isinstance(info.value, TypeError)  # what earlier versions raised
    assert info.value.errors()[0]["loc"] == ("data", 0)
    with pytest.raises(ValueError, match="official `tinker` package"):
        T.ModelInput(chunks=[_official_datum()])


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
def test_an_official_object_that_cannot_be_converted_names_both_packages() -> None:
    broken = OT.SamplingParams.model_construct(max_tokens="many")  # pydantic skips validation
    with pytest.raises(ValueError, match=r"tinker\..*SamplingParams.*official `tinker` package"):
        T.SampleRequest(prompt=T.ModelInput.from_ints([1]), sampling_params=broken)
