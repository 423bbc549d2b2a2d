"""Tests for tinker_sync._transport over real loopback HTTP
(docs/design/behavior.md#http-retry-policy, docs/design/behavior.md#timeouts,
docs/design/behavior.md#limiter-registry, docs/design/behavior.md#exception-hierarchy,
docs/design/behavior.md#jwt-auth, docs/design/behavior.md#request-headers,
docs/design/behavior.md#drop-inherited-transport).

Two servers are used: a tiny scripted stdlib ``http.server`` (below) where a test needs exact
control of the socket (read timeouts, dropped or half-sent replies, raw headers, barriers) and
``tinker_sync.local.LocalServer`` with fault plans for the protocol-level retry flows.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import urllib3
import urllib3.exceptions

from tinker_sync import _transport
from tinker_sync._config import ClientConfig, Timeout
from tinker_sync._credentials import CredentialAuth, StaticKeyAuth
from tinker_sync._flow.retry import send_with_retries
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._session.jwt import JwtAuth, TokenExchange
from tinker_sync._transport import (
    BARE_400_BUDGET,
    USER_AGENT,
    HookEvent,
    Pool,
    Reply,
    RequestSpec,
    Transport,
    _connection,
    _direct,
    _exchange,
    _models,
    _pools,
    close_all_pools,
    context_without_sdk_method,
    current_sdk_method,
    error_from_reply,
    map_transport_error,
    quote_path,
    sdk_method_scope,
)
from tinker_sync.exceptions import (
    APIConnectError,
    APIConnectionError,
    APIConnectTimeoutError,
    APIResponseValidationError,
    APITimeoutError,
    BadRequestError,
    ClientClosedError,
    InternalServerError,
    RequestOutcome,
)

pytestmark = pytest.mark.usefixtures("transport_path")  # every test on both request paths

KEY = "tml-transport-test-key-0123456789"
CF_SECRET = "cf-transport-secret-987654"
HANG_GUARD_S = 60.0

# ---------------------------------------------------------------------------------------------
# A scripted loopback HTTP server
# ---------------------------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # every header line, in order

    def header(self, name: str) -> str | None:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None


Action = Any  # (status, headers, body) | "drop" | ("partial", declared, body) | ("block", Event)
#              | ("raw", reply bytes, keep the connection open)


@dataclass
class Stub:
    """Records every request; answers from per-path scripts, a responder, or 200 ``{"ok":true}``."""

    server: ThreadingHTTPServer
    seen: list[Seen] = field(default_factory=list)
    scripts: dict[str, list[Action]] = field(default_factory=dict)
    responder: Callable[[Seen], Action] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    blockers: list[threading.Event] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def script(self, path: str, *actions: Action) -> None:
        with self.lock:
            self.scripts.setdefault(path, []).extend(actions)

    def next_action(self, req: Seen) -> Action:
        with self.lock:
            self.seen.append(req)
            queue = self.scripts.get(req.path.split("?")[0])
            if queue:
                return queue.pop(0)
        if self.responder is not None:
            return self.responder(req)
        return (200, {"Content-Type": "application/json"}, b'{"ok":true}')

    def paths(self) -> list[str]:
        with self.lock:
            return [s.path for s in self.seen]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        req = Seen(
            self.command,
            self.path,
            dict(self.headers.items()),
            body,
            self.client_address[1],
            list(self.headers.items()),
        )
        stub: Stub = self.server.stub
        action = stub.next_action(req)
        if callable(action):
            action = action(req)
        if action == "drop":
            self.close_connection = True
            return
        if isinstance(action, tuple) and action[0] == "partial":
            _, declared, partial = action
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(declared))
            self.end_headers()
            self.wfile.write(partial)
            self.wfile.flush()
            self.close_connection = True
            return
        if isinstance(action, tuple) and action[0] == "raw":
            _, raw, keep_open = action
            self.wfile.write(raw)
            self.wfile.flush()
            self.close_connection = not keep_open
            return
        if isinstance(action, tuple) and action[0] == "block":
            action[1].wait(HANG_GUARD_S)
            self.close_connection = True
            return
        status, headers, payload = action
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _handle


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    s = Stub(server)
    server.stub = s  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield s
    finally:
        for event in s.blockers:
            event.set()
        server.shutdown()
        server.server_close()
        thread.join(HANG_GUARD_S)


def config_for(url: str, **kw: Any) -> ClientConfig:
    env = kw.pop("environ", {})
    return ClientConfig.from_env(base_url=url, api_key=kw.pop("api_key", KEY), environ=env, **kw)


@contextlib.contextmanager
def transport_for(url: str, *, auth: Any = "static", **kw: Any) -> Iterator[Transport]:
    config = config_for(url, **{k: v for k, v in kw.items() if k not in ("hooks", "clock")})
    if auth == "static":
        auth = StaticKeyAuth(config.credentials)
    t = Transport(config, auth=auth, hooks=kw.get("hooks", ()), clock=kw.get("clock", FakeClock()))
    try:
        yield t
    finally:
        t.close()


def post(path: str = "/api/v1/x", **kw: Any) -> RequestSpec:
    kw.setdefault("json", {"a": 1})
    return RequestSpec(method="POST", path=path, pool=kw.pop("pool", Pool.TRAIN), **kw)


def get(path: str = "/api/v1/x", **kw: Any) -> RequestSpec:
    return RequestSpec(method="GET", path=path, pool=kw.pop("pool", Pool.TRAIN), **kw)


# ---------------------------------------------------------------------------------------------
# Pure pieces
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "expected"),
    [
        ("sess1:train:0", "sess1:train:0"),
        ("weights/step1", "weights/step1"),
        ("ck 1", "ck%201"),
        ("a?b#c", "a%3Fb%23c"),
        ("x%y", "x%25y"),
        ("é", "%C3%A9"),
        ("tinker://run:1/weights/s", "tinker://run:1/weights/s"),
    ],
)
def test_quote_path(segment: str, expected: str) -> None:
    assert quote_path(segment) == expected


def test_idempotency_keys_are_uuid4s_unique_across_blocks_of_random_bytes() -> None:
    keys = [_transport.new_idempotency_key() for _ in range(3 * _models.KEY_BLOCK + 1)]
    assert len(set(keys)) == len(keys)
    for key in keys:
        value = uuid.UUID(key.removeprefix("tinker_sync-retry-"))
        assert value.version == 4 and value.variant == uuid.RFC_4122


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_reuses_the_parents_idempotency_key_bytes() -> None:
    _transport.new_idempotency_key()  # the parent now holds unused random bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(write, _transport.new_idempotency_key().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child_key = pipe.read().decode()
    os.waitpid(pid, 0)
    assert child_key.startswith("tinker_sync-retry-")
    assert child_key != _transport.new_idempotency_key()


def test_request_spec_defaults() -> None:
    p = post(json={"b": "é", "a": [1, 2]})
    assert p.method == "POST"
    assert p.content == '{"b":"é","a":[1,2]}'.encode()
    assert p.content_type == "application/json"
    assert p.idempotency_key and p.idempotency_key.startswith("tinker_sync-retry-")
    assert post().idempotency_key != p.idempotency_key  # a new key per logical request
    assert get().idempotency_key is None
    assert RequestSpec(method="delete", path="/x", pool=Pool.REST).idempotency_key
    assert post(idempotency_key="fixed").idempotency_key == "fixed"
    assert post(timeout=45).timeout == Timeout.coerce(45)
    raw = RequestSpec(
        method="POST",
        path="/p",
        pool=Pool.TRAIN,
        content=b"\x00",
        content_type="application/x-protobuf",
    )
    assert raw.content_type == "application/x-protobuf"
    with pytest.raises(ValueError):
        RequestSpec(method="GET", path="api/v1/x", pool=Pool.TRAIN)
    with pytest.raises(ValueError):
        RequestSpec(method="POST", path="/x", pool=Pool.TRAIN, json={}, content=b"")
    assert KEY not in repr(post(headers={"X-API-Key": KEY}))


def test_sdk_method_scope_outermost_wins_and_is_captured_by_specs() -> None:
    assert current_sdk_method.get() is None
    with sdk_method_scope("TrainingClient.forward_backward"):
        with sdk_method_scope("TrainingClient.forward"):
            assert current_sdk_method.get() == "TrainingClient.forward_backward"
            captured = post()
        assert context_without_sdk_method().run(current_sdk_method.get) is None
        assert context_without_sdk_method().run(post).sdk_method is None
    assert current_sdk_method.get() is None
    assert captured.sdk_method == "TrainingClient.forward_backward"  # carried to any thread
    assert post().sdk_method is None


# ---------------------------------------------------------------------------------------------
# Headers (docs/design/behavior.md#request-headers)
# ---------------------------------------------------------------------------------------------


def test_post_headers(stub: Stub) -> None:
    with transport_for(stub.url) as t, sdk_method_scope("SamplingClient.sample"):
        spec = post(headers={"X-Tinker-Sampling-Backpressure": "1"}, timeout=Timeout(45.0))
        reply = t.send_once(spec, attempt=3)
    assert reply.status == 200 and reply.json() == {"ok": True}
    seen = stub.seen[0]
    assert seen.method == "POST" and seen.path == "/api/v1/x"
    assert seen.body == b'{"a":1}'
    expected = {
        "Accept": "application/json",
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "x-stainless-retry-count": "3",
        "x-stainless-read-timeout": "45",
        "X-Idempotency-Key": spec.idempotency_key,
        "X-API-Key": KEY,
        "x-sdk-version": "0.38.0",
        "x-sdk-method": "SamplingClient.sample",
        "X-Tinker-Sampling-Backpressure": "1",
    }
    for name, value in expected.items():
        assert seen.header(name) == value, name
    assert USER_AGENT.startswith("tinker-sync/") and "(protocol 0.38.0)" in USER_AGENT
    assert seen.header("Authorization") is None
    assert seen.header("Accept-Encoding") == "gzip, deflate"  # what both paths decode


def test_get_headers_and_query(stub: Stub) -> None:
    with transport_for(stub.url) as t:
        t.send_once(get("/api/v1/training_runs", params={"limit": 5, "flag": True, "skip": None}))
    seen = stub.seen[0]
    assert seen.path == "/api/v1/training_runs?limit=5&flag=true"
    assert seen.header("Content-Type") is None
    assert seen.header("X-Idempotency-Key") is None
    assert seen.header("x-sdk-method") is None and seen.header("x-sdk-version") is None
    assert seen.header("x-stainless-read-timeout") == "60"
    assert seen.header("X-API-Key") == KEY


def test_proto_expectation_sets_accept(stub: Stub) -> None:
    with transport_for(stub.url) as t:
        t.send_once(post(expect="proto"))
        t.send_once(
            RequestSpec(
                method="POST",
                path="/api/v1/fb",
                pool=Pool.TRAIN,
                content=b"\x08\x01",
                content_type="application/x-protobuf",
            )
        )
    assert stub.seen[0].header("Accept") == "application/x-protobuf"
    assert stub.seen[1].header("Content-Type") == "application/x-protobuf"
    assert stub.seen[1].body == b"\x08\x01"


def test_header_precedence(stub: Stub) -> None:
    env = {"CLOUDFLARE_ACCESS_CLIENT_ID": "cf-id", "CLOUDFLARE_ACCESS_CLIENT_SECRET": CF_SECRET}
    overrides = {
        "x-tinker-request-type": "user",
        "CF-Access-Client-Id": "mine",
        "x-api-key": "user-value",
    }
    with transport_for(stub.url, environ=env, default_headers_overrides=overrides) as t:
        t.send_once(post(headers={"X-Tinker-Request-Type": "spec"}))
    with transport_for(stub.url, auth=None, environ=env, default_headers_overrides=overrides) as t:
        t.send_once(post())
    with_auth, without_auth = stub.seen
    assert with_auth.header("X-Tinker-Request-Type") == "user"  # user overrides come last
    assert with_auth.header("CF-Access-Client-Id") == "mine"
    assert with_auth.header("CF-Access-Client-Secret") == CF_SECRET
    assert with_auth.header("X-API-Key") == KEY  # the credential always wins
    assert without_auth.header("X-API-Key") == "user-value"
    assert sum(1 for k in with_auth.headers if k.lower() == "x-api-key") == 1


@pytest.mark.parametrize(
    "spec_headers",
    [{}, {"X-Tinker-Sampling-Backpressure": "1"}, {"accept": "text/plain"}, {"A": "1", "a": "2"}],
)
@pytest.mark.parametrize(
    "user", [{}, {"x-tinker-request-type": "user"}, {"x-stainless-os": "Plan9"}, {"X-API-KEY": "u"}]
)
def test_built_headers_are_the_case_insensitive_merge_of_their_sources(
    spec_headers: dict[str, str], user: dict[str, str]
) -> None:
    # build_headers adds overrides whose names collide with nothing without merging: the
    # lines and their order must stay those of the merge, with or without collisions.
    from tinker_sync._transport._headers import _merge

    with transport_for("http://127.0.0.1:9") as plain:
        sdk = plain.build_headers(post(headers={}), 2, None)
    with transport_for("http://127.0.0.1:9", default_headers_overrides=user) as t:
        static = t.config.static_headers()
        for token in (KEY, None):
            for _ in range(2):  # the second time from what the transport remembered
                spec = post(headers=spec_headers, idempotency_key=sdk["X-Idempotency-Key"])
                got = t.build_headers(spec, 2, token)
                sources = [o for o in (spec_headers, static) if o]
                expected = _merge(dict(sdk), *sources, *([{"X-API-Key": token}] if token else []))
                assert list(got.items()) == list(expected.items())


def test_redirect_strips_secrets_across_origins(stub: Stub) -> None:
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    other.daemon_threads = True
    other_stub = Stub(other)
    other.stub = other_stub  # type: ignore[attr-defined]
    thread = threading.Thread(target=other.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        stub.script("/api/v1/x", (307, {"Location": other_stub.url + "/api/v1/y"}, b""))
        stub.script("/api/v1/same", (307, {"Location": "/api/v1/z"}, b""))
        env = {"CLOUDFLARE_ACCESS_CLIENT_SECRET": CF_SECRET}
        with transport_for(stub.url, environ=env) as t:
            assert t.send_once(post()).status == 200
            assert t.send_once(post("/api/v1/same")).status == 200
        moved = other_stub.seen[0]
        assert moved.path == "/api/v1/y"
        assert moved.header("X-API-Key") is None and moved.header("CF-Access-Client-Secret") is None
        same = [s for s in stub.seen if s.path == "/api/v1/z"][0]
        assert same.header("X-API-Key") == KEY
    finally:
        other.shutdown()
        other.server_close()
        thread.join(HANG_GUARD_S)


# ---------------------------------------------------------------------------------------------
# Timeouts (docs/design/behavior.md#timeouts, docs/design/behavior.md#limiter-registry)
# ---------------------------------------------------------------------------------------------


def test_every_request_has_connect_and_read_timeouts(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, transport_path: str
) -> None:
    log: list[Any] = []
    cases = [
        (None, None, (5.0, 60.0)),
        (None, 45, (45.0, 45.0)),
        (None, Timeout(10.0), (5.0, 10.0)),
        (None, Timeout(45.0, connect=2.0), (2.0, 45.0)),
        (30, None, (30.0, 30.0)),
        (Timeout(20.0), None, (5.0, 20.0)),
    ]
    read_timeouts: list[float | None] = []
    if transport_path == "urllib3":
        real_urlopen = urllib3.HTTPConnectionPool.urlopen
        real_getresponse = urllib3.connection.HTTPConnection.getresponse

        def urlopen(self: Any, method: str, url: str, **kw: Any) -> Any:
            log.append((kw["timeout"].connect_timeout, kw["timeout"].read_timeout))  # asked...
            return real_urlopen(self, method, url, **kw)

        def getresponse(self: Any, *args: Any, **kw: Any) -> Any:
            read_timeouts.append(self.timeout)  # ...and what the connection reads with
            return real_getresponse(self, *args, **kw)

        monkeypatch.setattr(urllib3.HTTPConnectionPool, "urlopen", urlopen)
        monkeypatch.setattr(urllib3.connection.HTTPConnection, "getresponse", getresponse)
    else:
        real_exchange = _direct.DirectPool.exchange
        real_read = _direct.DirectConnection.read_reply

        def exchange(
            self: Any, method: str, target: str, body: Any, headers: Any, timeout: Any, *a: Any
        ) -> Any:
            log.append((timeout.connect, timeout.read))  # asked...
            return real_exchange(self, method, target, body, headers, timeout, *a)

        def read_reply(self: Any, method: str, *a: Any) -> Any:
            # ...and what the socket reads with
            read_timeouts.append(socket_read_timeout(self.sock))
            return real_read(self, method, *a)

        monkeypatch.setattr(_direct.DirectPool, "exchange", exchange)
        monkeypatch.setattr(_direct.DirectConnection, "read_reply", read_reply)
    for client_timeout, spec_timeout, expected in cases:
        with transport_for(stub.url, timeout=client_timeout) as t:
            for pool in Pool:
                t.send_once(post(pool=pool, timeout=spec_timeout))
                t.send_once(get(pool=pool, timeout=spec_timeout))
        assert log == [expected] * (2 * len(Pool)), (client_timeout, spec_timeout)
        assert read_timeouts == [pytest.approx(expected[1], abs=0.01)] * (2 * len(Pool))
        log.clear()
        read_timeouts.clear()


# ---------------------------------------------------------------------------------------------
# Transport failures
# ---------------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_not_sent() -> None:
    with (
        transport_for(f"http://127.0.0.1:{closed_port()}") as t,
        pytest.raises(APIConnectError) as info,
    ):
        t.send_once(post())
    err = info.value
    assert type(err) is APIConnectError and err.outcome is RequestOutcome.NOT_SENT
    assert err.request is not None and err.request.headers["X-API-Key"] == "<redacted>"
    assert KEY not in str(err) and KEY not in repr(err.request.headers)
    assert isinstance(err.__cause__, urllib3.exceptions.NewConnectionError)
    assert KEY not in repr(vars(err.__cause__))  # the urllib3 error holds no headers


def socket_read_timeout(sock: socket.socket) -> float | None:
    """How long ``sock``'s reads wait for a byte: its timeout, or for a blocking socket the
    kernel's ``SO_RCVTIMEO`` (None: for ever)."""
    if sock.gettimeout() is not None or not _direct.KERNEL_TIMEOUTS:
        return sock.gettimeout()
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.calcsize("@ll"))
    seconds, micros = struct.unpack("@ll", raw)
    return None if seconds == micros == 0 else seconds + micros / 1e6


