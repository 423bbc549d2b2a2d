"""The examples run end to end in a fresh interpreter (against their embedded local server)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TINKER_TELEMETRY"] = "0"
    # Ray (rollout_ray.py): no usage reports, no killing of workers on a memory spike
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_memory_monitor_refresh_ms="0")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_sl_loop_loss_falls() -> None:
    """examples/sl_loop.py: pipelined supervised fine-tuning of the tiny model learns."""
    out = run_example("sl_loop.py", "--steps", "30")
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([0-9.]+)$", out, re.M)]
    assert len(losses) == 30
    first, last = re.search(r"loss: first ([0-9.]+) -> last ([0-9.]+)", out).groups()  # type: ignore[union-attr]
    assert float(first) == losses[0] and float(last) == losses[-1]
    assert losses[-1] < 0.5 * losses[0]
    assert min(losses[-5:]) < min(losses[:5])
    assert "sample:" in out


def rewards_of(out: str) -> list[float]:
    rewards = [float(x) for x in re.findall(r"^step +\d+ +reward ([0-9.]+)$", out, re.M)]
    first, last = re.search(r"reward: first ([0-9.]+) -> last ([0-9.]+)", out).groups()  # type: ignore[union-attr]
    assert float(first) == rewards[0] and float(last) == rewards[-1]
    return rewards


@pytest.mark.parametrize(
    "example",
    [
        ("rollout_pool.py",),
        ("rollout_ray.py", "--mode", "actors"),
    ],
    ids=["process-pool", "ray-actors"],
)
def test_rollout_examples_learn_the_toy_reward(example: tuple[str, ...]) -> None:
    """examples/rollout_*.py: rollouts in worker processes / on Ray; the mean reward rises."""
    if example[0] == "rollout_ray.py" and not os.environ.get("CI"):
        pytest.importorskip("ray")  # CI installs Ray (test extra): never skipped there
    out = run_example(*example, "--steps", "7", "--groups", "6")
    rewards = rewards_of(out)
    assert len(rewards) == 7
    assert rewards[0] < 0.1 and rewards[-1] > 0.5, rewards
