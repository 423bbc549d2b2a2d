"""HTTP/1.1 on a socket: the fast path for requests to the base URL's own origin.

Usage::

    pool = direct_pool(base_url, 8, verify=True, options=socket_options(), tracker=tracker,
                       limit=max_reply_bytes())
    if pool is not None:                       # None: not eligible, use urllib3
        status, headers, raw = pool.exchange("POST", "/api/v1/asample", body, headers,
                                             Timeout(60.0, connect=5.0), deadline)
    pool.close()

Why it exists: per request, urllib3 and http.client validate every header line in Python
(about 20 per SDK request), parse the reply's header block with the ``email`` package and
build two response objects; measured on the sample benchmark (docs/transport.md) that was most
of the SDK's client CPU. This module writes the same request bytes (request line, ``Host``,
the caller's header lines in order, ``Content-Length``) in one ``sendall`` and reads the reply
with llhttp (Node's HTTP parser, through ``httptools``, strict): status line, header block,
``Content-Length``, chunked or close-delimited body. The raw body is returned; the caller
decodes it (``_replies.decode``), as on the urllib3 path.

Never another request's reply: a connection goes back to the pool only when the reply was
complete, allowed keep-alive and nothing followed it; a 101, a reply with both
``Content-Length`` and ``Transfer-Encoding`` (refused by llhttp) or any leftover byte closes it.
Bounded: the header block (:data:`MAX_HEAD_BYTES`), interim replies (:data:`MAX_INTERIM`),
the body (the pool's ``limit``) and the time (the attempt's deadline) are all capped.

It is used only where it is a drop-in (see :func:`direct_pool`): ``httptools`` imports, no
proxy (urllib3 keeps proxies, SOCKS and redirects), ``TINKER_SYNC_TRANSPORT`` not set to
``urllib3``, and, for ``https://``, an ``ssl`` module whose contexts wrap sockets with SNI
(feature-detected once). Failures are raised as the exceptions urllib3 and http.client raise
for the same event (``NewConnectionError`` / ``NameResolutionError`` / ``ConnectTimeoutError``
/ ``SSLError`` on connect, ``http.client`` ``RemoteDisconnected`` / ``IncompleteRead`` or an
``HTTPException`` for a refused reply, socket timeouts), so the SDK maps both paths the same
way (``_errors.map_transport_error``). Only documented APIs: ``socket``, ``ssl``,
``httptools`` and those public exception classes.

Thread safety: a :class:`DirectPool` is thread-safe; a :class:`DirectConnection` is used by
one thread at a time (the pool hands it out). Fork safety: pools are abandoned in a child
with the rest of the transport state (``_pools``), never closed there.
"""

from __future__ import annotations

# Imported up front, not by the first failure that needs its exceptions: when Ctrl-C ends a
# program, exit cuts the held polls and every waiting thread raises RemoteDisconnected at
# once; a first import of http.client (and email) from those threads during exit made the
# interpreter exit with status 1 instead of dying of SIGINT (tests/test_signals.py,
# test_exit_with_64_threads_blocked_in_result). It costs about 7 ms of start-up.
import http.client
import logging
import math
import os
import re
import select
import socket
import struct
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tinker_sync._runtime.fork import make_lock
from tinker_sync._transport._connection import COALESCE_LIMIT, setup_timeout
from tinker_sync._transport._replies import check_length, protocol_error, too_large
from tinker_sync._transport._settings import Verify, ca_locations

try:
    import httptools

    HAVE_HTTPTOOLS = True
except ImportError:  # pragma: no cover - a platform without a wheel: urllib3 serves
    HAVE_HTTPTOOLS = False

if TYPE_CHECKING:
    import ssl

    from tinker_sync._config import Timeout
    from tinker_sync._transport._connection import _InflightTracker

logger = logging.getLogger("tinker_sync.transport")

TRANSPORT_ENV = "TINKER_SYNC_TRANSPORT"
"""``urllib3``: every request through urllib3 (the documented-API path); else ``auto``."""

