"""The ``tinker-sync`` CLI end to end: commands run in subprocesses against
``tinker-sync serve --json --port 0 --backend instant`` (also a subprocess), plus in-process
``main()`` checks of options, errors and exit codes."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tinker_sync
from tinker_sync.cli import main
from tinker_sync.testing import reset_process_state

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60.0


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TINKER_PROJECT_ID", None)
    env.update(extra or {})
    return env


class Served:
    """A ``tinker-sync serve`` subprocess with seeded runs and checkpoints."""

    def __init__(self, tmp: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tinker_sync",
                "serve",
                "--json",
                "--port",
                "0",
                "--backend",
                "instant",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(),
            text=True,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(TIMEOUT)
        assert line and line[0].strip(), "serve did not report its URL"
        info = json.loads(line[0])
        assert set(info) == {"url", "api_key", "pid"}
        self.url: str = info["url"]
        self.key: str = info["api_key"]
        self.env = cli_env({"TINKER_BASE_URL": self.url, "TINKER_API_KEY": self.key})
        service = tinker_sync.ServiceClient(base_url=self.url, api_key=self.key)
        first = service.create_lora_training_client("tinker-sync/tiny", rank=4)
        second = service.create_lora_training_client("tinker-sync/tiny", rank=2)
        self.run_id = first.model_id
        self.other_run_id = second.model_id
        self.weights = first.save_state("s1").result(TIMEOUT).path
        self.sampler = first.save_weights_for_sampler("w1").result(TIMEOUT).path
        self.external = first.save_weights_external("e1").result(TIMEOUT).path
        second.save_state("t1").result(TIMEOUT)
        self.training = first
        self.service = service

    def checkpoint(self, name: str) -> str:
        return self.training.save_state(name).result(TIMEOUT).path

    def stop(self) -> int:
        self.service.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        return code


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("served"))
    yield s
    assert s.stop() == 0  # serve exits 0 on SIGTERM
    reset_process_state()


def cli(
    served: Served | None,
    *args: str,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tinker_sync", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=env if env is not None else (served.env if served else cli_env()),
        cwd=cwd,
        timeout=TIMEOUT,
    )


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_aligned(lines: list[str]) -> None:
    """Header and rows start every column at the offsets given by the dashed rule."""
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "} and "-" in line)
    starts = [
        i for i, ch in enumerate(lines[rule]) if ch == "-" and (i == 0 or lines[rule][i - 1] == " ")
    ]
    for line in [lines[rule - 1], *lines[rule + 1 :]]:
        for start in starts[1:]:
            assert line[start - 2 : start] == "  ", (line, start)
            assert line[start] != " ", (line, start)


# -- subprocess: every command -------------------------------------------------------------


def test_version_table_and_json() -> None:
    proc = cli(None, "version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"tinker-sync {tinker_sync.__version__} (protocol 0.38.0)"
    doc = as_json(cli(None, "--json", "version"))
    assert doc["tinker_sync"] == tinker_sync.__version__ and doc["protocol"] == "0.38.0"
    assert doc["python"].count(".") == 2


def test_model_list(served: Served) -> None:
    proc = cli(served, "model", "list")
    assert proc.returncode == 0, proc.stderr
    lines = table_lines(proc.stdout)
    assert lines[1].split() == ["Model", "Max", "Context", "Trainable", "Sampleable"]
    assert any(line.startswith("tinker-sync/tiny ") for line in lines)
    assert_aligned(lines)


def test_run_list_and_info(served: Served) -> None:
    doc = as_json(cli(served, "run", "list", "--limit", "1", "--json"))
    assert len(doc["runs"]) == 1 and doc["total_count"] == 2
    assert doc["runs"][0]["last_request_time"].endswith("Z")
    proc = cli(served, "run", "list", "-c", "id,lora,checkpoint")
    assert proc.returncode == 0, proc.stderr
    lines = table_lines(proc.stdout)
    assert lines[0] == "2 training runs"
    assert lines[1].split() == ["Run", "ID", "LoRA", "Last", "Checkpoint"]
    assert_aligned(lines)
    assert any(served.run_id in line and "Rank 4" in line for line in lines)
    proc = cli(served, "run", "info", served.run_id)
    assert proc.returncode == 0, proc.stderr
    assert f"Training run: {served.run_id}" in proc.stdout
    assert served.weights in proc.stdout  # the last training checkpoint's path


def test_api_error_goes_to_stderr_with_exit_1(served: Served) -> None:
    proc = cli(served, "run", "info", "no-such-run")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("Error: Resource not found\n")
    assert "no-such-run" in proc.stderr
    assert "HTTP 404: " in proc.stderr and "{'detail'" not in proc.stderr  # words, not a dict


def test_json_errors_are_one_json_document_on_stderr(served: Served) -> None:
    proc = cli(served, "--json", "run", "info", "no-such-run")
    assert proc.returncode == 1 and proc.stdout == ""
    doc = json.loads(proc.stderr)["error"]
    assert doc["message"] == "Resource not found" and doc["type"] == "NotFoundError"
    assert doc["status_code"] == 404 and "no-such-run" in doc["details"]


def test_version_flag() -> None:
    proc = cli(None, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"tinker-sync {tinker_sync.__version__} (protocol ")


def test_authentication_error(served: Served) -> None:
    proc = cli(served, "--api-key", "tml-wrong", "run", "list")
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: Authentication failed\n")
    assert "tml-wrong" not in proc.stderr


def test_checkpoint_list_and_info(served: Served) -> None:
    proc = cli(served, "checkpoint", "list", "--run-id", served.run_id)
    assert proc.returncode == 0, proc.stderr
    lines = table_lines(proc.stdout)
    assert lines[0].endswith(f"checkpoints for run {served.run_id}")
    assert_aligned(lines)
    assert any(line.startswith("weights/s1 ") and "training" in line for line in lines)
    doc = as_json(cli(served, "checkpoint", "info", served.weights, "-f", "json"))
    assert doc["tinker_path"] == served.weights and doc["checkpoint_type"] == "training"
    assert doc["training_run"]["training_run_id"] == served.run_id
    assert doc["time"].endswith("Z")


def test_publish_unpublish_and_ttl(served: Served) -> None:
    path = served.checkpoint("pub")
    proc = cli(served, "checkpoint", "publish", path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"Published {path}"
    doc = as_json(cli(served, "checkpoint", "unpublish", path, "--json"))
    assert doc == {"tinker_path": path, "public": False, "changed": True}
    doc = as_json(cli(served, "--json", "checkpoint", "set-ttl", path, "--ttl", "3600"))
    assert doc == {"tinker_path": path, "ttl_seconds": 3600}
    listing = served.service.create_rest_client().list_checkpoints(served.run_id).result()
    (ckpt,) = [c for c in listing.checkpoints if c.tinker_path == path]
    assert ckpt.expires_at is not None and ckpt.public is False
    proc = cli(served, "checkpoint", "set-ttl", path)
    assert proc.returncode == 2
    assert "--ttl" in proc.stderr and "--remove" in proc.stderr


def test_delete_paths_and_filtered_run(served: Served) -> None:
    a, b = served.checkpoint("del-a"), served.checkpoint("del-b")
    doc = as_json(cli(served, "--json", "checkpoint", "delete", a, b, "-y"))
    assert doc["deleted_count"] == 2 and sorted(doc["deleted"]) == sorted([a, b])
    assert doc["failed"] == []
    # a filtered run deletion, confirmed on stdin: only training checkpoints of the other run
    proc = cli(
        served,
        "checkpoint",
        "delete",
        "--run-id",
        served.other_run_id,
        "--type",
        "weights",
        "--after",
        "2000-01-01",
        stdin="y\n",
    )
    assert proc.returncode == 0, proc.stderr
    assert "Will delete 1 checkpoint" in proc.stderr and "[y/N]" in proc.stderr
    assert proc.stdout.strip() == "Deleted 1 checkpoint"
    listing = served.service.create_rest_client().list_checkpoints(served.other_run_id).result()
    assert listing.checkpoints == []


def test_download_external_with_and_without_force(served: Served, tmp_path: Path) -> None:
    proc = cli(served, "checkpoint", "download", served.external, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    name = f"{served.run_id}_external_weights_e1".replace(":", "-")  # portable names
    target = tmp_path / name
    files = sorted(p.name for p in target.iterdir())
    assert files and "Downloaded to" in proc.stdout
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())
    again = cli(served, "checkpoint", "download", served.external, cwd=tmp_path)
    assert again.returncode == 1
    assert again.stderr.startswith("Error: Target directory already exists")
    assert "--force" in again.stderr
    (target / "stale.txt").write_text("old")
    doc = as_json(
        cli(
            served,
            "--json",
            "checkpoint",
            "download",
            served.external,
            "--force",
            "-o",
            str(tmp_path),
        )
    )
    assert Path(doc["destination"]) == target
    assert doc["files"] == files and doc["size_bytes"] == sum(
        (target / f).stat().st_size for f in files
    )
    assert not (target / "stale.txt").exists()


def test_download_training_checkpoint_needs_no_run_or_session(
    served: Served, tmp_path: Path
) -> None:
    rest = served.service.create_rest_client()
    runs = rest.list_training_runs(limit=1000).result(TIMEOUT).training_runs
    sessions = rest.list_sessions(limit=1000).result(TIMEOUT).sessions
    proc = cli(served, "checkpoint", "download", served.weights, "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "Exporting" not in proc.stderr
    target = tmp_path / "out" / f"{served.run_id}_weights_s1".replace(":", "-")
    assert sorted(p.name for p in target.iterdir())
    assert "(what checkpoint list counts)" in proc.stdout and "archive (tar)" in proc.stdout
    # nothing new in `run list`, no session
    assert rest.list_training_runs(limit=1000).result(TIMEOUT).training_runs == runs
    assert rest.list_sessions(limit=1000).result(TIMEOUT).sessions == sessions
    sampler = cli(served, "checkpoint", "download", served.sampler, cwd=tmp_path)
    assert sampler.returncode == 2 and "Sampler checkpoints cannot be downloaded" in sampler.stderr


def test_download_json_reports_bytes_digest_attempts_and_resumes(
    served: Served, tmp_path: Path
) -> None:
    from urllib.parse import urlsplit

    from tinker_sync.local._admin import AdminChannel, RemoteFaultPlan

    listed = as_json(cli(served, "--json", "checkpoint", "list", "--run-id", served.run_id))
    size = next(
        c["size_bytes"] for c in listed["checkpoints"] if c["tinker_path"] == served.weights
    )
    port = urlsplit(served.url).port
    assert port is not None
    plan = RemoteFaultPlan(AdminChannel("127.0.0.1", port, served.key))
    plan.add("/_files/** cut_at=700 x2")
    try:
        doc = as_json(
            cli(served, "--json", "checkpoint", "download", served.weights, "-o", str(tmp_path))
        )
    finally:
        plan.clear()
    target = Path(doc["path"])
    assert target.parent == tmp_path and ":" not in target.name
    assert doc["bytes"] == doc["size_bytes"] == size  # the listed size counts the same files
    assert doc["attempts"] == 3 and doc["resumed_bytes"] == 700 + 1400
    assert doc["bytes_transferred"] == doc["fetched_bytes"] > doc["bytes"]
    assert doc["digest"].startswith("sha256:") and doc["verified_by"] == "repr-digest"
    table = cli(served, "checkpoint", "download", served.weights, "--force", "-o", str(tmp_path))
    assert table.returncode == 0, table.stderr
    assert "/s" in table.stdout and "Transferred" in table.stdout  # speed


def test_download_progress_bar_on_a_tty(served: Served, tmp_path: Path) -> None:
    master, slave = pty.openpty()
    # a pty starts at 0x0 characters, where tqdm draws nothing: give it a real size
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tinker_sync", "checkpoint", "download", served.external],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            env=served.env,
            cwd=tmp_path,
        )
        os.close(slave)
        slave = -1
        chunks: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 4096)
                except OSError:
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        out, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    assert proc.returncode == 0
    drawn = b"".join(chunks).decode("utf-8", "replace")
    assert "B/s" in drawn or "/s]" in drawn  # tqdm's rate column
    assert b"Downloaded to" in out


def test_ctrl_c_exits_130(served: Served) -> None:
    path = served.checkpoint("sigint")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinker_sync", "checkpoint", "delete", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=served.env,
        text=True,
    )
    seen = ""
    assert proc.stderr is not None
    while "[y/N]" not in seen:  # the prompt has no newline: read char by char
        ch = proc.stderr.read(1)
        assert ch, f"no prompt; stderr so far: {seen!r}"
        seen += ch
    proc.send_signal(signal.SIGINT)
    proc.wait(TIMEOUT)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    assert proc.returncode == 130
    listing = served.service.create_rest_client().list_checkpoints(served.run_id).result()
    assert path in {c.tinker_path for c in listing.checkpoints}


def test_demo_is_delegated(served: Served) -> None:
    import importlib.util

    proc = cli(
        served,
        "--json",
        "demo",
        "--base-url",
        served.url,
        "--api-key",
        served.key,
        "--backend",
        "instant",
        "--steps",
        "2",
        "--max-tokens",
        "4",
    )
    if importlib.util.find_spec("tinker_sync.cli.demo") is None:
        assert proc.returncode == 1 and "demo is not available" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["losses"]) == 2


def test_demo_quiet_prints_nothing_and_draws_no_bar_into_a_pipe(served: Served) -> None:
    args = ("--base-url", served.url, "--api-key", served.key, "--steps", "2")
    proc = cli(served, "demo", "-q", *args, "--backend", "instant", "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    loud = cli(served, "demo", *args, "--backend", "instant", "--max-tokens", "4")
    assert loud.returncode == 0, loud.stderr
    assert "loss:" in loud.stdout
    assert "fine-tuning" not in loud.stderr and "\r" not in loud.stderr  # stderr is a pipe


def test_demo_against_nothing_says_where_and_why(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from tinker_sync._runtime.clock import SYSTEM_CLOCK
    from tinker_sync.testing import VirtualSleepClock

    clock = VirtualSleepClock()  # the 60 s retry window passes in virtual time
    names = ("monotonic", "sleep", "random")
    for name in names:
        setattr(SYSTEM_CLOCK, name, getattr(clock, name))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("TINKER_API_KEY", "tml-x")
    caplog.set_level(logging.WARNING, logger="tinker_sync.health")
    try:
        code, out, err = run_main(capsys, "demo", "--base-url", url, "--max-tokens", "4")
    finally:
        for name in names:
            delattr(SYSTEM_CLOCK, name)
    assert code == 1 and out == ""
    assert f"connecting to {url}" in err
    assert f"cannot reach the Tinker server at {url}" in caplog.text  # the WARNING, at once
    assert "Error: Connection failed" in err and "gave up after" in err
    assert sum(clock.delays("http-retry")) <= 60.0


def test_usage_errors_exit_2() -> None:
    assert cli(None).returncode == 2
    assert cli(None, "nonsense").returncode == 2
    proc = cli(None, "run", "list", "-c", "id,bogus")
    assert proc.returncode == 2 and "bogus" in proc.stderr


# -- in-process main(): options, filters, errors --------------------------------------------


@pytest.fixture
def env(served: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    monkeypatch.setenv("TINKER_BASE_URL", served.url)
    monkeypatch.setenv("TINKER_API_KEY", served.key)
    return served


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_global_options_work_after_the_command(
    env: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(capsys, "model", "list", "TINY", "--json")
    assert code == 0
    assert [m["model_name"] for m in json.loads(out)["models"]] == ["tinker-sync/tiny"]
    code, out, err = run_main(capsys, "model", "list", "no-such-model")
    assert code == 1 and out == "" and err.startswith("Error: No model name contains")


def test_list_limits_and_pagination(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "--json", "checkpoint", "list", "--limit", "0")
    assert code == 0
    doc = json.loads(out)
    assert len(doc["checkpoints"]) == doc["total_count"] >= 3
    code, out, _ = run_main(capsys, "checkpoint", "list", "--limit", "1")
    assert code == 0
    first = out.splitlines()[0]
    assert first.startswith("1 checkpoint (") and "more not shown" in first
    code, out, _ = run_main(capsys, "--json", "run", "list", "--limit", "0")
    doc = json.loads(out)
    assert len(doc["runs"]) == doc["total_count"] >= 2


def test_delete_rules(
    env: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(capsys, "checkpoint", "delete")
    assert code == 2 and err.startswith("Error: Specify checkpoint paths or --run-id")
    code, _, err = run_main(capsys, "checkpoint", "delete", env.weights, "--run-id", env.run_id)
    assert code == 2 and "mutually exclusive" in err
    code, _, err = run_main(capsys, "checkpoint", "delete", "--type", "weights")
    assert code == 2 and "need --run-id" in err
    code, _, err = run_main(
        capsys, "checkpoint", "delete", "--run-id", env.run_id, "--before", "yesterday"
    )
    assert code == 2 and "invalid date" in err
    code, _, err = run_main(capsys, "checkpoint", "delete", "not-a-path", "-y")
    assert code == 2 and "Invalid checkpoint path" in err
    # nothing matches: a filter in the distant past
    code, out, _ = run_main(
        capsys,
        "checkpoint",
        "delete",
        "--run-id",
        env.run_id,
        "--before",
        "2000-01-01T00:00:00Z",
        "-y",
    )
    assert code == 0 and "match the filters" in out
    # declined confirmation: nothing deleted, exit 1
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    code, _, err = run_main(capsys, "checkpoint", "delete", env.weights)
    assert code == 1 and "Deletion cancelled." in err
    listing = env.service.create_rest_client().list_checkpoints(env.run_id).result()
    assert env.weights in {c.tinker_path for c in listing.checkpoints}


def test_delete_reports_failures(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"tinker://{env.run_id}/weights/never-saved"
    code, out, err = run_main(capsys, "--json", "checkpoint", "delete", missing, "-y")
    assert code == 1
    doc = json.loads(out)
    assert doc["deleted_count"] == 0
    assert doc["failed"] == [{"tinker_path": missing, "error": "Resource not found"}]


def test_publish_is_idempotent(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    path = env.checkpoint("pub-twice")
    assert run_main(capsys, "checkpoint", "publish", path)[0] == 0
    code, out, _ = run_main(capsys, "checkpoint", "publish", path)
    assert code == 0 and out.strip() == f"{path} is already public"
    code, _, err = run_main(capsys, "checkpoint", "publish", f"tinker://{env.run_id}/weights/nope")
    assert code == 1 and err.startswith("Error: Checkpoint not found")


def test_set_ttl_remove_and_quiet(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    path = env.checkpoint("ttl")
    code, out, _ = run_main(capsys, "-q", "checkpoint", "set-ttl", path, "--ttl", "60")
    assert code == 0 and out == ""
    code, out, _ = run_main(capsys, "checkpoint", "set-ttl", path, "--remove")
    assert code == 0 and out.strip() == f"Removed the expiry of {path}"
    listing = env.service.create_rest_client().list_checkpoints(env.run_id).result()
    (ckpt,) = [c for c in listing.checkpoints if c.tinker_path == path]
    assert ckpt.expires_at is None


def test_no_progress_and_json_never_draw_a_bar(
    env: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for extra in (["--no-progress"], ["--json"]):
        err, out = Tty(), io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(sys, "stdout", out)
        code = main(
            ["checkpoint", "download", env.external, "-o", str(tmp_path), "--force", *extra]
        )
        assert code == 0
        assert "B/s" not in err.getvalue() and "%|" not in err.getvalue()
    # the same TTY with neither option draws one
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert main(["checkpoint", "download", env.external, "-o", str(tmp_path), "--force"]) == 0
    assert "B/s" in err.getvalue() or "/s]" in err.getvalue()


def test_unreachable_server_fails_fast(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from tinker_sync._runtime.clock import SYSTEM_CLOCK
    from tinker_sync.testing import VirtualSleepClock

    clock = VirtualSleepClock()
    names = ("monotonic", "sleep", "random")
    for name in names:
        setattr(SYSTEM_CLOCK, name, getattr(clock, name))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    try:
        code, out, err = run_main(capsys, "--base-url", f"http://127.0.0.1:{port}", "run", "list")
    finally:
        for name in names:
            delattr(SYSTEM_CLOCK, name)
    assert code == 1 and out == ""
    assert err.startswith("Error: Connection failed\n")
    assert f"127.0.0.1:{port}" in err
    assert clock.delays("http-retry") == [0.5, 1.0, 2.0, 4.0]
    assert clock.delays("submission-retry") == []
