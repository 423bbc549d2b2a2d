"""An RL loop whose rollouts run in worker processes (a spawn ProcessPoolExecutor).

Run::

    python examples/rollout_pool.py                   # 12 steps, 2 worker processes
    python examples/rollout_pool.py --workers 4 --steps 20

The driver owns the LocalServer (tiny backend) and the TrainingClient. Each step it submits
one rollout per group to the pool, passing the current SamplingClient as an argument: the
client travels as a pickle that holds no API key, and each worker finds the key in its own
environment (``TINKER_API_KEY``, inherited from the driver here). The driver turns the scored
groups into a policy-gradient step and saves new weights; the next step's tasks carry the new
sampler. The mean reward (fraction of ``a`` in the answers) rises from about 0 to about 1.

Against the hosted service: drop the LocalServer, export ``TINKER_API_KEY`` and pick a real
base model. Use "spawn" or "forkserver" for pools of tinker_sync clients on any platform (fork
also works with tinker_sync, but not with every library a worker may import).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import toy_rl  # the task shared with rollout_ray.py (this script's directory is on sys.path)
from tqdm import tqdm

import tinker_sync as tinker
from tinker_sync.local import LocalServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--groups", type=int, default=8, help="rollout tasks per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()
    started = time.monotonic()

    with LocalServer(backend="tiny") as server:
        os.environ["TINKER_API_KEY"] = server.api_key  # the workers' credential
        ctx = multiprocessing.get_context("spawn")
        with (
            tinker.ServiceClient(base_url=server.url) as service,
            ProcessPoolExecutor(args.workers, mp_context=ctx) as pool,
        ):
            training = service.create_lora_training_client(toy_rl.MODEL, rank=8, seed=0)
            sampler = training.save_weights_and_get_sampling_client()
            rewards = []
            bar = tqdm(range(args.steps), desc="rl (process pool)", unit="step", file=sys.stderr)
            for step in bar:
                seeds = [step * 1000 + g for g in range(args.groups)]
                futures = [
                    pool.submit(toy_rl.rollout_group, sampler, args.group_size, seed)
                    for seed in seeds
                ]
                groups = [f.result(timeout=300) for f in futures]
                rewards.append(toy_rl.mean_reward(groups))
                bar.set_postfix(reward=f"{rewards[-1]:.3f}")
                tqdm.write(f"step {step:3d}  reward {rewards[-1]:.3f}", file=sys.stdout)
                sampler = toy_rl.train_step(training, groups, args.lr)
            bar.close()
    print(
        f"reward: first {rewards[0]:.3f} -> last {rewards[-1]:.3f}"
        f" ({args.workers} worker processes, {time.monotonic() - started:.1f} s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