MAX_HEAD_BYTES = 256 * 1024
"""Most bytes read before the final reply's header block is complete (interim replies
included)."""
MAX_HEADERS = 100
"""Most distinct header names in one reply (as http.client counts lines)."""
MAX_INTERIM = 8
"""Most interim (1xx) replies skipped before the final one."""
_RECV_SIZE = 256 * 1024
_FIRST_RECV = 64 * 1024
"""A reply's first read asks for less than a large body's reads: a buffer under glibc's mmap
threshold (128 KiB) comes from the heap, where a 256 KiB one is mapped and unmapped on every
read (three more system calls, and the unmap interrupts the cores running the process's other
threads). Most replies fit in it whole."""
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
    limit: int,
) -> DirectPool | None:
    """The direct pool for ``base_url``'s origin, or None where urllib3 must be used.

    ``verify`` (used for ``https://`` only): True (certifi's bundle) or a CA bundle file or
    directory, as :func:`~._settings.ca_locations` reads it (never off: docs/transport.md). Call only
    for routes without a proxy.
    """
    if not HAVE_HTTPTOOLS or os.environ.get(TRANSPORT_ENV, "auto").strip().lower() == "urllib3":
        return None
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.scheme == "https" and not _has_tls():
        return None
    tls = verify if parts.scheme == "https" else None
    port = parts.port or (443 if tls is not None else 80)
    return DirectPool(parts.hostname, port, tls, size, options, tracker, limit)


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


class _Leftover(Exception):
    """Bytes followed the final reply (stops the parser; the reply itself stands)."""


class _Reply:
    """The ``httptools`` protocol object collecting one reply (plus skipped interim replies).

    A callback that must stop the parser stores its exception in ``error`` and raises it;
    ``feed_data`` then raises ``HttpParserCallbackError`` and the reader re-raises ``error``.
    """

    __slots__ = (
        "bodiless",
        "body",
        "done",
        "error",
        "final",
        "headers",
        "interim",
        "keep_alive",
        "leftover",
        "limit",
        "parser",
        "size",
        "status",
    )

    def __init__(self, method: str, limit: int) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.bodiless = method == "HEAD"
        self.limit = limit
        self.headers: Headers = {}
        self.body: list[bytes] = []
        self.size = 0
        self.status = 0
        self.interim = 0
        self.final = False  # the final (non-1xx) reply's header block is complete
        self.done = False  # the final reply is complete
        self.keep_alive = False
        self.leftover = False  # bytes followed the final reply
        self.error: BaseException | None = None

    def _stop(self, exc: BaseException) -> BaseException:
        self.error = exc
        return exc

    def on_message_begin(self) -> None:
        if self.done:  # a second reply on the same bytes: never read as the next request's
            self.leftover = True
            raise self._stop(_Leftover())
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise self._stop(protocol_error(f"more than {MAX_HEADERS} reply headers"))
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self.headers.get(key)
        self.headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        status = self.parser.get_status_code()
        self.status = status
        if status == 101:
            raise self._stop(
                protocol_error("unexpected 101 Switching Protocols (no upgrade was asked)")
            )
        if 100 <= status < 200:
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise self._stop(protocol_error(f"more than {MAX_INTERIM} interim (1xx) replies"))
            return
        self.final = True
        declared = self.headers.get("content-length")
        if declared is not None and not self.bodiless and status not in (204, 304):
            try:
                check_length(declared, self.limit)  # refused before its body is read
            except Exception as exc:
                raise self._stop(exc) from None
        if self.bodiless or status in (204, 304):
            # The reply ends with its header block, whatever it declares (some parser
            # versions would read a declared body): anything after it is left over.
            self.bodiless = True
            self.keep_alive = bool(self.parser.should_keep_alive())
            self.done = True

    def on_body(self, data: bytes) -> None:
        if self.done:
            self.leftover = True
            raise self._stop(_Leftover())
        self.size += len(data)
        if self.size > self.limit:
            raise self._stop(too_large(self.limit, "body"))
        self.body.append(data)

    def on_message_complete(self) -> None:
        if not self.final:
            return  # an interim reply: the final one follows
        if not self.done:
            assert self.parser is not None
            self.keep_alive = bool(self.parser.should_keep_alive())
            self.done = True


_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)
"""Linux's ``TCP_INFO`` socket option (``struct tcp_info``, tcp(7)), or None elsewhere."""
_TCP_ESTABLISHED = 1
"""``tcpi_state`` (the struct's first byte) of an open connection (``TCP_ESTABLISHED``)."""
_TCP_BYTES_RECEIVED_AT = 128
"""Offset of ``tcpi_bytes_received`` (u64, Linux 4.1+): payload bytes received in order."""
_TCP_BYTES_RECEIVED = struct.Struct("=Q")
_TCP_INFO_SIZE = _TCP_BYTES_RECEIVED_AT + _TCP_BYTES_RECEIVED.size

_TIMEVAL = struct.Struct("@ll")
"""``struct timeval`` of 64-bit Linux (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``)."""
KERNEL_TIMEOUTS = sys.platform == "linux" and _TIMEVAL.size == 16
"""Whether plain TCP connections keep their timeouts in the kernel (see
:class:`DirectConnection`)."""


