"""The tinker cookbook's rollout executor with tinker_sync clients: a spawn pool and Ray.

``set_rollout_executor`` ships each group rollout, with its pickled SamplingClient, to an
executor worker. The program (tests/compat/cookbook_rollouts_program.py) runs under ``tinker-sync
exec`` (the ``tinker`` alias), which must reach the pool's and Ray's worker processes too; the
workers get the API key from their environment only (the pickles carry none), and the server,
which accepts only that key, must see every episode's sample exactly once. The cookbook's own
loops on a spawn pool are in tests/compat/test_cookbook.py; this module is about the executor
boundary, and RayExecutor in particular.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tinker_sync._flow.limiter import reset_limiters
from tinker_sync.local import LocalServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KEY = "tml-cookbook-executor-key-0123456789"

if os.environ.get("CI"):  # .ci/run installs the cookbook: never skip there
    import tinker_cookbook  # noqa: F401
else:
    pytest.importorskip("tinker_cookbook")


@pytest.fixture
def srv() -> Iterator[LocalServer]:
    with LocalServer(backend="instant", api_key=KEY, long_poll_s=1.0) as server:
        yield server
    reset_limiters()


def run_program(srv: LocalServer, kind: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    env.update(TINKER_API_KEY=KEY, TINKER_TELEMETRY="0")
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_memory_monitor_refresh_ms="0")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    program = os.path.join(HERE, "cookbook_rollouts_program.py")
    proc = subprocess.run(
        [sys.executable, "-m", "tinker_sync", "exec", "--", sys.executable, program, srv.url, kind],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert KEY not in proc.stdout + proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check(srv: LocalServer, result: dict[str, object]) -> None:
    assert result["sampler_type"] == "tinker_sync.sampling_client"
    assert result["worker_alias"] == [1.0], "every worker's `import tinker` gave tinker_sync"
    assert result["groups"] == [4, 4, 4, 4]
    rewards = result["rewards"]
    assert isinstance(rewards, list) and len(rewards) == 16
    assert all(0.0 <= r <= 1.0 for r in rewards)
    pids = result["pids"]
    assert isinstance(pids, list) and pids and result["driver_pid"] not in pids
    seqs = [r.json["seq_id"] for r in srv.requests.filter("asample")]
    assert len(seqs) == 16 and len(set(seqs)) == 16, "each episode sampled exactly once"


def test_cookbook_rollouts_on_a_spawn_process_pool(srv: LocalServer) -> None:
    check(srv, run_program(srv, "spawn"))


def test_cookbook_rollouts_on_ray_through_ray_executor(srv: LocalServer) -> None:
    if not os.environ.get("CI"):
        pytest.importorskip("ray")
    check(srv, run_program(srv, "ray"))
