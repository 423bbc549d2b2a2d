"""HTTP transport: connection pools per traffic type, request headers, one HTTP attempt.

Usage::

    from tinker_sync._transport import Pool, RequestSpec, Transport, quote_path, sdk_method_scope

    transport = Transport(config, auth=StaticKeyAuth(config.credentials), hooks=(my_hook,))
    spec = RequestSpec(method="POST", path="/api/v1/get_info", pool=Pool.TRAIN,
                       json={"model_id": mid, "type": "get_info"})
    reply = transport.send_once(spec, attempt=0)      # one attempt; retries live in _retry
    reply.status, reply.headers["content-type"], reply.json()
    transport.close()

Layers: :class:`HttpPools` holds one set of urllib3 connection pools per :class:`Pool` for one
``(pid, normalized base_url)``, shared by every :class:`Transport` of that server in the
process (reference counted; the last ``close()`` closes the connections). A :class:`Transport`
is the per-client view: config (headers, timeouts), the
:class:`~tinker_sync._config.AuthProvider`, hooks and the clock.

urllib3 directly, not requests: per request, requests' Session machinery (settings merges,
environment scans, header dict copies) cost more client CPU than the HTTP exchange itself.
What it provided is done here once per server: proxies and the CA bundle come from the same
environment variables (:func:`_environment_settings`), redirects are followed (up to
:data:`MAX_REDIRECTS`, secrets dropped across origins) and ``~/.netrc`` is never read.
urllib3 owns the connections (pooling, TLS, proxies, dropped-connection checks); requests
without a proxy are written and read with ``http.client`` on those connections
(:func:`_exchange_pooled`), skipping urllib3's ``urlopen`` and response wrapper, and header
lines that never change are validated once (:func:`prepare_headers`). Together these halve
the client CPU of a small request.

Every request carries explicit ``(connect, read)`` timeouts (B30), is sent with urllib3
retries off (the SDK owns all retries) and is mapped on failure to the SDK exceptions: connect
failures -> :class:`APIConnectError` / :class:`APIConnectTimeoutError` (never sent), read
timeouts -> :class:`APITimeoutError`, anything else on the wire (reset, dropped mid-response,
EBADF) -> :class:`APIConnectionError`. HTTP error statuses are returned as a :class:`Reply`;
the retry layer turns them into exceptions (:func:`error_from_reply`).

Pools and HTTP/1.1: a urllib3 connection carries one request at a time (no pipelining), so the
official "TRAIN = 1 request per client" rule holds as long as the pool never blocks; pools use
``block=False`` and are sized above their thread counts, so concurrent requests never share
a connection and connections are still kept alive between requests (no ``Connection: close``,
which would cost a TLS handshake per training call).

Exit (B55): at interpreter exit the sockets of requests still in flight are shut down, so a
long poll blocked in a non-daemon pool thread fails at once instead of delaying exit; from then
on the long-poll pools (RETRIEVE_PROMISE, RETRIEVE_FUTURES) fail new requests at once, while the
other pools keep working for final requests made by exit handlers.

Fork (B50): in a forked child every inherited :class:`HttpPools` is moved to a never-collected
graveyard list without closing it (closing could write a TLS close_notify onto the parent's
live connection); each :class:`Transport` notices the pid change and acquires fresh pools.

Thread safety: :class:`Transport` and :class:`HttpPools` may be shared by any number of threads.
Fork safety: as described above.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import errno
import functools
import http.client
import io
import json as _json
import logging
import os
import platform
import re
import socket
import ssl
import sys
import urllib.parse
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

import attrs
import urllib3.exceptions
import urllib3.response
from urllib3 import PoolManager, ProxyManager
from urllib3 import Timeout as _Urllib3Timeout
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util import make_headers
from urllib3.util.ssl_match_hostname import CertificateError

from tinker_sync._clock import SYSTEM_CLOCK, Clock, register_exit_callback
from tinker_sync._config import PROTOCOL_VERSION, AuthProvider, ClientConfig, Timeout
from tinker_sync._fork import current_pid, make_lock, register_after_fork
from tinker_sync._redact import is_secret_header, redact_headers, scrub
from tinker_sync._version import __version__
from tinker_sync.exceptions import (
    APIConnectError,
    APIConnectionError,
    APIConnectTimeoutError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    ClientClosedError,
    RequestSnapshot,
    ResponseSnapshot,
    status_error_class,
)

__all__ = [
    "BARE_400_BUDGET",
    "DEFAULT_POOL_SIZES",
    "LONG_POLL_POOLS",
    "USER_AGENT",
    "Hook",
    "HookEvent",
    "HttpPools",
    "Pool",
    "Reply",
    "RequestSpec",
    "Transport",
    "acquire_pools",
    "add_global_hook",
    "close_all_pools",
    "context_without_sdk_method",
    "current_sdk_method",
    "emit_hook",
    "error_from_reply",
    "is_invalid_token",
    "map_transport_error",
    "new_idempotency_key",
    "quote_path",
    "remove_global_hook",
    "sdk_method_scope",
]

logger = logging.getLogger("tinker_sync.transport")

USER_AGENT = f"tinker-sync/{__version__} (protocol {PROTOCOL_VERSION})"
BARE_400_BUDGET = 16
"""Bare 400s (empty body, a proxy rejection) retried as connection errors per pool (§5.3)."""


class Pool(str, enum.Enum):
    """Traffic types; each has its own connection pool (B31, PROTOCOL §5.4)."""

    SESSION = "session"
    SAMPLE = "sample"
    TRAIN = "train"
    REST = "rest"
    RETRIEVE_PROMISE = "retrieve_promise"
    RETRIEVE_FUTURES = "retrieve_futures"
    TELEMETRY = "telemetry"
    AUTH = "auth"

    def __str__(self) -> str:
        return self.value


DEFAULT_POOL_SIZES: Mapping[Pool, int] = {
    Pool.SESSION: 32,
    Pool.SAMPLE: 512,
    Pool.TRAIN: 256,
    Pool.REST: 32,
    Pool.RETRIEVE_PROMISE: 512,
    Pool.RETRIEVE_FUTURES: 16,
    Pool.TELEMETRY: 8,
    Pool.AUTH: 4,
}
"""``pool_maxsize`` per pool: above the thread counts of B54, so no request waits or churns."""


# --------------------------------------------------------------------------------------------
# x-sdk-method context
# --------------------------------------------------------------------------------------------

current_sdk_method: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tinker_sync_sdk_method", default=None
)
"""The outermost public SDK method running in this context (``"TrainingClient.forward_backward"``)."""


@contextlib.contextmanager
def sdk_method_scope(name: str) -> Iterator[None]:
    """Mark requests made inside as caused by public method ``name``; the outermost call wins."""
    if current_sdk_method.get() is not None:
        yield
        return
    token = current_sdk_method.set(name)
    try:
        yield
    finally:
        current_sdk_method.reset(token)


def context_without_sdk_method() -> contextvars.Context:
    """A copy of the current context without the method name (for loops that outlive a call)."""
    ctx = contextvars.copy_context()
    ctx.run(current_sdk_method.set, None)
    return ctx


# --------------------------------------------------------------------------------------------
# Hooks (B63)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class HookEvent:
    """One observation for hooks: ``kind`` (``"request"``, ``"retry_scheduled"``, ...) + fields.

    ``request`` fields: method, path, pool, status (None on a transport error), duration,
    attempt, error (exception class name or None). ``retry_scheduled``: delay, reason, attempt,
    method, path. Values never contain secrets.
    """

    kind: str
    data: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


Hook = Callable[[HookEvent], object]
_global_hooks: tuple[Hook, ...] = ()
_global_hooks_lock = make_lock()


def add_global_hook(hook: Hook) -> None:
    """Register a process-wide hook (runs after the per-client ones)."""
    global _global_hooks
    with _global_hooks_lock:
        _global_hooks = (*_global_hooks, hook)


def remove_global_hook(hook: Hook) -> None:
    """Unregister a process-wide hook (no error when absent)."""
    global _global_hooks
    with _global_hooks_lock:
        _global_hooks = tuple(h for h in _global_hooks if h is not hook)


def emit_hook(hooks: Sequence[Hook], kind: str, **data: Any) -> None:
    """Call each hook (then the global ones) with a :class:`HookEvent`; exceptions are logged."""
    everything = (*hooks, *_global_hooks)
    if not everything:
        return
    event = HookEvent(kind, data)
    for hook in everything:
        try:
            hook(event)
        except Exception:
            logger.warning("hook %r failed on %s event", hook, kind, exc_info=True)


# --------------------------------------------------------------------------------------------
# Request description and reply
# --------------------------------------------------------------------------------------------


def new_idempotency_key() -> str:
    """A fresh ``X-Idempotency-Key`` value (one per logical request, B34): a random UUID4."""
    raw = bytearray(os.urandom(16))  # what uuid.uuid4() does, without its object (hot path)
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"tinker_sync-retry-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def quote_path(segment: str) -> str:
    """Percent-encode a path parameter, keeping ``/`` and ``:`` literal (B30, PROTOCOL §0.1)."""
    from urllib.parse import quote

    return quote(str(segment), safe="/:")


def _headers_repr(headers: Mapping[str, str]) -> str:
    return repr(redact_headers(headers))


def _upper(method: str) -> str:
    return method.upper()


def _coerce_timeout(value: object) -> Timeout | None:
    return None if value is None else Timeout.coerce(value)


def _default_key(self: RequestSpec) -> str | None:
    return None if self.method == "GET" else new_idempotency_key()


def _default_sdk_method() -> str | None:
    return current_sdk_method.get()


Expect = Literal["json", "proto", "none", "any"]
_JSON_ENCODER = _json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@attrs.frozen(kw_only=True)
class RequestSpec:
    """One logical request; reused unchanged by every retry of it.

    Usage::

        RequestSpec(method="POST", path="/api/v1/asample", pool=Pool.SAMPLE, json=body,
                    headers={"X-Tinker-Sampling-Backpressure": "1"}, max_retries=0)

    * ``json`` is encoded once into ``content`` (``application/json``); or pass ``content`` +
      ``content_type`` (protobuf). No body: no Content-Type.
    * ``timeout``: a :class:`Timeout` or number (all parts); None = the client's default.
    * ``idempotency_key``: defaults to a new key for non-GET, None for GET.
    * ``sdk_method``: defaults to :data:`current_sdk_method` *at construction*, so the spec
      carries it into pool threads.
    * ``expect``: ``"proto"`` sends ``Accept: application/x-protobuf``; informative otherwise.
    * ``max_retries``: HTTP-level retry override (None = the client's ``max_retries``).

    Thread safety: immutable (do not mutate ``json`` after construction). Fork safety: data.
    """

    method: str = attrs.field(converter=_upper)
    path: str
    pool: Pool
    json: Any = attrs.field(default=None, eq=False, repr=False)
    content: bytes | None = attrs.field(default=None, eq=False, repr=False)
    content_type: str | None = None
    params: Mapping[str, Any] | None = None
    timeout: Timeout | None = attrs.field(default=None, converter=_coerce_timeout)
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=_headers_repr)
    idempotency_key: str | None = attrs.field(default=attrs.Factory(_default_key, takes_self=True))
    sdk_method: str | None = attrs.field(factory=_default_sdk_method)
    expect: Expect = "json"
    max_retries: int | None = None

    def __attrs_post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"RequestSpec.path must start with '/': {self.path!r}")
        if self.json is not None:
            if self.content is not None:
                raise ValueError("RequestSpec takes json or content, not both")
            encoded = _JSON_ENCODER.encode(self.json).encode()
            object.__setattr__(self, "content", encoded)
            if self.content_type is None:
                object.__setattr__(self, "content_type", "application/json")
        elif self.content is not None and self.content_type is None:
            object.__setattr__(self, "content_type", "application/octet-stream")


@attrs.frozen(kw_only=True)
class Reply:
    """An HTTP response, fully read. ``headers`` has lower-case names.

    ``request`` is a redacted :class:`RequestSnapshot`, set only for error statuses (>= 400).
    Thread safety: immutable. Fork safety: data.
    """

    status: int
    headers: Mapping[str, str] = attrs.field(repr=False)
    content: bytes = attrs.field(repr=False)
    elapsed: float
    method: str
    url: str
    request: RequestSnapshot | None = attrs.field(default=None, repr=False, eq=False)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    @property
    def is_protobuf(self) -> bool:
        return "application/x-protobuf" in self.content_type

    def json(self) -> Any:
        """The body parsed as JSON; :class:`APIResponseValidationError` when it is not JSON."""
        try:
            return _json.loads(self.content)
        except ValueError:
            raise APIResponseValidationError(
                f"{self.method} {self.url}: response body is not JSON "
                f"(status {self.status}, {len(self.content)} bytes)",
                response=self.snapshot(),
                request=self.request,
            ) from None

    def snapshot(self) -> ResponseSnapshot:
        """A redacted, picklable copy for exceptions."""
        return ResponseSnapshot(self.status, self.headers, self.content, self.url)


def error_from_reply(reply: Reply) -> APIStatusError:
    """The status exception for an error reply (400 -> BadRequestError, ..., 5xx -> Internal).

    ``body`` is the parsed JSON (or the text) and the message reads
    ``"Error code: 404 - {...}"`` like the official client.
    """
    snapshot = reply.snapshot()  # scrubbed: the body must not smuggle a secret either
    try:
        body: Any = _json.loads(snapshot.content) if snapshot.content else None
    except ValueError:
        body = snapshot.text
    cls = status_error_class(reply.status)
    shown = body if body is not None else "(empty body)"
    return cls(
        f"Error code: {reply.status} - {shown}",
        response=snapshot,
        body=body,
        request=reply.request,
    )


def is_invalid_token(reply: Reply) -> bool:
    """A 401 whose ``WWW-Authenticate`` says ``error="invalid_token"`` (RFC 6750)."""
    return reply.status == 401 and 'error="invalid_token"' in reply.headers.get(
        "www-authenticate", ""
    )


# --------------------------------------------------------------------------------------------
# Exception mapping
# --------------------------------------------------------------------------------------------


def _related(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it wraps (args, ``reason``, ``__cause__``, ``__context__``)."""
    seen: set[int] = set()
    stack = [exc]
    while stack and len(seen) < 32:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        nested = [a for a in getattr(cur, "args", ()) if isinstance(a, BaseException)]
        reason = getattr(cur, "reason", None)
        if isinstance(reason, BaseException):
            nested.append(reason)
        for link in (cur.__cause__, cur.__context__):
            if link is not None:
                nested.append(link)
        stack.extend(reversed(nested))


def _requests_exceptions() -> Any:
    """``requests.exceptions`` if something imported it (else no such exception can exist)."""
    return sys.modules.get("requests.exceptions")


def _is_programming_error(exc: BaseException) -> bool:
    """A malformed URL or header: a bug to raise as is, not a transport failure."""
    if isinstance(exc, urllib3.exceptions.LocationValueError):
        return True
    rex = _requests_exceptions()
    return rex is not None and isinstance(
        exc,
        (rex.InvalidURL, rex.MissingSchema, rex.InvalidSchema, rex.InvalidHeader, rex.URLRequired),
    )


def map_transport_error(
    exc: BaseException, request: RequestSnapshot | None = None
) -> APIConnectionError | None:
    """Map a urllib3/requests/OS failure to the SDK exception, or None if it is not one.

    * connect timeout -> :class:`APIConnectTimeoutError` (NOT_SENT)
    * refused / DNS / TLS / proxy / closed pool -> :class:`APIConnectError` (NOT_SENT)
    * read timeout -> :class:`APITimeoutError`
    * any other transport failure, e.g. reset, dropped mid-response, EBADF -> APIConnectionError
    """
    if isinstance(exc, APIConnectionError):
        return exc
    if _is_programming_error(exc):
        return None
    rex = _requests_exceptions()
    chain = list(_related(exc))
    detail = scrub(_describe(exc))[:300]
    if (rex is not None and isinstance(exc, rex.ConnectTimeout)) or any(
        isinstance(e, urllib3.exceptions.ConnectTimeoutError)
        and not isinstance(e, urllib3.exceptions.NewConnectionError)
        for e in chain
    ):
        return APIConnectTimeoutError(f"Connect timed out: {detail}", request)
    refused: tuple[type[BaseException], ...] = (
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.ClosedPoolError,
        urllib3.exceptions.ProxyError,
        urllib3.exceptions.SSLError,
        ConnectionRefusedError,
    )
    if rex is not None:
        refused = (*refused, rex.ProxyError, rex.SSLError)
    if any(isinstance(e, refused) for e in chain):
        return APIConnectError(f"Connection failed: {detail}", request)
    if (rex is not None and isinstance(exc, rex.ReadTimeout)) or any(
        isinstance(e, (urllib3.exceptions.ReadTimeoutError, TimeoutError)) for e in chain
    ):
        return APITimeoutError(f"Request timed out: {detail}", request)
    wire: tuple[type[BaseException], ...] = (
        urllib3.exceptions.HTTPError,
        http.client.HTTPException,  # IncompleteRead, BadStatusLine, LineTooLong, ...
        OSError,
    )
    if rex is not None:
        wire = (*wire, rex.RequestException)
    if isinstance(exc, wire):
        return APIConnectionError(f"Connection error: {detail}", request)
    return None


def _describe(exc: BaseException) -> str:
    innermost = exc
    for e in _related(exc):
        innermost = e
    text = str(innermost) or type(innermost).__name__
    if innermost is exc:
        return f"{type(exc).__name__}: {text}"
    return f"{type(exc).__name__} ({type(innermost).__name__}: {text})"


# --------------------------------------------------------------------------------------------
# Connection pools
# --------------------------------------------------------------------------------------------


class _InflightTracker:
    """The connections currently checked out of one pool's urllib3 pools (weakly held).

    ``abort()`` shuts their sockets down so that reads blocked in other threads return at once;
    with ``sticky=True`` every connection checked out or connected later fails the same way.
    Used at interpreter exit (B55), in the process that opened the connections.
    """

    def __init__(self) -> None:
        self._lock = make_lock()
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        self.aborted = False

    def add(self, conn: Any) -> None:
        with self._lock:
            self._conns.add(conn)
            aborted = self.aborted
        if aborted:
            _shutdown(conn)

    def discard(self, conn: Any) -> None:
        with self._lock:
            self._conns.discard(conn)

    def connected(self, conn: Any) -> None:
        with self._lock:
            aborted = self.aborted
        if aborted:
            _shutdown(conn)

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns)

    def abort(self, *, sticky: bool = False) -> int:
        with self._lock:
            conns = list(self._conns)
            self.aborted = self.aborted or sticky
        return sum(_shutdown(conn) for conn in conns)


