"""HTTP/1.1 on a socket: the fast path for requests to the base URL's own origin.

Usage::

    pool = direct_pool(base_url, 8, verify=True, options=socket_options(), tracker=tracker)
    if pool is not None:                       # None: not eligible, use urllib3
        status, headers, content = pool.exchange("POST", "/api/v1/asample", body, headers,
                                                 Timeout(60.0, connect=5.0))
    pool.close()

Why it exists: per request, urllib3 and http.client validate every header line in Python
(about 20 per SDK request), parse the reply's header block with the ``email`` package and
build two response objects; measured on the sample benchmark (docs/transport.md) that was most
of the SDK's client CPU. This module writes the same request bytes (request line, ``Host``,
the caller's header lines in order, ``Content-Length``) in one ``sendall`` and reads the reply
with a small parser: status line, header block, a ``Content-Length``, chunked or
close-delimited body, ``gzip``/``deflate`` decoding.

It is used only where it is a drop-in (see :func:`direct_pool`): no proxy (urllib3 keeps
proxies, SOCKS and redirects), ``TINKER_SYNC_TRANSPORT`` not set to ``urllib3``, and, for
``https://``, an ``ssl`` module whose contexts wrap sockets with SNI (feature-detected once).
Failures are raised as the exceptions urllib3 and http.client raise for the same event
(``NewConnectionError`` / ``NameResolutionError`` / ``ConnectTimeoutError`` / ``SSLError`` on
connect, ``http.client`` ``RemoteDisconnected`` / ``IncompleteRead`` / ``BadStatusLine`` /
``LineTooLong``, socket timeouts, ``DecodeError``), so the SDK maps both paths the same way
(``_errors.map_transport_error``). Only documented APIs: ``socket``, ``ssl``, ``zlib`` and
those public exception classes.

Thread safety: a :class:`DirectPool` is thread-safe; a :class:`DirectConnection` is used by
one thread at a time (the pool hands it out). Fork safety: pools are abandoned in a child
with the rest of the transport state (``_pools``), never closed there.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import select
import socket
import urllib.parse
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import urllib3.exceptions

from tinker_sync._runtime.fork import make_lock
from tinker_sync._transport._connection import COALESCE_LIMIT, setup_timeout
from tinker_sync._transport._settings import Verify, ca_locations

if TYPE_CHECKING:
    import ssl

    from tinker_sync._config import Timeout
    from tinker_sync._transport._connection import _InflightTracker

logger = logging.getLogger("tinker_sync.transport")

TRANSPORT_ENV = "TINKER_SYNC_TRANSPORT"
"""``urllib3``: every request through urllib3 (the documented-API path); else ``auto``."""

MAX_LINE = 65536
"""Longest status or header line read (as http.client)."""
MAX_HEADERS = 100
"""Most header lines in one reply (as http.client)."""
_METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
"""Sent with ``Content-Length: 0`` when they have no body (as urllib3)."""
_BAD_TARGET = re.compile("[\x00-\x20\x7f]")
_HEADER_NAME = re.compile(r"[^:\s][^:\r\n]*")

Headers = dict[str, str]


def direct_pool(
    base_url: str,
    size: int,
    verify: Verify,
    options: Sequence[tuple[int, int, int | bytes]],
    tracker: _InflightTracker,
) -> DirectPool | None:
    """The direct pool for ``base_url``'s origin, or None where urllib3 must be used.

    ``verify`` (used for ``https://`` only): True (certifi's bundle) or a CA bundle file or
    directory, as :func:`~._settings.ca_locations` reads it (never off: docs/transport.md). Call only
    for routes without a proxy.
    """
    if os.environ.get(TRANSPORT_ENV, "auto").strip().lower() == "urllib3":
        return None
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.scheme == "https" and not _has_tls():
        return None
    tls = verify if parts.scheme == "https" else None
    port = parts.port or (443 if tls is not None else 80)
    return DirectPool(parts.hostname, port, tls, size, options, tracker)


def _has_tls() -> bool:
    """Whether this interpreter's ``ssl`` module can open verified client connections."""
    try:
        import ssl
    except ImportError:  # an interpreter built without OpenSSL
        return False
    return bool(getattr(ssl, "HAS_SNI", False))


def _tls_context(verify: Verify) -> ssl.SSLContext:
    """A client context verifying like urllib3's (built at the first connection, as urllib3
    loads its CA bundle then: a missing bundle is a connection error, not a setup error)."""
    import ssl

    where = ca_locations(verify)
    context = ssl.create_default_context(
        cafile=where.get("ca_certs"), capath=where.get("ca_cert_dir")
    )
    context.set_alpn_protocols(["http/1.1"])
    return context


class DirectConnection:
    """One keep-alive connection: write a request, read its whole reply.

    ``sock`` is public for the in-flight tracker, which shuts it down to cut a request.
    """

    __slots__ = ("_file", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._file = sock.makefile("rb")

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self.sock.close()

    def dropped(self) -> bool:
        """Whether an idle connection was closed by the peer (readable means EOF or junk)."""
        try:
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(self.sock, select.POLLIN)
                return bool(poller.poll(0))
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def request(self, head: bytes, body: bytes | None) -> None:
        if body and len(body) <= COALESCE_LIMIT:
            self.sock.sendall(head + body)
            return
        self.sock.sendall(head)
        if body:
            self.sock.sendall(body)

    def read_reply(self, method: str) -> tuple[int, Headers, bytes, bool]:
        """``(status, lower-cased merged headers, decoded body, reusable)``."""
        while True:
            version, status = self._status_line()
            headers = self._headers()
            if not (100 <= status < 200) or status == 101:
                break  # interim replies (100 Continue, 103 Early Hints) are skipped
        connection = headers.get("connection", "").lower()
        reusable = "close" not in connection and (
            version != "HTTP/1.0" or "keep-alive" in connection
        )
        if method == "HEAD" or status in (204, 304) or status == 101:
            return status, headers, b"", reusable
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._chunked()
        else:
            length = _content_length(headers.get("content-length"))
            if length is None:
                body, reusable = self._file.read(), False
            else:
                body = self._file.read(length)
                if len(body) < length:
                    raise http.client.IncompleteRead(body, length - len(body))
        encoding = headers.get("content-encoding")
        if encoding and body:
            body = _decode(body, encoding)
        return status, headers, body, reusable

    def _line(self, what: str) -> bytes:
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong(what)
        return line

    def _status_line(self) -> tuple[str, int]:
        line = self._line("status line")
        if not line:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise http.client.BadStatusLine(repr(line))
        try:
            status = int(parts[1])
        except ValueError:
            raise http.client.BadStatusLine(repr(line)) from None
        if not 100 <= status <= 999:
            raise http.client.BadStatusLine(repr(line))
        return parts[0].decode("latin-1"), status

    def _headers(self) -> Headers:
        headers: Headers = {}
        last = ""
        for _ in range(MAX_HEADERS + 1):
            line = self._line("header line")
            if line in (b"\r\n", b"\n", b""):
                return headers
            if line[:1] in (b" ", b"\t") and last:  # an obsolete folded continuation
                headers[last] += " " + line.strip().decode("latin-1")
                continue
            name, sep, value = line.partition(b":")
            if not sep:
                continue  # not a header line; http.client's parser skips it too
            last = name.strip().decode("latin-1").lower()
            text = value.strip().decode("latin-1")
            headers[last] = f"{headers[last]}, {text}" if last in headers else text
        raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self._line("chunk size")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise http.client.IncompleteRead(b"".join(parts)) from None
            if size == 0:
                break
            chunk = self._file.read(size)
            if len(chunk) < size:
                raise http.client.IncompleteRead(b"".join(parts) + chunk, size - len(chunk))
            parts.append(chunk)
            self._file.read(2)  # the CRLF after the chunk
        while self._line("trailer line") not in (b"\r\n", b"\n", b""):
            pass  # trailers are read and dropped, like urllib3
        return b"".join(parts)


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    values = {v.strip() for v in value.split(",")}  # "5, 5" from merged duplicates
    if len(values) != 1:
        raise http.client.HTTPException(f"conflicting Content-Length values: {value!r}")
    try:
        length = int(values.pop())
    except ValueError:
        return None  # unreadable: read to the end of the connection, as http.client does
    if length < 0:
        return None
    return length


def _decode(body: bytes, encoding: str) -> bytes:
    """Undo ``gzip`` / ``deflate`` content codings (the ones the SDK accepts); others untouched."""
    for coding in reversed([c.strip().lower() for c in encoding.split(",")]):
        try:
            if coding in ("gzip", "x-gzip"):
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
            elif coding == "deflate":
                try:
                    body = zlib.decompress(body)
                except zlib.error:  # raw deflate without the zlib header
                    body = zlib.decompress(body, -zlib.MAX_WBITS)
            elif coding not in ("identity", ""):
                return body
        except zlib.error as exc:
            raise urllib3.exceptions.DecodeError(
                f"Received response with content-encoding: {coding}, but failed to decode it.",
                exc,
            ) from exc
    return body


class DirectPool:
    """Keep-alive connections to one origin, opened on demand, at most ``size`` kept idle.

    A request never waits for a connection: with none idle it opens one (like urllib3's
    ``block=False`` pools). A connection that failed, or whose reply asked to close, is closed
    instead of kept. Thread safety: thread-safe.
    """

    def __init__(
        self,
        host: str,
        port: int,
        tls: Verify | None,
        size: int,
        options: Sequence[tuple[int, int, int | bytes]],
        tracker: _InflightTracker,
    ) -> None:
        self.host = host
        self.port = port
        default_port = 443 if tls is not None else 80
        self._host_line = f"Host: {_host_header(host, port, default_port)}\r\n"
        self._tls = tls  # None: plain HTTP; else how to verify (see direct_pool)
        self._context: ssl.SSLContext | None = None
        self._size = size
        self._options = list(options)
        self._tracker = tracker
        self._lock = make_lock()
        self._idle: list[DirectConnection] = []
        self._names: set[str] = set()  # header names already checked (names only, no values)
        self._closed = False

    def exchange(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: Timeout,
    ) -> tuple[int, Headers, bytes]:
        """Send one request and read its whole reply: ``(status, headers, body)``."""
        head = self._head(method, target, body, headers)
        conn = self._take(timeout)
        self._tracker.begin(conn)
        reusable = False
        try:
            conn.sock.settimeout(timeout.read)
            conn.request(head, body)
            status, reply_headers, content, reusable = conn.read_reply(method)
        finally:
            if reusable:
                self._give_back(conn)
            else:
                conn.close()
        return status, reply_headers, content

    def close(self) -> None:
        """Close the idle connections; those in use are closed when their exchange ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- internals -----------------------------------------------------------------------------

    def _head(
        self, method: str, target: str, body: bytes | None, headers: Mapping[str, str]
    ) -> bytes:
        """The request line and header block, checked like http.client checks them."""
        if _BAD_TARGET.search(target) or not target.isascii():
            raise urllib3.exceptions.LocationValueError(f"invalid request target {target!r}")
        host_line = self._host_line
        for name in headers:
            if name not in self._names:
                if not _HEADER_NAME.fullmatch(name):
                    raise ValueError(f"Invalid header name {name!r}")
                if len(self._names) < 256:
                    self._names.add(name)
            if len(name) == 4 and name.lower() == "host":
                host_line = ""  # the caller's own Host header replaces ours (as in urllib3)
        lines = "\r\n".join([f"{k}: {v}" for k, v in headers.items()])
        if "\r" in lines or "\n" in lines or "\0" in lines:
            for k, v in headers.items():  # the rare case: find and name the bad one
                if "\r" in v or "\n" in v or "\0" in v:
                    raise ValueError(f"Invalid header value for {k!r}")
        if body is not None:
            lines += f"\r\nContent-Length: {len(body)}"
        elif method in _METHODS_WITH_BODY:
            lines += "\r\nContent-Length: 0"
        return f"{method} {target} HTTP/1.1\r\n{host_line}{lines}\r\n\r\n".encode("latin-1")

    def _take(self, timeout: Timeout) -> DirectConnection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect(timeout)
            if not conn.dropped():
                return conn
            conn.close()  # closed by the server while idle: try the next one

    def _give_back(self, conn: DirectConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, timeout: Timeout) -> DirectConnection:
        where = f"{self.host}:{self.port}"
        logger.debug("new connection to %s", where)
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout.connect)
        except socket.gaierror as exc:
            raise urllib3.exceptions.NameResolutionError(self.host, self, exc) from exc  # type: ignore[arg-type]
        except TimeoutError as exc:
            raise urllib3.exceptions.ConnectTimeoutError(
                self, f"Connection to {where} timed out. (connect timeout={timeout.connect})"
            ) from exc
        except OSError as exc:
            raise urllib3.exceptions.NewConnectionError(
                self,  # type: ignore[arg-type]
                f"Failed to establish a new connection: {exc}",
            ) from exc
        try:
            for level, option, value in self._options:
                sock.setsockopt(level, option, value)
            if self._tls is not None:
                try:
                    context = self._context
                    if context is None:
                        context = self._context = _tls_context(self._tls)
                    sock = context.wrap_socket(sock, server_hostname=self.host)
                except TimeoutError as exc:  # the handshake runs under the connect timeout
                    raise setup_timeout(self, where, "TLS handshake", timeout.connect) from exc
                except (OSError, ValueError) as exc:
                    raise urllib3.exceptions.SSLError(exc) from exc
        except BaseException:
            sock.close()
            raise
        conn = DirectConnection(sock)
        self._tracker.connected(conn)
        return conn

    def __repr__(self) -> str:
        return f"<DirectPool {self.host}:{self.port}>"


def _host_header(host: str, port: int, default_port: int) -> str:
    name = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return name if port == default_port else f"{name}:{port}"
