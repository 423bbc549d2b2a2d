"""``tinker-sync health``: the tenant's shared circuit as other processes left it, and an
optional bounded probe, through the CLI entry point (``main``) against a LocalServer
(docs/cli.md#health, docs/health.md#across-processes)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tinker_sync._config import normalize_base_url
from tinker_sync._credentials import Secret
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync._flow.sharedcircuit import CircuitRecord, open_shared_circuit
from tinker_sync.cli import main
from tinker_sync.local import Fault, LocalServer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def server() -> Iterator[LocalServer]:
    srv = LocalServer(backend="instant").start()
    yield srv
    srv.stop()
    reset_limiters()


def health(
    server: LocalServer, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any], str]:
    args = ["--json", "health", "--base-url", server.url, "--api-key", server.api_key or ""]
    status = main([*args, *extra])
    out, err = capsys.readouterr()
    assert server.api_key and server.api_key not in out + err  # never the key
    return status, json.loads(out), err


def write(server: LocalServer, record: CircuitRecord) -> None:
    identity = Secret(server.api_key or "").sha256()
    shared = open_shared_circuit(normalize_base_url(server.url), identity)
    assert shared is not None
    shared.update(lambda _: record)
    shared.close()


def test_a_tenant_nobody_opened_is_closed_and_the_probe_says_it_answers(server, capsys):
    status, doc, _ = health(server, capsys, "--probe")
    assert status == 0
    assert doc["state"] == "closed" and doc["since"] is None and doc["shared"] is True
    assert doc["credential"] == Secret(server.api_key or "").sha256()[:12]
    assert doc["probe"]["ok"] is True and doc["probe"]["error"] is None
    assert server.requests.count("get_server_capabilities") >= 1
    assert not list(Path(os.environ["TINKER_SYNC_RUNTIME_DIR"]).glob("*.circuit"))  # read only


def test_an_open_circuit_says_since_when_why_and_the_next_probe(server, capsys):
    wall = time.time()
    write(server, CircuitRecord("open", 3, 2, wall - 30.0, wall + 8.0, 0.0, wall, 0, "HTTP 503"))
    status, doc, _ = health(server, capsys)
    assert status == 0 and "probe" not in doc
    assert doc["state"] == "open" and doc["reason"] == "HTTP 503" and doc["failed_probes"] == 2
    assert 7.0 <= doc["next_probe_in_s"] <= 8.0
    since = datetime.datetime.fromisoformat(doc["since"].replace("Z", "+00:00"))
    assert since.timestamp() == pytest.approx(wall - 30.0)
    # a probe out (another process holds the lease): half-open until its lease ends
    write(server, CircuitRecord("open", 3, 2, wall - 30.0, wall, wall + 60.0, wall, 7, "HTTP 503"))
    _, doc, _ = health(server, capsys)
    assert doc["state"] == "half_open" and doc["probe_out_until"] is not None
    write(server, CircuitRecord("closed", 3, 0, wall - 30.0, changed_wall=wall, reason="HTTP 503"))
    _, doc, _ = health(server, capsys)
    assert doc["state"] == "closed" and doc["reason"] == "HTTP 503" and doc["since"] is not None


def test_the_probe_is_bounded_and_does_not_wait_for_an_open_circuit(server, capsys):
    wall = time.time()
    write(server, CircuitRecord("open", 1, 0, wall, wall + 60.0, 0.0, wall, 0, "HTTP 503"))
    server.faults.add(Fault(endpoint="**", status=503, times=None))
    status, doc, _ = health(server, capsys, "--probe", "--timeout", "2")
    assert status == 1
    assert doc["probe"]["ok"] is False and doc["probe"]["error"].startswith("HTTP 503")
    assert doc["state"] == "open"  # the probe neither waited for the circuit nor changed it
    assert len(server.requests.all()) == 1  # one request (the session's config), no retry


def test_the_table_never_shows_the_key(server):
    wall = time.time()
    write(server, CircuitRecord("open", 1, 1, wall, wall + 5.0, 0.0, wall, 0, "HTTP 502"))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TINKER_BASE_URL": server.url,
        "TINKER_API_KEY": server.api_key or "",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tinker_sync", "health"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert (server.api_key or "") not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Tenant health"
    assert any(line.split()[:2] == ["Circuit", "open"] for line in lines)
    assert any(line.startswith("Why") and "HTTP 502" in line for line in lines)
    assert any(line.startswith("Next probe") for line in lines)
