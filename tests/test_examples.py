"""The examples run end to end in a fresh interpreter (against their embedded local server)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TINKER_TELEMETRY"] = "0"
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
