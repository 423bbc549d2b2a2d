"""A hostile or broken HTTP peer, byte by byte, against both request paths and each request kind.

The peer (``Hostile``) is a raw socket server on 127.0.0.1 that reads each request and answers
with the next scripted bytes. Every test sends real requests through ``Transport.send_once`` (no
retries, so each reply is seen as the client read it) for each request kind — a sample
submission, a future poll, a REST call and a training send, each on its own pool — and on both
request paths (the ``transport_path`` fixture). Classes (docs/transport.md#hostile-peers):

* never another request's reply: bytes after a reply close the connection;
* bounded memory: a reply above the cap, before or after decoding, is a typed error;
* bounded time: a peer dripping bytes is cut at the attempt's deadline; interim replies capped;
* codings: ``Accept-Encoding`` offers what both paths decode; an unknown coding is an error.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tinker_sync._config import ClientConfig, Timeout
from tinker_sync._credentials import StaticKeyAuth
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._transport import Pool, RequestSpec, Transport, _replies
from tinker_sync.exceptions import (
    APIConnectionError,
    APITimeoutError,
    RequestOutcome,
    TinkerError,
)

pytestmark = pytest.mark.usefixtures("transport_path")  # every test on both request paths
KEY = "tml-hostile-peer-test-key-0123456789"
GUARD_S = 20.0
"""A scripted misbehaviour never lasts longer than this (old code would otherwise hang)."""

Action = bytes | Callable[[socket.socket], None]


class Hostile:
    """A raw HTTP/1.1 peer: reads each request (head and ``Content-Length`` body) and answers with
    the next scripted action — bytes (the connection stays open for the next request) or a
    function of the socket (the connection is closed after it). Unscripted requests get
    ``{"default":true}``. ``requests`` lists ``(connection number, request line)``."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.actions: list[Action] = []
        self.requests: list[tuple[int, str]] = []
        self.heads: list[bytes] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def script(self, *actions: Action) -> None:
        with self.lock:
            self.actions.extend(actions)

    def connections(self) -> list[int]:
        with self.lock:
            return [conn for conn, _ in self.requests]

    def close(self) -> None:
        self.stop.set()
        self.accepter.join(5)
        with self.lock:
            socks = list(self.socks)
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass
        for thread in self.threads:
            thread.join(5)
        self.listener.close()

    def _accept(self) -> None:
        number = 0
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.socks.append(sock)
            thread = threading.Thread(target=self._serve, args=(sock, number), daemon=True)
            number += 1
            self.threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        buffer = b""
        sock.settimeout(GUARD_S)
        try:
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buffer:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                buffer = buffer[length:]
                with self.lock:
                    self.requests.append((number, head.split(b"\r\n")[0].decode()))
                    self.heads.append(head)
                    action = self.actions.pop(0) if self.actions else reply(b'{"default":true}')
                if isinstance(action, bytes):
                    sock.sendall(action)
                else:
                    action(sock)
                    return
        except OSError:
            return
        finally:
            sock.close()


