"""JWT auth (server ``pjwt_auth_enabled``): exchange, caching, refresh, single-flight
(docs/design/behavior.md#jwt-auth).

Usage::

    from tinker_sync._session.jwt import make_auth

    auth = make_auth(config.credentials, server_config, transport, clock=clock)
    transport = transport.with_auth(auth)      # every request now sends the JWT in X-API-Key
    # on the session's timer thread:
    while not stopped:
        delay = auth.tick() if isinstance(auth, JwtAuth) else math.inf
        clock.wait(stop_event, min(delay, 10.0))

Behaviour (official ``lib/_jwt_auth.py``): the first :meth:`JwtAuth.token` exchanges the raw
credential (``POST /api/v1/auth/token {}``, pool AUTH) for a JWT. :meth:`JwtAuth.tick` refreshes
it at 45-55 % of ``exp - iat`` after receipt; :meth:`JwtAuth.token` also refreshes on demand
when <= 60 s remain. A failed background refresh retries in 60 s, keeping the valid token; a
failed on-demand refresh keeps the cached token until it expires. A 401 ``invalid_token`` makes
the transport call :meth:`JwtAuth.replace`: concurrent rejections of one token share one
exchange.

Thread safety: all methods are thread-safe; exchanges are single-flight under one lock.
Fork safety: the lock is fork-safe; a child keeps the cached token.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from tinker_sync._config import ServerConfig
from tinker_sync._credentials import (
    AuthProvider,
    CredentialAuth,
    Credentials,
    StaticKeyAuth,
    jwt_claims,
    jwt_expiry,
)
from tinker_sync._flow.retry import send_with_retries
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.fork import make_lock
from tinker_sync._runtime.redact import register_secret
from tinker_sync._transport import Pool, RequestSpec, Transport
from tinker_sync.exceptions import APIResponseValidationError, AuthenticationError

__all__ = [
    "REFRESH_ON_DEMAND_S",
    "RETRY_DELAY_S",
    "JwtAuth",
    "TokenExchange",
    "make_auth",
]

logger = logging.getLogger("tinker_sync.auth")

REFRESH_ON_DEMAND_S = 60.0
RETRY_DELAY_S = 60.0
AUTH_TOKEN_PATH = "/api/v1/auth/token"


class TokenExchange:
    """``POST /api/v1/auth/token {}`` with the raw credential; returns the JWT.

    Calling it runs the credential command when that is the source (a fresh credential per
    exchange). ``close()`` releases its transport.
    Thread safety: callable from any thread. Fork safety: via its Transport.
    """

    def __init__(
        self, transport: Transport, credentials: Credentials, *, use_command: bool = False
    ) -> None:
        self._transport = transport.with_auth(CredentialAuth(credentials, use_command=use_command))

    def __call__(self) -> str:
        spec = RequestSpec(
            method="POST", path=AUTH_TOKEN_PATH, pool=Pool.AUTH, json={}, sdk_method=None
        )
        reply = send_with_retries(self._transport, spec)
        body = reply.json()
        jwt = body.get("jwt") if isinstance(body, dict) else None
        if not isinstance(jwt, str) or not jwt:
            raise APIResponseValidationError(
                "auth/token reply has no 'jwt' string", response=reply.snapshot()
            )
        register_secret(jwt)
        return jwt

    def close(self) -> None:
        self._transport.close()


def _lifetime(token: str) -> float | None:
    """``exp - iat`` of a JWT (None when either is unreadable or the lifetime is not positive)."""
    try:
        lifetime = jwt_expiry(token) - float(jwt_claims(token)["iat"])
    except (ValueError, KeyError, TypeError):
        return None
    return lifetime if lifetime > 0 else None


def _expiry(token: str) -> float | None:
    """``exp`` of a JWT as :func:`~tinker_sync._credentials.jwt_expiry` reads it, or None."""
    try:
        return jwt_expiry(token)
    except ValueError:
        return None


class JwtAuth:
    """:class:`~tinker_sync._credentials.AuthProvider` that sends an exchanged, refreshed JWT.

    ``exchange()`` returns a fresh JWT (normally a :class:`TokenExchange`); ``clock`` supplies
    wall time (for ``exp``), monotonic time (for the refresh schedule) and jitter.
    Thread safety: thread-safe, single-flight exchanges. Fork safety: yes.
    """

    def __init__(self, exchange: Callable[[], str], *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._exchange = exchange
        self._clock = clock
        self._lock = make_lock()
        self._token = ""
        self._next_refresh = math.inf
        self._failing = False
        self._closed = False
        self.exchanges = 0
        """How many exchanges were attempted (for tests and diagnostics)."""

    # -- AuthProvider ------------------------------------------------------------------------
    def token(self) -> str:
        """The JWT to send; exchanges first / refreshes on demand when <= 60 s remain."""
        token = self._token
        if token and self._remaining(token) > REFRESH_ON_DEMAND_S:
            return token
        with self._lock:
            token = self._token
            if token and self._remaining(token) > REFRESH_ON_DEMAND_S:
                return token
            try:
                return self._fetch()
            except AuthenticationError:
                raise
            except Exception as exc:
                if not token or self._remaining(token) <= 0:
                    raise
                logger.warning("On-demand JWT refresh failed: %s", exc)
                return token

    def replace(self, rejected: str) -> str | None:
        """A token other than ``rejected``; exchanges only if nobody else already did."""
        if self._token != rejected:
            return self._token or None
        with self._lock:
            if self._token != rejected:
                return self._token or None
            return self._fetch()

    # -- background refresh ------------------------------------------------------------------
    def tick(self) -> float:
        """Refresh if the scheduled time has come; return seconds until the next check.

        Returns ``math.inf`` before the first exchange and after :meth:`close`.
        """
        if self._closed:
            return math.inf
        now = self._clock.monotonic()
        if now < self._next_refresh:
            return self._next_refresh - now
        with self._lock:
            if self._closed or self._clock.monotonic() < self._next_refresh:
                return max(self._next_refresh - self._clock.monotonic(), 0.0)
            try:
                self._fetch()
            except Exception as exc:
                remaining = self._remaining(self._token) if self._token else 0.0
                if (
                    isinstance(exc, AuthenticationError)
                    and remaining - RETRY_DELAY_S <= REFRESH_ON_DEMAND_S
                ):
                    logger.warning("JWT refresh rejected, stopping background refresh: %s", exc)
                    self._next_refresh = math.inf
                else:
                    log = logger.debug if self._failing else logger.warning
                    log("JWT refresh failed, retrying in %ds: %s", int(RETRY_DELAY_S), exc)
                    self._next_refresh = self._clock.monotonic() + RETRY_DELAY_S
                    self._failing = True
            return max(self._next_refresh - self._clock.monotonic(), 0.0)

    def next_refresh_in(self) -> float:
        """Seconds until the scheduled background refresh (``inf`` when none)."""
        return self._next_refresh - self._clock.monotonic()

    def close(self) -> None:
        """Stop background refreshes; :meth:`token` keeps working (final telemetry)."""
        self._closed = True
        close = getattr(self._exchange, "close", None)
        if callable(close):
            close()

    # -- internals ---------------------------------------------------------------------------
    def _remaining(self, token: str) -> float:
        exp = _expiry(token)
        return 0.0 if exp is None else exp - self._clock.time()

    def _fetch(self) -> str:
        """Exchange now (caller holds the lock); schedule the next background refresh."""
        self.exchanges += 1
        token = self._exchange()
        self._token = token
        self._failing = False
        lifetime = _lifetime(token)
        if lifetime is None:
            delay = RETRY_DELAY_S
        else:
            delay = lifetime * (0.45 + 0.1 * self._clock.random())
        self._next_refresh = self._clock.monotonic() + delay
        return token

    def __repr__(self) -> str:
        return f"<JwtAuth has_token={bool(self._token)} exchanges={self.exchanges}>"


def make_auth(
    credentials: Credentials,
    server: ServerConfig,
    transport: Transport,
    *,
    clock: Clock = SYSTEM_CLOCK,
) -> AuthProvider:
    """The auth provider for a server: the static key, or a :class:`JwtAuth` when enabled."""
    if not server.pjwt_auth_enabled:
        return StaticKeyAuth(credentials)
    exchange = TokenExchange(transport, credentials, use_command=server.uses_credential_command)
    return JwtAuth(exchange, clock=clock)
