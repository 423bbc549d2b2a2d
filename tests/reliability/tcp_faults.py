"""A TCP-level fault proxy: a bad network between a client and a local server, on loopback.

Usage::

    with LocalServer() as server, TcpFaultProxy(server.url, FaultRates.each(0.05), seed=7) as proxy:
        service = tinker_sync.ServiceClient(base_url=proxy.url, ...)
        ...                                        # the client talks to the proxy
        proxy.counts()                             # {"reset_before": 3, "hold": 1, ...}

The proxy understands just enough HTTP/1.1 to find exchange boundaries on keep-alive
connections (``Content-Length`` bodies; the local server always sends one), and for every
exchange draws one fault from a seeded generator:

=================  ==========================================================================
``reset_before``   the request is never forwarded; the client gets a TCP reset
``reset_after``    the server handles the request; the client gets a reset instead of the reply
``cut_body``       the server handles it; the client gets the reply head and half the body,
                   then a reset
``delay``          the reply is forwarded after ``delay`` seconds (uniform, default 0.5-3 s)
``hold``           the server handles it; the reply is never forwarded and the connection stays
                   open and silent (a half-open peer) until the client gives up, at most
                   ``hold_max_s``
``accept_close``   per new connection: accepted, then closed at once (FIN) before any byte
=================  ==========================================================================

Reproducible: one ``random.Random(seed)`` makes every draw, in the order exchanges reach the
proxy, so a single-threaded client sees the same faults on every run; with many client
threads the sequence of draws is the same and only which request gets which draw depends on
scheduling. ``script`` replaces the draw (tests that need one fault on one request).

``rates`` may be replaced while the proxy runs: ``proxy.rates = FaultRates(accept_close=1.0)``
closes every new connection at once (a server that is down), ``accepted`` counts connects.

``strip_reply_headers`` removes headers from every reply (e.g. to play a server that does not
advertise something). Bounded: loopback only, at most ``max_connections`` client connections at once, every wait
ends at ``close()``, holds end after ``hold_max_s``. ``close()`` returns within a second or so.

Thread safety: one accept thread plus one thread per client connection; ``counts``,
``exchanges`` and ``close`` may be called from any thread. Fork safety: not fork-safe.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import random
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection
from types import TracebackType

__all__ = ["Exchange", "Fault", "FaultRates", "TcpFaultProxy"]

MAX_HEAD = 64 * 1024
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a RST


class Fault(enum.Enum):
    RESET_BEFORE = "reset_before"
    RESET_AFTER = "reset_after"
    CUT_BODY = "cut_body"
    DELAY = "delay"
    HOLD = "hold"
    ACCEPT_CLOSE = "accept_close"


@dataclasses.dataclass(frozen=True)
class FaultRates:
    """Probability of each fault per exchange (``accept_close``: per new connection)."""

    reset_before: float = 0.0
    reset_after: float = 0.0
    cut_body: float = 0.0
    delay: float = 0.0
    hold: float = 0.0
    accept_close: float = 0.0

    @classmethod
    def each(cls, p: float) -> FaultRates:
        """Every fault kind at probability ``p``."""
        return cls(p, p, p, p, p, p)

    @classmethod
    def only(cls, kind: Fault, p: float) -> FaultRates:
        return cls(**{kind.value: p})

    def per_exchange(self) -> list[tuple[Fault, float]]:
        return [
            (Fault.RESET_BEFORE, self.reset_before),
            (Fault.RESET_AFTER, self.reset_after),
            (Fault.CUT_BODY, self.cut_body),
            (Fault.DELAY, self.delay),
            (Fault.HOLD, self.hold),
        ]


@dataclasses.dataclass(frozen=True)
class Exchange:
    """One request as the proxy saw it (what ``script`` and ``exchanges()`` get)."""

    index: int  # global order of arrival at the proxy
    connection: int  # which client connection (0, 1, ...)
    method: str
    path: str
    fault: Fault | None = None


Script = Callable[[Exchange], "Fault | None"]


class _Closed(Exception):
    """The proxy is closing, or a peer went away: stop serving this connection."""


class TcpFaultProxy:
    """Forward 127.0.0.1 TCP connections to ``upstream_url``, injecting faults (module docs)."""

    def __init__(
        self,
        upstream_url: str,
        rates: FaultRates = FaultRates(),
        *,
        seed: int = 0,
        delay_s: tuple[float, float] = (0.5, 3.0),
        hold_max_s: float = 120.0,
        script: Script | None = None,
        max_connections: int = 512,
        strip_reply_headers: Collection[str] = (),
    ) -> None:
        parts = urllib.parse.urlsplit(upstream_url)
        if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
            raise ValueError(f"the fault proxy forwards to loopback only, not {upstream_url!r}")
        self.upstream = ("127.0.0.1", parts.port)
        self.rates = rates
        self.delay_s = delay_s
        self.hold_max_s = hold_max_s
        self.script = script
        self.max_connections = max_connections
        self.strip = frozenset(name.lower().encode() for name in strip_reply_headers)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._exchanges: list[Exchange] = []
        self._accept_closed = 0
        self._connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._acceptor: threading.Thread | None = None

    # ------------------------------------------------------------------ public

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> TcpFaultProxy:
        self._acceptor = threading.Thread(target=self._accept_loop, name="tcp-fault-accept")
        self._acceptor.daemon = True
        self._acceptor.start()
        return self

    def __enter__(self) -> TcpFaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return list(self._exchanges)

    def counts(self) -> dict[str, int]:
        """How many times each fault was applied (``accept_close`` counts connections)."""
        with self._lock:
            counter = collections.Counter(e.fault.value for e in self._exchanges if e.fault)
            if self._accept_closed:
                counter[Fault.ACCEPT_CLOSE.value] = self._accept_closed
        return dict(counter)

    @property
    def accepted(self) -> int:
        """Client connections accepted so far (those closed at once by ``accept_close``
        included): how many times a client connected."""
        with self._lock:
            return self._connections

    @property
    def open_connections(self) -> int:
        """Client connections the proxy currently holds open (held ones included)."""
        with self._lock:
            return sum(1 for t in self._threads if t.is_alive())

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, cut every connection and join the threads (bounded)."""
        self._closing.set()
        with self._lock:
            sockets = list(self._sockets)
            threads = list(self._threads)
        for sock in sockets:
            _shutdown(sock)
        deadline = time.monotonic() + timeout
        if self._acceptor is not None:
            self._acceptor.join(max(0.0, deadline - time.monotonic()))
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._listener.close()

    # ------------------------------------------------------------------ internals

    def _draw_exchange(self, exchange: Exchange) -> Fault | None:
        with self._lock:
            if self.script is not None:
                fault = self.script(exchange)
            else:
                fault = None
                u = self._rng.random()
                for kind, p in self.rates.per_exchange():
                    if u < p:
                        fault = kind
                        break
                    u -= p
            self._exchanges.append(dataclasses.replace(exchange, fault=fault))
            return fault

    def _next_index(self) -> int:
        with self._lock:
            return len(self._exchanges)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                live = sum(1 for t in self._threads if t.is_alive())
                self._threads = {t for t in self._threads if t.is_alive()}
                number = self._connections
                self._connections += 1
                refuse = live >= self.max_connections
                if not refuse and self.script is None:
                    refuse = self._rng.random() < self.rates.accept_close
                    self._accept_closed += refuse
            if refuse:
                client.close()  # accept-and-close: a FIN before any byte
                continue
            thread = threading.Thread(
                target=self._serve, args=(client, number), name=f"tcp-fault-conn-{number}"
            )
            thread.daemon = True
            with self._lock:
                self._threads.add(thread)
                self._sockets.add(client)
            thread.start()

    def _serve(self, client: socket.socket, number: int) -> None:
        upstream: socket.socket | None = None
        client.settimeout(0.5)
        buffer = bytearray()
        try:
            while not self._closing.is_set():
                head, body = _read_message(client, buffer, self._closing, request=True)
                if not head:
                    return  # the client closed an idle connection
                method, path = _request_line(head)
                exchange = Exchange(self._next_index(), number, method, path)
                fault = self._draw_exchange(exchange)
                if fault is Fault.RESET_BEFORE:
                    _reset(client)
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=10.0)
                    upstream.settimeout(0.5)
                    with self._lock:
                        self._sockets.add(upstream)
                upstream.sendall(head + body)
                reply_head, reply_body = _read_message(
                    upstream, bytearray(), self._closing, request=False, method=method
                )
                if not reply_head:
                    _reset(client)
                    return
                if self.strip:
                    reply_head = _strip_headers(reply_head, self.strip)
                if fault is Fault.RESET_AFTER:
                    _reset(client)
                    return
                if fault is Fault.CUT_BODY:
                    reply = reply_head + reply_body
                    cut = len(reply_head) + len(reply_body) // 2
                    client.sendall(reply[: max(1, min(cut, len(reply) - 1))])
                    _reset(client)
                    return
                if fault is Fault.HOLD:
                    self._hold(client)
                    return
                if fault is Fault.DELAY:
                    with self._lock:
                        pause = self._rng.uniform(*self.delay_s)
                    if self._closing.wait(pause):
                        return
                client.sendall(reply_head + reply_body)
                if b"\r\nconnection: close" in reply_head.lower():
                    return
        except (_Closed, OSError):
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    sock.close()
                    with self._lock:
                        self._sockets.discard(sock)

    def _hold(self, client: socket.socket) -> None:
        """Stay silent until the client closes, the hold bound passes or the proxy closes."""
        until = time.monotonic() + self.hold_max_s
        while time.monotonic() < until and not self._closing.is_set():
            try:
                if not client.recv(65536):
                    return
            except TimeoutError:
                continue