@pytest.mark.skipif(not _direct.KERNEL_TIMEOUTS, reason="kernel socket timeouts: 64-bit Linux")
@pytest.mark.parametrize("transport_path", ["direct"], indirect=True)  # the direct path's sockets
def test_a_plain_connection_is_blocking_with_kernel_timeouts(
    stub: Stub, transport_path: str
) -> None:
    """No poll before each send and read (each would release the GIL once more,
    docs/transport.md): the socket blocks and the kernel keeps the timeouts (in its clock
    ticks: a few milliseconds)."""
    seen: list[tuple[float | None, float | None, float | None]] = []
    real_read = _direct.DirectConnection.read_reply

    def read_reply(self: Any, method: str, *a: Any) -> Any:
        raw = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.calcsize("@ll"))
        seconds, micros = struct.unpack("@ll", raw)
        seen.append(
            (self.sock.gettimeout(), socket_read_timeout(self.sock), seconds + micros / 1e6)
        )
        return real_read(self, method, *a)

    with pytest.MonkeyPatch.context() as mp, transport_for(stub.url) as t:
        mp.setattr(_direct.DirectConnection, "read_reply", read_reply)
        t.send_once(post(timeout=Timeout(7.5, connect=5.0)))
        t.send_once(post(timeout=Timeout(2.25, connect=5.0)))
    tick = 0.01
    assert seen == [
        (None, pytest.approx(7.5, abs=tick), pytest.approx(7.5, abs=tick)),
        (None, pytest.approx(2.25, abs=tick), pytest.approx(2.25, abs=tick)),
    ]


