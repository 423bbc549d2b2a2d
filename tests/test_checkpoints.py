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
from tinker_sync._runtime.clock import SystemClock
from tinker_sync.checkpoints import (
    DOWNLOAD_ATTEMPTS,
    download,
    download_checkpoint,
    target_dir_name,
)
from tinker_sync.exceptions import (
    APIConnectionError,
    DownloadError,
    DownloadVerificationError,
    NotFoundError,
    TinkerError,
)
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
        self.weights2 = training.save_state("s2").result(TIMEOUT).path
        self.weights3 = training.save_state("s3").result(TIMEOUT).path
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
    assert target_dir_name("tinker://r:train:0/weights/final") == "r-train-0_weights_final"
    assert target_dir_name('tinker://a<b>|c/weights/x?y*"z. ') == "a-b--c_weights_x-y--z"
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
    assert target == (tmp_path / "models" / target_dir_name(seed.external)).absolute()
    assert ":" not in target.name
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


def runs_and_sessions(seed: Seed) -> tuple[int, list[str]]:
    runs = seed.rest.list_training_runs(limit=1000).result(TIMEOUT)
    sessions = seed.rest.list_sessions(limit=1000).result(TIMEOUT).sessions
    return len(runs.training_runs), sorted(sessions)


def test_training_checkpoint_comes_as_an_archive_without_a_run_or_session(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    runs_before = runs_and_sessions(seed)
    before = len(server.requests)
    result = download_checkpoint(seed.weights, tmp_path, service_client=seed.service)
    assert (
        result.path.name
        == target_dir_name(seed.weights)
        == f"{seed.run_id.replace(':', '-')}_weights_s1"
    )
    files = read_dir(result.path)
    assert files and all(files.values()) and tuple(sorted(files)) == result.files
    assert result.source == "archive" and result.verified_by == "repr-digest"
    assert result.bytes_written == sum(len(b) for b in files.values())
    assert result.bytes_transferred == result.fetched_bytes > result.bytes_written  # tar headers
    assert result.attempts == 1 and result.resumed_bytes == 0
    assert list(result.digests) == ["archive.tar"]
    entries = server.requests.all()[before:]
    # besides the REST client's start-up (client/config), one archive request and one GET
    assert [
        e.endpoint
        for e in entries
        if not e.path.startswith("/_files/") and not e.endpoint.startswith("client/")
    ] == [f"training_runs/{seed.run_id}/checkpoints/weights/s1/archive"]
    assert len(file_gets(server, before)) == 1
    entries = server.requests.all()[before:]
    assert runs_and_sessions(seed) == runs_before  # no training run, no session
    assert [p.name for p in tmp_path.iterdir()] == [result.path.name]  # no staging left


def test_without_a_client_uses_the_environment_and_only_rest(
    seed: Seed, server: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    before = len(server.requests)
    target = download(seed.weights, tmp_path)
    assert read_dir(target)
    external = download(seed.external, tmp_path / "ext")
    assert read_dir(external) == seed.expected_files(seed.external)
    entries = server.requests.all()[before:]
    assert not [e for e in entries if e.endpoint in ("create_session", "create_model")]


def test_server_without_archives_falls_back_to_an_export(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    server.faults.add("training_runs/*/checkpoints/**/archive 404 x1")
    events: list[str] = []
    before = len(server.requests)
    result = download_checkpoint(
        seed.weights, tmp_path, service_client=seed.service, on_event=events.append
    )
    assert result.source == "export" and read_dir(result.path)
    assert any("exporting" in e for e in events)
    entries = server.requests.all()[before:]
    assert [e for e in entries if e.endpoint == "save_weights_external"]
    deletes = [e for e in entries if e.method == "DELETE"]
    assert len(deletes) == 1 and "/external_weights/download-" in deletes[0].path
    everything = seed.rest.list_user_checkpoints(limit=1000).result(TIMEOUT).checkpoints
    assert not [c for c in everything if "download-" in c.checkpoint_id]


def test_missing_training_checkpoint_is_not_exported(seed: Seed, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        download(f"tinker://{seed.run_id}/weights/nope", tmp_path, service_client=seed.service)
    assert list(tmp_path.iterdir()) == []


# -- resume, verify, archive creation (docs/downloads.md) -------------------------------------


def file_gets(server: LocalServer, before: int) -> list[Any]:
    return [e for e in server.requests.all()[before:] if e.path.startswith("/_files/")]


def test_cut_archive_resumes_with_range_and_if_range(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    clock = VirtualSleepClock()
    server.faults.add("/_files/** cut_at=1000 x3")
    before = len(server.requests)
    events: list[str] = []
    result = download_checkpoint(
        seed.weights, tmp_path, service_client=seed.service, on_event=events.append, _clock=clock
    )
    gets = file_gets(server, before)
    assert [g.status for g in gets] == [200, 206, 206, 206]
    assert "range" not in gets[0].headers
    etag = gets[0].headers.get("if-range")
    assert etag is None
    ranges = [g.headers.get("range") for g in gets[1:]]
    assert ranges == ["bytes=1000-", "bytes=2000-", "bytes=3000-"]
    assert len({g.headers["if-range"] for g in gets[1:]}) == 1
    # every byte crossed the network once; nothing was fetched twice
    assert result.bytes_transferred == result.fetched_bytes
    assert result.resumed_bytes == 1000 + 2000 + 3000
    assert result.attempts == 4 and result.verified_by == "repr-digest"
    assert clock.delays("download-retry") == []  # a moving transfer resumes at once
    assert sum("resumed at byte" in e for e in events) == 3
    assert read_dir(result.path) == read_dir(
        download(seed.weights, tmp_path / "clean", service_client=seed.service)
    )


def test_server_ignoring_ranges_is_detected_and_restarted(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    server.faults.add("/_files/** no_ranges=true x*")
    server.faults.add("/_files/** cut_at=1000 x1")
    before = len(server.requests)
    events: list[str] = []
    result = download_checkpoint(
        seed.weights, tmp_path, service_client=seed.service, on_event=events.append
    )
    gets = file_gets(server, before)
    assert [g.status for g in gets] == [200, 200]
    assert gets[1].headers.get("range") == "bytes=1000-"
    assert result.bytes_transferred == 1000 + result.fetched_bytes
    assert result.resumed_bytes == 0 and result.attempts == 2
    assert any("ignored the range" in e for e in events)
    assert read_dir(result.path)


def test_attempts_are_bounded(seed: Seed, server: LocalServer, tmp_path: Path) -> None:
    server.faults.add("/_files/** cut_at=10 x*")
    before = len(server.requests)
    with pytest.raises(APIConnectionError):
        download(seed.weights, tmp_path, service_client=seed.service)
    assert len(file_gets(server, before)) == DOWNLOAD_ATTEMPTS
    assert list(tmp_path.iterdir()) == []


def test_expired_url_is_signed_again_and_the_download_continues(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    server.faults.add("training_runs/*/checkpoints/**/archive url_ttl=1.0 x1")
    server.faults.add("/_files/** cut_at=1000 x1")
    server.faults.add("/_files/** delay=1.5 x1")  # the second GET arrives after the expiry
    before = len(server.requests)
    result = download_checkpoint(seed.weights, tmp_path, service_client=seed.service)
    entries = server.requests.all()[before:]
    kinds = [
        ("archive", e.status) if e.endpoint.endswith("/archive") else ("file", e.status)
        for e in entries
    ]
    assert kinds == [
        ("archive", 302),
        ("file", 200),
        ("file", 403),
        ("archive", 302),
        ("file", 206),
    ]
    assert entries[-1].headers["range"] == "bytes=1000-"
    assert result.resigns == 1 and result.bytes_transferred == result.fetched_bytes
    assert read_dir(result.path)


def test_digest_mismatch_is_a_typed_error_and_leaves_nothing(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    wrong = "sha-256=:" + "A" * 43 + "=:"
    server.faults.add({"endpoint": "/_files/**", "times": None, "headers": {"repr-digest": wrong}})
    with pytest.raises(DownloadVerificationError) as info:
        download(seed.weights, tmp_path, service_client=seed.service)
    assert info.value.check == "digest" and isinstance(info.value, TinkerError)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DownloadVerificationError):
        download(seed.external, tmp_path, service_client=seed.service)
    assert list(tmp_path.iterdir()) == []


def test_without_a_digest_length_and_tar_are_checked(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    server.faults.add({"endpoint": "/_files/**", "times": 1, "headers": {"repr-digest": ""}})
    result = download_checkpoint(seed.weights, tmp_path, service_client=seed.service)
    assert result.verified_by == "length" and read_dir(result.path)
    server.faults.add("/_files/** 200 x1 body='this is not a tar archive'")
    with pytest.raises(DownloadVerificationError) as info:
        download(seed.weights, tmp_path / "bad", service_client=seed.service)
    assert info.value.check == "tar"
    assert not (tmp_path / "bad").exists() or list((tmp_path / "bad").iterdir()) == []


class RecordingClock(SystemClock):
    """The real clock, recording each sleep (the server's archive timer runs in real time)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[tuple[float, str]] = []

    def sleep(self, seconds: float, reason: str = "") -> None:
        self.sleeps.append((seconds, reason))
        super().sleep(seconds, reason)


def test_archive_creation_is_polled_with_short_requests(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    server.faults.add("training_runs/*/checkpoints/**/archive generating=0.6 x1")
    clock = RecordingClock()
    events: list[str] = []
    before = len(server.requests)
    # a new checkpoint: the server has not created its archive yet
    result = download_checkpoint(
        seed.weights2, tmp_path, service_client=seed.service, on_event=events.append, _clock=clock
    )
    polls = [e for e in server.requests.all()[before:] if e.endpoint.endswith("/archive")]
    assert [p.status for p in polls][0] == 503 and [p.status for p in polls][-1] == 302
    assert all(p.duration_s < 0.5 for p in polls)  # no request held open
    waits = [s for s, r in clock.sleeps if r == "archive-wait"]
    assert waits and 0.5 <= waits[0] <= 0.6 and len(waits) == len(polls) - 1
    assert result.archive_polls == len(waits)
    assert any("creating the archive" in e for e in events)
    assert read_dir(result.path)


def test_archive_deadline_is_bounded(seed: Seed, server: LocalServer, tmp_path: Path) -> None:
    server.faults.add("training_runs/*/checkpoints/**/archive generating=100 x1")
    clock = VirtualSleepClock()
    with pytest.raises(DownloadError, match="still being created"):
        download(
            seed.weights3, tmp_path, service_client=seed.service, archive_deadline=5.0, _clock=clock
        )
    assert clock.delays("archive-wait") == [2.0, 2.0]  # the server's Retry-After, then over 5 s
    assert list(tmp_path.iterdir()) == []


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
    # no ETag: every attempt starts from scratch; only the first one brought new bytes
    assert clock.delays("download-retry") == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
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


def test_signed_links_serve_ranges_etag_and_digest(seed: Seed, server: LocalServer) -> None:
    import base64
    import hashlib

    urls = seed.rest.get_external_weights_urls(seed.external).result(TIMEOUT).urls
    url = urls[sorted(urls)[0]]
    whole = requests.get(url, timeout=10)
    body, etag = whole.content, whole.headers["etag"]
    digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
    assert whole.headers["repr-digest"] == f"sha-256=:{digest}:" and len(body) > 10
    part = requests.get(url, headers={"Range": "bytes=5-9", "If-Range": etag}, timeout=10)
    assert part.status_code == 206 and part.content == body[5:10]
    assert part.headers["content-range"] == f"bytes 5-9/{len(body)}"
    assert part.headers["repr-digest"] == whole.headers["repr-digest"]  # the whole file's
    changed = requests.get(url, headers={"Range": "bytes=5-", "If-Range": '"other"'}, timeout=10)
    assert changed.status_code == 200 and changed.content == body
    beyond = requests.get(url, headers={"Range": f"bytes={len(body)}-"}, timeout=10)
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(body)}"


# -- review: bounded, visible waits; signed URLs kept out of logs and errors ------------------


def test_archive_endpoint_errors_honour_retry_after_and_name_the_checkpoint(
    seed: Seed, server: LocalServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.faults.add("training_runs/*/checkpoints/**/archive 429 x1 retry_after=3")
    server.faults.add("training_runs/*/checkpoints/**/archive 500 x1")
    clock = VirtualSleepClock()
    with caplog.at_level("INFO", logger="tinker_sync.checkpoints"):
        result = download_checkpoint(
            seed.weights, tmp_path, service_client=seed.service, _clock=clock
        )
    assert read_dir(result.path)
    assert clock.delays("download-retry") == [3.0, 1.0]  # Retry-After, then the HTTP backoff
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 2 and all(seed.weights in m for m in retries)


def test_a_closed_rest_client_is_refused(seed: Seed, server: LocalServer, tmp_path: Path) -> None:
    rest = tinker_sync.RestClient(base_url=server.url, api_key=server.api_key)
    rest.list_checkpoints(seed.run_id).result(TIMEOUT)  # started
    rest.close()
    before = len(server.requests)
    with pytest.raises(tinker_sync.ClientClosedError):
        download(seed.weights, tmp_path, rest_client=rest)
    assert len(server.requests) == before and list(tmp_path.iterdir()) == []


SIGNATURE = "c2lnbmF0dXJlLW9mLXRoZS1saW5r0123456789abcdef"


class EchoingDenial(http.server.BaseHTTPRequestHandler):
    """Storage that refuses a link and echoes its query, as S3's SignatureDoesNotMatch does."""

    def do_GET(self) -> None:
        body = f"<Error><SignatureProvided>{self.path}</SignatureProvided></Error>".encode()
        self.send_response(403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def everything_said(exc: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    import pickle

    from tinker_sync._runtime.causes import related

    chain = list(related(exc))
    return "\n".join(
        [caplog.text]
        + [f"{e!s} {e!r}" for e in chain]
        + [repr(getattr(e, "response", None)) for e in chain]
        + [repr(pickle.dumps(exc))]
    )


def test_signed_url_query_never_reaches_logs_or_errors(
    seed: Seed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoingDenial)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    port = httpd.server_address[1]
    query = f"?X-Amz-Credential=AKIDEXAMPLE1234&X-Amz-Signature={SIGNATURE}"
    clock = VirtualSleepClock()
    try:
        with caplog.at_level("DEBUG", logger="tinker_sync"):
            # a denied link (signed again, then given up) and a refused connection
            fake_listing(monkeypatch, seed, {"a.bin": f"http://127.0.0.1:{port}/a.bin{query}"})
            with pytest.raises(tinker_sync.PermissionDeniedError) as denied:
                download(seed.external, tmp_path, service_client=seed.service, _clock=clock)
            fake_listing(monkeypatch, seed, {"b.bin": f"http://127.0.0.1:9/b.bin{query}"})
            with pytest.raises(APIConnectionError) as refused:
                download(seed.external, tmp_path, service_client=seed.service, _clock=clock)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(TIMEOUT)
    assert denied.value.response is not None and b"<redacted>" in denied.value.response.content
    for info in (denied, refused):
        said = everything_said(info.value, caplog)
        assert SIGNATURE not in said and "AKIDEXAMPLE1234" not in said
    assert "retrying in" in caplog.text and "http://127.0.0.1:9/b.bin " in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_download_errors_are_exported_and_pickle() -> None:
    import pickle

    assert tinker_sync.DownloadError is DownloadError and "DownloadError" in tinker_sync.__all__
    assert tinker_sync.DownloadVerificationError is DownloadVerificationError
    error = pickle.loads(pickle.dumps(DownloadVerificationError("bad tar", check="tar")))
    assert isinstance(error, DownloadError) and error.check == "tar" and str(error) == "bad tar"


@pytest.mark.parametrize("member", ["../evil.bin", "/abs.bin", "a/../../b"])
def test_an_archive_member_with_an_unsafe_name_fails_the_tar_check(
    tmp_path: Path, member: str
) -> None:
    import io
    import tarfile

    from tinker_sync.checkpoints import _extract

    archive = tmp_path / "archive.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo(member)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(DownloadVerificationError, match="unsafe") as caught:
        _extract(archive, dest)
    assert caught.value.check == "tar"
    assert list(dest.iterdir()) == [] and not (tmp_path / "evil.bin").exists()


def test_links_about_to_expire_are_signed_again_before_the_first_get(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    server.faults.add("**/external_weights_urls url_ttl=10 x1")  # inside RESIGN_MARGIN_S
    before = len(server.requests)
    target = download(seed.external, tmp_path, service_client=seed.service)
    entries = server.requests.all()[before:]
    assert len([e for e in entries if e.path.endswith("external_weights_urls")]) == 2
    assert [e.status for e in file_gets(server, before)] == [200] * len(read_dir(target))
    assert read_dir(target) == seed.expected_files(seed.external)


def test_a_target_that_appears_during_the_download_is_kept_without_force(
    seed: Seed, server: LocalServer, tmp_path: Path
) -> None:
    target = tmp_path / target_dir_name(seed.external)

    def someone_else_writes_it(done: int, total: int) -> None:
        target.mkdir(exist_ok=True)
        (target / "theirs.txt").write_text("keep me")

    with pytest.raises(FileExistsError):
        download(
            seed.external, tmp_path, service_client=seed.service, progress=someone_else_writes_it
        )
    assert read_dir(target) == {"theirs.txt": b"keep me"}
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no staging left