def reply(body: bytes, status: str = "200 OK", headers: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{headers}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    peer = Hostile()
    try:
        yield peer
    finally:
        peer.close()


KINDS: dict[str, Callable[[], RequestSpec]] = {
    "sample submission": lambda: RequestSpec(
        method="POST",
        path="/api/v1/asample",
        pool=Pool.SAMPLE,
        json={"sampling_session_id": "s", "seq_id": 1, "prompt": {"chunks": []}},
        headers={"X-Tinker-Sampling-Backpressure": "1"},
    ),
    "future poll": lambda: RequestSpec(
        method="POST",
        path="/api/v1/retrieve_future",
        pool=Pool.RETRIEVE_PROMISE,
        json={"request_id": "r-1"},
        expect="proto",
    ),
    "REST call": lambda: RequestSpec(method="GET", path="/api/v1/training_runs", pool=Pool.REST),
    "training send": lambda: RequestSpec(
        method="POST",
        path="/api/v1/forward_backward",
        pool=Pool.TRAIN,
        content=b"\x08\x01" * 64,
        content_type="application/x-protobuf",
    ),
}


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> Callable[[], RequestSpec]:
    """Each request kind: the spec (path, pool, body, Accept) the SDK sends for it."""
    return KINDS[str(request.param)]


@pytest.fixture
def send(hostile: Hostile, kind: Callable[[], RequestSpec]) -> Iterator[Callable[..., Any]]:
    """``send(timeout=None)``: one attempt of this kind's request to the hostile peer."""
    config = ClientConfig.from_env(base_url=hostile.url, api_key=KEY, environ={})
    transport = Transport(config, auth=StaticKeyAuth(config.credentials), clock=FakeClock())

    def one(timeout: Timeout | None = None) -> Any:
        spec = kind()
        if timeout is not None:
            spec = RequestSpec(
                method=spec.method,
                path=spec.path,
                pool=spec.pool,
                content=spec.content,
                content_type=spec.content_type,
                headers=spec.headers,
                timeout=timeout,
            )
        return transport.send_once(spec)

    try:
        yield one
    finally:
        transport.close()


# -- never another request's reply -----------------------------------------------------------

FAKE = reply(b'{"reply":"FAKE, for nobody"}')
LEFTOVERS: dict[str, tuple[bytes, int]] = {
    # what the peer sends for the first request, and the status the client reads from it
    "a second reply after the first": (reply(b'{"reply":1}') + FAKE, 200),
    "body bytes past Content-Length": (reply(b'{"reply":1}') + b'{"more":1}' + FAKE, 200),
    "a 204 with a body": (
        f"HTTP/1.1 204 No Content\r\nContent-Length: {len(FAKE)}\r\n\r\n".encode() + FAKE,
        204,
    ),
    "a 304 with a body": (
        f"HTTP/1.1 304 Not Modified\r\nContent-Length: {len(FAKE)}\r\n\r\n".encode() + FAKE,
        304,
    ),
}


@pytest.mark.parametrize("leftover", list(LEFTOVERS))
def test_bytes_left_after_a_reply_close_the_connection_never_the_next_reply(
    hostile: Hostile, send: Callable[..., Any], leftover: str, transport_path: str
) -> None:
    """The direct path closes a connection with bytes after its reply; urllib3 drops them
    with http.client's reader of that reply (or finds the socket readable before reuse)."""
    first, status = LEFTOVERS[leftover]
    hostile.script(first, reply(b'{"reply":2}'))
    assert send().status == status
    second = send()
    assert second.json() == {"reply": 2}  # its own reply, not the left-over one
    if transport_path == "direct":
        assert hostile.connections() == [0, 1]  # the connection was not reused


REFUSED: dict[str, bytes] = {
    "a 101 Switching Protocols": (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        + FAKE
    ),
    "both Content-Length and Transfer-Encoding": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'b\r\n{"reply":1}\r\n0\r\n\r\n' + FAKE
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_101_or_an_ambiguous_framing_is_refused_and_its_connection_closed(
    hostile: Hostile, send: Callable[..., Any], case: str
) -> None:
    hostile.script(REFUSED[case], reply(b'{"reply":2}'))
    with pytest.raises(APIConnectionError, match="ReplyProtocolError") as info:
        send()
    assert info.value.outcome is RequestOutcome.UNKNOWN
    assert send().json() == {"reply": 2}
    assert hostile.connections() == [0, 1]


# -- bounded memory ----------------------------------------------------------------------------


def test_the_default_reply_cap_and_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _replies.max_reply_bytes() == _replies.DEFAULT_MAX_REPLY_BYTES == 128 * 1024 * 1024
    monkeypatch.setenv(_replies.MAX_REPLY_ENV, "4096")
    assert _replies.max_reply_bytes() == 4096
    for bad in ("0", "-1", "lots"):
        monkeypatch.setenv(_replies.MAX_REPLY_ENV, bad)
        with pytest.raises(ValueError, match=_replies.MAX_REPLY_ENV):
            _replies.max_reply_bytes()


CAP = 64 * 1024


def _endless_chunks(sock: socket.socket) -> None:
    sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    end = time.monotonic() + GUARD_S
    while time.monotonic() < end:
        sock.sendall(b"4000\r\n" + b"x" * 0x4000 + b"\r\n")


def _bomb(levels: int) -> tuple[bytes, str]:
    body = b"[" + b"0," * (CAP * 4) + b"0]"  # 4x the cap once decoded
    for _ in range(levels):
        body = gzip.compress(body)
    return body, ", ".join(["gzip"] * levels)


OVERSIZED: dict[str, Action] = {
    "a body above the cap": reply(b"[" + b"1," * CAP + b"1]"),
    "a Content-Length above the cap": b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n{",
    "a Content-Length beyond 64 bits": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n{}"
    ),
    "duplicated Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2"
    b"\r\n\r\n{}",
    "a chunk size beyond 64 bits": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"fffffffffffffffffffff\r\n{}",
    "an endless chunked body": _endless_chunks,
    "a gzip bomb": reply(_bomb(1)[0], headers="Content-Encoding: gzip\r\n"),
    "a nested gzip bomb": reply(_bomb(2)[0], headers=f"Content-Encoding: {_bomb(2)[1]}\r\n"),
    "a deflate bomb": reply(zlib.compress(b" " * CAP * 4), headers="Content-Encoding: deflate\r\n"),
    "an endless header block": lambda sock: _drip(
        sock, b"HTTP/1.1 200 OK\r\nX-Long: ", b"a" * 4096, 0.0
    ),
}


@pytest.mark.parametrize("case", list(OVERSIZED))
def test_an_oversized_or_overflowing_reply_is_a_typed_error_within_the_cap(
    hostile: Hostile,
    send: Callable[..., Any],
    case: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each fails with APIConnectionError (outcome UNKNOWN: the server may have acted), never
    MemoryError / OverflowError, and the next request gets its own reply. (On the urllib3 path
    a chunk size beyond 64 bits is cut by the attempt's deadline: http.client reads it as a
    large but finite chunk.)"""
    monkeypatch.setenv(_replies.MAX_REPLY_ENV, str(CAP))
    hostile.script(OVERSIZED[case], reply(b'{"reply":2}'))
    start = time.monotonic()
    with pytest.raises(APIConnectionError) as info:
        send(Timeout(1.0, connect=0.5))
    assert time.monotonic() - start < GUARD_S / 2  # cut at the cap, not at the peer's end
    assert info.value.outcome is RequestOutcome.UNKNOWN
    assert send().json() == {"reply": 2}


def test_a_reply_just_under_the_cap_is_read_whole(
    hostile: Hostile, send: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_replies.MAX_REPLY_ENV, str(CAP))
    raw = b"[" + b"7," * ((CAP - 3) // 2) + b"7]"
    assert len(raw) <= CAP
    hostile.script(
        reply(raw),
        reply(gzip.compress(raw), headers="Content-Encoding: gzip\r\n"),
    )
    assert send().content == raw
    assert send().content == raw


# -- bounded time ----------------------------------------------------------------------------


def _drip(sock: socket.socket, head: bytes, unit: bytes, pause: float) -> None:
    """Send ``head``, then ``unit`` again and again (every ``pause`` s) until GUARD_S or the
    client goes away."""
    sock.sendall(head)
    end = time.monotonic() + GUARD_S
    while time.monotonic() < end:
        sock.sendall(unit)
        if pause:
            time.sleep(pause)


DRIPS: dict[str, Action] = {
    "the header block one byte at a time": lambda sock: _drip(
        sock, b"HTTP/1.1 200 OK\r\n", b"X", 0.02
    ),
    "the body one byte at a time": lambda sock: _drip(
        sock, b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", b"x", 0.02
    ),
    "endless 100 Continue replies": lambda sock: _drip(
        sock, b"", b"HTTP/1.1 100 Continue\r\n\r\n", 0.01
    ),
    "endless 103 Early Hints": lambda sock: _drip(
        sock, b"", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", 0.01
    ),
}


@pytest.mark.parametrize("case", list(DRIPS))
def test_a_dripping_peer_is_cut_at_the_attempt_deadline(
    hostile: Hostile, send: Callable[..., Any], case: str
) -> None:
    """The read timeout (0.3 s, 15 drip pauses) restarts with every byte; the attempt's
    deadline (connect + 2 x read = 0.9 s) does not. Endless interim replies are refused after
    MAX_INTERIM."""
    hostile.script(DRIPS[case], reply(b'{"reply":2}'))
    start = time.monotonic()
    with pytest.raises(TinkerError) as info:
        send(Timeout(0.3, connect=0.3))
    assert time.monotonic() - start < GUARD_S / 2  # not held until the peer gives up
    assert isinstance(info.value, (APITimeoutError, APIConnectionError))
    assert info.value.outcome is RequestOutcome.UNKNOWN
    assert send().json() == {"reply": 2}
    assert hostile.connections() == [0, 1]


# -- codings -----------------------------------------------------------------------------------


def test_every_offered_coding_is_decoded_and_an_unknown_one_is_a_typed_error(
    hostile: Hostile, send: Callable[..., Any]
) -> None:
    body = b'{"reply":"coded"}'
    encoders: dict[str, Callable[[bytes], bytes]] = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
    }
    assert set(_replies.CODINGS) == set(encoders)  # one source: what is offered is decoded
    for coding in _replies.CODINGS:
        hostile.script(reply(encoders[coding](body), headers=f"Content-Encoding: {coding}\r\n"))
    hostile.script(reply(b"\x28\xb5\x2f\xfd" + body, headers="Content-Encoding: zstd\r\n"))
    for _coding in _replies.CODINGS:
        assert send().content == body
    with pytest.raises(APIConnectionError, match="zstd"):
        send()
    for head in hostile.heads:
        assert b"\r\naccept-encoding: gzip, deflate\r\n" in head.lower() + b"\r\n"


# -- wrong-typed JSON ----------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["asample", "forward_backward"])
def test_a_wrong_typed_accept_reply_is_a_tinker_error(endpoint: str) -> None:
    """A 200 whose JSON does not fit (``request_id`` a number) fails the call with
    APIResponseValidationError (a TinkerError, outcome UNKNOWN), not a raw WireValidationError."""
    from reliability_helpers import HANG, datum, prompt

    import tinker_sync
    from tinker_sync import types
    from tinker_sync.exceptions import APIResponseValidationError
    from tinker_sync.local import LocalServer

    with LocalServer(backend="instant") as server:
        server.faults.add(f'{endpoint} 200 x* body={{"request_id":5}}')
        service = tinker_sync.ServiceClient(
            base_url=server.url, api_key=server.api_key, max_retries=0
        )
        try:
            if endpoint == "asample":
                sampler = service.create_sampling_client(base_model="base")
                params = types.SamplingParams(max_tokens=2)
                future = sampler.sample(prompt(1), num_samples=1, sampling_params=params)
            else:
                trainer = service.create_lora_training_client(base_model="base")
                future = trainer.forward_backward([datum(1)], "cross_entropy")
            with pytest.raises(TinkerError) as info:
                future.result(timeout=HANG)
        finally:
            service.close()
    assert isinstance(info.value, APIResponseValidationError), repr(info.value)
    assert info.value.outcome is RequestOutcome.UNKNOWN
    assert "request_id" in str(info.value)


def test_json_nested_deeper_than_the_stack_is_a_validation_error(
    hostile: Hostile, send: Callable[..., Any]
) -> None:
    from tinker_sync.exceptions import APIResponseValidationError

    depth = 200_000
    hostile.script(reply(b"[" * depth + b"]" * depth))
    with pytest.raises(APIResponseValidationError, match="not JSON"):
        send().json()
