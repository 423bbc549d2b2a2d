"""HTTP/1.1 layer of the local server (tinker_sync.local._http) against a small test app."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tinker_sync.local._faults import FaultPlan
from tinker_sync.local._http import HttpError, HttpServer, parse_head
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._log import RequestLog


class EchoApp:
    """Echoes the request; ``/api/v1/hold`` waits until released; ``/api/v1/boom`` raises."""

    def __init__(self, hold_target: int = 0) -> None:
        self.calls = 0
        self.held = 0
        self.hold_target = hold_target
        self.all_held = threading.Event()
        self._release: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cancelled = 0

    async def handle(self, request: HttpRequest) -> HttpResponse:
        self.calls += 1
        if request.path == "/api/v1/boom":
            raise RuntimeError("kaboom")
        if request.path == "/api/v1/hold":
            if self._release is None:
                self._release = asyncio.Event()
                self._loop = asyncio.get_running_loop()
            self.held += 1
            if self.held >= self.hold_target:
                self.all_held.set()
            try:
                await self._release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return HttpResponse.json({"released": True})
        if request.path == "/api/v1/empty":
            return HttpResponse(200, {}, b"")
        if request.path == "/api/v1/inject":
            return HttpResponse(200, {"x-evil": "a\r\nset-cookie: b"}, b"ok")
        pf = request.poll_fault
        return HttpResponse.json(
            {
                "method": request.method,
                "path": request.path,
                "raw_path": request.raw_path,
                "query": request.query,
                "headers": request.headers,
                "length": len(request.body),
                "sha": hashlib.sha256(request.body).hexdigest(),
                "poll_fault": None if pf is None else pf.__dict__,
            }
        )

    def release(self) -> None:
        assert self._loop is not None and self._release is not None
        self._loop.call_soon_threadsafe(self._release.set)

    def match_fields(self, request: HttpRequest) -> dict[str, Any]:
        kind = request.headers.get("x-kind")
        return {"request_type": kind} if kind else {}

    def endpoint_name(self, request: HttpRequest) -> str:
        return request.path


class Raw:
    """A raw HTTP/1.1 client connection (no library quirks)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise EOFError("connection closed")
        self.buf += chunk

    def response(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if status < 200 or head_only:
            return status, headers, b""
        n = int(headers["content-length"])
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def is_closed(self) -> bool:
        """True once the server closed the connection (EOF or reset)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def app() -> EchoApp:
    return EchoApp()


@pytest.fixture
def log() -> RequestLog:
    return RequestLog()


@pytest.fixture
def server(app: EchoApp, log: RequestLog) -> Iterator[HttpServer]:
    srv = HttpServer(app, log=log, faults=FaultPlan(), max_body_bytes=1 << 20)
    srv.start()
    yield srv
    srv.stop()


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


# -- parsing ------------------------------------------------------------------------------


def test_parse_head_lowercases_and_joins_repeated_headers() -> None:
    method, target, version, headers = parse_head(
        b"POST /a?b=1 HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nContent-Type:  application/json \r\n\r\n"
    )
    assert (method, target, version) == ("POST", "/a?b=1", "HTTP/1.1")
    assert headers == {"x-a": "1, 2", "content-type": "application/json"}


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /x\r\n\r\n", 400),
        (b"GET  /x HTTP/1.1\r\n\r\n", 400),
        (b"G(T /x HTTP/1.1\r\n\r\n", 400),
        (b"GET /x HTTP/2.0\r\n\r\n", 505),
        (b"GET /x FOO/1.1\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nNoColon\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nBad Name: v\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n", 400),
    ],
)
def test_parse_head_rejects_malformed(head: bytes, status: int) -> None:
    with pytest.raises(HttpError) as info:
        parse_head(head)
    assert info.value.status == status


# -- keep-alive and connection handling -----------------------------------------------------


def test_keep_alive_reuses_one_connection(server: HttpServer, log: RequestLog) -> None:
    c = Raw(server.port)
    for i in range(5):
        c.send(get(f"/api/v1/echo?i={i}"))
        status, headers, body = c.response()
        assert status == 200
        assert json.loads(body)["query"] == {"i": str(i)}
        assert headers["content-length"] == str(len(body))
        assert "connection" not in headers
    assert log.count("echo") == 5
    assert server.connection_count == 1
    c.close()


def test_pipelined_requests_are_answered_in_order(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(b"".join(get(f"/api/v1/p{i}") for i in range(3)))
    paths = [json.loads(c.response()[2])["path"] for _ in range(3)]
    assert paths == ["/api/v1/p0", "/api/v1/p1", "/api/v1/p2"]
    c.close()


def test_connection_close_is_honoured(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(get("/api/v1/echo", "Connection: close\r\n"))
    status, headers, _ = c.response()
    assert status == 200
    assert headers["connection"] == "close"
    assert c.is_closed()


def test_http10_closes_unless_keep_alive(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(b"GET /api/v1/echo HTTP/1.0\r\n\r\n")
    assert c.response()[1]["connection"] == "close"
    assert c.is_closed()
    c = Raw(server.port)
    c.send(b"GET /api/v1/echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert c.response()[1]["connection"] == "keep-alive"
    c.send(b"GET /api/v1/echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert c.response()[0] == 200
    c.close()


def test_path_is_percent_decoded_and_query_parsed(server: HttpServer, app: EchoApp) -> None:
    c = Raw(server.port)
    raw = "/api/v1/training_runs/sess1:train:0/checkpoints/weights/ck%201?limit=5&x=&y=a%2Fb"
    c.send(f"DELETE {raw} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, _, body = c.response()
    data = json.loads(body)
    assert status == 200
    assert data["method"] == "DELETE"
    assert data["path"] == "/api/v1/training_runs/sess1:train:0/checkpoints/weights/ck 1"
    assert data["query"] == {"limit": "5", "x": "", "y": "a/b"}
    assert data["raw_path"] == raw
    c.close()


def test_absolute_form_target(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(b"GET http://127.0.0.1/api/v1/echo?a=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    data = json.loads(c.response()[2])
    assert (data["path"], data["query"]) == ("/api/v1/echo", {"a": "1"})
    c.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /x HTTP/3.0\r\n\r\n", 505),
        (b"GET /x HTTP/1.1\r\nNoColon\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n", 400),
        (b"GET nopath HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_malformed_requests_get_json_errors_and_close(
    server: HttpServer, app: EchoApp, request_bytes: bytes, status: int
) -> None:
    c = Raw(server.port)
    c.send(request_bytes)
    got, headers, body = c.response()
    assert got == status
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["detail"]
    assert c.is_closed()
    assert app.calls == 0
    # the server is unharmed
    c = Raw(server.port)
    c.send(get("/api/v1/echo"))
    assert c.response()[0] == 200
    c.close()


def test_tls_handshake_on_the_plain_port_is_refused_at_once(server: HttpServer) -> None:
    """A ClientHello gets a plain-HTTP answer and a close, not a 25 s wait for a head."""
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        with pytest.raises(ssl.SSLError) as info:
            context.wrap_socket(sock, server_hostname="localhost")
    assert not isinstance(info.value, TimeoutError)
    assert info.value.reason == "WRONG_VERSION_NUMBER"
    c = Raw(server.port)  # plain HTTP on the same port still works
    c.send(get("/api/v1/echo"))
    assert c.response()[0] == 200


def test_oversized_head_gets_431(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(b"GET /x HTTP/1.1\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n")
    status, _, body = c.response()
    assert status == 431
    assert json.loads(body)["detail"]
    c.close()


def test_oversized_body_gets_413_without_reading_it(
    server: HttpServer, app: EchoApp, log: RequestLog
) -> None:
    c = Raw(server.port)
    c.send(b"POST /api/v1/upload HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
    status, headers, body = c.response()
    assert status == 413
    assert headers["connection"] == "close"
    assert "too large" in json.loads(body)["detail"]
    assert app.calls == 0
    assert [r.status for r in log.filter(endpoint="upload")] == [413]
    c.close()


def test_chunked_body_is_reassembled(server: HttpServer) -> None:
    payload = b'{"hello": "world", "n": 12345}'
    chunks = [payload[:5], payload[5:20], payload[20:]]
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(ch), ch) for ch in chunks)
    c = Raw(server.port)
    c.send(
        b"POST /api/v1/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        + body
        + b"0\r\nX-Trailer: t\r\n\r\n"
    )
    status, _, resp = c.response()
    assert status == 200
    data = json.loads(resp)
    assert data["length"] == len(payload)
    assert data["sha"] == hashlib.sha256(payload).hexdigest()
    c.send(get("/api/v1/echo"))  # keep-alive survives a chunked request
    assert c.response()[0] == 200
    c.close()


def test_chunked_body_over_limit_gets_413(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(b"POST /api/v1/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % (2 << 20))
    assert c.response()[0] == 413
    c.close()


def test_expect_continue(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(b"POST /api/v1/echo HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
    assert c.response()[0] == 100
    c.send(b"abc")
    status, _, body = c.response()
    assert status == 200
    assert json.loads(body)["length"] == 3
    c.close()


def test_large_body_round_trip(server: HttpServer) -> None:
    payload = bytes(range(256)) * 4000  # ~1 MB, under the 1 MiB test limit
    c = Raw(server.port)
    c.send(b"POST /api/v1/echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
    data = json.loads(c.response()[2])
    assert data["sha"] == hashlib.sha256(payload).hexdigest()
    c.close()


def test_empty_response_has_content_length_zero_and_head_has_no_body(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(get("/api/v1/empty"))
    status, headers, body = c.response()
    assert (status, headers["content-length"], body) == (200, "0", b"")
    c.send(b"HEAD /api/v1/echo HTTP/1.1\r\n\r\n")
    status, headers, _ = c.response(head_only=True)
    assert status == 200 and int(headers["content-length"]) > 0
    c.send(get("/api/v1/empty"))
    assert c.response()[0] == 200
    c.close()


def test_header_values_cannot_inject_lines(server: HttpServer) -> None:
    c = Raw(server.port)
    c.send(get("/api/v1/inject"))
    _, headers, body = c.response()
    assert "set-cookie" not in headers
    assert headers["x-evil"] == "a  set-cookie: b"
    assert body == b"ok"
    c.close()


def test_app_exception_becomes_500_json_and_connection_survives(
    server: HttpServer, log: RequestLog
) -> None:
    c = Raw(server.port)
    c.send(get("/api/v1/boom"))
    status, _, body = c.response()
    assert status == 500
    assert "kaboom" in json.loads(body)["detail"]
    c.send(get("/api/v1/echo"))
    assert c.response()[0] == 200
    assert [r.status for r in log.all()] == [500, 200]
    c.close()


def test_client_disconnect_mid_body_does_not_break_server(server: HttpServer, app: EchoApp) -> None:
    c = Raw(server.port)
    c.send(b"POST /api/v1/echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-a-little")
    c.close()
    c = Raw(server.port)
    c.send(get("/api/v1/echo"))
    assert c.response()[0] == 200
    assert app.calls == 1
    c.close()


def test_log_records_redacted_headers_json_and_duration(
    server: HttpServer, log: RequestLog
) -> None:
    c = Raw(server.port)
    body = b'{"seq_id": 3}'
    c.send(
        b"POST /api/v1/asample HTTP/1.1\r\nX-API-Key: tml-supersecretkey\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert c.response()[0] == 200
    [rec] = log.wait_for("asample", 1, timeout=5)
    assert rec.method == "POST" and rec.endpoint == "asample" and rec.status == 200
    assert rec.json == {"seq_id": 3}
    assert rec.headers["x-api-key"] == "<redacted>"
    assert "tml-supersecretkey" not in repr(rec) + json.dumps(rec.to_dict())
    assert rec.duration_s >= 0 and rec.fault is None and rec.dropped is None
    c.close()


def test_admin_paths_bypass_faults_and_log(app: EchoApp, log: RequestLog) -> None:
    async def admin(request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"admin": request.path})

    plan = FaultPlan(["* 500 x*"])
    srv = HttpServer(app, log=log, faults=plan, admin=admin)
    srv.start()
    try:
        c = Raw(srv.port)
        c.send(get("/_local/state"))
        status, _, body = c.response()
        assert (status, json.loads(body)) == (200, {"admin": "/_local/state"})
        c.send(get("/api/v1/echo"))
        assert c.response()[0] == 500
        assert [r.path for r in log.all()] == ["/api/v1/echo"]
        c.close()
    finally:
        srv.stop()


def test_admin_listener_serves_only_admin_and_survives_refusal(app: EchoApp) -> None:
    async def admin(request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"ok": True})

    srv = HttpServer(app, admin=admin, admin_listener=True)
    srv.start()
    try:
        assert srv.admin_port is not None
        c = Raw(srv.admin_port)
        c.send(get("/api/v1/echo"))
        assert c.response()[0] == 404
        srv.refuse_connections(30)
        c.send(get("/_local/x"))
        assert c.response()[0] == 200
        c2 = Raw(srv.admin_port)  # new admin connections are still accepted
        c2.send(get("/_local/x"))
        assert c2.response()[0] == 200
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    finally:
        srv.stop()


# -- refusing connections -------------------------------------------------------------------


def test_refuse_connections_then_listen_again_on_same_port(server: HttpServer) -> None:
    port = server.port
    idle = Raw(port)
    idle.send(get("/api/v1/echo"))
    assert idle.response()[0] == 200
    server.refuse_connections(0.3)
    assert idle.is_closed()  # idle keep-alive connections are closed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    assert server.wait_listening(timeout=10)
    assert server.port == port
    c = Raw(port)
    c.send(get("/api/v1/echo"))
    assert c.response()[0] == 200
    c.close()


def test_busy_connection_finishes_then_closes_while_refusing() -> None:
    app = EchoApp(hold_target=1)
    srv = HttpServer(app)
    srv.start()
    try:
        c = Raw(srv.port)
        c.send(get("/api/v1/hold"))
        assert app.all_held.wait(10)
        srv.refuse_connections(30)
        app.release()
        status, headers, _ = c.response()
        assert status == 200 and headers["connection"] == "close"
        assert c.is_closed()
    finally:
        srv.stop()


# -- capacity and shutdown -------------------------------------------------------------------


async def _open_and_hold(
    port: int, n: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    conns = []
    for start in range(0, n, 100):
        batch = await asyncio.gather(
            *(asyncio.open_connection("127.0.0.1", port) for _ in range(start, min(n, start + 100)))
        )
        for reader, writer in batch:
            writer.write(get("/api/v1/hold"))
        conns.extend(batch)
    return conns


async def _read_status(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1])


def test_thousand_concurrent_held_long_polls() -> None:
    n = 1000
    app = EchoApp(hold_target=n)
    srv = HttpServer(app, log=RequestLog())
    srv.start()

    async def scenario() -> list[int]:
        conns = await _open_and_hold(srv.port, n)
        loop = asyncio.get_running_loop()
        held = await loop.run_in_executor(None, app.all_held.wait, 60)
        assert held, f"only {app.held} of {n} polls held"
        # the loop still answers other requests while 1000 polls are held
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(get("/api/v1/echo"))
        assert await _read_status(r) == 200
        w.close()
        app.release()
        statuses = await asyncio.gather(*(_read_status(r) for r, _ in conns))
        for _, writer in conns:
            writer.close()
        return statuses

    try:
        statuses = asyncio.run(asyncio.wait_for(scenario(), 120))
        assert statuses == [200] * n
    finally:
        srv.stop()


def test_stop_returns_quickly_with_held_polls() -> None:
    n = 200
    app = EchoApp(hold_target=n)
    srv = HttpServer(app)
    srv.start()
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(get("/api/v1/hold"))
        socks.append(s)
    assert app.all_held.wait(30)
    t0 = time.monotonic()
    srv.stop(timeout=5.0)
    assert time.monotonic() - t0 < 5.0
    for s in socks:
        try:
            assert s.recv(100) == b""  # closed without an answer
        except ConnectionResetError:
            pass
        s.close()
    assert app.cancelled == n
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    srv.stop()  # idempotent


def test_start_twice_is_idempotent_and_restart_is_refused(app: EchoApp) -> None:
    srv = HttpServer(app)
    srv.start()
    port = srv.port
    srv.start()
    assert srv.port == port and srv.running
    srv.stop()
    assert not srv.running
    with pytest.raises(RuntimeError):
        srv.start()


def test_bind_error_is_raised(app: EchoApp) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        srv = HttpServer(app, port=blocker.getsockname()[1])
        with pytest.raises(OSError):
            srv.start()
    finally:
        blocker.close()


def test_oversized_upload_in_flight_still_gets_413(server: HttpServer) -> None:
    size = 40 << 20
    c = Raw(server.port)
    c.send(b"POST /api/v1/upload HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size)
    c.send(b"x" * size)  # the server discards the upload instead of resetting the connection
    status, _, body = c.response()
    assert status == 413
    assert "too large" in json.loads(body)["detail"]
    assert c.is_closed()
