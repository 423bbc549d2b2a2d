"""The RL loop of ``rollout_pool.py`` with its rollouts on Ray: actors, or RayExecutor tasks.

Run::

    python examples/rollout_ray.py                    # 12 steps, 2 rollout actors
    python examples/rollout_ray.py --mode executor    # the same through RayExecutor tasks
    python examples/rollout_ray.py --address auto     # on an existing cluster (ray start ...)

The driver keeps the TrainingClient; Ray workers only sample. ``--mode actors`` (default) starts
one long-lived actor per worker; after each optimizer step the driver saves new weights and
sends every actor the new sampler's handle (a short credential-free string), which the actor
turns back into a SamplingClient with ``SamplingClient.from_sampler_handle``. ``--mode
executor`` submits each rollout as a Ray task through
:class:`tinker_sync.contrib.ray.RayExecutor`, the same ``concurrent.futures`` API the process
pool example uses, with the SamplingClient itself as the argument (Ray pickles it without a
key). Either way the API key reaches the workers through Ray's ``runtime_env``, never
through the pickles or handles.

Note that a ``runtime_env``'s ``env_vars`` are stored in the cluster's metadata (visible to
anyone who can read the job's details). On a shared cluster, prefer keys that the worker
nodes already hold in their environment, or mint a short-lived key per job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import ray
import toy_rl  # the task shared with rollout_pool.py (this script's directory is on sys.path)
from tqdm import tqdm

import tinker_sync as tinker
from tinker_sync.contrib.ray import RayExecutor
from tinker_sync.local import LocalServer


@ray.remote
class RolloutWorker:
    """Holds the current sampler; the driver swaps it with each new checkpoint."""

    def __init__(self) -> None:
        self.sampler: tinker.SamplingClient | None = None

    def set_sampler(self, handle: str) -> None:
        if self.sampler is not None:
            self.sampler.close()
        self.sampler = tinker.SamplingClient.from_sampler_handle(handle)

    def rollout(self, group_size: int, seed: int) -> toy_rl.Group:
        assert self.sampler is not None, "set_sampler first"
        return toy_rl.rollout_group(self.sampler, group_size, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2, help="actors, or CPUs of a local Ray")
    parser.add_argument("--groups", type=int, default=8, help="rollouts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--mode", choices=("actors", "executor"), default="actors")
    parser.add_argument(
        "--address", default=None, help="an existing Ray cluster (default: start one)"
    )
    args = parser.parse_args()
    started = time.monotonic()

    with LocalServer(backend="tiny") as server:
        key_env: dict[str, Any] = {"env_vars": {"TINKER_API_KEY": server.api_key}}
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if args.address:
            ray.init(address=args.address, runtime_env=key_env)
        else:  # a local cluster on loopback (the LocalServer is only reachable from here)
            ray.init(
                num_cpus=args.workers,
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
                runtime_env=key_env,
            )
        try:
            rewards = run(args, server)
        finally:
            ray.shutdown()
    print(
        f"reward: first {rewards[0]:.3f} -> last {rewards[-1]:.3f}"
        f" (Ray {args.mode}, {args.workers} workers, {time.monotonic() - started:.1f} s)",
        flush=True,
    )


def run(args: argparse.Namespace, server: LocalServer) -> list[float]:
    with tinker.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
        training = service.create_lora_training_client(toy_rl.MODEL, rank=8, seed=0)
        sampler = training.save_weights_and_get_sampling_client()
        actors = [RolloutWorker.remote() for _ in range(args.workers)]
        executor = RayExecutor(num_cpus=1) if args.mode == "executor" else None
        rewards = []
        bar = tqdm(range(args.steps), desc=f"rl (Ray {args.mode})", unit="step", file=sys.stderr)
        for step in bar:
            seeds = [step * 1000 + g for g in range(args.groups)]
            if executor is not None:
                futures = [
                    executor.submit(toy_rl.rollout_group, sampler, args.group_size, seed)
                    for seed in seeds
                ]
                groups = [f.result(timeout=300) for f in futures]
            else:
                handle = sampler.get_sampler_handle()
                ray.get([a.set_sampler.remote(handle) for a in actors], timeout=300)
                refs = [
                    actors[i % len(actors)].rollout.remote(args.group_size, seed)
                    for i, seed in enumerate(seeds)
                ]
                groups = ray.get(refs, timeout=300)
            rewards.append(toy_rl.mean_reward(groups))
            bar.set_postfix(reward=f"{rewards[-1]:.3f}")
            tqdm.write(f"step {step:3d}  reward {rewards[-1]:.3f}", file=sys.stdout)
            sampler = toy_rl.train_step(training, groups, args.lr)
        bar.close()
        if executor is not None:
            executor.shutdown()
        return rewards


if __name__ == "__main__":
    main()
