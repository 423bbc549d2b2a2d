"""tinker-cookbook 0.6.1's capture module around one SDK's training and sampling calls.

Run by tests/compat/test_capture_patching.py as ``python capture_program.py`` (the official
SDK) or ``tinker-sync exec -- python capture_program.py`` (tinker_sync through the alias),
with TINKER_BASE_URL / TINKER_API_KEY pointing at a local server with the tiny backend. Prints
one JSON document: the SDK's name and every capture record as ``[kind, op, mode, status]``.

``instrument_tinker`` replaces ``tinker.SamplingClient.sample`` / ``sample_async`` and
``tinker.TrainingClient.forward_backward`` / ``optim_step`` / ``save_weights_for_sampler``
and their ``*_async`` twins on the classes, then records each call's outcome from a
done-callback on the returned future. Each call must give exactly one record.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import tinker
from tinker_cookbook.capture import (
    CaptureExporter,
    capture,
    instrument_tinker,
    uninstrument_tinker,
)


class ListSink:
    """Keeps every exported record in memory."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def export(self, records: Sequence[dict[str, Any]], timeout: float | None = None) -> None:
        self.records.extend(records)


def main() -> None:
    types = tinker.types
    sink = ListSink()
    exporter = CaptureExporter(sink, flush_interval_sec=0.05)
    instrument_tinker(exporter)
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model="tinker-sync/tiny", rank=2)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4]},
    )
    prompt = types.ModelInput.from_ints([1, 2, 3])
    params = types.SamplingParams(max_tokens=3)
    adam = types.AdamParams(learning_rate=1e-3)

    with capture(mode="sync"):
        training.forward_backward([datum], "cross_entropy").result()
        training.optim_step(adam).result()
        path = training.save_weights_for_sampler("sync").result().path
        sampler = service.create_sampling_client(model_path=path)
        sampler.sample(prompt, 1, params).result()

    async def in_a_loop() -> None:
        with capture(mode="async"):
            await (await training.forward_backward_async([datum], "cross_entropy"))
            await (await training.optim_step_async(adam))
            saved = await (await training.save_weights_for_sampler_async("async"))
            # created inside the event loop: a pending client until awaited
            looped = await service.create_sampling_client_async(model_path=saved.path)
            await looped.sample_async(prompt, 1, params)
        with capture(mode="await-sync"):
            await training.forward_backward([datum], "cross_entropy")
            await sampler.sample(prompt, 1, params)

    asyncio.run(in_a_loop())
    assert exporter.wait_pending(60), "a done-callback never ran"
    assert exporter.force_flush(60)
    uninstrument_tinker()
    exporter.shutdown()
    rows = [[r["kind"], r.get("op"), r["scope"].get("mode"), r.get("status")] for r in sink.records]
    print(json.dumps({"sdk": tinker.__name__, "records": rows, "lost": exporter.dropped}))


if __name__ == "__main__":
    main()
