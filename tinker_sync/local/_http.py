"""The local server's HTTP/1.1 layer: asyncio streams, one event-loop thread, stdlib only.

Usage::

    server = HttpServer(app, port=0, faults=FaultPlan(), log=RequestLog())
    server.start()                       # binds 127.0.0.1, serves from a background thread
    print(server.url)                    # http://127.0.0.1:54321
    server.refuse_connections(2.0)       # listener and idle keep-alive connections closed for 2 s
    server.stop()                        # returns within ``timeout`` even with held long polls

What it does: keep-alive (HTTP/1.1 default, HTTP/1.0 on request), ``Content-Length`` and chunked
request bodies, ``Expect: 100-continue``, size limits (head 64 KiB -> 431, body 256 MiB -> 413),
malformed requests -> 400 JSON and close, percent-decoded paths and parsed query strings,
``content-length`` on every response. Per request it consults the fault plan (HTTP-level
actions run here; poll actions go to the app in ``request.poll_fault``), awaits
``app.handle(request)`` and records the exchange in the request log. Paths under ``/_local/``
go to the admin handler, without faults or log records.

Thread safety: ``start``/``stop``/``refuse_connections``/``wait_listening`` may be called from
any thread; all sockets live on the one loop thread. Fork safety: not fork-safe; a forked child
must not touch a parent's server (its loop thread does not exist there).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import http
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, unquote

from tinker_sync._runtime.redact import scrub
from tinker_sync.local._faults import FaultDecision, FaultPlan, endpoint_of
from tinker_sync.local._httpapi import App, HttpRequest, HttpResponse
from tinker_sync.local._log import RecordedRequest, RequestLog

__all__ = ["ADMIN_PREFIX", "MAX_BODY_BYTES", "MAX_HEAD_BYTES", "HttpServer", "parse_head"]

logger = logging.getLogger("tinker_sync.local")

ADMIN_PREFIX = "/_local/"
MAX_BODY_BYTES = 256 * 1024 * 1024
#: First byte of a TLS record carrying a handshake (a ClientHello sent to the plain port).
_TLS_HANDSHAKE = b"\x16"
MAX_HEAD_BYTES = 64 * 1024

AdminHandler = Callable[[HttpRequest], Awaitable[HttpResponse]]
T = TypeVar("T")

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_REASONS = {s.value: s.phrase for s in http.HTTPStatus}
_NO_BODY_STATUSES = frozenset({204, 304})
_SKIP_RESPONSE_HEADERS = frozenset({"content-length", "connection", "transfer-encoding"})
_SERVER_NAME = "tinker-sync-local"


class HttpError(Exception):
    """A request the HTTP layer answers itself (status + JSON detail) and then closes."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """Parse a request head: request line, header lines, the empty line (CRLF separated).

    Returns ``(method, target, version, headers)`` with lower-cased header names; repeated
    headers are joined with ``", "``. Raises :class:`HttpError` (400 / 505) when malformed.
    """
    text = head.decode("latin-1")
    end = text.find("\r\n")
    if end < 0:
        end = len(text)
    parts = text[:end].split(" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise HttpError(400, "malformed request method")
    if not target or "\t" in target or "\x00" in target:
        raise HttpError(400, "malformed request target")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if re.fullmatch(r"HTTP/\d\.\d", version):
            raise HttpError(505, f"unsupported HTTP version {version}")
        raise HttpError(400, "malformed HTTP version")
    headers: dict[str, str] = {}
    for line in text[end + 2 :].split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpError(400, "malformed header line")
        plain = name.replace("-", "")
        if not (plain.isalnum() and plain.isascii()) and not _TOKEN.fullmatch(name):
            if name[:1] in (" ", "\t"):
                raise HttpError(400, "obsolete header line folding is not supported")
            raise HttpError(400, "malformed header name")
        if "\x00" in value:
            raise HttpError(400, "malformed header value")
        name = name.lower()
        value = value.strip(" \t")
        if name in headers:
            headers[name] = f"{headers[name]}, {value}"
        else:
            headers[name] = value
    return method, target, version, headers


def _split_target(target: str) -> tuple[str, dict[str, str]]:
    """Percent-decoded path and parsed query of a request target."""
    if target[0] != "/":
        if target == "*":
            return "*", {}
        scheme, sep, rest = target.partition("://")
        if not sep or not scheme.isalpha():
            raise HttpError(400, "malformed request target")
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    raw_path, _, query = target.partition("?")
    raw_path = raw_path.partition("#")[0]
    path = unquote(raw_path, errors="replace") if "%" in raw_path else raw_path
    params = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    return path, params


def _content_length(value: str) -> int:
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1:
        raise HttpError(400, "conflicting content-length headers")
    (v,) = values
    if not v.isdigit() or len(v) > 18:
        raise HttpError(400, "malformed content-length")
    return int(v)


class _DateCache:
    """``Date`` header value, formatted at most once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def get(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._value = email.utils.formatdate(now, usegmt=True)
        return self._value


def _clean(value: str) -> str:
    if "\r" in value or "\n" in value:
        return value.replace("\r", " ").replace("\n", " ")
    return value


class _Conn:
    __slots__ = ("admin_only", "idle", "task", "writer")

    def __init__(
        self, writer: asyncio.StreamWriter, task: asyncio.Task[Any] | None, admin_only: bool
    ) -> None:
        self.writer = writer
        self.task = task
        self.admin_only = admin_only
        self.idle = True


class HttpServer:
    """An asyncio HTTP/1.1 server for one :class:`~tinker_sync.local._httpapi.App`.

    Usage: ``HttpServer(app, port=0).start()``; ``.url``; ``.stop()``.

    Params: ``app`` answers requests; ``faults`` / ``log`` are consulted / filled per request;
    ``admin`` answers ``/_local/`` paths; ``admin_listener=True`` also opens a second port
    (``admin_port``) that serves only admin paths and is never refused; ``on_start`` /
    ``on_stop`` are awaited on the loop after binding / before the loop ends; ``tls``
    (``(certfile, keyfile)``) serves HTTPS on the main port (the admin port stays plain HTTP).

    Thread safety: public methods may be called from any thread. Fork safety: not fork-safe.
    """

    def __init__(
        self,
        app: App,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan | None = None,
        log: RequestLog | None = None,
        admin: AdminHandler | None = None,
        admin_listener: bool = False,
        on_start: Callable[[], Awaitable[None]] | None = None,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_head_bytes: int = MAX_HEAD_BYTES,
        backlog: int = 4096,
        tls: tuple[str, str] | None = None,
    ) -> None:
        self._app = app
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ssl.load_cert_chain(tls[0], tls[1])
        self._host = host
        self._port = port
        self._faults = faults
        self._log = log
        self._admin = admin
        self._admin_listener = admin_listener
        self._on_start = on_start
        self._on_stop = on_stop
        self._max_body = max_body_bytes
        self._max_head = max_head_bytes
        self._backlog = backlog

        self._state_lock = threading.Lock()
        self._started = False
        self._stopped = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread_id: int | None = None
        self._server: asyncio.Server | None = None
        self._admin_server: asyncio.Server | None = None
        self._admin_port: int | None = None
        self._conns: set[_Conn] = set()
        self._listening = threading.Event()
        self._refusing = False
        self._refuse_deadline = 0.0
        self._relisten_handle: asyncio.TimerHandle | None = None
        self._stopping = False
        self._dates = _DateCache()

    # -- properties ------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The bound port (the requested one before :meth:`start`)."""
        return self._port

    @property
    def admin_port(self) -> int | None:
        """The admin-only port when ``admin_listener=True`` (after start), else None."""
        return self._admin_port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("HttpServer is not started")
        return self._loop

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    @property
    def connection_count(self) -> int:
        """Open client connections (including the admin port's)."""
        return len(self._conns)

    def wait_listening(self, timeout: float | None = None) -> bool:
        """Block until the listener is open (e.g. after a refusal window); False on timeout."""
        return self._listening.wait(timeout)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Bind and start serving from a background thread. Idempotent; raises OSError on bind."""
        with self._state_lock:
            if self._started:
                if self._stopped:
                    raise RuntimeError("a stopped HttpServer cannot be restarted")
                return
            self._started = True
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(loop, ready), name="tinker-sync-local-http", daemon=True
        )
        self._thread.start()
        ready.wait()
        try:
            asyncio.run_coroutine_threadsafe(self._startup(), loop).result(timeout=60)
        except BaseException:
            self.stop(timeout=5.0)
            raise

    def _run(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        self._loop_thread_id = threading.get_ident()
        ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            except Exception:  # pragma: no cover - defensive
                logger.debug("shutdown_asyncgens failed", exc_info=True)
            loop.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Close listeners and every connection (held long polls included), stop the loop.

        Idempotent; returns within about ``timeout`` seconds.
        """
        with self._state_lock:
            if not self._started or self._stopped:
                self._stopped = self._started or self._stopped
                return
            self._stopped = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if threading.get_ident() == self._loop_thread_id:
            raise RuntimeError("HttpServer.stop() must not be called from its own loop thread")
        deadline = time.monotonic() + max(timeout, 0.1)
        if thread.is_alive() and not loop.is_closed():
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(deadline), loop)
            with contextlib.suppress(Exception):
                fut.result(timeout=max(deadline - time.monotonic(), 0.05))
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        thread.join(max(deadline - time.monotonic(), 0.05))
        if thread.is_alive():
            logger.warning("local HTTP server thread did not stop within %.1fs", timeout)
        self._listening.clear()

    async def _startup(self) -> None:
        await self._listen()
        if self._admin_listener:
            self._admin_server = await asyncio.start_server(
                functools.partial(self._on_connection, admin_only=True),
                self._host,
                0,
                limit=self._max_head,
                backlog=128,
            )
            self._admin_port = self._admin_server.sockets[0].getsockname()[1]
        if self._on_start is not None:
            await self._on_start()

    async def _listen(self) -> None:
        server = await asyncio.start_server(
            functools.partial(self._on_connection, admin_only=False),
            self._host,
            self._port,
            limit=self._max_head,
            backlog=self._backlog,
            reuse_address=True,
            ssl=self._ssl,
        )
        self._server = server
        self._port = server.sockets[0].getsockname()[1]
        self._listening.set()

    async def _shutdown(self, deadline: float) -> None:
        self._stopping = True
        self._listening.clear()
        if self._relisten_handle is not None:
            self._relisten_handle.cancel()
        for server in (self._server, self._admin_server):
            if server is not None:
                server.close()
        self._server = self._admin_server = None
        conns = list(self._conns)
        for conn in conns:
            conn.writer.transport.abort()
            if conn.task is not None:
                conn.task.cancel()
        tasks = [c.task for c in conns if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=max(deadline - time.monotonic() - 0.5, 0.05) / 2)
        if self._on_stop is not None:
            try:
                await asyncio.wait_for(
                    self._on_stop(), timeout=max(deadline - time.monotonic() - 0.5, 0.05)
                )
            except Exception:
                logger.warning("local server app shutdown failed", exc_info=True)
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me]
        for t in others:
            t.cancel()
        if others:
            await asyncio.wait(others, timeout=max(deadline - time.monotonic() - 0.3, 0.05))

    # -- helpers for owners ----------------------------------------------------------------

    def run_coroutine(self, coro: Awaitable[T], timeout: float | None = 30.0) -> T:
        """Run ``coro`` on the server loop from another thread and return its result."""
        if threading.get_ident() == self._loop_thread_id:
            raise RuntimeError("run_coroutine() would deadlock on the server loop thread")

        async def wrapper() -> T:
            return await coro

        fut: ConcurrentFuture[T] = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        return fut.result(timeout)

    # -- refusing ----------------------------------------------------------------------------

    def refuse_connections(self, seconds: float) -> None:
        """Close the listener and idle keep-alive connections for ``seconds``, then re-listen.

        Busy connections finish their current request and are then closed. New connections
        get "connection refused" meanwhile. Calling it again extends the window. Returns once
        the listener is closed (when called from another thread).
        """
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        loop = self.loop
        if threading.get_ident() == self._loop_thread_id:
            loop.create_task(self._refuse(seconds))
            return
        asyncio.run_coroutine_threadsafe(self._refuse(seconds), loop).result(timeout=30)

    @property
    def refusing(self) -> bool:
        return self._refusing

    async def _refuse(self, seconds: float) -> None:
        if self._stopping:
            return
        loop = asyncio.get_running_loop()
        self._refusing = True
        self._refuse_deadline = max(self._refuse_deadline, loop.time() + seconds)
        self._listening.clear()
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self._conns):
            if conn.idle and not conn.admin_only:
                conn.writer.close()
        if self._relisten_handle is not None:
            self._relisten_handle.cancel()
        self._relisten_handle = loop.call_at(
            self._refuse_deadline, lambda: loop.create_task(self._relisten())
        )

    async def _relisten(self) -> None:
        self._relisten_handle = None
        for _ in range(200):
            if self._stopping:
                return
            try:
                await self._listen()
            except OSError:
                await asyncio.sleep(0.05)
                continue
            self._refusing = False
            return
        logger.error("local server could not listen again on port %s", self._port)

    # -- connections -------------------------------------------------------------------------

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, admin_only: bool
    ) -> None:
        conn = _Conn(writer, asyncio.current_task(), admin_only)
        if self._stopping:
            writer.transport.abort()
            return
        self._conns.add(conn)
        try:
            await self._serve(conn, reader)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # stop(): swallowed on purpose, asyncio's stream callback would log a cancelled task
            pass
        except Exception:
            logger.exception("local server connection handler failed")
        finally:
            self._conns.discard(conn)
            if self._stopping:
                writer.transport.abort()
            elif not writer.transport.is_closing():
                writer.close()

    async def _serve(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        writer = conn.writer
        first = True
        while True:
            conn.idle = True
            try:
                lead = b""
                if first:
                    first = False
                    lead = await reader.readexactly(1)
                    if lead == _TLS_HANDSHAKE:
                        await self._refuse_tls(writer)
                        return
                head = lead + await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # peer closed (possibly mid-head)
            except asyncio.LimitOverrunError:
                await self._send_error(writer, 431, "request header fields too large")
                return
            conn.idle = False
            if head[:2] == b"\r\n":
                head = head.lstrip(b"\r\n")
                if not head:
                    continue
            received = time.perf_counter()
            try:
                method, target, version, headers = parse_head(head)
                path, query = _split_target(target)
            except HttpError as exc:
                await self._send_error(writer, exc.status, exc.detail)
                return
            keep_alive = self._keep_alive(version, headers)
            request = HttpRequest(
                method=method, path=path, query=query, headers=headers, body=b"", raw_path=target
            )
            is_admin = path.startswith(ADMIN_PREFIX) and self._admin is not None
            try:
                request.body, must_close = await self._read_body(reader, writer, headers)
            except HttpError as exc:
                if not is_admin and exc.status == 413:
                    self._record(request, exc.status, received, None, None)
                # 413: let the client finish sending so that it can read the answer
                await self._send_error(
                    writer, exc.status, exc.detail, drain_from=reader if exc.status == 413 else None
                )
                return
            keep_alive = keep_alive and not must_close
            if is_admin and self._admin is not None:
                response: HttpResponse | None = await self._admin(request)
            elif conn.admin_only:
                response = HttpResponse.error(404, "this port serves only /_local/ admin paths")
            else:
                response = await self._dispatch(request, received)
                if response is None:
                    writer.close()
                    return
            if self._refusing and not conn.admin_only:
                keep_alive = False
            assert response is not None
            await self._write(writer, response, keep_alive, version, method == "HEAD")
            if response.cut_at is not None:
                writer.close()  # a download cut mid-body (fault ``cut_at``): flush, then FIN
                return
            if not keep_alive:
                return

    @staticmethod
    def _keep_alive(version: str, headers: Mapping[str, str]) -> bool:
        value = headers.get("connection")
        if value is None:
            return version == "HTTP/1.1"
        tokens = {t.strip().lower() for t in value.split(",")}
        if version == "HTTP/1.1":
            return "close" not in tokens
        return "keep-alive" in tokens

    async def _refuse_tls(self, writer: asyncio.StreamWriter) -> None:
        """A TLS ClientHello on this plain-HTTP port: answer in plain HTTP and close at once.

        The client's TLS layer then fails immediately ("wrong version number") instead of
        waiting for a handshake that never comes.
        """
        logger.warning(
            "a client tried TLS (https://) on this plain-HTTP server; it should use http://"
        )
        await self._send_error(writer, 400, "this server speaks plain HTTP: use http://")

    async def _read_body(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]
    ) -> tuple[bytes, bool]:
        """Read the request body; returns ``(body, must_close)``."""
        te = headers.get("transfer-encoding")
        cl = headers.get("content-length")
        if te is not None:
            codings = [c.strip().lower() for c in te.split(",") if c.strip()]
            if codings != ["chunked"]:
                raise HttpError(400, f"unsupported transfer-encoding {te!r}")
            await self._maybe_continue(writer, headers)
            # A request with both headers is suspicious (smuggling): serve it, then close.
            return await self._read_chunked(reader), cl is not None
        if cl is None:
            return b"", False
        length = _content_length(cl)
        if length > self._max_body:
            raise HttpError(413, f"request body too large ({length} > {self._max_body} bytes)")
        if length == 0:
            return b"", False
        await self._maybe_continue(writer, headers)
        return await reader.readexactly(length), False

    @staticmethod
    async def _maybe_continue(writer: asyncio.StreamWriter, headers: Mapping[str, str]) -> None:
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            try:
                line = await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise HttpError(400, "malformed chunk size line") from None
            size_text = line[:-2].split(b";", 1)[0].strip()
            if not _HEX.fullmatch(size_text):
                raise HttpError(400, "malformed chunk size")
            size = int(size_text, 16)
            if size == 0:
                break
            total += size
            if total > self._max_body:
                raise HttpError(413, f"request body too large (> {self._max_body} bytes)")
            chunk = await reader.readexactly(size + 2)
            if chunk[-2:] != b"\r\n":
                raise HttpError(400, "malformed chunk terminator")
            parts.append(chunk[:-2])
        trailer_bytes = 0
        while True:  # trailers, ignored
            try:
                line = await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise HttpError(431, "chunked trailer too large") from None
            if line == b"\r\n":
                break
            trailer_bytes += len(line)
            if trailer_bytes > self._max_head:
                raise HttpError(431, "chunked trailer too large")
        return b"".join(parts)

    # -- dispatch ----------------------------------------------------------------------------

    async def _dispatch(self, request: HttpRequest, received: float) -> HttpResponse | None:
        """Faults, app, log. Returns None when the connection must be dropped."""
        endpoint = endpoint_of(request.path)
        request.endpoint = endpoint
        decision: FaultDecision | None = None
        if self._faults is not None:
            decision = self._faults.evaluate(
                request.method,
                request.path,
                endpoint,
                functools.partial(self._match_fields, request),
            )
        if decision is None:
            answer = await self._call_app(request)
            self._record(request, answer.status, received, None, None)
            return answer
        if decision.delay > 0:
            await asyncio.sleep(decision.delay)
        for key, value in decision.meta.items():
            request.meta[f"fault.{key}"] = value
        action = decision.action
        dropped: Literal["before", "after"] | None = None
        response: HttpResponse | None
        if action is not None and action.drop == "before":
            response = None
            dropped = "before"
        elif action is not None and action.status is not None:
            response = action.status_response()
        else:
            if action is not None and action.is_poll_action:
                request.poll_fault = action.poll_fault()
            response = await self._call_app(request)
            if action is not None and action.drop == "after":
                response = None
                dropped = "after"
            elif action is not None and action.cut_at is not None:
                response.cut_at = action.cut_at
        if response is not None:
            extra = dict(decision.headers)
            if action is not None:
                extra.update(action.response_headers())
            if extra:
                response.headers = {**response.headers, **extra}
        self._record(
            request, None if response is None else response.status, received, decision, dropped
        )
        return response

    def _match_fields(self, request: HttpRequest) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if request.body[:1] in (b"{", b" ", b"\t", b"\r", b"\n"):
            try:
                body = json.loads(request.body)
            except ValueError:
                body = None
            if isinstance(body, dict):
                fields.update(body)
        for name, value in request.headers.items():
            fields[f"header:{name}"] = value
        try:
            fields.update(self._app.match_fields(request))
        except Exception:
            logger.warning("app.match_fields failed", exc_info=True)
        return fields

    def _summary(self, request: HttpRequest) -> dict[str, Any] | None:
        """A proto summary for requests the app did not handle (faults answered them)."""
        if "protobuf" not in request.headers.get("content-type", ""):
            return None
        summarize = getattr(self._app, "proto_summary", None)
        if summarize is None:
            return None
        try:
            result: dict[str, Any] | None = summarize(request)
        except Exception:
            return None
        return result

    async def _call_app(self, request: HttpRequest) -> HttpResponse:
        try:
            return await self._app.handle(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("local server app failed on %s %s", request.method, request.path)
            return HttpResponse.json(
                {"detail": scrub(f"local server error: {type(exc).__name__}: {exc}")}, 500
            )

    def _record(
        self,
        request: HttpRequest,
        status: int | None,
        received: float,
        decision: FaultDecision | None,
        dropped: Literal["before", "after"] | None,
    ) -> None:
        log = self._log
        if log is None:
            return
        body_json = request.log_json
        if body_json is None and request.body[:1] in (b"{", b"["):
            try:
                body_json = json.loads(request.body)
            except ValueError:
                body_json = None
        elapsed = time.perf_counter() - received
        log.record(
            RecordedRequest(
                time=time.time() - elapsed,  # arrival (head fully received)
                method=request.method,
                path=request.path,
                endpoint=request.endpoint or endpoint_of(request.path),
                status=status,
                raw_headers=request.headers,
                json=body_json,
                proto=request.log_proto
                if request.log_proto is not None
                else self._summary(request),
                fault=None if decision is None else decision.name,
                duration_s=elapsed,
                query=request.query,
                dropped=dropped,
            )
        )

    # -- writing -----------------------------------------------------------------------------

    async def _write(
        self,
        writer: asyncio.StreamWriter,
        response: HttpResponse,
        keep_alive: bool,
        version: str,
        head_only: bool,
    ) -> None:
        status = response.status
        body = response.body
        parts = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"]
        for name, value in response.headers.items():
            lname = name.lower()
            if lname in _SKIP_RESPONSE_HEADERS or not _TOKEN.fullmatch(name):
                continue
            parts.append(f"{name}: {_clean(str(value))}\r\n")
        if status in _NO_BODY_STATUSES or status < 200:
            body = b""
        else:
            parts.append(f"content-length: {len(body)}\r\n")
        parts.append(f"date: {self._dates.get()}\r\nserver: {_SERVER_NAME}\r\n")
        if not keep_alive:
            parts.append("connection: close\r\n")
        elif version == "HTTP/1.0":
            parts.append("connection: keep-alive\r\n")
        parts.append("\r\n")
        head = "".join(parts).encode("latin-1", "replace")
        if response.cut_at is not None:
            body = body[: response.cut_at]
        if head_only or not body:
            writer.write(head)
        elif len(body) < 65536:
            writer.write(head + body)
        else:
            writer.write(head)
            writer.write(body)
        await writer.drain()

    async def _send_error(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        detail: str,
        drain_from: asyncio.StreamReader | None = None,
    ) -> None:
        """Answer an unparseable / refused request with a JSON error and close.

        With ``drain_from``, half-close and discard what the client still sends (up to 2 s), so
        a client busy uploading an oversized body gets the answer instead of a reset.
        """
        try:
            await self._write(
                writer, HttpResponse.error(status, detail), False, "HTTP/1.1", head_only=False
            )
            if drain_from is not None and writer.can_write_eof():
                writer.write_eof()
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 2.0
                while (remaining := deadline - loop.time()) > 0:
                    if not await asyncio.wait_for(drain_from.read(1 << 20), remaining):
                        break
        except (ConnectionError, RuntimeError, TimeoutError, OSError):
            pass
        writer.close()
