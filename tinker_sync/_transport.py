"""HTTP transport: connection pools per traffic type, request headers, one HTTP attempt.

Usage::

    from tinker_sync._transport import Pool, RequestSpec, Transport, quote_path, sdk_method_scope

    transport = Transport(config, auth=StaticKeyAuth(config.credentials), hooks=(my_hook,))
    spec = RequestSpec(method="POST", path="/api/v1/get_info", pool=Pool.TRAIN,
                       json={"model_id": mid, "type": "get_info"})
    reply = transport.send_once(spec, attempt=0)      # one attempt; retries live in _retry
    reply.status, reply.headers["content-type"], reply.json()
    transport.close()

Layers: :class:`HttpPools` holds one ``requests.Session`` per :class:`Pool` for one
``(pid, normalized base_url)``, shared by every :class:`Transport` of that server in the
process (reference counted; the last ``close()`` closes the sessions). A :class:`Transport` is
the per-client view: config (headers, timeouts), the :class:`~tinker_sync._config.AuthProvider`,
hooks and the clock.

Every request carries explicit ``(connect, read)`` timeouts (B30), goes through an
``HTTPAdapter(max_retries=0)`` (the SDK owns all retries) and is mapped on failure to the SDK
exceptions: connect failures -> :class:`APIConnectError` / :class:`APIConnectTimeoutError`
(never sent), read timeouts -> :class:`APITimeoutError`, anything else on the wire (reset,
dropped mid-response, EBADF) -> :class:`APIConnectionError`. HTTP error statuses are returned
as a :class:`Reply`; the retry layer turns them into exceptions (:func:`error_from_reply`).

Pools and HTTP/1.1: a urllib3 connection carries one request at a time (no pipelining), so the
official "TRAIN = 1 request per client" rule holds as long as the pool never blocks; pools use
``pool_block=False`` and are sized above their thread counts, so concurrent requests never share
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
import json as _json
import logging
import platform
import socket
import uuid
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import requests
import requests.adapters
import requests.exceptions
import urllib3.exceptions
from requests.utils import DEFAULT_ACCEPT_ENCODING
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

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
    """A fresh ``X-Idempotency-Key`` value (one per logical request, B34)."""
    return f"tinker_sync-retry-{uuid.uuid4()}"


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
            encoded = _json.dumps(self.json, separators=(",", ":"), ensure_ascii=False).encode()
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


_PROGRAMMING_ERRORS = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    requests.exceptions.InvalidHeader,
    requests.exceptions.URLRequired,
)


def map_transport_error(
    exc: BaseException, request: RequestSnapshot | None = None
) -> APIConnectionError | None:
    """Map a requests/urllib3/OS failure to the SDK exception, or None if it is not one.

    * connect timeout -> :class:`APIConnectTimeoutError` (NOT_SENT)
    * refused / DNS / TLS / proxy / closed pool -> :class:`APIConnectError` (NOT_SENT)
    * read timeout -> :class:`APITimeoutError`
    * any other transport failure, e.g. reset, dropped mid-response, EBADF -> APIConnectionError
    """
    if isinstance(exc, APIConnectionError):
        return exc
    if isinstance(exc, _PROGRAMMING_ERRORS):
        return None
    chain = list(_related(exc))
    detail = scrub(_describe(exc))[:300]
    if isinstance(exc, requests.exceptions.ConnectTimeout) or any(
        isinstance(e, urllib3.exceptions.ConnectTimeoutError)
        and not isinstance(e, urllib3.exceptions.NewConnectionError)
        for e in chain
    ):
        return APIConnectTimeoutError(f"Connect timed out: {detail}", request)
    if any(
        isinstance(
            e,
            (
                urllib3.exceptions.NewConnectionError,
                urllib3.exceptions.ClosedPoolError,
                urllib3.exceptions.ProxyError,
                requests.exceptions.ProxyError,
                ConnectionRefusedError,
            ),
        )
        for e in chain
    ) or isinstance(exc, requests.exceptions.SSLError):
        return APIConnectError(f"Connection failed: {detail}", request)
    if isinstance(exc, requests.exceptions.ReadTimeout) or any(
        isinstance(e, (urllib3.exceptions.ReadTimeoutError, TimeoutError)) for e in chain
    ):
        return APITimeoutError(f"Request timed out: {detail}", request)
    if isinstance(
        exc, (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError)
    ):
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


def _strip_request_refs(exc: BaseException) -> None:
    """requests exceptions keep the PreparedRequest (with X-API-Key): drop it."""
    for e in _related(exc):
        if isinstance(e, requests.exceptions.RequestException):
            e.request = None
            e.response = None


# --------------------------------------------------------------------------------------------
# Sessions and pools
# --------------------------------------------------------------------------------------------


def _no_netrc(request: Any) -> Any:
    """Session-level auth that does nothing: stops requests from applying ~/.netrc."""
    return request


class _Session(requests.Session):
    """A Session that strips secret headers (X-API-Key, CF-Access-*) on cross-origin redirects."""

    def rebuild_auth(self, prepared_request: Any, response: Any) -> None:
        headers = prepared_request.headers
        if self.should_strip_auth(response.request.url, prepared_request.url):  # type: ignore[no-untyped-call]
            for name in [n for n in headers if is_secret_header(n)]:
                del headers[name]


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


def _tracking_pool_classes(tracker: _InflightTracker) -> dict[str, type[HTTPConnectionPool]]:
    class _TrackedHTTPConnection(HTTPConnection):
        def connect(self) -> None:
            super().connect()
            tracker.connected(self)

    class _TrackedHTTPSConnection(HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            tracker.connected(self)

    class _TrackedHTTPPool(HTTPConnectionPool):
        ConnectionCls = _TrackedHTTPConnection

        def _get_conn(self, timeout: float | None = None) -> Any:
            conn = super()._get_conn(timeout)
            tracker.add(conn)
            return conn

        def _put_conn(self, conn: Any) -> None:
            if conn is not None:
                tracker.discard(conn)
            super()._put_conn(conn)

    class _TrackedHTTPSPool(HTTPSConnectionPool):
        ConnectionCls = _TrackedHTTPSConnection

        def _get_conn(self, timeout: float | None = None) -> Any:
            conn = super()._get_conn(timeout)
            tracker.add(conn)
            return conn

        def _put_conn(self, conn: Any) -> None:
            if conn is not None:
                tracker.discard(conn)
            super()._put_conn(conn)

    return {"http": _TrackedHTTPPool, "https": _TrackedHTTPSPool}


def _environment_settings(base_url: str) -> tuple[dict[str, str], bool | str]:
    """Proxies and CA bundle from the environment, resolved once per server.

    ``requests`` would rescan ``os.environ`` twice per request (a quarter of the client's CPU
    on small requests); the same variables are honoured here, once: ``HTTP(S)_PROXY`` /
    ``ALL_PROXY`` unless ``NO_PROXY`` bypasses the host, and ``REQUESTS_CA_BUNDLE`` /
    ``CURL_CA_BUNDLE``.
    """
    import os
    import urllib.parse
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


def _new_session(
    size: int, tracker: _InflightTracker | None = None, base_url: str = ""
) -> requests.Session:
    session = _Session()
    session.headers.clear()
    session.auth = _no_netrc
    session.trust_env = False
    session.proxies, session.verify = _environment_settings(base_url)
    adapter = requests.adapters.HTTPAdapter(
        pool_connections=4, pool_maxsize=size, max_retries=0, pool_block=False
    )
    if tracker is not None:
        adapter.poolmanager.pool_classes_by_scheme = _tracking_pool_classes(tracker)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _close_session(session: requests.Session) -> None:
    """Close a Session and its sockets now.

    ``Session.close()`` only clears urllib3's pool manager, which (in urllib3 2) does not close
    the connection pools: after a lost reply a pool can sit in a reference cycle with its
    keep-alive sockets open until the garbage collector runs. Close each pool explicitly.
    """
    try:
        for adapter in set(session.adapters.values()):
            manager = getattr(adapter, "poolmanager", None)
            pools = getattr(manager, "pools", None)
            if pools is None:
                continue
            for key in list(pools.keys()):
                conn_pool = pools.get(key)
                if conn_pool is not None:
                    conn_pool.close()
        session.close()
    except Exception:  # pragma: no cover - best effort
        logger.debug("closing a session failed", exc_info=True)


_GRAVEYARD: list[object] = []
"""Transport state inherited over fork: kept alive forever, never closed (B50)."""


class HttpPools:
    """One ``requests.Session`` per :class:`Pool` for one (pid, normalized base_url).

    Get one with :func:`acquire_pools`. Also holds the per-pool bare-400 budgets (§5.3).
    Thread safety: all methods are thread-safe. Fork safety: abandoned in a child (see module).
    """

    def __init__(self, base_url: str, sizes: Mapping[Pool, int] | None = None) -> None:
        self.base_url = base_url
        self.pid = current_pid()
        self._sizes = {**DEFAULT_POOL_SIZES, **(sizes or {})}
        self._lock = make_lock()
        self._sessions: dict[Pool, requests.Session] = {}
        self._budget: dict[Pool, int] = dict.fromkeys(Pool, BARE_400_BUDGET)
        self._inflight = {pool: _InflightTracker() for pool in Pool}
        self._users = 0
        self.closed = False

    def session(self, pool: Pool) -> requests.Session:
        """The Session for ``pool`` (created on first use)."""
        with self._lock:
            if self.closed:
                raise ClientClosedError("HTTP connection pools are closed")
            session = self._sessions.get(pool)
            if session is None:
                session = self._sessions[pool] = _new_session(
                    self._sizes[pool], self._inflight[pool], self.base_url
                )
            return session

    def reset(self, pool: Pool) -> None:
        """Replace ``pool``'s Session so new requests open new connections.

        Requests in flight finish on the old Session, which is then left to the garbage
        collector (like the official pool, which replaces its client without closing it).
        """
        with self._lock:
            self._sessions.pop(pool, None)

    def take_bare_400(self, pool: Pool) -> bool:
        """Spend one unit of ``pool``'s bare-400 budget; False when it is exhausted."""
        with self._lock:
            if self._budget[pool] <= 0:
                return False
            self._budget[pool] -= 1
            return True

    def refill(self, pool: Pool) -> None:
        """A successful request earns one unit back (up to :data:`BARE_400_BUDGET`)."""
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
        """Close every Session (only in the process that created them)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
        if self.pid != current_pid():
            _GRAVEYARD.append(sessions)
            return
        for session in sessions:
            _close_session(session)

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
_seen_deprecations: set[str] = set()
_deprecations_lock = make_lock()


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


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
        """The exact headers of one attempt (B36). Contains secrets: never log unredacted."""
        timeout = spec.timeout or self.config.timeout
        merged: dict[str, tuple[str, str]] = {}

        def put(name: str, value: str) -> None:
            merged[name.lower()] = (name, value)

        put("Accept", "application/x-protobuf" if spec.expect == "proto" else "application/json")
        put("Accept-Encoding", DEFAULT_ACCEPT_ENCODING)
        put("User-Agent", USER_AGENT)
        for name, value in _PLATFORM_HEADERS.items():
            put(name, value)
        put("x-stainless-retry-count", str(attempt))
        if timeout.read is not None:
            put("x-stainless-read-timeout", _fmt_seconds(timeout.read))
        if spec.content is not None and spec.content_type:
            put("Content-Type", spec.content_type)
        if spec.idempotency_key and spec.method != "GET":
            put("X-Idempotency-Key", spec.idempotency_key)
        if spec.sdk_method:
            put("x-sdk-version", PROTOCOL_VERSION)
            put("x-sdk-method", spec.sdk_method)
        for name, value in spec.headers.items():
            put(name, value)
        for name, value in self._static_headers.items():
            put(name, value)
        if token:
            put("X-API-Key", token)
        return dict(merged.values())

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
        session = pools.session(spec.pool)
        url = self.base_url + spec.path
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
        params = None
        if spec.params:
            params = {k: _param(v) for k, v in spec.params.items() if v is not None}
        start = self.clock.monotonic()
        try:
            response = session.request(
                spec.method,
                url,
                params=params,
                data=spec.content,
                headers=headers,
                timeout=timeout.as_tuple(),
                allow_redirects=True,
            )
            content = response.content
        except Exception as exc:
            duration = self.clock.monotonic() - start
            snapshot = RequestSnapshot(spec.method, url, headers)
            mapped = map_transport_error(exc, snapshot)
            _strip_request_refs(exc)
            self._emit_request(spec, attempt, None, duration, type(mapped or exc).__name__)
            if debug:
                logger.debug("HTTP %s %s failed: %r", spec.method, spec.path, mapped or exc)
            if mapped is None:
                raise
            raise mapped from exc
        duration = self.clock.monotonic() - start
        reply_headers = {k.lower(): v for k, v in response.headers.items()}
        status = response.status_code
        reply = Reply(
            status=status,
            headers=reply_headers,
            content=content,
            elapsed=duration,
            method=spec.method,
            url=response.url or url,
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
        _log_deprecation(reply_headers)
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