def _shutdown(conn: Any) -> bool:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return False
    try:
        # The plain-socket shutdown also works under TLS without touching the SSL object.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        return False
    return True


_PREPARED_LIMIT = 4096
_prepared: dict[tuple[str, str], bytes] = {}
_LEGAL_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_LEGAL_VALUE = re.compile(r"[\x20-\x7e\t]*")


def prepare_headers(headers: Mapping[str, str]) -> None:
    """Validate and encode header lines sent on many requests, once (see ``_PreparedHeaders``).

    Only plain printable-ASCII names and values are prepared; anything else keeps taking the
    normal path, which validates it (and rejects CR/LF) on every request. Bounded: past 4,096
    distinct lines nothing more is prepared.
    """
    for name, value in headers.items():
        key = (name, value)
        if key in _prepared or len(_prepared) >= _PREPARED_LIMIT:
            continue
        if _LEGAL_NAME.fullmatch(name) and _LEGAL_VALUE.fullmatch(value):
            _prepared[key] = f"{name}: {value}".encode("ascii")


_COALESCE_LIMIT = 64 * 1024
"""Bodies up to this size leave in the same write as their headers."""


class _PreparedHeaders(HTTPConnection):
    """A urllib3 connection that writes requests with fewer checks and fewer writes.

    ``http.client`` validates and encodes every header of every request (and urllib3 adds its
    own pass); a request here carries about 20, most of them the same on every request, which
    made header writing the largest client-side cost of a small request after the socket
    calls. Lines registered with :func:`prepare_headers` were checked once and are appended
    as they are; every other header goes through the normal, validating ``putheader``. After
    :meth:`hold_head`, the header block and a small body leave in one write.
    Thread safety: like any connection, used by one thread at a time (the pool hands it out).
    """

    _head: bytes | None = None
    _hold_head = False

    def putheader(self, header: str, *values: str) -> None:  # type: ignore[override]  # as urllib3
        if len(values) == 1:
            line = _prepared.get((header, values[0]))
            if line is not None:
                self._output(line)  # type: ignore[attr-defined]
                return
        super().putheader(header, *values)

    def hold_head(self) -> None:
        """Send the next request's header block together with its (small) body, in one write.

        ``http.client`` writes them separately, which costs a system call here and, on the
        server, a second read before the request is complete. Call it only when a body follows.
        """
        self._hold_head = True
        self._head = None

    def send(self, data: Any) -> None:
        if self._hold_head:
            self._hold_head = False
            self._head = bytes(data)  # the header block; the body comes next
            return
        head = self._head
        if head is not None:
            self._head = None
            data = head + bytes(data)
        super().send(data)


