"""The README's code runs as written (issue 6): every python block, and the demo command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TIMEOUT = 240
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(README.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    ),
}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_quickstart_has_exactly_two_commands_demo_and_tests():
    quickstart = README.read_text().split("## Quickstart", 1)[1].split("##", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", quickstart, flags=re.S)
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines == [
        "pip install -e . && tinker-sync demo",
        "pip install -e '.[test]' && pytest",
    ]


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs(index: int, tmp_path: Path):
    code = blocks("python")[index]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=tmp_path,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    if "create_lora_training_client" in code:
        lines = proc.stdout.strip().splitlines()
        losses = [float(line.split()[1]) for line in lines[:-1]]
        assert losses[-1] < 0.3 * losses[0]
        assert lines[-1] == repr(" blue\n")


def test_demo_command_from_the_quickstart_works():
    proc = subprocess.run(
        [sys.executable, "-m", "tinker_sync", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["losses"][-1] < 0.2 * summary["losses"][0]
    assert summary["checkpoints"] and summary["sample_text"].strip()
    assert summary["timings"]["total_s"] < 60