@pytest.mark.skipif(
    not _direct.KERNEL_TIMEOUTS or not hasattr(socket, "TCP_INFO"), reason="TCP_INFO: 64-bit Linux"
)
@pytest.mark.parametrize("end", ["bytes", "fin", "rst"])
def test_the_idle_check_of_a_plain_connection_reads_tcp_info_without_a_poll(end: str) -> None:
    """A poll releases the GIL (docs/transport.md): on plain TCP the idle check asks the
    kernel's TCP_INFO instead, and still finds bytes nobody asked for, a FIN and a RST."""
    import select

    def no_poll(*args: Any) -> Any:
        raise AssertionError("the idle check polled")

    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    with socket.create_server(("127.0.0.1", 0)) as server:
        conn = _direct.DirectConnection(socket.create_connection(server.getsockname(), 5.0))
        peer, _ = server.accept()
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(select, "poll", no_poll)
                mp.setattr(select, "select", no_poll)
                assert not conn.dropped()
                peer.sendall(reply)
                status, _, body, reusable = conn.read_reply("GET", 1024, 5.0, None)
                assert (status, body, reusable) == (200, b"ok", True)
                assert not conn.dropped()  # every byte received was read
            if end == "bytes":
                peer.sendall(b"HTTP/1.1 200 OK\r\n")  # a reply nobody asked for
            elif end == "fin":
                peer.shutdown(socket.SHUT_WR)
            else:
                peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                peer.close()
            assert select.select([conn.sock], [], [], 5.0)[0]  # arrived (before the patch)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(select, "poll", no_poll)
                mp.setattr(select, "select", no_poll)
                assert conn.dropped()
        finally:
            conn.close()
            peer.close()


