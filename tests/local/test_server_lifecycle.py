"""LocalServer lifecycle, controls, subprocess mode and the ``serve`` CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tinker_sync.local import Fault, FaultPlan, LocalServer, RecordedRequest, RequestLog
from tinker_sync.local._admin import AdminChannel, AdminError

ROOT = Path(__file__).resolve().parents[2]
SESSION_BODY = {"tags": [], "sdk_version": "0.38.0", "type": "create_session"}
SAMPLE_BODY = {
    "base_model": "Qwen/Qwen3-8B",
    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
    "sampling_params": {"max_tokens": 3},
    "num_samples": 1,
    "type": "sample",
}


def post(server: LocalServer, endpoint: str, body: Any, **kw: Any) -> requests.Response:
    return requests.post(
        f"{server.url}/api/v1/{endpoint}",
        json=body,
        headers={"X-API-Key": server.api_key or "tml-x"},
        timeout=kw.pop("timeout", 30),
        **kw,
    )


def test_public_exports() -> None:
    import tinker_sync.local as local

    assert {"LocalServer", "Fault", "FaultPlan", "RequestLog", "RecordedRequest"} <= set(
        local.__all__
    )
    assert local.FaultPlan is FaultPlan and local.RecordedRequest is RecordedRequest


def test_start_stop_idempotent_properties_and_temp_dir() -> None:
    server = LocalServer()
    with pytest.raises(RuntimeError):
        _ = server.url
    assert server.start() is server
    port = server.port
    assert server.start() is server and server.port == port
    assert server.url == f"http://127.0.0.1:{port}" == server.base_url
    assert server.env == {"TINKER_BASE_URL": server.url, "TINKER_API_KEY": "tml-local"}
    data_dir = server.data_dir
    assert data_dir.is_dir()
    assert requests.get(server.url + "/api/v1/healthz", timeout=10).status_code == 200
    server.stop()
    assert not data_dir.exists()
    server.stop()
    with pytest.raises(RuntimeError):
        server.start()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=10)


def test_explicit_data_dir_is_kept(tmp_path: Path) -> None:
    with LocalServer(data_dir=tmp_path / "d") as server:
        assert server.data_dir == tmp_path / "d"
        assert post(server, "create_session", SESSION_BODY).status_code == 200
    assert (tmp_path / "d").is_dir() and any((tmp_path / "d").iterdir())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        LocalServer("huge")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LocalServer(protocol="future")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LocalServer(faults=["asample nonsense"])


def test_faults_forms_log_and_api_key() -> None:
    plan = FaultPlan(["create_session 503"])
    with LocalServer(faults=plan, api_key="tml-lifecycle-key") as server:
        assert server.faults is plan
        server.faults.add(Fault(endpoint="healthz", status=500, times=None))
        assert post(server, "create_session", SESSION_BODY).status_code == 503
        assert post(server, "create_session", SESSION_BODY).status_code == 200
        bad = requests.post(
            server.url + "/api/v1/create_session",
            json=SESSION_BODY,
            headers={"X-API-Key": "tml-wrong"},
            timeout=10,
        )
        assert bad.status_code == 401
        log: RequestLog = server.requests
        recs = log.wait_for("create_session", 3)
        assert [r.status for r in recs] == [503, 200, 401]
        assert recs[0].fault == "create_session 503" and recs[1].fault is None
        assert recs[1].json == SESSION_BODY
        assert recs[1].headers["x-api-key"] == "<redacted>"
        assert "tml-lifecycle-key" not in repr(recs) + json.dumps([r.to_dict() for r in recs])
        with pytest.raises(AssertionError, match="healthz 500"):
            server.faults.assert_exhausted()


def test_pause_resume_state_and_client_config() -> None:
    with LocalServer(client_config={"fwdbwd_max_chunk_len": 7}) as server:
        assert post(server, "client/config", {}).json()["fwdbwd_max_chunk_len"] == 7
        server.set_client_config(sample_use_retrieve_futures=True)
        assert post(server, "client/config", {}).json()["sample_use_retrieve_futures"] is True
        server.pause("paused_rate_limit", "maintenance", kind="sampling")
        state = server.state()
        assert state["paused"]["sampling"] == {
            "state": "paused_rate_limit",
            "reason": "maintenance",
        }
        assert state["paused"]["training"] is None
        server.resume()
        assert server.state()["paused"]["sampling"] is None
        with pytest.raises(ValueError):
            server.pause("paused_forever")  # type: ignore[arg-type]


def test_refuse_connections_closes_pooled_connections_and_reopens_same_port() -> None:
    with LocalServer() as server:
        session = requests.Session()
        url = server.url + "/api/v1/healthz"
        assert session.get(url, timeout=10).status_code == 200  # pooled keep-alive connection
        port = server.port
        server.refuse_connections(2.0)
        with pytest.raises(requests.ConnectionError) as info:
            session.get(url, timeout=10)
        assert "refused" in str(info.value).lower()
        assert server.wait_listening(timeout=15)
        assert server.port == port
        assert session.get(url, timeout=10).status_code == 200
        session.close()


def _held_polls(server: LocalServer, n: int) -> list[socket.socket]:
    assert post(server, "create_session", SESSION_BODY).status_code == 200
    rid = post(server, "asample", SAMPLE_BODY).json()["request_id"]
    body = json.dumps({"request_id": rid}).encode()
    request = (
        b"POST /api/v1/retrieve_future HTTP/1.1\r\nHost: x\r\nX-API-Key: tml-local\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(request)
        socks.append(s)
    # a later request on the same loop completes after the polls were read
    assert requests.get(server.url + "/api/v1/healthz", timeout=10).status_code == 200
    return socks


def test_stop_within_5s_while_long_polls_are_held() -> None:
    server = LocalServer(work_delay_s=120, long_poll_s=60).start()
    socks = _held_polls(server, 50)
    t0 = time.monotonic()
    server.stop(timeout=5.0)
    assert time.monotonic() - t0 < 5.0
    for s in socks:
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
        s.close()


def test_admin_api_requires_the_key() -> None:
    with LocalServer() as server:
        assert AdminChannel("127.0.0.1", server.port, "tml-local").call("GET", "info")["port"] == (
            server.port
        )
        with pytest.raises(AdminError) as info:
            AdminChannel("127.0.0.1", server.port, "tml-other").call("GET", "state")
        assert info.value.status == 401
        with pytest.raises(AdminError) as info:
            AdminChannel("127.0.0.1", server.port, "tml-local").call("GET", "nope")
        assert info.value.status == 404


def test_in_subprocess_round_trip_via_admin_api() -> None:
    server = LocalServer(in_subprocess=True, faults=["create_session 500"], long_poll_s=5)
    with server:
        assert server.pid != os.getpid()
        data_dir = server.data_dir
        assert data_dir.is_dir()
        assert post(server, "create_session", SESSION_BODY).status_code == 500
        assert post(server, "create_session", SESSION_BODY).status_code == 200
        recs = server.requests.wait_for("create_session", 2, timeout=10)
        assert [(r.status, r.fault) for r in recs] == [(500, "create_session 500"), (200, None)]
        assert recs[1].json == SESSION_BODY
        assert server.requests.count("create_session", status=200) == 1
        server.faults.assert_exhausted()
        rule = server.faults.add("healthz 503 x2")
        assert rule.remaining == 2
        assert requests.get(server.url + "/api/v1/healthz", timeout=10).status_code == 503
        assert [r.hits for r in server.faults.rules] == [1, 1]
        server.faults.clear()
        assert server.faults.rules == []
        assert requests.get(server.url + "/api/v1/healthz", timeout=10).status_code == 200
        server.requests.clear()
        assert server.requests.count() == 0
        with pytest.raises(TimeoutError):
            server.requests.wait_for("never", 1, timeout=0.2)
        server.pause("paused_capacity", "busy")
        assert server.state()["paused"]["training"] == {
            "state": "paused_capacity",
            "reason": "busy",
        }
        server.resume()
        server.set_client_config(sample_use_retrieve_futures=True)
        assert post(server, "client/config", {}).json()["sample_use_retrieve_futures"] is True
        server.refuse_connections(1.0)
        with pytest.raises(requests.ConnectionError):
            requests.get(server.url + "/api/v1/healthz", timeout=10)
        assert server.requests.count("healthz") == 0  # the admin port is never refused
        assert server.wait_listening(timeout=15)
        assert requests.get(server.url + "/api/v1/healthz", timeout=10).status_code == 200
        proc = server._proc
    assert proc is not None and proc.poll() is not None
    assert not data_dir.exists()
    # the log and the rule counters stay readable after stop
    assert server.requests.count("healthz", status=200) == 1
    assert server.faults.rules == []


# -- CLI ------------------------------------------------------------------------------------


def _spawn_cli(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "tinker_sync.cli.serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_cli_serve_json_line_and_signals(sig: int, code: int) -> None:
    proc = _spawn_cli(
        "--port",
        "0",
        "--backend",
        "instant",
        "--json",
        "--fault",
        "healthz 503",
        "--client-config",
        "fwdbwd_max_chunk_len=9",
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert set(info) == {"url", "api_key", "pid"} and info["pid"] == proc.pid
        url = info["url"]
        assert requests.get(url + "/api/v1/healthz", timeout=10).status_code == 503
        config = requests.post(
            url + "/api/v1/client/config",
            json={},
            headers={"X-API-Key": info["api_key"]},
            timeout=10,
        ).json()
        assert config["fwdbwd_max_chunk_len"] == 9
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_serve_human_output_and_faults_file(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"endpoint": "healthz", "status": 502}, "asample 429 x2"]))
    proc = _spawn_cli("--port", "0", "--backend", "instant", "--faults-file", str(faults))
    try:
        assert proc.stdout is not None
        lines = []
        while not lines or not lines[-1].startswith("Press Ctrl-C"):
            line = proc.stdout.readline()
            assert line, "serve exited early"
            lines.append(line.strip())
        text = "\n".join(lines)
        export = next(line for line in lines if line.startswith("export "))
        url = export.split("TINKER_BASE_URL=")[1].split()[0]
        assert "TINKER_API_KEY=tml-local" in export
        assert "healthz 502" in text and "asample 429" in text
        assert requests.get(url + "/api/v1/healthz", timeout=10).status_code == 502
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "args",
    [
        ["--fault", "asample bogus"],
        ["--client-config", "no_equals_sign"],
        ["--faults-file", "/nonexistent/faults.json"],
    ],
)
def test_cli_serve_bad_options_exit_2(args: list[str]) -> None:
    proc = _spawn_cli("--port", "0", *args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.startswith("Error:")


def test_cli_parse_value() -> None:
    from tinker_sync.cli.serve import parse_value

    assert parse_value("true") is True
    assert parse_value("10") == 10
    assert parse_value("0.5") == 0.5
    assert parse_value("[1, 2]") == [1, 2]
    assert parse_value("hello") == "hello"
