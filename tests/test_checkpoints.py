"""tinker_sync.checkpoints.download against a LocalServer (signed URLs served by the same
server), plus a misbehaving file server for size checks and unsafe listings."""

from __future__ import annotations

import datetime as dt
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import tinker_sync
from tinker_sync._futures import completed
from tinker_sync.checkpoints import download, target_dir_name
from tinker_sync.exceptions import APIConnectionError, NotFoundError
from tinker_sync.local import LocalServer
from tinker_sync.testing import VirtualSleepClock, reset_process_state
from tinker_sync.types import ExternalWeightsUrlsResponse

TIMEOUT = 30.0


class Seed:
    def __init__(self, server: LocalServer) -> None:
        self.server = server
        self.service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        training = self.service.create_lora_training_client("tinker-sync/tiny", rank=4)
        self.run_id = training.model_id
        self.weights = training.save_state("s1").result(TIMEOUT).path
        self.sampler = training.save_weights_for_sampler("w1").result(TIMEOUT).path
        self.external = training.save_weights_external("e1").result(TIMEOUT).path
        self.rest = self.service.create_rest_client()

    def expected_files(self, path: str) -> dict[str, bytes]:
        urls = self.rest.get_external_weights_urls(path).result(TIMEOUT).urls
        return {name: requests.get(url, timeout=10).content for name, url in urls.items()}

    def size_of(self, path: str) -> int | None:
        listing = self.rest.list_checkpoints(self.run_id).result(TIMEOUT).checkpoints
        return next(c.size_bytes for c in listing if c.tinker_path == path)


@pytest.fixture(scope="module")
def seed() -> Iterator[Seed]:
    with LocalServer(backend="instant") as server:
        s = Seed(server)
        yield s
        s.service.close()
    reset_process_state()


@pytest.fixture
def server(seed: Seed) -> LocalServer:
    seed.server.faults.clear()
    return seed.server


