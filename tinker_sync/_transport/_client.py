"""The per-client sender, :class:`Transport`: headers, auth, hooks, one attempt at a time.

Thread safety: share freely. Fork safety: rebuilds its pools in a child.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tinker_sync._config import PROTOCOL_VERSION, ClientConfig
from tinker_sync._credentials import AuthProvider
from tinker_sync._runtime.causes import signal_exception
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.fork import current_pid, make_lock
from tinker_sync._runtime.redact import redact_headers, scrub
from tinker_sync._transport import _exchange, _hooks
from tinker_sync._transport._errors import is_invalid_token, map_transport_error
from tinker_sync._transport._headers import (
    _BASE_HEADERS,
    _JSON,
    _PROTO,
    _SDK_HEADER_NAMES,
    _fmt_seconds,
    _merge,
)
from tinker_sync._transport._hooks import Hook, emit_event, emit_hook
from tinker_sync._transport._models import Pool, Reply, RequestSpec
from tinker_sync._transport._pools import (
    LONG_POLL_POOLS,
    HttpPools,
    _release_pools,
    acquire_pools,
)
from tinker_sync.exceptions import APIConnectionError, ClientClosedError, RequestSnapshot

logger = logging.getLogger("tinker_sync.transport")
_JSON_BASE = {"Accept": _JSON, **_BASE_HEADERS}
_PROTO_BASE = {"Accept": _PROTO, **_BASE_HEADERS}
"""The first header lines of every request, copied per attempt."""
_seen_deprecations: set[str] = set()
_deprecations_lock = make_lock()


class Transport:
    """The per-client HTTP sender: headers, auth, hooks and one attempt at a time.

    Usage::

        transport = Transport(config, auth=auth, hooks=hooks, clock=clock)
        reply = transport.send_once(spec, attempt=k)

    ``auth`` is asked for ``X-API-Key`` on every request (None sends no key). A 401 with
    ``error="invalid_token"`` makes it ``replace()`` the token once and replays the request once.
    Thread safety: share freely. Fork safety: rebuilds its pools in a child.
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
        self._static_headers = config.static_headers()  # secrets: dropped by close()
        # Whether the static headers' names can be added without a merge (build_headers),
        # then per tuple of a request's own header names (_plain_names).
        self._plain: dict[tuple[str, ...], bool] = {}
        self._plain[()] = self._plain_names((), self._static_headers)
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
        """Stop sending (later sends raise ClientClosedError); the last user closes the pools.

        The header values derived from the config (Cloudflare secret, user headers such as
        ``Authorization``) are dropped here, so a closed transport holds no secret of its own.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._static_headers = {}
            pools = self._pools
        if pools.pid == current_pid():
            _release_pools(pools)

    def abort_polls(self, threads: Collection[int]) -> int:
        """Cut the long polls that ``threads`` are waiting on now (``close()``: a poll held by
        the server must not keep its socket and thread for the rest of its hold)."""
        return self.abort_threads(threads, LONG_POLL_POOLS)

    def abort_threads(self, threads: Collection[int], pools: Collection[Pool]) -> int:
        """Shut down the sockets ``threads`` are sending or reading on in ``pools`` (their
        requests fail with APIConnectionError at once; a hedge that won uses it)."""
        with self._lock:
            http = self._pools
        return http.abort_threads(threads, pools)

    def pools(self) -> HttpPools:
        """This process's pools for the server (re-acquired after a fork)."""
        pools = self._pools  # the usual case without the lock: open, this process's pools
        if not self._closed and pools.pid == current_pid():
            return pools
        with self._lock:
            if self._closed:
                raise ClientClosedError("The client was closed")
            pools = self._pools
            if pools.pid != current_pid():
                pools = self._pools = acquire_pools(self.base_url, self._pool_sizes)
            return pools

    # -- sending -----------------------------------------------------------------------------
    def build_headers(self, spec: RequestSpec, attempt: int, token: str | None) -> dict[str, str]:
        """The exact headers of one attempt. Contains secrets: never log unredacted.

        Later sources win, case-insensitively: SDK headers, then ``spec.headers``, then the
        config's (Cloudflare, user) headers, then the credential.
        """
        timeout = spec.timeout or self.config.timeout
        headers = (_PROTO_BASE if spec.expect == "proto" else _JSON_BASE).copy()
        headers["x-stainless-retry-count"] = str(attempt)
        if timeout.read is not None:
            headers["x-stainless-read-timeout"] = _fmt_seconds(timeout.read)
        if spec.content is not None and spec.content_type:
            headers["Content-Type"] = spec.content_type
        if spec.idempotency_key and spec.method != "GET":
            headers["X-Idempotency-Key"] = spec.idempotency_key
        if spec.sdk_method:
            headers["x-sdk-version"] = PROTOCOL_VERSION
            headers["x-sdk-method"] = spec.sdk_method
        static = self._static_headers
        names = tuple(spec.headers)
        plain = self._plain.get(names)
        if plain is None:
            plain = self._plain_names(names, static)
        if not plain:
            overrides = [o for o in (spec.headers, static) if o]
            if token:
                overrides.append({"X-API-Key": token})
            return _merge(headers, *overrides)
        # No override shares a name with another header (case-insensitively): each is added
        # at the end in turn, which is what _merge does with such names.
        headers.update(spec.headers)
        headers.update(static)
        if token:
            headers["X-API-Key"] = token
        return headers

    def _plain_names(self, names: tuple[str, ...], static: Mapping[str, str]) -> bool:
        """Whether ``names``, ``static``'s names and ``X-API-Key`` all differ case-insensitively
        from each other and from the SDK's header names (remembered per tuple of names)."""
        lows = [name.lower() for name in (*names, *static, "X-API-Key")]
        plain = len(set(lows)) == len(lows) and _SDK_HEADER_NAMES.isdisjoint(lows)
        if len(self._plain) < 64:  # names only (no values, no secrets)
            self._plain[names] = plain
        return plain

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
            response, url = _exchange.exchange(
                route,
                spec.method,
                target,
                url,
                spec.content,
                headers,
                timeout,
                follow_redirects=spec.follow_redirects,
            )
            content = response.content
        except Exception as exc:
            raised = signal_exception(exc)
            if raised is not None:
                # A signal handler's (an alarm timeout): the caller's own, as it is, and no
                # request event: it says nothing of the network (no lossy-network hedging).
                raise raised  # noqa: B904 (unchanged: it is not ours to chain)
            duration = self.clock.monotonic() - start
            mapped = map_transport_error(exc, RequestSnapshot(spec.method, url, headers))
            self._emit_request(spec, attempt, None, start, duration, type(mapped or exc).__name__)
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
        if self.hooks or _hooks.has_global_hooks():
            self._emit_request(spec, attempt, status, start, duration, None)
        return reply

    def _emit_request(
        self,
        spec: RequestSpec,
        attempt: int,
        status: int | None,
        started: float,
        duration: float,
        error: str | None,
    ) -> None:
        emit_event(
            self.hooks,
            "request",
            {
                "method": spec.method,
                "path": spec.path,
                "pool": spec.pool.value,
                "status": status,
                "started": started,
                "duration": duration,
                "attempt": attempt,
                "error": error,
                "idempotency_key": spec.logical_key or spec.idempotency_key,
            },
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