def _strip_headers(head: bytes, names: frozenset[bytes]) -> bytes:
    lines = head.split(b"\r\n")
    kept = [ln for ln in lines if ln.split(b":", 1)[0].strip().lower() not in names]
    return b"\r\n".join(kept)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.close()


def _recv(sock: socket.socket, closing: threading.Event) -> bytes:
    while True:
        if closing.is_set():
            raise _Closed
        try:
            return sock.recv(65536)
        except TimeoutError:
            continue


def _read_message(
    sock: socket.socket,
    buffer: bytearray,
    closing: threading.Event,
    *,
    request: bool,
    method: str = "GET",
) -> tuple[bytes, bytes]:
    """One HTTP message (head, body) from ``sock``; ``(b"", b"")`` on EOF before a byte."""
    while b"\r\n\r\n" not in buffer:
        chunk = _recv(sock, closing)
        if not chunk:
            if buffer:
                raise _Closed
            return b"", b""
        buffer += chunk
        if len(buffer) > MAX_HEAD and b"\r\n\r\n" not in buffer:
            raise _Closed
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    del buffer[:end]
    length = _content_length(head, request=request, method=method)
    while len(buffer) < length:
        chunk = _recv(sock, closing)
        if not chunk:
            raise _Closed
        buffer += chunk
    body = bytes(buffer[:length])
    del buffer[:length]
    return head, body


def _content_length(head: bytes, *, request: bool, method: str) -> int:
    lines = head.decode("latin-1").split("\r\n")
    if not request:
        status = int(lines[0].split()[1])
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "transfer-encoding":
            raise _Closed  # not needed: the SDK and the local server send Content-Length
        if name.strip().lower() == "content-length":
            return int(value.strip())
    return 0


def _request_line(head: bytes) -> tuple[str, str]:
    method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    return method, target.split("?", 1)[0]
