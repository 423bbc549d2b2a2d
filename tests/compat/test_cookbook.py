"""tinker-cookbook 0.6.1 runs unchanged on tinker_sync, through the `tinker` alias, offline.

``cookbook_programs.py`` runs the cookbook's loops as a real program (``tinker-sync exec --
python ...``) against one local server with the tiny backend: the supervised loop
(checkpoints every step, the sampling-client and training-client NLL evaluators, resume after
an interruption), ``weights.download`` of its final state (an age-encrypted export), DPO, and RL (sync, async off-policy with stable_reinforce, stream-minibatch,
KL penalty, resume, rollouts in a spawn ProcessPoolExecutor). On the deterministic paths (SL,
DPO) the same program also runs on the official ``tinker`` SDK against the same server, and
every logged metric must be equal, number for number. One process per SDK runs every loop
in turn, to keep the module fast.

This module installs nothing. It runs when tinker_cookbook 0.6.1 is importable; CI installs
it (``.ci/run``), and there a missing cookbook or official SDK fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("cookbook_programs.py")
TIMEOUT = 280
DETERMINISTIC = ["sl", "sl_resume", "download", "dpo"]
RL = ["rl_sync", "rl_sync_resume", "rl_async", "rl_stream", "rl_kl", "rl_spawn"]


def _missing(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    if module == "tinker_cookbook":
        from importlib.metadata import version

        if version("tinker_cookbook") != "0.6.1":
            return f"tinker_cookbook {version('tinker_cookbook')} is installed, not 0.6.1"
    return None


def _require(*modules: str) -> None:
    for module in modules:
        reason = _missing(module)
        if reason is None:
            continue
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must install it (.ci/run)")
        pytest.skip(reason)


def run(
    server: Any, capabilities: list[str], workdir: Path, *, official: bool = False
) -> dict[str, dict[str, Any]]:
    """Run the capabilities in one process; ``official`` uses the official SDK, not the alias."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "PYTHONPATH"))}
    env.update(
        TINKER_BASE_URL=server.url,
        TINKER_API_KEY=server.api_key,
        TINKER_TELEMETRY="0",
        PYTHONPATH=str(REPO),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    cmd = [sys.executable, str(PROGRAM), ",".join(capabilities), str(workdir)]
    if not official:
        cmd = [sys.executable, "-m", "tinker_sync", "exec", "--", *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{capabilities} failed:\n{proc.stderr[-6000:]}"
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["capability"] for r in results] == capabilities
    assert {r["sdk"] for r in results} == {"tinker" if official else "tinker_sync"}
    return {r["capability"]: r for r in results}


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    _require("tinker_cookbook")
    from tinker_sync.local import LocalServer

    with LocalServer(backend="tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cookbook")


@pytest.fixture(scope="module")
def ours(server: Any, workdir: Path) -> dict[str, dict[str, Any]]:
    return run(server, DETERMINISTIC + RL, workdir / "tinker_sync")


@pytest.fixture(scope="module")
def theirs(server: Any, workdir: Path) -> dict[str, dict[str, Any]]:
    _require("tinker")
    return run(server, DETERMINISTIC, workdir / "official", official=True)


def steps(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RL training steps (the loop also logs a closing row without rollouts)."""
    return [row for row in trace if "env/all/reward/total" in row]


def test_supervised_loop_with_evaluators_checkpoints_and_resume(
    ours: dict[str, dict[str, Any]], workdir: Path
) -> None:
    first, resumed = ours["sl"]["trace"], ours["sl_resume"]["trace"]
    assert len(first) == 2
    # resumed from the step-1 checkpoint (next batch: 1): step 0 is kept, steps 1..3 are
    # trained on the longer schedule
    assert len(resumed) == 4 and resumed[0] == first[0] and resumed[1] != first[1]
    for row in resumed:
        assert "sampler_test/nll" in row and "train_mean_nll" in row  # every step
    assert "test/nll" in resumed[0] and "test/nll" in resumed[2]  # every 2nd step
    records = (workdir / "tinker_sync" / "sl" / "checkpoints.jsonl").read_text().splitlines()
    names = [json.loads(r)["name"] for r in records]
    assert len(names) >= 4 and names[-1] == "final"  # one per step, then the final one


def test_weights_download_decrypts_an_encrypted_export(ours: dict[str, dict[str, Any]]) -> None:
    # the tiny backend's adapter files, decrypted (the official SDK's run downloads the same
    # bytes: the download is in the number-for-number comparison below)
    files = {f["file"] for f in ours["download"]["trace"]}
    assert files == {"adapter_model.npz", "adapter_config.json"}


def test_supervised_and_dpo_traces_equal_the_official_sdks_number_for_number(
    ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]
) -> None:
    assert len(ours["dpo"]["trace"]) == 3
    assert all("dpo_loss" in row for row in ours["dpo"]["trace"])
    for capability in DETERMINISTIC:
        assert ours[capability]["trace"] == theirs[capability]["trace"], capability


@pytest.mark.parametrize(
    ("capability", "marker"),
    [
        ("rl_sync", "optim/kl_sample_train_v1"),
        ("rl_async", "async/staleness_max"),  # off-policy, trained with stable_reinforce
        ("rl_stream", "optim/kl_sample_train_v1"),
        ("rl_kl", "kl_policy_base"),
    ],
)
def test_rl_loops(
    ours: dict[str, dict[str, Any]], workdir: Path, capability: str, marker: str
) -> None:
    trace = steps(ours[capability]["trace"])
    assert len(trace) == 2
    for row in trace:
        assert marker in row and row["env/all/total_episodes"] == 4
    log_dir = workdir / "tinker_sync" / capability
    assert len((log_dir / "checkpoints.jsonl").read_text().splitlines()) >= 2


def test_rl_resume(ours: dict[str, dict[str, Any]]) -> None:
    first, resumed = steps(ours["rl_sync"]["trace"]), steps(ours["rl_sync_resume"]["trace"])
    assert len(resumed) == 3 and resumed[0] == first[0]


def test_rl_rollouts_in_spawn_process_pool(ours: dict[str, dict[str, Any]]) -> None:
    """set_rollout_executor(ProcessPoolExecutor(spawn)): the workers get the alias too."""
    trace = steps(ours["rl_spawn"]["trace"])
    assert len(trace) == 1 and trace[0]["env/all/total_episodes"] == 4
