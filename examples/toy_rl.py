"""The toy RL task shared by the rollout examples (``rollout_pool.py``, ``rollout_ray.py``).

The policy writes 12 bytes after ``"Write:"``; the reward is the fraction of them that are the
letter ``a``. The tiny model starts near 0.0 and learns to fill its answers with ``a`` within
about a dozen policy-gradient steps. Worker side: :func:`rollout_group` (sample a group, score
it) runs wherever the examples ship it, with a SamplingClient that arrived pickled or as a
handle. Driver side: :func:`train_step` turns groups into ``importance_sampling`` data with
group-relative advantages and takes one optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import tinker_sync as tinker
from tinker_sync import types

MODEL = "tinker-sync/tiny"
PROMPT = [ord(c) for c in "Write:"]  # the tiny model's tokenizer is byte-level
MAX_TOKENS = 12


@dataclass(frozen=True)
class Group:
    """One prompt's samples, scored in the worker that drew them."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    rewards: list[float]


def reward(tokens: list[int]) -> float:
    """Fraction of the completion that is the letter ``a``."""
    return sum(t == ord("a") for t in tokens) / MAX_TOKENS


def rollout_group(sampler: tinker.SamplingClient, group_size: int, seed: int) -> Group:
    """Worker side: sample ``group_size`` completions of the prompt and score them."""
    response = sampler.sample(
        types.ModelInput.from_ints(PROMPT),
        num_samples=group_size,
        sampling_params=types.SamplingParams(max_tokens=MAX_TOKENS, seed=seed, stop=[]),
    ).result(timeout=120)
    tokens = [list(s.tokens) for s in response.sequences]
    logprobs = [list(s.logprobs or []) for s in response.sequences]
    return Group(tokens, logprobs, [reward(t) for t in tokens])


def to_data(groups: list[Group]) -> list[types.Datum]:
    """Policy-gradient data: each completion weighted by its reward minus its group's mean."""
    data = []
    p = len(PROMPT)
    for group in groups:
        mean = float(np.mean(group.rewards))
        for tokens, logprobs, r in zip(group.tokens, group.logprobs, group.rewards, strict=True):
            if not tokens or r == mean:
                continue  # no learning signal
            full = np.array(PROMPT + tokens, dtype=np.int64)
            n = len(full) - 1
            old = np.zeros(n, np.float32)
            old[p - 1 :] = logprobs
            advantages = np.zeros(n, np.float32)
            advantages[p - 1 :] = r - mean
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={
                        "target_tokens": full[1:],
                        "logprobs": old,
                        "advantages": advantages,
                    },
                )
            )
    return data


def train_step(
    training: tinker.TrainingClient, groups: list[Group], learning_rate: float
) -> tinker.SamplingClient:
    """Driver side: one policy-gradient step; returns a sampler for the new weights."""
    data = to_data(groups)
    if data:
        training.forward_backward(data, "importance_sampling")
        training.optim_step(types.AdamParams(learning_rate=learning_rate))
    return training.save_weights_and_get_sampling_client()


def mean_reward(groups: list[Group]) -> float:
    return float(np.mean([r for g in groups for r in g.rewards]))
