"""``tinker-sync demo``: fine-tune the tiny local model, sample from it, save and list it.

Usage::

    tinker-sync demo                 # embedded LocalServer(backend="tiny"), about 30 s
    tinker-sync demo --json          # one JSON summary on stdout
    tinker-sync demo -q              # nothing on success (the exit status tells)
    tinker-sync demo --base-url http://127.0.0.1:8000   # against a running server

Everything runs offline on loopback: the embedded server, a real small numpy transformer with
LoRA adapters, and the built-in byte tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

#: A dozen question/answer pairs sharing one prompt format: the model learns the answers.
FACTS: tuple[tuple[str, str], ...] = (
    ("What color is the sky?", "blue"),
    ("What color is grass?", "green"),
    ("What color is snow?", "white"),
    ("What color is coal?", "black"),
    ("What color is a banana?", "yellow"),
    ("What color is a tomato?", "red"),
    ("What is two plus two?", "four"),
    ("What is three plus four?", "seven"),
    ("What animal says meow?", "a cat"),
    ("What animal says woof?", "a dog"),
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
)
DEFAULT_PROMPT = "What color is grass?"


def _format(question: str) -> str:
    return f"Q: {question}\nA:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("tiny", "instant"), default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="a question in the style of the training data"
    )
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--base-url", default=None, help="use a running server instead of an embedded one"
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON summary")


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, str | None]]:
    if args.base_url:
        yield args.base_url, args.api_key
        return
    from tinker_sync.local import LocalServer

    with LocalServer(backend=args.backend, seed=args.seed) as server:
        yield server.url, server.api_key


def build_data(tokenizer: Any) -> list[Any]:
    """One Datum per fact: loss only on the answer tokens (weights 0 on the prompt)."""
    from tinker_sync import types

    data = []
    for question, answer in FACTS:
        prompt = tokenizer.encode(_format(question), add_special_tokens=False)
        completion = tokenizer.encode(f" {answer}\n", add_special_tokens=False)
        tokens = prompt + completion
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
            )
        )
    return data


def run(args: argparse.Namespace) -> int:
    import tinker_sync
    from tinker_sync import types

    for name in ("steps", "rank", "max_tokens"):
        if getattr(args, name) < 1:
            print(f"Error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    # -q prints nothing on success (the exit status tells); --json prints only its summary.
    # The progress bar is drawn only into a terminal, never into a log file or a pipe.
    quiet = bool(args.json) or bool(getattr(args, "quiet", False))
    if args.base_url and not quiet:
        print(f"connecting to {args.base_url} ...", file=sys.stderr)
    with _server(args) as (url, api_key):
        timings["server_start_s"] = time.perf_counter() - t0
        with tinker_sync.ServiceClient(base_url=url, api_key=api_key) as service:
            t = time.perf_counter()
            training = service.create_lora_training_client(
                "tinker-sync/tiny", rank=args.rank, seed=args.seed
            )
            tokenizer = training.get_tokenizer()
            data = build_data(tokenizer)
            timings["create_s"] = time.perf_counter() - t
            adam = types.AdamParams(learning_rate=args.learning_rate)
            losses: list[float] = []
            ntokens = sum(sum(d.loss_fn_inputs["weights"].data) for d in data)
            t = time.perf_counter()
            bar = None
            if not quiet and sys.stderr.isatty():
                from tqdm import tqdm

                bar = tqdm(total=args.steps, desc="fine-tuning", unit="step", file=sys.stderr)
            # Pipelined: step k+1 is queued before step k's results are read; the sequencer
            # keeps every request in call order.
            pending = (training.forward_backward(data, "cross_entropy"), training.optim_step(adam))
            for step in range(args.steps):
                nxt = None
                if step + 1 < args.steps:
                    nxt = (
                        training.forward_backward(data, "cross_entropy"),
                        training.optim_step(adam),
                    )
                fwd, opt = pending
                loss = fwd.result().metrics["loss:sum"] / max(ntokens, 1.0)
                opt.result()
                losses.append(round(loss, 4))
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.3f}")
                    bar.update(1)
                if nxt is not None:
                    pending = nxt
            if bar is not None:
                bar.close()
            timings["train_s"] = time.perf_counter() - t
            t = time.perf_counter()
            sampler = training.save_weights_and_get_sampling_client()
            prompt_text = _format(args.prompt)
            prompt = types.ModelInput.from_ints(
                tokenizer.encode(prompt_text, add_special_tokens=False)
            )
            result = sampler.sample(
                prompt,
                1,
                types.SamplingParams(
                    max_tokens=args.max_tokens,
                    temperature=0.0,
                    stop=["\n"],
                    seed=args.seed,
                ),
            ).result()
            sample_text = tokenizer.decode(result.sequences[0].tokens, skip_special_tokens=True)
            timings["sample_s"] = time.perf_counter() - t
            t = time.perf_counter()
            saved = training.save_state("demo-final").result()
            rest = service.create_rest_client()
            checkpoints = rest.list_checkpoints(training.model_id).result().checkpoints
            timings["save_and_list_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    paths = [c.tinker_path for c in checkpoints]
    if args.json:
        print(
            json.dumps(
                {
                    "losses": losses,
                    "sample_text": sample_text,
                    "checkpoints": paths,
                    "saved": saved.path,
                    "timings": {k: round(v, 3) for k, v in timings.items()},
                }
            )
        )
        return 0
    if quiet:
        return 0
    print(
        f"loss: {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps "
        f"({timings['train_s']:.1f} s)"
    )
    print(f"prompt : {prompt_text!r}")
    print(f"sample : {sample_text!r}")
    print("checkpoints:")
    for path in paths:
        print(f"  {path}")
    print(f"done in {timings['total_s']:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tinker-sync demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
