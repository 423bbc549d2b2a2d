"""HTTP transport: connection pools per traffic type, request headers, one HTTP attempt.

Usage::

    from tinker_sync._transport import Pool, RequestSpec, Transport, quote_path, sdk_method_scope

    transport = Transport(config, auth=StaticKeyAuth(config.credentials), hooks=(my_hook,))
    spec = RequestSpec(method="POST", path="/api/v1/get_info", pool=Pool.TRAIN,
                       json={"model_id": mid, "type": "get_info"})
    reply = transport.send_once(spec, attempt=0)      # one attempt; retries live in _flow.retry
    reply.status, reply.headers["content-type"], reply.json()
    transport.close()

The package is split along the seams of an HTTP client (as httpx and urllib3 are):

* ``_models``   -- :class:`Pool` (traffic types), :class:`RequestSpec`, :class:`Reply`.
* ``_errors``   -- error replies and urllib3 / OS failures as SDK exceptions.
* ``_settings`` -- what is read from the environment once per server (proxies, CA bundle) and
  the urllib3 pool options; :func:`~tinker_sync._transport._settings.socket_options` is the
  one place for TCP options (e.g. keepalive), per traffic type.
* ``_connection`` -- the connection class the pools open (through urllib3's ``ConnectionCls``):
  in-flight tracking (aborted at interpreter exit) and one write per small request.
* ``_pools``    -- :class:`HttpPools`: one set of urllib3 pools per :class:`Pool` for one
  ``(pid, normalized base_url)``, shared by every :class:`Transport` of that server in the
  process (reference counted).
* ``_headers``  -- the SDK's own headers and the case-insensitive merge of overrides.
* ``_exchange`` -- one HTTP exchange: send, read the whole reply, follow redirects; the
  request's ``(connect, read)`` timeout is applied here. Requests to the base URL's origin
  without a proxy take the direct path (``_direct``: HTTP/1.1 on a socket, the same bytes for
  a fraction of the CPU), the rest urllib3's documented ``urlopen`` (docs/transport.md).
* ``_client``   -- :class:`Transport`, the per-client view: config (headers, timeouts), the
  :class:`~tinker_sync._credentials.AuthProvider`, hooks and the clock.
* ``_context`` / ``_hooks`` -- the ``x-sdk-method`` context and observation hooks.

urllib3 directly, not requests: per request, requests' Session machinery (settings merges,
environment scans, header dict copies) cost more client CPU than the HTTP exchange itself.
What it provided is done here once per server: proxies and the CA bundle come from the same
environment variables, redirects are followed (secrets dropped across origins) and
``~/.netrc`` is never read. Only urllib3's documented API is used (``urlopen``, pool managers,
``ConnectionCls``, ``socket_options``, ``Timeout``, ``Retry``), so any urllib3 2.x works; the
direct path uses ``socket``, ``ssl`` and ``zlib`` and raises urllib3's and http.client's public
exception classes, so failures map the same way on both paths.

Every request carries explicit ``(connect, read)`` timeouts, is sent with urllib3 retries off
(the SDK owns all retries) and is mapped on failure to the SDK exceptions: connect failures ->
:class:`~tinker_sync.exceptions.APIConnectError` / ``APIConnectTimeoutError`` (never sent),
read timeouts -> ``APITimeoutError``, anything else on the wire (reset, dropped mid-response,
EBADF) -> ``APIConnectionError``. HTTP error statuses are returned as a :class:`Reply`; the
retry layer turns them into exceptions (:func:`error_from_reply`).

Pools and HTTP/1.1: a urllib3 connection carries one request at a time (no pipelining), so the
"TRAIN = 1 request per client" rule holds as long as the pool never blocks; pools use
``block=False`` and are sized above their thread counts, so concurrent requests never share a
connection and connections are still kept alive between requests (no ``Connection: close``,
which would cost a TLS handshake per training call).

Exit: at interpreter exit the sockets of requests still in flight are shut down, so a long poll
blocked in any thread (the SDK's workers are daemon threads, but a caller's own thread may be
running a step inline) fails at once instead of delaying exit; from then on the
long-poll pools (RETRIEVE_PROMISE, RETRIEVE_FUTURES) fail new requests at once, while the other
pools keep working for final requests made by exit handlers.

Fork: in a forked child every inherited :class:`HttpPools` is moved to a never-collected
graveyard list without closing it (closing could write a TLS close_notify onto the parent's
live connection); each :class:`Transport` notices the pid change and acquires fresh pools.

Thread safety: :class:`Transport` and :class:`HttpPools` may be shared by any number of threads.
"""

from __future__ import annotations

from tinker_sync._transport._client import Transport
from tinker_sync._transport._context import (
    context_without_sdk_method,
    current_sdk_method,
    sdk_method_scope,
)
from tinker_sync._transport._errors import error_from_reply, is_invalid_token, map_transport_error
from tinker_sync._transport._headers import USER_AGENT
from tinker_sync._transport._hooks import (
    Hook,
    HookEvent,
    add_global_hook,
    emit_hook,
    remove_global_hook,
)
from tinker_sync._transport._models import (
    DEFAULT_POOL_SIZES,
    Pool,
    Reply,
    RequestSpec,
    new_idempotency_key,
    quote_path,
)
from tinker_sync._transport._pools import (
    BARE_400_BUDGET,
    LONG_POLL_POOLS,
    HttpPools,
    acquire_pools,
    close_all_pools,
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