class _TrackedConnection(_PreparedHeaders):
    """Reports every (re)connect to its pool's tracker (a sticky abort closes it at once)."""

    tracker: _InflightTracker

    def connect(self) -> None:
        super().connect()
        self.tracker.connected(self)


class _TrackedHTTPSConnection(_TrackedConnection, HTTPSConnection):
    pass


class _TrackedPool(HTTPConnectionPool):
    """Counts its connections as in flight from checkout until they are handed back."""

    tracker: _InflightTracker

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)
        self.tracker.add(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            self.tracker.discard(conn)
        super()._put_conn(conn)


class _TrackedHTTPSPool(_TrackedPool, HTTPSConnectionPool):
    pass


def _tracking_pool_classes(tracker: _InflightTracker) -> dict[str, type[HTTPConnectionPool]]:
    """urllib3 pool classes by scheme whose connections report to ``tracker``."""
    classes: dict[str, type[HTTPConnectionPool]] = {}
    for scheme, pool_cls, conn_cls in (
        ("http", _TrackedPool, _TrackedConnection),
        ("https", _TrackedHTTPSPool, _TrackedHTTPSConnection),
    ):
        conn = type(conn_cls.__name__, (conn_cls,), {"tracker": tracker})
        classes[scheme] = type(
            pool_cls.__name__, (pool_cls,), {"tracker": tracker, "ConnectionCls": conn}
        )
    return classes


def _environment_settings(base_url: str) -> tuple[dict[str, str], bool | str]:
    """Proxies and CA bundle from the environment, resolved once per server.

    The variables ``requests`` honours, read once rather than per request: ``HTTP(S)_PROXY`` /
    ``ALL_PROXY`` unless ``NO_PROXY`` bypasses the host, and ``REQUESTS_CA_BUNDLE`` /
    ``CURL_CA_BUNDLE``. Returns ``(proxies by scheme, verify)``.
    """
    import urllib.request

    host = urllib.parse.urlsplit(base_url).hostname or ""
    found = urllib.request.getproxies()
    proxies: dict[str, str] = {}
    if found and not urllib.request.proxy_bypass(host):
        proxies = {k: v for k, v in found.items() if k in ("http", "https", "all")}
    verify: bool | str = (
        os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    )
    return proxies, verify


def _proxy_for(proxies: Mapping[str, str], scheme: str) -> str | None:
    return proxies.get(scheme) or proxies.get("all")


def _tls_settings(verify: bool | str) -> dict[str, Any]:
    """urllib3 keyword arguments for ``verify`` (True: the certifi bundle, as requests does)."""
    if verify is False:
        return {"cert_reqs": "CERT_NONE"}
    if verify is True:
        from requests.utils import DEFAULT_CA_BUNDLE_PATH  # certifi's bundle

        return {"cert_reqs": "CERT_REQUIRED", "ca_certs": DEFAULT_CA_BUNDLE_PATH}
    if os.path.isdir(verify):
        return {"cert_reqs": "CERT_REQUIRED", "ca_cert_dir": verify}
    return {"cert_reqs": "CERT_REQUIRED", "ca_certs": verify}


class _Route:
    """How one :class:`Pool` reaches the server: a urllib3 pool manager and the origin's pool.

    Requests to the base URL's origin go straight to ``origin`` (path-only request target),
    skipping the manager's per-request URL parsing; ``forward`` is set when a plain-HTTP proxy
    must see absolute URLs, in which case every request goes through the manager. Redirects to
    other origins always go through the manager.
    """

    def __init__(
        self,
        base_url: str,
        size: int,
        tracker: _InflightTracker | None,
        settings: tuple[Mapping[str, str], bool | str],
    ) -> None:
        proxies, verify = settings
        scheme = urllib.parse.urlsplit(base_url).scheme or "http"
        kw: dict[str, Any] = {"maxsize": size, "block": False, "retries": False}
        if scheme == "https":
            kw.update(_tls_settings(verify))
        proxy = _proxy_for(proxies, scheme)
        manager: PoolManager
        if proxy is None:
            manager = PoolManager(num_pools=4, **kw)
        elif proxy.lower().startswith("socks"):
            from urllib3.contrib.socks import SOCKSProxyManager

            manager = SOCKSProxyManager(proxy, num_pools=4, **kw)
        else:
            manager = ProxyManager(proxy, num_pools=4, **kw)
        if tracker is not None:
            manager.pool_classes_by_scheme = _tracking_pool_classes(tracker)
        self.manager = manager
        self.forward = isinstance(manager, ProxyManager) and scheme == "http"
        self.origin = manager.connection_from_url(base_url)

    def close(self) -> None:
        """Close every connection now (urllib3 2 leaves pools open until collected)."""
        try:
            self.origin.close()
            self.manager.clear()
        except Exception:  # pragma: no cover - best effort
            logger.debug("closing connection pools failed", exc_info=True)


_GRAVEYARD: list[object] = []
"""Transport state inherited over fork: kept alive forever, never closed (B50)."""


class HttpPools:
    """One :class:`_Route` (urllib3 connection pools) per :class:`Pool` for one server.

    Keyed by (pid, normalized base_url); get one with :func:`acquire_pools`. Also holds the
    per-pool bare-400 budgets (§5.3).
    Thread safety: all methods are thread-safe. Fork safety: abandoned in a child (see module).
    """

    def __init__(self, base_url: str, sizes: Mapping[Pool, int] | None = None) -> None:
        self.base_url = base_url
        self.pid = current_pid()
        self._sizes = {**DEFAULT_POOL_SIZES, **(sizes or {})}
        self._settings = _environment_settings(base_url)
        self._lock = make_lock()
        self._routes: dict[Pool, _Route] = {}
        self._budget: dict[Pool, int] = dict.fromkeys(Pool, BARE_400_BUDGET)
        self._inflight = {pool: _InflightTracker() for pool in Pool}
        self._users = 0
        self.closed = False

    def route(self, pool: Pool) -> _Route:
        """The connection pools for ``pool`` (created on first use)."""
        route = self._routes.get(pool)
        if route is not None and not self.closed:
            return route
        with self._lock:
            if self.closed:
                raise ClientClosedError("HTTP connection pools are closed")
            route = self._routes.get(pool)
            if route is None:
                route = self._routes[pool] = _Route(
                    self.base_url, self._sizes[pool], self._inflight[pool], self._settings
                )
            return route

    def reset(self, pool: Pool) -> None:
        """Replace ``pool``'s connections so new requests open new ones.

        Requests in flight finish on the old pools, which are then left to the garbage
        collector (like the official pool, which replaces its client without closing it).
        """
        with self._lock:
            self._routes.pop(pool, None)

    def take_bare_400(self, pool: Pool) -> bool:
        """Spend one unit of ``pool``'s bare-400 budget; False when it is exhausted."""
        with self._lock:
            if self._budget[pool] <= 0:
                return False
            self._budget[pool] -= 1
            return True

    def refill(self, pool: Pool) -> None:
        """A successful request earns one unit back (up to :data:`BARE_400_BUDGET`)."""
        if self._budget[pool] >= BARE_400_BUDGET:  # the common case, without the lock
            return
        with self._lock:
            if self._budget[pool] < BARE_400_BUDGET:
                self._budget[pool] += 1

    def budget(self, pool: Pool) -> int:
        with self._lock:
            return self._budget[pool]

    def inflight(self, pool: Pool | None = None) -> int:
        """How many connections are in use right now (requests being sent or read)."""
        pools = list(Pool) if pool is None else [pool]
        return sum(len(self._inflight[p]) for p in pools)

    def abort_inflight(self, *, sticky: Collection[Pool] = ()) -> int:
        """Shut down the sockets of requests in flight (they fail with APIConnectionError).

        Pools listed in ``sticky`` also fail every later request at once. For interpreter exit
        only; a no-op on pools inherited over fork. Returns how many sockets were shut down.
        """
        if self.pid != current_pid():
            return 0
        return sum(t.abort(sticky=p in sticky) for p, t in self._inflight.items())

    def close(self) -> None:
        """Close every connection (only in the process that opened them)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            routes = list(self._routes.values())
            self._routes.clear()
        if self.pid != current_pid():
            _GRAVEYARD.append(routes)
            return
        for route in routes:
            route.close()

    def __repr__(self) -> str:
        return f"<HttpPools {self.base_url} pid={self.pid} users={self._users}>"


_registry_lock = make_lock()
_registry: dict[tuple[int, str], HttpPools] = {}


def acquire_pools(normalized_base_url: str, sizes: Mapping[Pool, int] | None = None) -> HttpPools:
    """The shared pools of this process for a server (reference counted: Transport.close)."""
    key = (current_pid(), normalized_base_url)
    with _registry_lock:
        pools = _registry.get(key)
        if pools is None or pools.closed:
            pools = _registry[key] = HttpPools(normalized_base_url, sizes)
        pools._users += 1
        return pools


def _release_pools(pools: HttpPools) -> None:
    with _registry_lock:
        pools._users -= 1
        if pools._users > 0:
            return
        key = (pools.pid, pools.base_url)
        if _registry.get(key) is pools:
            del _registry[key]
    pools.close()


def close_all_pools() -> None:
    """Close every shared pool of this process (tests' ``reset_process_state``)."""
    with _registry_lock:
        everything = list(_registry.values())
        _registry.clear()
    for pools in everything:
        pools.close()


def _abandon_pools_in_child() -> None:
    # Runs in a forked child: keep the parent's sessions alive and never touch their sockets.
    _GRAVEYARD.append(list(_registry.values()))
    _registry.clear()


register_after_fork(_abandon_pools_in_child)


LONG_POLL_POOLS = frozenset({Pool.RETRIEVE_PROMISE, Pool.RETRIEVE_FUTURES})
"""Pools whose requests fail at once after interpreter exit began (others may still send)."""


def _abort_inflight_at_exit() -> None:
    # B55: a long poll blocked in a (non-daemon) pool thread must not delay interpreter exit.
    # Only the long-poll pools refuse new requests, so atexit handlers can still finish a
    # session or flush telemetry over the other pools.
    with _registry_lock:
        everything = list(_registry.values())
    for pools in everything:
        pools.abort_inflight(sticky=LONG_POLL_POOLS)


register_exit_callback(_abort_inflight_at_exit)


# --------------------------------------------------------------------------------------------
# Transport
# --------------------------------------------------------------------------------------------


def _platform_headers() -> dict[str, str]:
    system = platform.system()
    os_name = {"Linux": "Linux", "Darwin": "MacOS", "Windows": "Windows"}.get(
        system, f"Other:{system}"
    )
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "arm64": "arm64", "aarch64": "arm64"}.get(
        machine, "x32" if machine in ("i386", "i686", "x86") else f"other:{machine}"
    )
    return {
        "X-Stainless-Lang": "python",
        "X-Stainless-Package-Version": __version__,
        "X-Stainless-OS": os_name,
        "X-Stainless-Arch": arch,
        "X-Stainless-Runtime": platform.python_implementation(),
        "X-Stainless-Runtime-Version": platform.python_version(),
        "X-Stainless-Async": "false",
    }


_PLATFORM_HEADERS = _platform_headers()
_ACCEPT_ENCODING = ", ".join(
    part.strip() for part in make_headers(accept_encoding=True)["accept-encoding"].split(",")
)
_BASE_HEADERS = {"Accept-Encoding": _ACCEPT_ENCODING, "User-Agent": USER_AGENT, **_PLATFORM_HEADERS}
"""Headers every request carries, in order, after ``Accept``."""
_PROTO = "application/x-protobuf"
_JSON = "application/json"
_SDK_HEADER_NAMES = frozenset(
    name.lower()
    for name in (
        *_BASE_HEADERS,
        "Accept",
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "Content-Type",
        "X-Idempotency-Key",
        "x-sdk-version",
        "x-sdk-method",
    )
)
"""Lower-cased names :meth:`Transport.build_headers` writes before the overrides."""
_seen_deprecations: set[str] = set()
_deprecations_lock = make_lock()


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


prepare_headers(_BASE_HEADERS)
prepare_headers({"x-sdk-version": PROTOCOL_VERSION})
for _mime in (_PROTO, _JSON):
    prepare_headers({"Accept": _mime, "Content-Type": _mime})
for _n in range(4):
    prepare_headers({"x-stainless-retry-count": str(_n)})


class Transport:
    """The per-client HTTP sender: headers, auth, hooks and one attempt at a time.

    Usage::

        transport = Transport(config, auth=auth, hooks=hooks, clock=clock)
        reply = transport.send_once(spec, attempt=k)

    ``auth`` is asked for ``X-API-Key`` on every request (None sends no key). A 401 with
    ``error="invalid_token"`` makes it ``replace()`` the token once and replays the request once.
    Thread safety: share freely. Fork safety: rebuilds its pools in a child (B50).
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        auth: AuthProvider | None = None,
        hooks: Sequence[Hook] = (),
        clock: Clock = SYSTEM_CLOCK,
        pool_sizes: Mapping[Pool, int] | None = None,
    ) -> None:
        self.config = config
        self.auth = auth
        self.hooks: tuple[Hook, ...] = tuple(hooks)
        self.clock = clock
        self.base_url = config.normalized_base_url
        self._pool_sizes = dict(pool_sizes or {})
        self._static_headers = config.static_headers()
        prepare_headers(self._static_headers)
        self._lock = make_lock()
        self._closed = False
        self._pools = acquire_pools(self.base_url, self._pool_sizes)

    # -- lifecycle ---------------------------------------------------------------------------
    def with_auth(self, auth: AuthProvider | None) -> Transport:
        """A new Transport like this one (same config, hooks, clock, shared pools) with ``auth``."""
        return Transport(
            self.config,
            auth=auth,
            hooks=self.hooks,
            clock=self.clock,
            pool_sizes=self._pool_sizes,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop sending (later sends raise ClientClosedError); the last user closes the pools."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pools = self._pools
        if pools.pid == current_pid():
            _release_pools(pools)

    def pools(self) -> HttpPools:
        """This process's pools for the server (re-acquired after a fork)."""
        with self._lock:
            if self._closed:
                raise ClientClosedError("The client was closed")
            pools = self._pools
            if pools.pid != current_pid():
                pools = self._pools = acquire_pools(self.base_url, self._pool_sizes)
            return pools

    # -- sending -----------------------------------------------------------------------------
    def build_headers(self, spec: RequestSpec, attempt: int, token: str | None) -> dict[str, str]:
        """The exact headers of one attempt (B36). Contains secrets: never log unredacted.

        Later sources win, case-insensitively: SDK headers, then ``spec.headers``, then the
        config's (Cloudflare, user) headers, then the credential.
        """
        timeout = spec.timeout or self.config.timeout
        headers = {
            "Accept": _PROTO if spec.expect == "proto" else _JSON,
            **_BASE_HEADERS,
            "x-stainless-retry-count": str(attempt),
        }
        if timeout.read is not None:
            headers["x-stainless-read-timeout"] = read = _fmt_seconds(timeout.read)
            if ("x-stainless-read-timeout", read) not in _prepared:
                prepare_headers({"x-stainless-read-timeout": read})
        if spec.content is not None and spec.content_type:
            headers["Content-Type"] = spec.content_type
        if spec.idempotency_key and spec.method != "GET":
            headers["X-Idempotency-Key"] = spec.idempotency_key
        if spec.sdk_method:
            headers["x-sdk-version"] = PROTOCOL_VERSION
            headers["x-sdk-method"] = spec.sdk_method
            if ("x-sdk-method", spec.sdk_method) not in _prepared:
                prepare_headers({"x-sdk-method": spec.sdk_method})
        overrides = [o for o in (spec.headers, self._static_headers) if o]
        if token:
            overrides.append({"X-API-Key": token})
        if overrides:
            headers = _merge(headers, *overrides)
        return headers

    def send_once(self, spec: RequestSpec, attempt: int = 0) -> Reply:
        """Send ``spec`` once (plus one replay after an ``invalid_token`` 401).

        Returns the :class:`Reply` for every HTTP status except a bare 400 (empty body), which
        resets the pool's connections and raises a retryable :class:`APIConnectionError` while
        the pool's budget of 16 lasts. Transport failures raise the mapped SDK exception.
        Credential failures (e.g. MissingCredentialsError) propagate unchanged.
        """
        pools = self.pools()
        token = self.auth.token() if self.auth is not None else None
        reply = self._exchange(pools, spec, attempt, token)
        if token is not None and self.auth is not None and is_invalid_token(reply):
            new_token = self.auth.replace(token)
            if new_token is not None:
                logger.debug("401 invalid_token on %s %s: replaying once", spec.method, spec.path)
                reply = self._exchange(pools, spec, attempt, new_token)
        if reply.status == 400 and not reply.content:
            pools.reset(spec.pool)
            if pools.take_bare_400(spec.pool):
                raise APIConnectionError(
                    f"{spec.method} {spec.path}: empty 400 reply (proxy rejection); "
                    "connections reset",
                    reply.request,
                )
        elif reply.status < 400:
            pools.refill(spec.pool)
        return reply

    def _exchange(
        self, pools: HttpPools, spec: RequestSpec, attempt: int, token: str | None
    ) -> Reply:
        route = pools.route(spec.pool)
        target = spec.path
        if spec.params:
            query = [(k, _param(v)) for k, v in spec.params.items() if v is not None]
            if query:
                target += "?" + urllib.parse.urlencode(query, doseq=True)
        url = self.base_url + target
        timeout = spec.timeout or self.config.timeout
        headers = self.build_headers(spec, attempt, token)
        debug = logger.isEnabledFor(logging.DEBUG)
        if debug:
            logger.debug(
                "HTTP %s %s pool=%s attempt=%d timeout=%s headers=%s",
                spec.method,
                spec.path,
                spec.pool.value,
                attempt,
                timeout.as_tuple(),
                redact_headers(headers),
            )
        start = self.clock.monotonic()
        try:
            response, url = _urlopen(
                route, spec.method, target, url, spec.content, headers, timeout
            )
            content = response.content
        except Exception as exc:
            duration = self.clock.monotonic() - start
            mapped = map_transport_error(exc, RequestSnapshot(spec.method, url, headers))
            self._emit_request(spec, attempt, None, duration, type(mapped or exc).__name__)
            if debug:
                logger.debug("HTTP %s %s failed: %r", spec.method, spec.path, mapped or exc)
            if mapped is None:
                raise
            raise mapped from exc
        duration = self.clock.monotonic() - start
        reply_headers = response.headers
        status = response.status
        reply = Reply(
            status=status,
            headers=reply_headers,
            content=content,
            elapsed=duration,
            method=spec.method,
            url=url,
            request=RequestSnapshot(spec.method, url, headers) if status >= 400 else None,
        )
        if debug:
            logger.debug(
                "HTTP %s %s -> %d (%d bytes, %.3f s) headers=%s",
                spec.method,
                spec.path,
                status,
                len(content),
                duration,
                redact_headers(reply_headers),
            )
        if "x-deprecation-note" in reply_headers:
            _log_deprecation(reply_headers)
        if self.hooks or _global_hooks:
            self._emit_request(spec, attempt, status, duration, None)
        return reply

    def _emit_request(
        self,
        spec: RequestSpec,
        attempt: int,
        status: int | None,
        duration: float,
        error: str | None,
    ) -> None:
        emit_hook(
            self.hooks,
            "request",
            method=spec.method,
            path=spec.path,
            pool=spec.pool.value,
            status=status,
            duration=duration,
            attempt=attempt,
            error=error,
        )

    def emit(self, kind: str, **data: Any) -> None:
        """Send an event to this transport's hooks (and the global ones)."""
        emit_hook(self.hooks, kind, **data)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Transport {self.base_url} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError("Transport objects are not picklable")


MAX_REDIRECTS = 30
"""Redirects followed per attempt (as requests does); one more is a connection error."""
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@functools.lru_cache(maxsize=64)
def _timeout(timeout: Timeout) -> _Urllib3Timeout:
    return _Urllib3Timeout(connect=timeout.connect, read=timeout.read)


class _Response:
    """A fully read response: status, lower-cased (merged) headers and the decoded body."""

    __slots__ = ("content", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status = status
        self.headers = headers
        self.content = content


def _via_manager(
    route: _Route,
    method: str,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: Timeout,
) -> _Response:
    """One exchange through urllib3's pool manager: proxies, and redirects to any origin."""
    response = route.manager.urlopen(
        method,
        url,
        body=body,
        headers=headers,
        timeout=_timeout(timeout),
        retries=False,
        redirect=False,
    )
    merged = {k.lower(): v for k, v in response.headers.itermerged()}
    return _Response(response.status, merged, response.data)


def _exchange_pooled(
    pool: HTTPConnectionPool,
    method: str,
    target: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: Timeout,
) -> _Response:
    """One request on a connection of ``pool`` (no proxy), read with ``http.client``.

    urllib3 still owns the connections (pooling, dropped-connection checks, TCP and TLS setup,
    the in-flight tracking of B55); this replaces only ``urlopen`` and its response wrapper,
    which together cost as much client CPU as the HTTP exchange itself. The steps and error
    handling follow urllib3's ``_make_request``: connect errors surface as urllib3's
    (never-sent) connect errors, a reset while sending still reads the reply the server may
    have sent, and on any failure the connection is closed, never reused.
    """
    conn = cast(HTTPConnection, pool._get_conn())
    reusable = False
    try:
        if conn.is_closed:
            conn.timeout = timeout.connect
            try:
                conn.connect()
            except (ssl.SSLError, CertificateError) as exc:
                raise urllib3.exceptions.SSLError(exc) from exc
        conn.timeout = timeout.read
        conn.sock.settimeout(timeout.read)
        if body and len(body) <= _COALESCE_LIMIT and isinstance(conn, _PreparedHeaders):
            conn.hold_head()
        try:
            http.client.HTTPConnection.request(conn, method, target, body, headers)
        except BrokenPipeError:
            pass  # the server may close after a complete early reply: read it
        except OSError as exc:
            if exc.errno not in (errno.EPROTOTYPE, errno.ECONNRESET):
                raise
        raw = http.client.HTTPConnection.getresponse(conn)
        content = raw.read()
        reusable = True  # http.client closed the socket itself if the server asked to
    finally:
        if not reusable:
            conn.close()
        pool._put_conn(conn if reusable else None)
    merged: dict[str, str] = {}
    for name, value in raw.msg.items():
        key = name.lower()
        merged[key] = f"{merged[key]}, {value}" if key in merged else value
    encoding = merged.get("content-encoding")
    if encoding and encoding.strip().lower() != "identity":
        content = urllib3.response.HTTPResponse(
            body=io.BytesIO(content), headers=merged, status=raw.status, preload_content=True
        ).data  # urllib3's decoders (gzip, deflate, and br / zstd when installed)
    return _Response(raw.status, merged, content)


def _urlopen(
    route: _Route,
    method: str,
    target: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: Timeout,
) -> tuple[_Response, str]:
    """One HTTP exchange, following redirects; returns the fully read response and its URL.

    The body is read (and decoded) before returning, which hands the connection back to its
    pool. Cross-origin redirects drop secret headers; 301/302/303 turn into a bodyless GET
    like a browser (and requests) would. Requests through a proxy, and redirects, go through
    urllib3's pool manager (:func:`_via_manager`); the rest through :func:`_exchange_pooled`.
    """
    if route.forward or route.origin.proxy is not None:
        response = _via_manager(route, method, url, body, headers, timeout)
    else:
        response = _exchange_pooled(route.origin, method, target, body, headers, timeout)
    redirects = 0
    while response.status in _REDIRECT_STATUSES:
        location = response.headers.get("location")
        if not location:
            break
        if redirects >= MAX_REDIRECTS:
            raise APIConnectionError(f"{method} {url}: more than {MAX_REDIRECTS} redirects")
        redirects += 1
        new_url = urllib.parse.urljoin(url, location)
        status = response.status
        if (status in (302, 303) and method != "HEAD") or (status == 301 and method == "POST"):
            method = "GET"
        if status not in (307, 308):
            body = None
            headers = {
                k: v
                for k, v in headers.items()
                if k.lower() not in ("content-type", "content-length", "transfer-encoding")
            }
        if _crosses_origin(url, new_url):
            headers = {k: v for k, v in headers.items() if not is_secret_header(k)}
        url = new_url
        response = _via_manager(route, method, url, body, headers, timeout)
    return response, url


def _crosses_origin(old_url: str, new_url: str) -> bool:
    """Whether credentials must be dropped on a redirect from ``old_url`` to ``new_url``.

    Like requests: another host, port or scheme does, except the http -> https upgrade on
    default ports of the same host.
    """
    old, new = urllib.parse.urlsplit(old_url), urllib.parse.urlsplit(new_url)
    if old.hostname != new.hostname:
        return True
    if (
        (old.scheme, new.scheme) == ("http", "https")
        and old.port in (80, None)
        and (new.port in (443, None))
    ):
        return False
    default = {"http": 80, "https": 443}
    return old.scheme != new.scheme or (old.port or default.get(old.scheme)) != (
        new.port or default.get(new.scheme)
    )


def _merge(headers: dict[str, str], *overrides: Mapping[str, str]) -> dict[str, str]:
    """``headers`` updated in place by each of ``overrides`` in turn, case-insensitively.

    A replaced header keeps its position and takes the overriding spelling. Only names that can
    collide (the SDK's own, or one added by an earlier override) pay for a case-folded lookup.
    """
    added: set[str] = set()
    for override in overrides:
        for name, value in override.items():
            if name in headers:  # same spelling: a plain update keeps the position
                headers[name] = value
                continue
            low = name.lower()
            old = None
            if low in _SDK_HEADER_NAMES or low in added:
                old = next((n for n in headers if n.lower() == low), None)
            if old is None:
                headers[name] = value
                added.add(low)
            else:  # another spelling of a header already there: same position, new spelling
                headers = {
                    (name if n == old else n): (value if n == old else v)
                    for n, v in headers.items()
                }
    return headers


def _param(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _log_deprecation(headers: Mapping[str, str]) -> None:
    note = headers.get("x-deprecation-note")
    if not note:
        return
    with _deprecations_lock:
        if note in _seen_deprecations:
            return
        _seen_deprecations.add(note)
    level_name = headers.get("x-deprecation-level", "").strip().lower()
    level = logging.ERROR if level_name == "error" else logging.WARNING
    logging.getLogger("tinker_sync").log(level, "Deprecation notice: %s", scrub(note))
