"""The tenant circuit across real processes (docs/health.md#across-processes): three spawned
processes of one key against one LocalServer during a 503 storm. What is asserted is what the
server saw, counted against the shared record's failed probes (never durations).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import until  # tests/waiting.py

from tinker_sync._config import normalize_base_url
from tinker_sync._credentials import Secret
from tinker_sync._flow.sharedcircuit import CircuitRecord, open_shared_circuit
from tinker_sync.local import Fault, LocalServer

HANG = 60.0
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROCESSES = 3
WINDOW = 6  # failed probes counted

_CHILD = r"""
import json, sys
import tinker_sync
from tinker_sync import HealthPolicy, types
url, key, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
policy = HealthPolicy(probe_initial_s=0.1, probe_max_s=0.1, probe_jitter=0.0, probe_lease_s=lease)
service = tinker_sync.ServiceClient(base_url=url, api_key=key, health=policy)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
sampler.sample(prompt, 1, params).result(60)
tenant = service._session.limiter.tenant
print(json.dumps({"ready": sampler.sampler_id}), flush=True)
futures = []
for line in sys.stdin:
    command, _, arg = line.strip().partition(" ")
    if command == "go":
        futures += [sampler.sample(prompt, 1, params) for _ in range(int(arg))]
        reply = {"went": int(arg)}
    elif command == "stat":
        reply = {"state": tenant.state, "failed_probes": tenant.snapshot()["failed_probes"],
                 "opens": tenant.opens, "probes": tenant.probes,
                 "expired_probes": tenant.expired_probes}
    elif command == "finish":
        reply = {"done": len([f.result(60) for f in futures])}
    else:
        break
    print(json.dumps(reply), flush=True)
service.close()
"""


class Child:
    def __init__(self, server: LocalServer, env: dict[str, str], lease: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, server.url, server.api_key or "", str(lease)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": REPO, **env},
        )

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.hear()

    def hear(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "a child process died"
        return dict(json.loads(line))

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(HANG)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def server() -> Iterator[LocalServer]:
    srv = LocalServer(backend="instant", long_poll_s=1.0).start()
    yield srv
    srv.stop()


def spawn(server: LocalServer, env: dict[str, str], lease: float = 90.0) -> list[Child]:
    children = [Child(server, env, lease) for _ in range(PROCESSES)]
    for child in children:
        child.hear()  # ready
    return children


def shared_record(server: LocalServer) -> CircuitRecord | None:
    identity = Secret(server.api_key or "").sha256()
    shared = open_shared_circuit(normalize_base_url(server.url), identity, create=False)
    if shared is None:
        return None
    try:
        return shared.read()
    finally:
        shared.close()


def failed_probes(server: LocalServer) -> int:
    rec = shared_record(server)
    return rec.failed_probes if rec is not None and rec.state == "open" else -1


def sent_since(server: LocalServer, count: int) -> int:
    """Requests the server got after its first ``count``, session heartbeats aside (one per
    process every 10 s, never parked: they keep the session alive, docs/health.md)."""
    return sum(r.endpoint != "session_heartbeat" for r in server.requests.all()[count:])


def storm(server: LocalServer, children: list[Child]) -> None:
    """Every request answered 503 while each process has samples to send."""
    server.faults.add(Fault(endpoint="**", status=503, times=None))
    for child in children:
        child.ask("go 5")


def test_an_opening_parks_every_process_and_one_probe_at_a_time_goes_out(server):
    children = spawn(server, {})
    try:
        storm(server, children)
        until(lambda: failed_probes(server) >= 2)
        rec = shared_record(server)
        assert rec is not None
        first, count = rec.failed_probes, server.requests.count()
        until(lambda: failed_probes(server) >= first + WINDOW)
        rec_after = shared_record(server)
        assert rec_after is not None and rec_after.epoch == rec.epoch  # one opening throughout
        sent = sent_since(server, count)
        # The probes only, as for one process (a probe may straddle each end); per-process
        # circuits sent one probe per process per round (about 3 * WINDOW).
        assert WINDOW - 2 <= sent <= WINDOW + 2, sent
        stats = [child.ask("stat") for child in children]
        assert all(s["state"] != "closed" and s["opens"] == 1 for s in stats)
        server.faults.clear()
        assert [child.ask("finish") for child in children] == [{"done": 5}] * PROCESSES
        rec = shared_record(server)
        assert rec is not None and rec.state == "closed"
        accepted = [
            (r.json["sampling_session_id"], r.json["seq_id"])
            for r in server.requests.filter("asample", status=200)
        ]
        assert len(set(accepted)) == PROCESSES * 6  # nothing lost
    finally:
        for child in children:
            child.stop()


def test_the_switch_keeps_the_circuit_per_process(server):
    children = spawn(server, {"TINKER_SYNC_SHARED_BACKOFF": "0"})
    try:
        storm(server, children)

        def probed() -> list[int]:
            return [int(child.ask("stat")["failed_probes"]) for child in children]

        until(lambda: min(probed()) >= 2)
        first, count = probed(), server.requests.count()
        until(lambda: probed()[0] >= first[0] + WINDOW)
        sent = sent_since(server, count)
        assert sent > WINDOW + 2, sent  # every process probes on its own
        assert shared_record(server) is None
        assert not list(Path(os.environ["TINKER_SYNC_RUNTIME_DIR"]).glob("*.circuit"))
    finally:
        server.faults.clear()  # close() in the children is answered
        for child in children:
            child.stop()


def test_a_crashed_probers_lease_expires_and_another_process_probes(server):
    """A prober that died holding the lease (written here as it would have left it): the
    processes wait for the lease, then one of them probes and the answer closes it."""
    identity = Secret(server.api_key or "").sha256()
    shared = open_shared_circuit(normalize_base_url(server.url), identity)
    assert shared is not None
    children = spawn(server, {}, lease=1.0)
    try:
        wall = time.time()
        dead = CircuitRecord(
            "open", 1, 0, wall, wall, wall + 1.0, wall, 12345, "HTTP 503 (a crashed prober)"
        )
        shared.update(lambda _: dead)
        count = server.requests.count()
        for child in children:
            child.ask("go 3")
        assert [child.ask("finish") for child in children] == [{"done": 3}] * PROCESSES
        after = server.requests.all()[count:]
        assert min(r.time for r in after) >= dead.lease_wall - 0.05  # nothing before it ended
        rec = shared.read()
        assert rec is not None and rec.state == "closed"
        stats = [child.ask("stat") for child in children]
        assert sum(s["expired_probes"] for s in stats) == 1 and sum(s["probes"] for s in stats) == 1
    finally:
        shared.close()
        for child in children:
            child.stop()