def read_dir(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_target_dir_name() -> None:
    assert target_dir_name("tinker://r:train:0/weights/final") == "r:train:0_weights_final"
    assert target_dir_name("tinker://r/external_weights/x") == "r_external_weights_x"
    with pytest.raises(ValueError):
        target_dir_name("tinker://r/weights")


def test_external_download_with_progress(seed: Seed, server: LocalServer, tmp_path: Path) -> None:
    events: list[tuple[int, int]] = []
    target = download(
        seed.external,
        tmp_path / "models",
        service_client=seed.service,
        progress=lambda done, total: events.append((done, total)),
    )
    assert target == (tmp_path / "models" / f"{seed.run_id}_external_weights_e1").absolute()
    assert read_dir(target) == seed.expected_files(seed.external)
    size = seed.size_of(seed.external)
    assert size and events[-1] == (size, size)
    assert [d for d, _ in events] == sorted(d for d, _ in events)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [target.name]  # no staging left


def test_existing_target_needs_force(seed: Seed, server: LocalServer, tmp_path: Path) -> None:
    target = download(seed.external, tmp_path, service_client=seed.service)
    (target / "extra.txt").write_text("stale")
    before = len(server.requests)
    with pytest.raises(FileExistsError) as info:
        download(seed.external, tmp_path, service_client=seed.service)
    assert info.value.filename == str(target)
    assert len(server.requests) == before  # refused before any request
    assert (target / "extra.txt").exists()
    again = download(seed.external, tmp_path, service_client=seed.service, force=True)
    assert again == target and not (target / "extra.txt").exists()
    assert read_dir(target) == seed.expected_files(seed.external)


def test_training_checkpoint_is_exported_then_deleted(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    before = len(server.requests)
    target = download(seed.weights, tmp_path, service_client=seed.service)
    assert target.name == f"{seed.run_id}_weights_s1"
    files = read_dir(target)
    assert files and all(files.values())
    entries = server.requests.all()[before:]
    assert [e for e in entries if e.endpoint == "save_weights_external"]
    deletes = [e for e in entries if e.method == "DELETE"]
    assert len(deletes) == 1 and "/external_weights/download-" in deletes[0].path
    everything = seed.rest.list_user_checkpoints(limit=1000).result(TIMEOUT).checkpoints
    assert not [c for c in everything if "download-" in c.checkpoint_id]
    # the caller's client stays open and usable
    assert seed.rest.list_checkpoints(seed.run_id).result(TIMEOUT).checkpoints


def test_without_a_client_uses_the_environment_and_finishes_its_session(
    seed: Seed, server: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    before = len(server.requests)
    target = download(seed.weights, tmp_path)
    assert read_dir(target)
    entries = server.requests.all()[before:]
    assert len([e for e in entries if e.endpoint == "create_session"]) == 1
    finishes = [e for e in entries if e.path.endswith("/finish")]
    assert len(finishes) == 1 and finishes[0].json["reason"] == {"type": "success"}
    external = download(seed.external, tmp_path / "ext")
    assert read_dir(external) == seed.expected_files(seed.external)


def test_argument_errors(seed: Seed, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sampler"):
        download(seed.sampler, tmp_path, service_client=seed.service)
    with pytest.raises(ValueError, match="tinker://"):
        download("run/weights/x", tmp_path, service_client=seed.service)
    with pytest.raises(TypeError, match="progress"):
        download(seed.external, tmp_path, service_client=seed.service, progress=3)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_missing_checkpoint_leaves_nothing(seed: Seed, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        download(
            f"tinker://{seed.run_id}/external_weights/nope", tmp_path, service_client=seed.service
        )
    assert list(tmp_path.iterdir()) == []


def test_server_errors_are_retried_from_scratch(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    clock = VirtualSleepClock()
    server.faults.add("/_files/** 500 x1")
    server.faults.add("/_files/** drop-after x1")
    target = download(seed.external, tmp_path, service_client=seed.service, _clock=clock)
    assert read_dir(target) == seed.expected_files(seed.external)
    assert clock.delays("download-retry") == [0.5, 1.0]


def test_expired_link_is_signed_again(seed: Seed, server: LocalServer, tmp_path: Path) -> None:
    before = len(server.requests)
    server.faults.add("/_files/** 403 x1")
    target = download(seed.external, tmp_path, service_client=seed.service)
    assert read_dir(target) == seed.expected_files(seed.external)
    signed = [e for e in server.requests.all()[before:] if e.path.endswith("external_weights_urls")]
    assert len(signed) >= 2


# -- a misbehaving file server ----------------------------------------------------------------


class Handler(http.server.BaseHTTPRequestHandler):
    payload = b"0123456789"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload) * 10))  # promises more
        self.end_headers()
        self.wfile.write(self.payload)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def short_server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(TIMEOUT)


def fake_listing(monkeypatch: pytest.MonkeyPatch, seed: Seed, urls: dict[str, str]) -> None:
    reply = ExternalWeightsUrlsResponse(
        urls=urls, expires=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    )
    monkeypatch.setattr(seed.rest, "get_external_weights_urls", lambda path: completed(reply))


def test_short_body_is_never_kept(
    seed: Seed, tmp_path: Path, short_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_listing(monkeypatch, seed, {"model.bin": f"{short_server}/model.bin"})
    clock = VirtualSleepClock()
    with pytest.raises(APIConnectionError):
        download(seed.external, tmp_path, service_client=seed.service, _clock=clock)
    assert clock.delays("download-retry") == [0.5, 1.0, 2.0]  # 4 attempts, each from scratch
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../evil.bin", "/abs.bin", "a/../../b", "a\\b"])
def test_unsafe_names_are_refused(
    seed: Seed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    fake_listing(monkeypatch, seed, {name: "http://127.0.0.1:9/never-fetched"})
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="unsafe"):
        download(seed.external, out, service_client=seed.service)
    assert list(out.iterdir()) == []
    assert not (tmp_path / "evil.bin").exists()
