"""A tinker cookbook rollout batch whose group rollouts run on an executor, through tinker_sync.

Run by tests/compat/test_cookbook_executor.py, under the ``tinker`` alias::

    TINKER_API_KEY=... tinker-sync exec -- python tests/compat/cookbook_rollouts_program.py URL spawn|ray

The cookbook says ``import tinker``; ``tinker-sync exec`` makes that tinker_sync in this process
and in every worker it starts (spawn pool workers and Ray workers inherit the environment that
turns the alias on). The program registers the executor with ``set_rollout_executor``, runs
four groups of four single-turn episodes with ``do_group_rollout_and_filter_constant_reward``
(the call the cookbook's RL loops make) and prints one JSON line: which processes ran the
episodes, their rewards, and the class of the sampling client the workers used.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor

import tinker
from tinker_cookbook.rl.rollouts import (
    do_group_rollout_and_filter_constant_reward,
    set_rollout_executor,
)
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, StepResult

BASE = "Qwen/Qwen3-8B"
PROMPT = [ord(c) for c in "Write:"]
GROUPS = 4
GROUP_SIZE = 4


class LetterEnv(Env):
    """One turn: the reward is the fraction of ``a`` in the answer; records its process."""

    async def initial_observation(self) -> tuple[tinker.ModelInput, list[int]]:
        return tinker.ModelInput.from_ints(PROMPT), []

    async def step(self, action: list[int], *, extra: object = None) -> StepResult:
        return StepResult(
            reward=sum(t == ord("a") for t in action) / max(len(action), 1),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[],
            # this worker's `tinker` is tinker_sync (1) or the official SDK (0)
            metrics={"pid": os.getpid(), "alias": float(tinker.__name__ == "tinker_sync")},
        )


class LetterGroup(EnvGroupBuilder):
    async def make_envs(self) -> Sequence[Env]:
        return [LetterEnv() for _ in range(GROUP_SIZE)]


def make_executor(kind: str) -> Executor:
    if kind == "spawn":
        return ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    import ray

    from tinker_sync.contrib.ray import RayExecutor  # tinker.contrib.ray under the alias

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"TINKER_API_KEY": os.environ["TINKER_API_KEY"]}},
    )
    return RayExecutor()


async def run(base_url: str, kind: str) -> dict[str, object]:
    executor = make_executor(kind)
    set_rollout_executor(executor)
    try:
        with tinker.ServiceClient(base_url=base_url) as service:
            sampler = service.create_sampling_client(base_model=BASE)
            groups = await asyncio.gather(
                *[
                    do_group_rollout_and_filter_constant_reward(
                        sampler,
                        LetterGroup(),
                        max_tokens=8,
                        temperature=1.0,
                        do_remove_constant_reward_groups=False,
                        enable_logging=False,
                    )
                    for _ in range(GROUPS)
                ]
            )
    finally:
        set_rollout_executor(None)
        executor.shutdown(wait=True)
    pids = sorted(
        {
            int(t.transitions[-1].metrics["pid"])
            for g in groups
            if g is not None
            for t in g.trajectories_G
        }
    )
    return {
        "driver_pid": os.getpid(),
        "pids": pids,
        "groups": [None if g is None else len(g.trajectories_G) for g in groups],
        "rewards": [r for g in groups if g is not None for r in g.get_total_rewards()],
        "sampler_type": type(sampler).__module__,
        "worker_alias": sorted(
            {t.transitions[-1].metrics["alias"] for g in groups if g for t in g.trajectories_G}
        ),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(sys.argv[1], sys.argv[2]))), flush=True)