def _timeval(timeout: float | None) -> bytes:
    """``timeout`` as a ``struct timeval``: None waits for ever (zero), any other value at
    least one microsecond (zero would mean for ever), rounded up to the microsecond."""
    if timeout is None:
        return _TIMEVAL.pack(0, 0)
    micros = max(1, math.ceil(round(timeout * 1_000_000, 6)))
    return _TIMEVAL.pack(*divmod(micros, 1_000_000))


class DirectConnection:
    """One keep-alive connection: write a request, read its whole reply.

    ``sock`` is public for the in-flight tracker, which shuts it down to cut a request;
    ``timeout`` is what the socket's sends and reads wait now (None: for ever).

    A plain TCP connection on 64-bit Linux is a blocking socket whose timeouts are kept by the
    kernel (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``): a socket timeout would make CPython poll
    before every send and read, and each poll releases the GIL once more (a thread hand-off
    when the caller's code keeps the GIL busy, docs/transport.md). The timeouts mean the same:
    a read that waits longer than ``timeout`` for a byte and a send that cannot finish within
    it raise ``TimeoutError``. One difference: a call interrupted by a signal delivered to its
    own thread waits its whole timeout again (Linux gives a process's signals to the main thread
    first; a reply's attempt deadline is still checked between reads). Elsewhere (TLS, other
    systems) the socket's own timeout is used.
    """

    __slots__ = ("_kernel", "_poller", "_read", "sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.timeout = sock.gettimeout()
        self._poller: select.poll | None = None  # made by the first idle check, then reused
        self._read = 0  # bytes read from the socket so far (the idle check compares them)
        self._kernel = KERNEL_TIMEOUTS and type(sock) is socket.socket
        if self._kernel:
            try:
                self._kernel_timeouts(self.timeout)
                sock.settimeout(None)  # once per connection: blocking, no poll before a call
            except OSError:  # not supported here: the socket's own timeout
                self._kernel = False

    def _kernel_timeouts(self, timeout: float | None) -> None:
        packed = _timeval(timeout)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, packed)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, packed)

    def set_timeout(self, timeout: float | None) -> None:
        """Set the timeout of the next sends and reads, unless it is already set (a kept-alive
        connection's requests mostly use the same one): ``settimeout`` is a system call that
        releases the GIL (``setsockopt`` does not)."""
        if timeout == self.timeout:
            return
        if self._kernel:
            self._kernel_timeouts(timeout)
        else:
            self.sock.settimeout(timeout)
        self.timeout = timeout

    def close(self) -> None:
        self.sock.close()

    def dropped(self) -> bool:
        """Whether an idle connection was closed by the peer or has bytes nobody asked for
        (readable, or TLS data already decrypted: EOF or junk either way).

        With kernel timeouts (plain TCP on Linux) the kernel's ``TCP_INFO`` says it without a
        poll, which would release the GIL: the connection is no longer established (the peer's
        FIN or RST) or it received more bytes than were read from it.
        """
        if self._kernel and _TCP_INFO is not None:
            try:
                info = self.sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_SIZE)
            except OSError:
                info = b""  # the poll below decides
            if len(info) >= _TCP_INFO_SIZE:  # else a kernel before 4.1: poll
                received = _TCP_BYTES_RECEIVED.unpack_from(info, _TCP_BYTES_RECEIVED_AT)[0]
                if received >= self._read:  # else not counted here (an emulated kernel): poll
                    return info[0] != _TCP_ESTABLISHED or received != self._read
        try:
            pending = getattr(self.sock, "pending", None)  # ssl.SSLSocket.pending()
            if pending is not None and pending():
                return True
            if hasattr(select, "poll"):
                poller = self._poller
                if poller is None:
                    poller = self._poller = select.poll()
                    poller.register(self.sock, select.POLLIN)
                return bool(poller.poll(0))
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def request(self, head: bytes, body: bytes | None) -> None:
        if body and len(body) <= COALESCE_LIMIT:
            self._sendall(head + body)
            return
        self._sendall(head)
        if body:
            self._sendall(body)

    def _sendall(self, data: bytes) -> None:
        """``sock.sendall(data)``; with kernel timeouts, the timeout bounds the whole call as a
        socket timeout does (a send cut short by it goes on with what is left)."""
        if not self._kernel or self.timeout is None:
            self.sock.sendall(data)
            return
        end = time.monotonic() + self.timeout
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            raise TimeoutError("timed out") from None
        if sent == len(data):  # the usual case: all of it at once
            return
        view = memoryview(data)[sent:]
        try:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out")
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(left))
                self.timeout = -1.0  # the send timeout no longer matches: set both again
                try:
                    sent = self.sock.send(view)
                except BlockingIOError:
                    raise TimeoutError("timed out") from None
                view = view[sent:]
                if not view:
                    return
        finally:
            view.release()

    def read_reply(
        self, method: str, limit: int, read_timeout: float | None, deadline: float | None
    ) -> tuple[int, Headers, bytes, bool]:
        """``(status, lower-cased merged headers, raw body, reusable)``.

        The body is not decoded (the caller decodes it under the cap). Raises ``TimeoutError``
        when no byte comes for ``read_timeout`` seconds or the reply is not complete at
        ``deadline`` (a ``time.monotonic()`` value), :class:`ReplyProtocolError` for a reply
        the parser refuses, ``ReplyTooLargeError`` above ``limit`` body bytes.
        """
        reply = _Reply(method, limit)
        parser = reply.parser = httptools.HttpResponseParser(reply)
        try:
            sock = self.sock
            received = 0
            while not reply.done:
                timeout = read_timeout
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("the reply did not complete within the attempt deadline")
                    timeout = left if timeout is None else min(timeout, left)
                self.set_timeout(timeout)
                try:
                    data = sock.recv(_RECV_SIZE if received else _FIRST_RECV)
                except BlockingIOError:
                    if not self._kernel:
                        raise
                    raise TimeoutError("timed out") from None
                if not data:
                    return self._at_eof(reply, received)
                received += len(data)
                self._read += len(data)
                if not reply.final and received > MAX_HEAD_BYTES:
                    raise protocol_error(f"reply header block above {MAX_HEAD_BYTES} bytes")
                try:
                    parser.feed_data(data)
                except httptools.HttpParserCallbackError:
                    if isinstance(reply.error, _Leftover):
                        break
                    raise reply.error or protocol_error("reply parser failed") from None
                except httptools.HttpParserUpgrade:
                    raise protocol_error("unexpected protocol upgrade in a reply") from None
                except httptools.HttpParserError as exc:
                    if reply.done:  # junk after a complete reply
                        reply.leftover = True
                        break
                    raise protocol_error(f"malformed reply: {exc}") from None
            reusable = reply.keep_alive and not reply.leftover
            return reply.status, reply.headers, b"".join(reply.body), reusable
        finally:
            reply.parser = None  # the parser holds the reply's callbacks: leave no cycle

    @staticmethod
    def _at_eof(reply: _Reply, received: int) -> tuple[int, Headers, bytes, bool]:
        """The peer closed the connection before the reply was complete."""
        headers = reply.headers
        if (
            received != 0
            and reply.final
            and "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        ):  # a close-delimited body ends here
            return reply.status, headers, b"".join(reply.body), False
        if received == 0:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        raise http.client.IncompleteRead(b"".join(reply.body))


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
        limit: int,
    ) -> None:
        self.host = host
        self.limit = limit
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
        self._hosts: set[str] = set()  # those of them spelling Host
        self._closed = False

    def exchange(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: Timeout,
        deadline: float | None,
    ) -> tuple[int, Headers, bytes]:
        """Send one request and read its whole reply: ``(status, headers, raw body)``.

        ``deadline`` (a ``time.monotonic()`` value, or None) bounds the send and the read.
        """
        head = self._head(method, target, body, headers)
        conn = self._take(timeout)
        self._tracker.begin(conn)
        reusable = False
        try:
            wait = timeout.read
            if deadline is not None:
                wait = (
                    max(0.0, deadline - time.monotonic())
                    if wait is None
                    else max(0.0, min(wait, deadline - time.monotonic()))
                )
            conn.set_timeout(wait)
            conn.request(head, body)
            status, reply_headers, content, reusable = conn.read_reply(
                method, self.limit, timeout.read, deadline
            )
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
            import urllib3.exceptions

            raise urllib3.exceptions.LocationValueError(f"invalid request target {target!r}")
        host_line = self._host_line
        if self._names.issuperset(headers):  # every name checked before (the usual case)
            if self._hosts and not self._hosts.isdisjoint(headers):
                host_line = ""  # the caller's own Host header replaces ours (as in urllib3)
        else:
            for name in headers:
                if name not in self._names:
                    if not _HEADER_NAME.fullmatch(name):
                        raise ValueError(f"Invalid header name {name!r}")
                    if len(self._names) < 256:
                        self._names.add(name)
                        if len(name) == 4 and name.lower() == "host":
                            self._hosts.add(name)
                if len(name) == 4 and name.lower() == "host":
                    host_line = ""
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
            import urllib3.exceptions

            raise urllib3.exceptions.NameResolutionError(self.host, self, exc) from exc  # type: ignore[arg-type]
        except TimeoutError as exc:
            import urllib3.exceptions

            raise urllib3.exceptions.ConnectTimeoutError(
                self, f"Connection to {where} timed out. (connect timeout={timeout.connect})"
            ) from exc
        except OSError as exc:
            import urllib3.exceptions

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
                    import urllib3.exceptions

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
