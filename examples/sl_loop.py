"""Supervised fine-tuning through tinker_sync against an embedded local server.

Run::

    python examples/sl_loop.py               # 40 steps on the tiny byte-level model
    python examples/sl_loop.py --steps 60 --lr 1e-3

The script starts ``LocalServer(backend="tiny")`` (a real small numpy language model), teaches
it colour facts ("Q: what is the color of sky? A: blue") with the cross-entropy loss, and prints
the mean loss per completion token as it falls. Against the hosted service, drop the server and
use ``ServiceClient()`` with ``TINKER_API_KEY`` set, and a real base model name.

**Pipelining.** ``forward_backward`` and ``optim_step`` return futures at once, and each
TrainingClient sends its requests in call order. So the loop submits step k+1 before it waits
for step k's result: the server always has the next batch queued, and no round trip is spent
idle. Waiting on ``fwd.result()`` only reads a result that is usually already there.
"""

from __future__ import annotations

import argparse
from collections import deque

import numpy as np

import tinker_sync as tinker
from tinker_sync import types
from tinker_sync.local import LocalServer

FACTS = [
    ("sky", "blue"),
    ("grass", "green"),
    ("snow", "white"),
    ("coal", "black"),
    ("blood", "red"),
    ("lemon", "yellow"),
    ("carrot", "orange"),
    ("plum", "purple"),
]


def build_dataset(tokenizer: tinker.TinkerTokenizer) -> list[types.Datum]:
    """One datum per fact; only the completion tokens carry loss weight."""
    data = []
    for thing, color in FACTS:
        prompt = tokenizer.encode(f"Q: what is the color of {thing}? A:", add_special_tokens=False)
        completion = tokenizer.encode(f" {color}\n", add_special_tokens=False)
        if tokenizer.eos_token_id is not None:
            completion.append(tokenizer.eos_token_id)
        tokens = np.array(prompt + completion, dtype=np.int64)
        weights = np.zeros(len(tokens) - 1, dtype=np.float32)
        weights[len(prompt) - 1 :] = 1.0  # predict the completion, not the prompt
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
            )
        )
    return data


def mean_token_loss(out: types.ForwardBackwardOutput, data: list[types.Datum]) -> float:
    """Weighted mean negative log-likelihood of the completion tokens."""
    total = weight = 0.0
    for datum, output in zip(data, out.loss_fn_outputs, strict=True):
        w = datum.loss_fn_inputs["weights"].to_numpy()
        total += float(-(output["logprobs"].to_numpy() * w).sum())
        weight += float(w.sum())
    return total / weight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()

    with (
        LocalServer(backend="tiny") as server,
        tinker.ServiceClient(base_url=server.url, api_key=server.api_key) as service,
    ):
        training = service.create_lora_training_client("tinker-sync/tiny", rank=args.rank)
        tokenizer = training.get_tokenizer()
        data = build_dataset(tokenizer)
        adam = types.AdamParams(learning_rate=args.lr)

        losses: list[float] = []
        in_flight: deque[tuple[int, tinker.APIFuture[types.ForwardBackwardOutput]]] = deque()
        for step in range(args.steps):
            fwd = training.forward_backward(data, "cross_entropy")
            training.optim_step(adam)  # ordered after fwd; no need to wait for it here
            in_flight.append((step, fwd))
            if len(in_flight) > 1:  # keep one step queued ahead of the one we read
                done_step, done = in_flight.popleft()
                losses.append(mean_token_loss(done.result(), data))
                print(f"step {done_step:3d}  loss {losses[-1]:.4f}", flush=True)
        while in_flight:
            done_step, done = in_flight.popleft()
            losses.append(mean_token_loss(done.result(), data))
            print(f"step {done_step:3d}  loss {losses[-1]:.4f}", flush=True)

        sampler = training.save_weights_and_get_sampling_client()
        prompt = tokenizer.encode("Q: what is the color of sky? A:", add_special_tokens=False)
        sample = sampler.sample(
            types.ModelInput.from_ints(prompt),
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=8, temperature=0.0),
        ).result()
        print("sample:", repr(tokenizer.decode(sample.sequences[0].tokens)), flush=True)
        print(f"loss: first {losses[0]:.4f} -> last {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