@pytest.mark.parametrize(
    "reply", [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"HTTP/1.1 ?"]
)
def test_reading_a_reply_leaves_no_reference_cycle(reply: bytes) -> None:
    """The reply parser holds the reply's callbacks: once read (or refused), the reply lets go
    of its parser, so each request leaves nothing for the cyclic garbage collector to find."""
    import gc

    with socket.create_server(("127.0.0.1", 0)) as server:
        conn = _direct.DirectConnection(socket.create_connection(server.getsockname(), 5.0))
        peer, _ = server.accept()
        try:
            peer.sendall(reply)
            peer.shutdown(socket.SHUT_WR)
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)  # unreachable objects go to gc.garbage, not away
            try:
                with contextlib.suppress(http.client.HTTPException):  # a refused reply too
                    conn.read_reply("GET", 1024, 5.0, None)
                gc.collect()
                kinds = {type(o).__name__ for o in gc.garbage}
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
        finally:
            conn.close()
            peer.close()
    assert not kinds & {"_Reply", "HttpResponseParser"}


@pytest.mark.skipif(not _direct.KERNEL_TIMEOUTS, reason="kernel socket timeouts: 64-bit Linux")
def test_a_send_the_peer_never_reads_times_out_within_its_timeout() -> None:
    """A blocking socket's send timeout bounds the whole send, as a socket timeout does (a
    send the kernel cut short goes on with what is left of it)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=5.0)
        peer, _ = server.accept()
        try:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            conn = _direct.DirectConnection(client)
            conn.set_timeout(0.2)
            assert client.gettimeout() is None
            with pytest.raises(TimeoutError):
                conn.request(b"POST / HTTP/1.1\r\n\r\n", b"x" * (16 * 1024 * 1024))
        finally:
            peer.close()
            client.close()


def test_read_timeout(stub: Stub) -> None:
    release = threading.Event()
    stub.blockers.append(release)
    stub.script("/api/v1/x", ("block", release))
    with transport_for(stub.url) as t, pytest.raises(APITimeoutError) as info:
        t.send_once(post(timeout=Timeout(0.3, connect=5.0)))
    assert not isinstance(info.value, APIConnectError)
    assert info.value.outcome is RequestOutcome.UNKNOWN


@pytest.mark.parametrize("action", ["drop", ("partial", 100, b'{"trunc')])
def test_dropped_connection_is_a_connection_error(stub: Stub, action: Action) -> None:
    stub.script("/api/v1/x", action)
    with transport_for(stub.url) as t, pytest.raises(APIConnectionError) as info:
        t.send_once(post())
    assert type(info.value) is APIConnectionError
    assert info.value.outcome is RequestOutcome.UNKNOWN


def _max_retry(reason: Exception) -> urllib3.exceptions.MaxRetryError:
    return urllib3.exceptions.MaxRetryError(None, "/x", reason)  # type: ignore[arg-type]


def _chain(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (urllib3.exceptions.ConnectTimeoutError(None, "t"), APIConnectTimeoutError),
        (_max_retry(urllib3.exceptions.NewConnectionError(None, "refused")), APIConnectError),  # type: ignore[arg-type]
        (
            _max_retry(urllib3.exceptions.NameResolutionError("h", None, OSError())),  # type: ignore[arg-type]
            APIConnectError,
        ),
        (urllib3.exceptions.ClosedPoolError(None, "closed"), APIConnectError),  # type: ignore[arg-type]
        (urllib3.exceptions.ProxyError("proxy said no", OSError()), APIConnectError),
        (http.client.IncompleteRead(b"partial"), APIConnectionError),
        (http.client.RemoteDisconnected("closed"), APIConnectionError),
        (OSError(9, "Bad file descriptor"), APIConnectionError),
        (
            _chain(urllib3.exceptions.ProtocolError("wrapped"), OSError(9, "Bad file descriptor")),
            APIConnectionError,
        ),
        (urllib3.exceptions.NewConnectionError(None, "refused"), APIConnectError),
        (urllib3.exceptions.SSLError("bad handshake"), APIConnectError),
        (urllib3.exceptions.ReadTimeoutError(None, "/x", "timed out"), APITimeoutError),  # type: ignore[arg-type]
        (urllib3.exceptions.ProtocolError("aborted", ConnectionResetError()), APIConnectionError),
        (urllib3.exceptions.DecodeError("bad gzip"), APIConnectionError),
        (urllib3.exceptions.LocationParseError("::bad"), None),
        (ValueError("a bug"), None),
    ],
)
def test_map_transport_error(exc: BaseException, expected: type[BaseException] | None) -> None:
    mapped = map_transport_error(exc)
    if expected is None:
        assert mapped is None
    else:
        assert type(mapped) is expected
    if expected is APIConnectTimeoutError:
        assert isinstance(mapped, APITimeoutError) and mapped.outcome is RequestOutcome.NOT_SENT


# ---------------------------------------------------------------------------------------------
# Status replies, bare 400 (docs/design/behavior.md#http-retry-policy)
# ---------------------------------------------------------------------------------------------


def test_error_statuses_are_returned_and_mapped(stub: Stub) -> None:
    stub.script(
        "/api/v1/x", (400, {"Content-Type": "application/json"}, b'{"detail":"bad seq_id"}')
    )
    stub.script("/api/v1/x", (503, {}, b"overloaded"))
    stub.script("/api/v1/x", (200, {}, b"not json"))
    with transport_for(stub.url) as t:
        bad = t.send_once(post())
        server = t.send_once(post())
        junk = t.send_once(post())
    assert bad.status == 400 and bad.request is not None
    err = error_from_reply(bad)
    assert isinstance(err, BadRequestError) and err.body == {"detail": "bad seq_id"}
    assert str(err) == "Error code: 400 - {'detail': 'bad seq_id'}"
    assert err.request is not None and err.request.headers["X-API-Key"] == "<redacted>"
    assert isinstance(error_from_reply(server), InternalServerError)
    assert error_from_reply(server).body == "overloaded"
    with pytest.raises(APIResponseValidationError):
        junk.json()
    for e in (err, error_from_reply(server)):  # docs/design/behavior.md#exception-hierarchy
        clone = pickle.loads(pickle.dumps(e))
        assert type(clone) is type(e) and KEY not in pickle.dumps(e).decode("latin-1")


def test_bare_400_budget_drains_and_refills(stub: Stub) -> None:
    empty_400 = (400, {}, b"")
    with transport_for(stub.url) as t:
        pools = t.pools()
        first_route = pools.route(Pool.SAMPLE)
        stub.script("/api/v1/x", *[empty_400] * (BARE_400_BUDGET + 1))
        for i in range(BARE_400_BUDGET):
            with pytest.raises(APIConnectionError) as info:
                t.send_once(post(pool=Pool.SAMPLE))
            assert type(info.value) is APIConnectionError
            assert pools.budget(Pool.SAMPLE) == BARE_400_BUDGET - 1 - i
        assert pools.route(Pool.SAMPLE) is not first_route  # connections were reset
        exhausted = t.send_once(post(pool=Pool.SAMPLE))  # budget gone: a real 400
        assert exhausted.status == 400 and isinstance(error_from_reply(exhausted), BadRequestError)
        assert pools.budget(Pool.TRAIN) == BARE_400_BUDGET  # budgets are per pool
        for expected in (1, 2):  # each success earns one back
            assert t.send_once(post(pool=Pool.SAMPLE)).status == 200
            assert pools.budget(Pool.SAMPLE) == expected
        stub.script("/api/v1/x", empty_400)
        with pytest.raises(APIConnectionError):
            t.send_once(post(pool=Pool.SAMPLE))
        assert pools.budget(Pool.SAMPLE) == 1
        for _ in range(30):
            t.send_once(post(pool=Pool.SAMPLE))
        assert pools.budget(Pool.SAMPLE) == BARE_400_BUDGET  # capped


# ---------------------------------------------------------------------------------------------
# Retries over real HTTP (docs/design/behavior.md#idempotency-key key reuse)
# ---------------------------------------------------------------------------------------------


def test_retries_share_one_idempotency_key_and_count_attempts(stub: Stub) -> None:
    stub.script("/api/v1/x", (500, {}, b"{}"), "drop", (429, {"retry-after-ms": "250"}, b"{}"))
    clock = FakeClock(rng=lambda: 0.0)
    with transport_for(stub.url, clock=clock) as t:
        spec = post()
        assert send_with_retries(t, spec).status == 200
        send_with_retries(t, post())  # an identical second call: a new key
    first, second, third, fourth, other = stub.seen
    keys = {s.header("X-Idempotency-Key") for s in (first, second, third, fourth)}
    assert keys == {spec.idempotency_key}
    assert other.header("X-Idempotency-Key") not in keys
    assert [s.header("x-stainless-retry-count") for s in stub.seen] == ["0", "1", "2", "3", "0"]
    assert clock.sleeps == [(0.5, "http-retry"), (1.0, "http-retry"), (0.25, "http-retry")]


# ---------------------------------------------------------------------------------------------
# JWT: 5 concurrent invalid_token 401s -> one exchange and one replay each
# (docs/design/behavior.md#jwt-auth)
# ---------------------------------------------------------------------------------------------


def make_jwt(n: int, now: float) -> str:
    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'HS256'})}.{b64({'iat': now, 'exp': now + 3600, 'n': n})}.sig"


def test_concurrent_invalid_token_cause_one_exchange(stub: Stub) -> None:
    now = time.time()
    jwts = [make_jwt(n, now) for n in (1, 2, 3)]
    issued: list[str] = []
    rejected_together = threading.Barrier(5)

    def responder(req: Seen) -> Action:
        if req.path == "/api/v1/auth/token":
            token = jwts[len(issued)]
            issued.append(req.header("X-API-Key") or "")
            return (200, {"Content-Type": "application/json"}, json.dumps({"jwt": token}).encode())
        if req.header("X-API-Key") == jwts[0]:
            rejected_together.wait(HANG_GUARD_S)  # all five were sent with the old token
            return (
                401,
                {"WWW-Authenticate": 'Bearer error="invalid_token"'},
                b'{"detail":"expired"}',
            )
        return (200, {"Content-Type": "application/json"}, b'{"ok":true}')

    stub.responder = responder
    config = config_for(stub.url)
    base = Transport(config, clock=FakeClock())
    auth = JwtAuth(TokenExchange(base, config.credentials), clock=base.clock)
    t = base.with_auth(auth)
    try:
        assert auth.token() == jwts[0]
        start = threading.Barrier(5)
        replies: list[Reply] = []
        lock = threading.Lock()

        def worker() -> None:
            start.wait(HANG_GUARD_S)
            r = t.send_once(post())
            with lock:
                replies.append(r)

        threads = [threading.Thread(target=worker) for _ in range(5)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(HANG_GUARD_S)
        assert [r.status for r in replies] == [200] * 5
        assert issued == [KEY, KEY]  # first token + exactly one replacement, raw key each time
        x_calls = [s for s in stub.seen if s.path == "/api/v1/x"]
        assert sorted(s.header("X-API-Key") or "" for s in x_calls) == sorted(
            [jwts[0]] * 5 + [jwts[1]] * 5
        )
        exchanges = [s for s in stub.seen if s.path == "/api/v1/auth/token"]
        assert all(s.body == b"{}" and s.header("x-sdk-method") is None for s in exchanges)
    finally:
        auth.close()
        t.close()
        base.close()


def test_invalid_token_without_refresh_returns_the_401(stub: Stub) -> None:
    stub.script("/api/v1/x", (401, {"WWW-Authenticate": 'Bearer error="invalid_token"'}, b"{}"))
    with transport_for(stub.url) as t:
        assert t.send_once(post()).status == 401
    assert len(stub.seen) == 1


# ---------------------------------------------------------------------------------------------
# Hooks, logging, secrets
# ---------------------------------------------------------------------------------------------


def test_request_hooks_and_isolation(stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tinker_sync.transport")
    events: list[HookEvent] = []

    def broken(event: HookEvent) -> None:
        raise RuntimeError("hook bug")

    stub.script("/api/v1/x", (503, {}, b"{}"), "drop")
    with transport_for(stub.url, hooks=(broken, events.append)) as t:
        assert t.send_once(post(pool=Pool.SAMPLE), attempt=0).status == 503
        with pytest.raises(APIConnectionError):
            t.send_once(post(pool=Pool.SAMPLE), attempt=1)
    assert [(e.kind, e["status"], e["attempt"], e["pool"], e["error"]) for e in events] == [
        ("request", 503, 0, "sample", None),
        ("request", None, 1, "sample", "APIConnectionError"),
    ]
    assert all(e["method"] == "POST" and e["path"] == "/api/v1/x" for e in events)
    assert sum("hook" in r.getMessage() for r in caplog.records) == 2


def test_global_hooks_run_after_client_hooks(stub: Stub) -> None:
    order: list[str] = []

    def global_hook(event: HookEvent) -> None:
        order.append("global")

    _transport.add_global_hook(global_hook)
    try:
        with transport_for(stub.url, hooks=(lambda e: order.append("client"),)) as t:
            t.send_once(post())
    finally:
        _transport.remove_global_hook(global_hook)
    assert order == ["client", "global"]


def test_debug_log_redacts_secrets(stub: Stub) -> None:
    logger = logging.getLogger("tinker_sync.transport")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    env = {"CLOUDFLARE_ACCESS_CLIENT_SECRET": CF_SECRET}
    try:
        with transport_for(stub.url, environ=env) as t:
            t.send_once(post())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    text = stream.getvalue()
    assert "HTTP POST /api/v1/x" in text and "<redacted>" in text
    assert KEY not in text and CF_SECRET not in text


def test_deprecation_note_logged_once(stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tinker_sync")
    note = f"endpoint x is deprecated {id(stub)}"
    hdrs = {"x-deprecation-note": note, "x-deprecation-level": "error"}
    stub.script("/api/v1/x", (200, hdrs, b"{}"), (200, hdrs, b"{}"))
    with transport_for(stub.url) as t:
        t.send_once(post())
        t.send_once(post())
    records = [r for r in caplog.records if note in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.ERROR


def test_transport_is_not_picklable_and_repr_is_clean(stub: Stub) -> None:
    with transport_for(stub.url) as t:
        assert KEY not in repr(t)
        with pytest.raises(TypeError):
            pickle.dumps(t)


# ---------------------------------------------------------------------------------------------
# Lifecycle and fork (docs/design/behavior.md#drop-inherited-transport)
# ---------------------------------------------------------------------------------------------


def test_close_and_shared_pools(stub: Stub) -> None:
    config = config_for(stub.url)
    a = Transport(config, auth=CredentialAuth(config.credentials))
    b = a.with_auth(StaticKeyAuth(config.credentials))
    assert a.pools() is b.pools()  # one set of sessions per (pid, base_url)
    a.close()
    a.close()  # idempotent
    with pytest.raises(ClientClosedError):
        a.send_once(post())
    assert b.send_once(post()).status == 200  # the other user keeps the pools
    pools = b.pools()
    b.close()
    assert pools.closed
    c = Transport(config)
    assert c.pools() is not pools and c.send_once(post()).status == 200
    close_all_pools()
    with pytest.raises(ClientClosedError):
        c.send_once(post())
    c.close()


def _pooled_sockets(t: Transport, pool: Pool) -> list[socket.socket]:
    direct = t.pools().route(pool).direct
    if direct is not None:
        return [conn.sock for conn in direct._idle]
    conn_pool = t.pools().route(pool).origin
    queued = list(conn_pool.pool.queue) if conn_pool.pool is not None else []
    return [conn.sock for conn in queued if conn is not None and conn.sock is not None]


def test_connections_on_both_paths_get_the_same_socket_options(stub: Stub) -> None:
    """TCP_NODELAY and keepalive (docs/guarantees.md) on the connections either path opens."""
    from tinker_sync._transport._settings import socket_options

    with transport_for(stub.url) as t:
        assert t.send_once(post(pool=Pool.SAMPLE)).status == 200
        sockets = _pooled_sockets(t, Pool.SAMPLE)
        assert sockets
        for sock in sockets:
            for level, name, value in socket_options(Pool.SAMPLE):
                assert sock.getsockopt(level, name) == value, (level, name)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_rebuilds_pools_and_never_closes_inherited_sockets(stub: Stub) -> None:
    with transport_for(stub.url) as t:
        assert t.send_once(post()).status == 200
        parent_pools = t.pools()
        inherited = _pooled_sockets(t, Pool.TRAIN)
        assert inherited, "expected a kept-alive connection"
        parent_port = stub.seen[-1].client_port
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                ok = t.send_once(post("/api/v1/child")).status == 200
                rebuilt = t.pools() is not parent_pools
                buried = any(
                    parent_pools in group for group in _pools._GRAVEYARD if isinstance(group, list)
                )
                t.close()
                close_all_pools()
                untouched = all(s.fileno() != -1 for s in inherited) and not parent_pools.closed
                code = 0 if (ok and rebuilt and buried and untouched) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        child_req = [s for s in stub.seen if s.path == "/api/v1/child"][0]
        assert child_req.client_port != parent_port  # the child opened its own connection
        assert t.send_once(post("/api/v1/after")).status == 200
        assert stub.seen[-1].client_port == parent_port  # the parent's connection still works


def test_abort_inflight_unblocks_a_long_read(stub: Stub) -> None:
    arrived = threading.Event()
    release = threading.Event()
    stub.blockers.append(release)

    def hold(req: Seen) -> Action:
        arrived.set()
        return ("block", release)

    stub.script("/api/v1/long", hold)
    errors: list[BaseException] = []
    with transport_for(stub.url) as t:
        pools = t.pools()
        assert t.send_once(post()).status == 200 and pools.inflight() == 0

        def long_poll() -> None:
            try:
                t.send_once(post("/api/v1/long", pool=Pool.RETRIEVE_PROMISE, timeout=3600))
            except BaseException as exc:
                errors.append(exc)

        th = threading.Thread(target=long_poll)
        th.start()
        assert arrived.wait(HANG_GUARD_S)
        assert pools.inflight() == 1
        assert pools.abort_inflight() == 1
        th.join(HANG_GUARD_S)
        assert not th.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], APIConnectionError)
        assert t.send_once(post()).status == 200  # other pools' connections are unaffected


@pytest.mark.slow
def test_interpreter_exit_aborts_long_polls_in_pool_threads() -> None:
    """A ThreadPoolExecutor job blocked on a 3600 s read does not delay exit
    (docs/design/behavior.md#fast-interpreter-exit)."""
    script = textwrap.dedent(
        """
        import socket, threading
        from concurrent.futures import ThreadPoolExecutor
        from tinker_sync._config import ClientConfig
        from tinker_sync._transport import Pool, RequestSpec, Transport

        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        accepted = threading.Event()
        held = []
        def accept():
            conn, _ = srv.accept()
            held.append(conn)
            accepted.set()
        threading.Thread(target=accept, daemon=True).start()
        url = "http://127.0.0.1:%d" % srv.getsockname()[1]
        config = ClientConfig.from_env(base_url=url, api_key="tml-exit-test", environ={}, timeout=3600)
        transport = Transport(config)
        pool = ThreadPoolExecutor(1)
        spec = RequestSpec(method="POST", path="/api/v1/retrieve_future", pool=Pool.RETRIEVE_PROMISE, json={})
        future = pool.submit(transport.send_once, spec)
        assert accepted.wait(60)
        print("in-flight", flush=True)
        """
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert "in-flight" in proc.stdout
    assert elapsed < 10.0  # without the exit hook the worker would block for an hour


# ---------------------------------------------------------------------------------------------
# Against tinker_sync.local.LocalServer with fault plans
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def local_server_factory() -> Iterator[Callable[..., Any]]:
    local = pytest.importorskip("tinker_sync.local")
    servers: list[Any] = []

    def make(**kw: Any) -> Any:
        server = local.LocalServer(**kw).start()
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()


CONFIG_BODY = {"sdk_version": "0.38.0"}


def config_spec() -> RequestSpec:
    return RequestSpec(
        method="POST", path="/api/v1/client/config", pool=Pool.SESSION, json=CONFIG_BODY
    )


@pytest.mark.parametrize(
    ("faults", "statuses", "sleeps"),
    [
        (["client/config 500 x2"], [500, 500, 200], [0.5, 1.0]),
        (["* 400 empty_body=true x3"], [400, 400, 400, 200], [0.5, 1.0, 2.0]),
        (["client/config 429 retry_after_ms=750"], [429, 200], [0.75]),
        (["client/config 503 retry_after=120"], [503, 200], [0.5]),
        (["client/config drop-before"], [None, 200], [0.5]),
    ],
)
def test_local_server_fault_flows(
    local_server_factory: Callable[..., Any],
    faults: list[str],
    statuses: list[int | None],
    sleeps: list[float],
) -> None:
    server = local_server_factory(faults=faults)
    clock = FakeClock(rng=lambda: 0.0)
    with transport_for(server.url, api_key=server.api_key, clock=clock) as t:
        reply = send_with_retries(t, config_spec())
    assert reply.status == 200 and reply.json()["pjwt_auth_enabled"] is False
    assert [r.status for r in server.requests if r.endpoint == "client/config"] == statuses
    assert clock.sleeps_for("http-retry") == pytest.approx(sleeps)


def test_local_server_retry_after_date(local_server_factory: Callable[..., Any]) -> None:
    server = local_server_factory(faults=["client/config 429 retry_after_date=30"])
    clock = FakeClock(wall=time.time(), rng=lambda: 0.0)
    with transport_for(server.url, api_key=server.api_key, clock=clock) as t:
        send_with_retries(t, config_spec())
    (delay,) = clock.sleeps_for("http-retry")
    assert 28.0 <= delay <= 32.0  # 1 s date resolution + the time to start the request


def test_local_server_should_retry_false_and_exhaustion(
    local_server_factory: Callable[..., Any],
) -> None:
    server = local_server_factory(faults=["client/config 500 x* should_retry=false"])
    clock = FakeClock(rng=lambda: 0.0)
    with transport_for(server.url, api_key=server.api_key, clock=clock) as t:
        with pytest.raises(InternalServerError) as info:
            send_with_retries(t, config_spec())
    assert info.value.status_code == 500 and "injected fault" in str(info.value)
    assert clock.sleeps == [] and len(server.requests) == 1


# ---------------------------------------------------------------------------------------------
# Prepared header lines and redirects
# ---------------------------------------------------------------------------------------------


def _reachable_strings(root: object, limit: int = 200_000) -> Iterator[str]:
    """Every str and bytes reachable from ``root`` through containers and object attributes."""
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            yield obj
        elif isinstance(obj, (bytes, bytearray)):
            yield bytes(obj).decode("latin-1")
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            stack.extend(getattr(obj, "__dict__", {}).values())
            stack.extend(getattr(obj, s, None) for s in getattr(type(obj), "__slots__", ()))


def _transport_module_state() -> list[object]:
    return [
        value
        for name, module in sys.modules.items()
        if name == "tinker_sync._transport" or name.startswith("tinker_sync._transport.")
        for key, value in vars(module).items()
        if not key.startswith("__") and key != "_registry"  # pools: checked on their own
    ]


def test_secrets_live_only_in_their_owners_and_close_drops_them(stub: Stub) -> None:
    """The Cloudflare secret and a user Authorization header are sent, but no module-level cache
    of the transport keeps them, and a closed Transport holds no copy of its own."""
    user_auth = "Bearer user-token-5551212"
    env = {"CLOUDFLARE_ACCESS_CLIENT_ID": "cf-id", "CLOUDFLARE_ACCESS_CLIENT_SECRET": CF_SECRET}
    overrides = {"Authorization": user_auth}
    secrets = (CF_SECRET, user_auth, KEY)
    with transport_for(stub.url, environ=env, default_headers_overrides=overrides) as t:
        for attempt in range(3):
            assert t.send_once(post(), attempt=attempt).status == 200
            assert t.send_once(get(pool=Pool.SAMPLE)).status == 200
        state = _transport_module_state() + [t.pools()]
        leaked = [x for x in _reachable_strings(state) if any(sec in x for sec in secrets)]
        assert leaked == []
        owned = t
    assert stub.seen[0].header("CF-Access-Client-Secret") == CF_SECRET
    assert stub.seen[0].header("Authorization") == user_auth
    own = [v for k, v in vars(owned).items() if k not in ("config", "auth")]
    assert [x for x in _reachable_strings(own) if any(sec in x for sec in secrets)] == []


def test_header_values_with_line_breaks_are_refused_before_sending(stub: Stub) -> None:
    spec = post(headers={"X-Split": "a\r\nX-Injected: 1"})
    with transport_for(stub.url) as t, pytest.raises(ValueError, match="Invalid header"):
        t.send_once(spec)
    assert stub.seen == []


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"X-A": "a\r\nX-Injected: 1"}, "header 'X-A': value contains CR, LF or NUL"),
        ({"Bad Name": "v"}, "header name 'Bad Name'"),
        # framing and connection headers: the transport's alone (two would be a smuggling shape)
        ({"Content-Length": "0"}, "header 'Content-Length' cannot be set"),
        ({"transfer-encoding": "chunked"}, "header 'transfer-encoding' cannot be set"),
        ({"Connection": "close"}, "header 'Connection' cannot be set"),
        ({"Upgrade": "h2c"}, "header 'Upgrade' cannot be set"),
        ({"TE": "trailers"}, "header 'TE' cannot be set"),
        ({"Trailer": "X-A"}, "header 'Trailer' cannot be set"),
        ({"Keep-Alive": "timeout=5"}, "header 'Keep-Alive' cannot be set"),
    ],
)
def test_unsendable_user_headers_fail_at_construction(overrides: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        config_for("http://127.0.0.1:1", default_headers_overrides=overrides)
    assert "X-Injected" not in str(info.value)  # the value (maybe a secret) is not echoed
    with pytest.raises(ValueError, match=message):
        config_for("http://127.0.0.1:1", default_headers=overrides)


def test_a_configured_host_header_replaces_the_default_one(stub: Stub) -> None:
    with transport_for(stub.url, default_headers_overrides={"Host": "tinker.example.com"}) as t:
        t.send_once(post())
    assert [v for k, v in stub.seen[-1].lines if k.lower() == "host"] == ["tinker.example.com"]


def test_303_redirect_becomes_a_get_without_body(stub: Stub) -> None:
    stub.script("/api/v1/x", (303, {"Location": "/api/v1/result"}, b""))
    with transport_for(stub.url) as t:
        reply = t.send_once(post())
    assert reply.status == 200 and reply.url == stub.url + "/api/v1/result"
    moved = stub.seen[1]
    assert (moved.method, moved.body, moved.header("Content-Type")) == ("GET", b"", None)
    assert moved.header("X-API-Key") == KEY  # same origin keeps the credential


def test_redirect_loop_is_a_connection_error(stub: Stub) -> None:
    stub.script(
        "/api/v1/x", *[(307, {"Location": "/api/v1/x"}, b"")] * (_exchange.MAX_REDIRECTS + 1)
    )
    with transport_for(stub.url) as t, pytest.raises(APIConnectionError, match="redirects"):
        t.send_once(post())
    assert len(stub.seen) == _exchange.MAX_REDIRECTS + 1


def test_compressed_replies_are_decoded(stub: Stub) -> None:
    import gzip
    import zlib

    stub.script(
        "/api/v1/x",
        (
            200,
            {"Content-Encoding": "gzip", "Content-Type": "application/json"},
            gzip.compress(b'{"a":1}'),
        ),
        (200, {"Content-Encoding": "deflate"}, zlib.compress(b'{"b":2}')),
        (200, {"Content-Encoding": "gzip"}, b"not gzip at all"),
    )
    with transport_for(stub.url) as t:
        assert t.send_once(post()).json() == {"a": 1}
        assert t.send_once(post()).json() == {"b": 2}
        with pytest.raises(APIConnectionError, match="DecodeError"):
            t.send_once(post())
        assert t.send_once(post()).status == 200  # the pool recovers


def test_every_reply_framing_reads_the_same_on_both_paths(stub: Stub, transport_path: str) -> None:
    """Chunked bodies (extensions, trailers), an interim 100, repeated headers, and an HTTP/1.0
    body that ends with the connection: the same Reply on both paths, and the connection is
    kept only when the reply allows it."""
    stub.script(
        "/api/v1/x",
        (
            "raw",
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b'4;ext=1\r\n{"a"\r\n3\r\n:1}\r\n0\r\nX-Trailer: t\r\n\r\n',
            True,
        ),
        (
            "raw",
            b"HTTP/1.1 100 Continue\r\nLink: </a>\r\n\r\n"
            b"HTTP/1.1 201 Created\r\nX-Multi: one\r\n"
            b"x-multi: two\r\nContent-Length: 2\r\n\r\n{}",
            True,
        ),
        ("raw", b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[1, 2]", False),
    )
    with transport_for(stub.url) as t:
        chunked = t.send_once(post())
        assert (chunked.status, chunked.json()) == (200, {"a": 1})
        interim = t.send_once(post())
        assert interim.status == 201 and interim.json() == {}
        assert interim.headers["x-multi"] == "one, two"
        assert "link" not in interim.headers  # the 100's headers are not the reply's
        closing = t.send_once(post())
        assert (closing.status, closing.json()) == (200, [1, 2])
        assert t.send_once(post()).status == 200
    ports = [s.client_port for s in stub.seen]
    assert ports[0] == ports[1] == ports[2] != ports[3]  # kept alive until the HTTP/1.0 reply


def test_an_obsolete_folded_header_is_refused_by_the_strict_parser_or_unfolded(
    stub: Stub, transport_path: str
) -> None:
    """The direct path's parser (llhttp, strict) refuses a reply with an obsolete folded header
    line as malformed and closes the connection; urllib3 reads one value holding both parts
    (RFC 9112 lets a client replace the fold with spaces). Either way the next request gets
    its own reply."""
    folded = b"HTTP/1.1 200 OK\r\nX-Folded: first\r\n\tsecond\r\nContent-Length: 2\r\n\r\n{}"
    stub.script("/api/v1/x", ("raw", folded, True))
    with transport_for(stub.url) as t:
        if transport_path == "direct":
            with pytest.raises(APIConnectionError, match="ReplyProtocolError") as info:
                t.send_once(post())
            assert info.value.outcome is RequestOutcome.UNKNOWN
        else:
            assert t.send_once(post()).headers["x-folded"].split() == ["first", "second"]
        assert t.send_once(post()).json() == {"ok": True}


def test_both_paths_send_the_same_request_lines(stub: Stub, transport_path: str) -> None:
    """Host (port included), Content-Length (0 on a bodiless POST), the SDK's headers in order."""
    with transport_for(stub.url) as t:
        t.send_once(post())
        t.send_once(post(json=None))
        t.send_once(get())
    body_post, empty_post, plain_get = stub.seen
    port = stub.server.server_address[1]
    for seen in stub.seen:
        assert seen.header("Host") == f"127.0.0.1:{port}"
    assert body_post.header("Content-Length") == str(len(body_post.body))
    assert empty_post.header("Content-Length") == "0" and empty_post.body == b""
    assert plain_get.header("Content-Length") is None
    names = [k.lower() for k in body_post.headers]
    assert names.index("accept") < names.index("user-agent") < names.index("x-api-key")
    with transport_for(stub.url) as t:
        t.send_once(post(headers={"host": "tinker.example.com"}))
    assert [v for k, v in stub.seen[-1].lines if k.lower() == "host"] == [
        "tinker.example.com"
    ]  # a caller's own Host header replaces the default one, never a second Host line


@pytest.mark.parametrize(
    "headers",
    [{"X-Bad": "a\r\nX-Injected: 1"}, {"X-Bad": "a\nb"}, {" X-Bad": "v"}, {"X-Bad:": "v"}],
)
def test_header_injection_is_refused_before_anything_is_sent(
    stub: Stub, headers: dict[str, str]
) -> None:
    with transport_for(stub.url) as t, pytest.raises(ValueError, match="[Hh]eader"):
        t.send_once(post(headers=headers))
    assert stub.seen == []


def test_server_closing_or_dropping_a_connection_costs_a_new_one_not_an_error(
    stub: Stub,
) -> None:
    stub.script("/api/v1/close", (200, {"Connection": "close"}, b"{}"))
    with transport_for(stub.url) as t:
        assert t.send_once(post("/api/v1/close")).status == 200
        assert t.send_once(post()).status == 200  # the closed connection was not reused
        assert t.send_once(post()).status == 200  # ...and the new one is kept alive
        ports = [s.client_port for s in stub.seen]
        assert ports[0] != ports[1] == ports[2]
        for sock in _pooled_sockets(t, Pool.TRAIN):
            sock.shutdown(socket.SHUT_RDWR)  # as if the server or a NAT dropped it while idle
        assert t.send_once(post()).status == 200
        assert stub.seen[-1].client_port != ports[2]


def test_small_bodies_leave_with_their_headers_in_one_write(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, transport_path: str
) -> None:
    writes: list[int] = []
    if transport_path == "urllib3":
        real_send = urllib3.connection.HTTPConnection.send

        def send(self: Any, data: Any) -> None:
            writes.append(len(data))
            real_send(self, data)

        monkeypatch.setattr(urllib3.connection.HTTPConnection, "send", send)
    else:

        class CountingSocket(socket.socket):
            def sendall(self, data: Any, flags: int = 0) -> None:
                writes.append(len(data))
                super().sendall(data, flags)

        real_connect = socket.create_connection

        def create_connection(*args: Any, **kw: Any) -> socket.socket:
            real = real_connect(*args, **kw)
            counting = CountingSocket(real.family, real.type, real.proto, fileno=real.detach())
            counting.settimeout(kw.get("timeout"))
            return counting

        monkeypatch.setattr(_direct.socket, "create_connection", create_connection)
    small, large = b"x" * 1000, b"y" * (_connection.COALESCE_LIMIT + 1)
    with transport_for(stub.url) as t:
        for body in (small, large):
            spec = post(json=None, content=body, content_type="application/octet-stream")
            assert t.send_once(spec).status == 200
        assert t.send_once(get()).status == 200
    assert [s.body for s in stub.seen[:2]] == [small, large]
    assert len(writes) == 4  # small: one write; large: headers, then body; GET: headers
    assert writes[0] > len(small) and writes[2] == len(large)


def test_status_errors_keep_the_servers_words_bounded_with_the_request_id() -> None:
    from tinker_sync._transport import Reply

    long_detail = "x" * 5000
    reply = Reply(
        status=500,
        headers={"X-Request-Id": "rq-42", "content-type": "application/json"},
        content=('{"detail": "' + long_detail + '"}').encode(),
        elapsed=0.0,
        method="POST",
        url="http://h/api/v1/x",
    )
    err = error_from_reply(reply)
    text = str(err)
    assert text.startswith("Error code: 500 - {'detail': 'xxx")
    assert len(text) < 2100 and text.endswith("... (request id rq-42)")
    assert err.response.request_id == "rq-42" and err.body == {"detail": long_detail}


def test_a_redirect_to_a_signed_link_is_logged_without_its_query(
    stub: Stub, caplog: pytest.LogCaptureFixture
) -> None:
    """DEBUG reply lines show a Location's path, never its query (a signed URL's signature)."""
    signature = "c2lnbmF0dXJlLW9mLWEtc2lnbmVkLWxpbms"
    link = f"https://storage.example.com/ckpt/archive.tar?X-Amz-Signature={signature}&e=1"
    stub.script(
        "/api/v1/x",
        (
            "raw",
            f"HTTP/1.1 302 Found\r\nLocation: {link}\r\nContent-Length: 0\r\n\r\n".encode(),
            True,
        ),
    )
    caplog.set_level(logging.DEBUG, logger="tinker_sync")
    with transport_for(stub.url) as t:
        reply = t.send_once(get(follow_redirects=False))
    assert reply.status == 302 and reply.headers["location"] == link  # the caller gets it whole
    assert "storage.example.com/ckpt/archive.tar" in caplog.text
    assert signature not in caplog.text
