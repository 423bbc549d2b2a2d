"""Benchmark row P11: tinker_sync on a lossy network, relative to the same run without faults.

Usage::

    python benchmarks/bench_lossy.py                       # 5 % per fault kind, 8 x 15 steps, 1,000 samples
    python benchmarks/bench_lossy.py --quick               # 8 x 15 steps, 300 samples
    python benchmarks/bench_lossy.py --rate 0.08 --kinds each --out /tmp/p11.json

One ``LocalServer(backend="instant", in_subprocess=True)``; between it and the client the TCP
fault proxy of the reliability suite (``tests/reliability/tcp_faults.py``): every column goes
through the proxy, the baseline with every rate at 0, so both do the same work on the same
inputs. The client uses ``Timeout(10, connect=2)``.

Per run: 8 training clients are created at once (slowest creation reported), then 8 threads run
``steps`` x (``forward_backward`` + ``optim_step``, both awaited) on their own client (wall time
and steps/s), then ``samples`` ``sample()`` calls from 16 threads, each timed from call to
result (p50 / p99 / max). Correctness is checked on every run: each model applied exactly its
``2 * steps`` operations once and in order, and each sample's tokens equal the fault-free
answer to its prompt. ``--kinds each`` adds one run per fault kind alone.
Output: a table on stdout and the JSON document (``--out``). ``benchmarks/run.py`` runs the
same workload as row P11 through ``_worker_lossy.py``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "reliability"))

import numpy as np  # noqa: E402
from tcp_faults import Fault, FaultRates, TcpFaultProxy  # noqa: E402

import tinker_sync  # noqa: E402
from tinker_sync import types  # noqa: E402
from tinker_sync.local import LocalServer  # noqa: E402

BASE_MODEL = "Qwen/Qwen3-8B"
SAMPLE_PARAMS = types.SamplingParams(max_tokens=8, temperature=0.0)
SIZES = {
    "full": {"threads": 8, "steps": 15, "samples": 1000, "sample_threads": 16},
    "quick": {"threads": 8, "steps": 15, "samples": 300, "sample_threads": 16},
    "smoke": {"threads": 2, "steps": 2, "samples": 10, "sample_threads": 4},
}


def _datum(i: int) -> types.Datum:
    tokens = (np.arange(i, i + 33, dtype=np.int64) * 7 + i) % 250
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(32, np.float32)},
    )


def _prompt(i: int) -> types.ModelInput:
    return types.ModelInput.from_ints([1 + i % 200, 2 + (i * 3) % 200, 3 + (i * 7) % 200, 4])


def _train(client: Any, steps: int, seed: int) -> None:
    for step in range(steps):
        fb = client.forward_backward([_datum(seed * 100 + step)], "cross_entropy")
        opt = client.optim_step(types.AdamParams(learning_rate=1e-4))
        fb.result()
        opt.result()


def one_run(
    url: str,
    state: Callable[[], dict[str, Any]],
    rates: FaultRates,
    size: dict[str, int],
    seed: int,
    api_key: str = "tml-local",
) -> dict[str, Any]:
    """Create clients, train, sample through a proxy with ``rates``; numbers and checks.

    ``state()`` returns the server's state snapshot (its applied log per model)."""
    with TcpFaultProxy(url, rates, seed=seed) as proxy:
        service = tinker_sync.ServiceClient(
            base_url=proxy.url, api_key=api_key, timeout=tinker_sync.Timeout(10, connect=2)
        )
        try:
            threads = size["threads"]
            with concurrent.futures.ThreadPoolExecutor(max(threads, size["sample_threads"])) as ex:
                t0 = time.monotonic()

                def create() -> tuple[Any, float]:
                    start = time.monotonic()
                    client = service.create_lora_training_client(BASE_MODEL, rank=8)
                    return client, time.monotonic() - start

                made = list(ex.map(lambda _: create(), range(threads)))
                create_s = time.monotonic() - t0
                clients = [c for c, _ in made]
                t0 = time.monotonic()
                list(ex.map(lambda i: _train(clients[i], size["steps"], i), range(threads)))
                train_s = time.monotonic() - t0

                sampler = service.create_sampling_client(base_model=BASE_MODEL)
                latencies: list[float] = [0.0] * size["samples"]
                answers: dict[int, tuple[int, ...]] = {}
                lock = threading.Lock()

                def sample(i: int) -> None:
                    start = time.monotonic()
                    result = sampler.sample(_prompt(i), 1, SAMPLE_PARAMS).result()
                    latencies[i] = time.monotonic() - start
                    with lock:
                        answers[i] = tuple(result.sequences[0].tokens)

                sample_pool = concurrent.futures.ThreadPoolExecutor(size["sample_threads"])
                t0 = time.monotonic()
                list(sample_pool.map(sample, range(size["samples"])))
                sample_wall = time.monotonic() - t0
                sample_pool.shutdown()
            models = state()["models"]
            applied_ok = all(
                [tuple(x) for x in models[c.model_id]["applied"]]
                == [(0, "CreateModel")]
                + [
                    (seq, kind)
                    for step in range(size["steps"])
                    for seq, kind in (
                        (2 * step + 1, "ForwardBackward"),
                        (2 * step + 2, "OptimStep"),
                    )
                ]
                for c in clients
            )
        finally:
            service.close()
        counts = proxy.counts()
        exchanges = len(proxy.exchanges())
    ordered = sorted(latencies)
    return {
        "create_max_s": max(t for _, t in made),
        "create_wall_s": create_s,
        "train_s": train_s,
        "train_steps_per_s": threads * size["steps"] / train_s,
        "sample_p50_s": statistics.median(ordered),
        "sample_p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "sample_max_s": ordered[-1],
        "sample_wall_s": sample_wall,
        "applied_exactly_once_in_order": applied_ok,
        "answers": answers,
        "faults": counts,
        "exchanges": exchanges,
    }


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.getLogger("tinker_sync.health").setLevel(logging.ERROR)  # a line per lost reply
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--rate", type=float, default=0.05, help="probability per fault kind")
    parser.add_argument("--kinds", choices=("all", "each"), default="all")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    size = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    runs: dict[str, FaultRates] = {"none": FaultRates(), "all": FaultRates.each(args.rate)}
    if args.kinds == "each":
        runs.update({k.value: FaultRates.only(k, args.rate) for k in Fault})
    results: dict[str, dict[str, Any]] = {}
    with LocalServer(backend="instant", in_subprocess=True) as server:
        for name, rates in runs.items():
            started = time.monotonic()
            results[name] = one_run(server.url, server.state, rates, size, args.seed)
            print(f"# {name}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    reference = results["none"]["answers"]
    for res in results.values():
        res["answers_right"] = res.pop("answers") == reference
    base = results["none"]
    print(f"P11 lossy network, {args.rate:.0%} per fault kind, size {size}")
    header = f"{'run':<13}{'train s':>9}{'x base':>8}{'p50 s':>8}{'p99 s':>8}{'max s':>8}"
    print(header + f"{'create s':>10}  ok  faults")
    for name, res in results.items():
        ok = res["applied_exactly_once_in_order"] and res["answers_right"]
        print(
            f"{name:<13}{res['train_s']:>9.1f}{res['train_s'] / base['train_s']:>8.2f}"
            f"{res['sample_p50_s']:>8.3f}{res['sample_p99_s']:>8.2f}{res['sample_max_s']:>8.2f}"
            f"{res['create_max_s']:>10.2f}  {'yes' if ok else 'NO '} {res['faults']}"
        )
    row = {
        "id": "P11",
        "name": "lossy network: training wall and sample latency vs the fault-free run",
        "rate": args.rate,
        "size": size,
        "runs": results,
        "train_ratio": results["all"]["train_s"] / base["train_s"],
    }
    if args.out:
        args.out.write_text(json.dumps(row, indent=1, sort_keys=True))
    correct = all(
        r["applied_exactly_once_in_order"] and r["answers_right"] for r in results.values()
    )
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
