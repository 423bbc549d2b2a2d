"""Connection pools: one urllib3 pool manager per traffic type and server, shared per process.

Usage::

    pools = acquire_pools(normalized_base_url)    # reference counted
    route = pools.route(Pool.SAMPLE)              # urllib3 pools for sampling traffic
    pools.abort_inflight()                        # interpreter exit only

Thread safety: every function and method is thread-safe. Fork safety: a child abandons the
pools it inherited (never closing the parent's sockets) and acquires new ones.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from tinker_sync._runtime.clock import register_exit_callback
from tinker_sync._runtime.fork import current_pid, make_lock, register_after_fork
from tinker_sync._transport._connection import _InflightTracker, use_sdk_connections
from tinker_sync._transport._direct import DirectPool, direct_pool
from tinker_sync._transport._models import DEFAULT_POOL_SIZES, Pool
from tinker_sync._transport._replies import max_reply_bytes
from tinker_sync._transport._settings import (
    Verify,
    _environment_settings,
    _proxy_for,
    check_proxies,
    connection_settings,
    socket_options,
    socks_manager,
)
from tinker_sync.exceptions import ClientClosedError

if TYPE_CHECKING:  # urllib3 loads with the first urllib3 pool (docs/scale-out.md#start-up)
    from urllib3 import HTTPConnectionPool, PoolManager

logger = logging.getLogger("tinker_sync.transport")

BARE_400_BUDGET = 16
"""Bare 400s (empty body, a proxy rejection) retried as connection errors per pool."""


class _Route:
    """How one :class:`Pool` reaches the server: a urllib3 pool manager and the origin's pool,
    and the direct pool (``_direct``) where it may be used.

    Requests to the base URL's origin go to ``direct`` when there is one, else straight to
    ``origin`` (path-only request target), skipping the manager's per-request URL parsing;
    ``forward`` is set when a plain-HTTP proxy must see absolute URLs, in which case every
    request goes through the manager. Redirects always go through the manager. With a direct
    pool, the manager and ``origin`` (and urllib3 itself) are built on first use: a redirect,
    or never (docs/scale-out.md#start-up).
    """

    def __init__(
        self,
        base_url: str,
        size: int,
        tracker: _InflightTracker | None,
        settings: tuple[Mapping[str, str], Verify],
        pool: Pool | None = None,
    ) -> None:
        proxies, verify = settings
        self._base_url = base_url
        scheme = urllib.parse.urlsplit(base_url).scheme or "http"
        self._kw = connection_settings(size, verify if scheme == "https" else None, pool)
        self._proxy = proxy = _proxy_for(proxies, scheme)
        # a ProxyManager (not SOCKS) forwards plain-HTTP requests as absolute URLs
        self.forward = proxy is not None and not _is_socks(proxy) and scheme == "http"
        self.tracker = tracker if tracker is not None else _InflightTracker()
        self.limit = max_reply_bytes()  # the reply cap, both paths (docs/transport.md)
        self._lock = make_lock()
        self._manager: PoolManager | None = None
        self._origin: HTTPConnectionPool | None = None
        self.direct: DirectPool | None = None
        if proxy is None:
            self.direct = direct_pool(
                base_url, size, verify, socket_options(pool), self.tracker, self.limit
            )
        if self.direct is None:
            self._build()  # the urllib3 path serves every request: build it now, as before

    def _build(self) -> tuple[PoolManager, HTTPConnectionPool]:
        with self._lock:
            if self._manager is None or self._origin is None:
                from urllib3 import PoolManager, ProxyManager

                proxy, kw = self._proxy, self._kw
                manager: Any
                if proxy is None:
                    manager = PoolManager(num_pools=4, **kw)
                elif _is_socks(proxy):
                    manager = socks_manager()(proxy, num_pools=4, **kw)
                else:
                    manager = ProxyManager(proxy, num_pools=4, **kw)
                origin = manager.connection_from_url(self._base_url)
                use_sdk_connections(origin, self.tracker)
                self._manager, self._origin = manager, origin
            return self._manager, self._origin

    @property
    def manager(self) -> PoolManager:
        """urllib3's pool manager (built on first use when there is a direct pool)."""
        manager = self._manager
        return manager if manager is not None else self._build()[0]

    @property
    def origin(self) -> HTTPConnectionPool:
        """urllib3's pool of the base URL's origin (built with :attr:`manager`)."""
        origin = self._origin
        return origin if origin is not None else self._build()[1]

    def close(self) -> None:
        """Close every connection now (urllib3 2 leaves pools open until collected)."""
        try:
            if self.direct is not None:
                self.direct.close()
            with self._lock:
                manager, origin = self._manager, self._origin
            if origin is not None:
                origin.close()
            if manager is not None:
                manager.clear()
        except Exception:  # pragma: no cover - best effort
            logger.debug("closing connection pools failed", exc_info=True)


def _is_socks(proxy: str) -> bool:
    return proxy.lower().startswith("socks")


_GRAVEYARD: list[object] = []
"""Transport state inherited over fork: kept alive forever, never closed."""


class HttpPools:
    """One :class:`_Route` (urllib3 connection pools) per :class:`Pool` for one server.

    Keyed by (pid, normalized base_url); get one with :func:`acquire_pools`. Also holds the
    per-pool bare-400 budgets.
    Thread safety: all methods are thread-safe. Fork safety: abandoned in a child (see module).
    """

    def __init__(self, base_url: str, sizes: Mapping[Pool, int] | None = None) -> None:
        self.base_url = base_url
        self.pid = current_pid()
        self._sizes = {**DEFAULT_POOL_SIZES, **(sizes or {})}
        self._settings = _environment_settings(base_url)
        check_proxies(self._settings[0], base_url)
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
                    self.base_url, self._sizes[pool], self._inflight[pool], self._settings, pool
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

    def abort_threads(self, threads: Collection[int], pools: Collection[Pool]) -> int:
        """Shut down the sockets of the requests that ``threads`` have in flight on ``pools``
        (they fail with APIConnectionError at once). A no-op on pools inherited over fork."""
        if self.pid != current_pid() or not threads:
            return 0
        return sum(self._inflight[p].abort_threads(threads) for p in pools)

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
    # A long poll blocked in any thread (a caller's own non-daemon thread may be running a
    # step inline) must not delay interpreter exit.
    # Only the long-poll pools refuse new requests, so atexit handlers can still finish a
    # session or flush telemetry over the other pools.
    with _registry_lock:
        everything = list(_registry.values())
    for pools in everything:
        pools.abort_inflight(sticky=LONG_POLL_POOLS)


register_exit_callback(_abort_inflight_at_exit)
