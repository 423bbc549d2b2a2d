"""Immutable client configuration: base URL, headers, timeouts, server flags, and the credentials.

Usage::

    from tinker_sync._config import ClientConfig, ServerConfig, Timeout

    config = ClientConfig.from_env(api_key=None, base_url=None)   # env read here, once
    config.normalized_base_url          # key for connection pools and rate limiters
    config.credentials.identity         # sha256 of the key / command text (lazy: first use)
    config.timeout.as_tuple()           # (connect, read) for requests
    server = ServerConfig.from_dict(reply_json)   # lenient: unknown keys ignored

Environment variables are read only by :meth:`ClientConfig.from_env`, :func:`resolve_base_url`
and :meth:`Credentials.from_env`, at construction time, never while a request is made. The
exception is the credentials file (``~/.tinker/credentials.json``), read lazily at first use,
and ``TINKER_CREDENTIAL_CMD``, whose command runs on every credential fetch (official
behaviour).

The credentials (resolution order, secrets, JWT claims) are defined in ``_credentials``; a
:class:`ClientConfig` carries one :class:`~tinker_sync._credentials.Credentials`.

Thread safety: every class here is immutable after construction except :class:`Credentials`,
whose lazy resolution is guarded by a fork-safe lock. Fork safety: plain data; a forked child
keeps the resolved values.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlsplit

import attrs

from tinker_sync._credentials import Credentials, Secret
from tinker_sync._logging import parse_log_level
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.redact import is_secret_header, redact_headers, scrub

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_STALL_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "PROTOCOL_VERSION",
    "ClientConfig",
    "DynamicConfig",
    "HealthPolicy",
    "RequestOptions",
    "ServerConfig",
    "Timeout",
    "normalize_base_url",
    "parse_health_policy",
    "parse_stall_timeout",
    "parse_tags",
    "resolve_base_url",
    "telemetry_enabled",
]

logger = logging.getLogger("tinker_sync.config")

DEFAULT_BASE_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"
PROTOCOL_VERSION = "0.38.0"
"""The official SDK version whose wire protocol we speak (``x-sdk-version``, ``sdk_version``)."""
DEFAULT_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_MAX_RETRIES = 10
#: Seconds a pending call may go without a useful answer (every attempt a connection error,
#: timeout or 5xx) before it fails with StalledError: long enough to ride out a server restart.
DEFAULT_STALL_TIMEOUT = 600.0
# --------------------------------------------------------------------------------------------
# Timeout
# --------------------------------------------------------------------------------------------


@attrs.frozen(init=False)
class Timeout:
    """Per-request timeouts in seconds (httpx-compatible signature).

    Usage::

        Timeout()                    # connect 5, read/write/pool 60 (the default)
        Timeout(30.0)                # connect 5, read/write/pool 30
        Timeout(30.0, connect=2.0)   # explicit parts win
        Timeout.coerce(30.0)         # a bare number sets every part: connect 30, read 30

    ``None`` means "no limit" for that part. Only ``connect`` and ``read`` are enforced (requests
    has no write/pool timeouts); ``write`` and ``pool`` are kept for httpx compatibility.
    Thread safety: immutable. Fork safety: plain data.
    """

    connect: float | None
    read: float | None
    write: float | None
    pool: float | None

    def __init__(
        self,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        connect: float | None = None,
        read: float | None = None,
        write: float | None = None,
        pool: float | None = None,
    ) -> None:
        if connect is None:
            connect = (
                DEFAULT_CONNECT_TIMEOUT
                if timeout is None
                else min(DEFAULT_CONNECT_TIMEOUT, timeout)
            )
        parts = {
            "connect": connect,
            "read": timeout if read is None else read,
            "write": timeout if write is None else write,
            "pool": timeout if pool is None else pool,
        }
        for name, value in parts.items():
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"Timeout.{name} must be a number or None, not {value!r}")
                if not value > 0 or math.isnan(value):
                    raise ValueError(f"Timeout.{name} must be > 0, not {value!r}")
                parts[name] = float(value)
        self.__attrs_init__(**parts)

    @classmethod
    def coerce(cls, value: object) -> Timeout:
        """Turn a user value into a Timeout.

        ``None`` -> the default; a number -> every part equal to it; a :class:`Timeout` as is;
        any object with ``connect``/``read`` attributes (e.g. ``httpx.Timeout``) is copied.
        """
        if value is None:
            return cls()
        if isinstance(value, Timeout):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v = float(value)
            return cls(v, connect=v)
        if hasattr(value, "connect") and hasattr(value, "read"):
            read = getattr(value, "read", None)
            return cls(
                read,
                connect=getattr(value, "connect", None),
                read=read,
                write=getattr(value, "write", None),
                pool=getattr(value, "pool", None),
            )
        raise TypeError(f"timeout must be a number, None or Timeout, not {type(value).__name__}")

    def as_dict(self) -> dict[str, float | None]:
        """The four parts by name (as ``httpx.Timeout.as_dict``)."""
        return {"connect": self.connect, "read": self.read, "write": self.write, "pool": self.pool}

    def as_tuple(self) -> tuple[float | None, float | None]:
        """``(connect, read)``, the form requests expects."""
        return (self.connect, self.read)


class RequestOptions(TypedDict, total=False):
    """Kept only so that ``from tinker import RequestOptions`` style imports work; unused."""

    headers: Mapping[str, str]
    max_retries: int
    timeout: float | Timeout | None
    params: Mapping[str, object]
    extra_json: Mapping[str, object]
    idempotency_key: str
    follow_redirects: bool


# --------------------------------------------------------------------------------------------
# Base URL
# --------------------------------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}


_SCHEME_TYPO = re.compile(r"^(https?):/*(?P<rest>[^/].*)$", re.IGNORECASE)
_LOCAL_HOSTS = ("localhost", "127.", "[::1]", "0.0.0.0")


def _suggest_scheme(text: str) -> str:
    """``http://`` for local addresses (the local server speaks plain HTTP), else ``https://``."""
    scheme = "http" if text.lower().startswith(_LOCAL_HOSTS) else "https"
    return f"{scheme}://{text}"


def normalize_base_url(url: str) -> str:
    """Canonical form of a base URL; the single key for pools and limiters
    (docs/design/behavior.md#limiter-registry).

    Lower-cases scheme and host, drops the default port (80 for http, 443 for https), drops
    user info, query and fragment, keeps the path (case preserved) without trailing ``/``::

        normalize_base_url("https://EXAMPLE.com:443/") == "https://example.com"

    Raises ValueError, with a suggestion, for a URL without ``http://`` / ``https://``
    (``127.0.0.1:8000``, ``example.com``), a mangled one (``http:/host``), other schemes or a
    missing host: such a URL could only fail later, slowly, on the network.
    """
    text = str(url).strip()
    if not text:
        raise ValueError("base_url is empty")
    if "://" not in text:
        typo = _SCHEME_TYPO.match(text)
        if typo is not None:
            fixed = f"{typo.group(1).lower()}://{typo.group('rest')}"
            raise ValueError(
                f"base_url {scrub(text)!r} is malformed; did you mean {scrub(fixed)!r}?"
            )
        raise ValueError(
            f"base_url {scrub(text)!r} has no scheme; did you mean "
            f"{scrub(_suggest_scheme(text))!r}?"
        )
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"base_url must use http:// or https://, got {scheme!r}")
    host = parts.hostname
    if not host:
        rest = text.split("://", 1)[1].lstrip("/")
        hint = f"; did you mean {scrub(f'{scheme}://{rest}')!r}?" if rest else ""
        raise ValueError(f"base_url has no host: {scrub(str(url))!r}{hint}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"base_url has an invalid port: {scrub(str(url))!r}") from exc
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if port is None or port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    path = parts.path.rstrip("/")
    return f"{scheme}://{netloc}{path}"


def resolve_base_url(base_url: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The base URL: the argument, else ``TINKER_BASE_URL``, else the production URL.

    Empty strings count as unset and a trailing ``/`` is stripped (official ``lib/base_url.py``).
    """
    env = os.environ if environ is None else environ
    resolved = str(base_url) if base_url is not None else ""
    resolved = resolved or env.get("TINKER_BASE_URL") or DEFAULT_BASE_URL
    return resolved.rstrip("/")


# --------------------------------------------------------------------------------------------
# Client configuration
# --------------------------------------------------------------------------------------------

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def telemetry_enabled(value: str | None) -> bool:
    """``TINKER_TELEMETRY``: on when unset, else only for 1/true/yes/on (any case)."""
    if value is None:
        return True
    return value.strip().lower() in _TRUE_WORDS


def parse_tags(value: str | None) -> tuple[str, ...]:
    """``TINKER_TAGS``: split on ``,``, strip, drop empties, de-duplicate keeping order."""
    if not value:
        return ()
    seen: dict[str, None] = {}
    for part in value.split(","):
        tag = part.strip()
        if tag:
            seen.setdefault(tag, None)
    return tuple(seen)


def parse_stall_timeout(value: str | None) -> float:
    """``TINKER_STALL_TIMEOUT``: seconds (> 0); unset or empty means the default (600)."""
    if value is None or not value.strip():
        return DEFAULT_STALL_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(
            f"TINKER_STALL_TIMEOUT must be a number of seconds, not {value!r}"
        ) from None
    if not seconds > 0 or math.isnan(seconds):
        raise ValueError(f"TINKER_STALL_TIMEOUT must be > 0 seconds, not {value!r}")
    return seconds


@attrs.frozen(kw_only=True)
class HealthPolicy:
    """Every number of the per-tenant circuit breaker and retry budget (docs/health.md).

    Usage::

        ServiceClient(health=HealthPolicy(fail_fast=True))      # or in the environment:
        # TINKER_SYNC_HEALTH="fail_fast=1,open_after=8"

    Opening: ``open_after`` failed attempts (5xx, connection failures, timeouts) of at least
    ``open_after_distinct`` distinct requests within ``failure_window_s``, with no success in
    between. Probing while open: one request at a time after ``min(probe_initial_s * 2^n,
    probe_max_s) * (1 - probe_jitter * U[0, 1))`` seconds; a probe without an answer after
    ``probe_lease_s`` counts as failed. Retry budget (botocore's standard mode): a bucket of
    ``retry_capacity`` tokens; a retry spends ``retry_cost`` (``timeout_retry_cost`` after a
    timeout), a success refunds ``success_refund``; a retry finding the bucket empty opens the
    circuit. ``same_error_repeats``: a request answered with the same 5xx error this many times
    in a row while other requests succeed ends with that error. ``fail_fast``: new calls raise
    :class:`~tinker_sync.exceptions.CircuitOpenError` while the circuit is open instead of
    waiting (bounded by ``stall_timeout``). ``summary_every_s``: the period of the summary log
    line while the circuit is not closed. ``enabled=False`` turns the breaker off (the budget
    too). Backoff of a retried 408 / 5xx / transport failure: the HTTP layer waits
    ``min(http_backoff_initial_s * 2^k, http_backoff_max_s) * (1 - http_backoff_jitter *
    U[0, 1))`` before retry ``k`` (unless the server's Retry-After says otherwise); the
    submission loop waits ``min(submit_backoff_initial_s * 2^n, submit_backoff_max_s)`` after
    failure ``n``. While the server declares a queue paused, the tenant's polls of that
    queue go out one at a time, at most ``paused_polls_per_s`` a second (0: no limit). The
    first policy seen by a tenant (base URL, API key) sizes its breaker and
    budget; ``fail_fast`` and the backoff knobs are per client. Thread safety: immutable. Fork
    safety: plain data.
    """

    enabled: bool = True
    failure_window_s: float = 10.0
    open_after: int = 5
    open_after_distinct: int = 3
    probe_initial_s: float = 1.0
    probe_max_s: float = 10.0
    probe_jitter: float = 0.5
    probe_lease_s: float = 90.0
    retry_capacity: int = 500
    retry_cost: int = 5
    timeout_retry_cost: int = 10
    success_refund: int = 1
    same_error_repeats: int = 4
    fail_fast: bool = False
    summary_every_s: float = 60.0
    http_backoff_initial_s: float = 0.5
    http_backoff_max_s: float = 10.0
    http_backoff_jitter: float = 0.25
    submit_backoff_initial_s: float = 1.0
    submit_backoff_max_s: float = 30.0
    paused_polls_per_s: float = 5.0

    def __attrs_post_init__(self) -> None:
        for name, value in attrs.asdict(self).items():
            if isinstance(value, bool):
                continue
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(f"HealthPolicy.{name} must be a number >= 0, not {value!r}")
        for name in ("probe_jitter", "http_backoff_jitter"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(
                    f"HealthPolicy.{name} must be in [0, 1], not {getattr(self, name)!r}"
                )
        if self.open_after < 1 or self.open_after_distinct < 1 or self.same_error_repeats < 1:
            raise ValueError("HealthPolicy.open_after* and same_error_repeats must be >= 1")


def parse_health_policy(value: str | None) -> HealthPolicy:
    """``TINKER_SYNC_HEALTH``: comma-separated ``knob=value`` pairs of :class:`HealthPolicy`
    (booleans as ``1``/``0``/``true``/``false``); unset or empty means the defaults."""
    if value is None or not value.strip():
        return HealthPolicy()
    fields = {f.name: f for f in attrs.fields(HealthPolicy)}
    knobs: dict[str, Any] = {}
    for part in value.split(","):
        if not part.strip():
            continue
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in fields:
            raise ValueError(
                f"TINKER_SYNC_HEALTH: {part.strip()!r} is not knob=value with a knob among "
                f"{', '.join(fields)}"
            )
        default = getattr(HealthPolicy(), name)
        try:
            if isinstance(default, bool):
                if raw.lower() not in ("1", "0", "true", "false"):
                    raise ValueError(raw)
                knobs[name] = raw.lower() in ("1", "true")
            elif isinstance(default, int):
                knobs[name] = int(raw)
            else:
                knobs[name] = float(raw)
        except ValueError:
            raise ValueError(f"TINKER_SYNC_HEALTH: {name}={raw!r} is not a valid value") from None
    return HealthPolicy(**knobs)


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_BREAK = re.compile(r"[\r\n\x00]")
_FRAMING_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive"}
)
"""Headers the transport alone writes (message framing and connection management): a user's
copy would send two framing headers, a request-smuggling shape (docs/transport.md). ``Host``
is allowed: it replaces the default one, never adds a second."""


def _merge_headers(*layers: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Merge header mappings case-insensitively; later layers win (and keep their spelling)."""
    merged: dict[str, tuple[str, str]] = {}
    for layer in layers:
        for name, value in (layer or {}).items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError("header names and values must be str")
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"header name {name!r} is not a valid HTTP header name")
            if name.lower() in _FRAMING_HEADERS:
                raise ValueError(
                    f"header {name!r} cannot be set: the transport writes the message framing "
                    "and connection headers itself"
                )
            if _HEADER_BREAK.search(value):
                # The value may be a secret: name the header, never echo the value.
                raise ValueError(f"header {name!r}: value contains CR, LF or NUL")
            merged[name.lower()] = (name, value)
    return tuple(merged.values())


def _headers_repr(headers: tuple[tuple[str, str], ...]) -> str:
    return repr(redact_headers(headers))


def _normalized(self: ClientConfig) -> str:
    return normalize_base_url(self.base_url)


@attrs.frozen(kw_only=True)
class ClientConfig:
    """Everything a client needs to talk to one server, resolved once at construction.

    Build with :meth:`from_env`. Fields: ``base_url`` (as resolved), ``normalized_base_url``
    (pool/limiter key), ``credentials``, ``project_id``, ``tags``, ``headers`` (user headers:
    ``default_headers`` merged with ``default_headers_overrides``), Cloudflare access id/secret,
    ``timeout``, ``max_retries``, ``telemetry``, ``log_level``.

    Pickling keeps only non-secret fields; the unpickled copy resolves its credential and the
    Cloudflare secret from its own process environment
    (docs/design/behavior.md#credential-free-pickles). Thread safety: immutable. Fork safety: plain
    data.
    """

    base_url: str
    credentials: Credentials = attrs.field(repr=False, eq=False)
    project_id: str | None = None
    tags: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=_headers_repr)
    cloudflare_client_id: str | None = None
    cloudflare_client_secret: Secret | None = attrs.field(default=None, repr=False)
    timeout: Timeout = attrs.field(factory=Timeout)
    max_retries: int = DEFAULT_MAX_RETRIES
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    health: HealthPolicy = attrs.field(factory=HealthPolicy)
    telemetry: bool = True
    log_level: str | None = None
    normalized_base_url: str = attrs.field(
        init=False, default=attrs.Factory(_normalized, takes_self=True)
    )

    def __attrs_post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise TypeError("max_retries must be an int")
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        stall = self.stall_timeout
        if isinstance(stall, bool) or not isinstance(stall, (int, float)):
            raise TypeError(f"stall_timeout must be a number of seconds, not {stall!r}")
        if not stall > 0 or math.isnan(stall):
            raise ValueError(f"stall_timeout must be > 0 seconds, not {stall!r}")

    @classmethod
    def from_env(
        cls,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        project_id: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        default_headers_overrides: Mapping[str, str] | None = None,
        timeout: object = None,
        max_retries: int | None = None,
        stall_timeout: float | None = None,
        health: HealthPolicy | None = None,
        environ: Mapping[str, str] | None = None,
        credentials_path: Path | str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> ClientConfig:
        """Resolve arguments against the environment (``environ`` defaults to ``os.environ``)."""
        env = os.environ if environ is None else environ
        cf_secret = env.get("CLOUDFLARE_ACCESS_CLIENT_SECRET") or None
        return cls(
            base_url=resolve_base_url(base_url, env),
            credentials=Credentials.from_env(
                api_key, environ=env, credentials_path=credentials_path, clock=clock
            ),
            project_id=project_id or env.get("TINKER_PROJECT_ID") or None,
            tags=parse_tags(env.get("TINKER_TAGS")),
            headers=_merge_headers(default_headers, default_headers_overrides),
            cloudflare_client_id=env.get("CLOUDFLARE_ACCESS_CLIENT_ID") or None,
            cloudflare_client_secret=Secret(cf_secret) if cf_secret else None,
            timeout=Timeout.coerce(timeout),
            max_retries=DEFAULT_MAX_RETRIES if max_retries is None else max_retries,
            stall_timeout=(
                parse_stall_timeout(env.get("TINKER_STALL_TIMEOUT"))
                if stall_timeout is None
                else stall_timeout
            ),
            health=parse_health_policy(env.get("TINKER_SYNC_HEALTH")) if health is None else health,
            telemetry=telemetry_enabled(env.get("TINKER_TELEMETRY")),
            log_level=parse_log_level(env.get("TINKER_LOG")),
        )

    @property
    def credential_identity(self) -> str:
        """SHA-256 hex of the static key or command text (limiter key,
        docs/design/behavior.md#limiter-registry); resolves lazily."""
        return self.credentials.identity

    @property
    def user_headers(self) -> dict[str, str]:
        """The merged user headers as a dict (may contain secrets: never log it)."""
        return dict(self.headers)

    def static_headers(self) -> dict[str, str]:
        """Headers from config sent on every request: Cloudflare access, then user headers.

        User headers win over the Cloudflare ones (case-insensitively). Contains secrets.
        """
        cf: dict[str, str] = {}
        if self.cloudflare_client_id:
            cf["CF-Access-Client-Id"] = self.cloudflare_client_id
        if self.cloudflare_client_secret:
            cf["CF-Access-Client-Secret"] = self.cloudflare_client_secret.reveal()
        return dict(_merge_headers(cf, dict(self.headers)))

    def public_state(self) -> dict[str, Any]:
        """A picklable, secret-free snapshot (secret-looking user headers dropped)."""
        return {
            "base_url": self.base_url,
            "project_id": self.project_id,
            "tags": self.tags,
            "headers": tuple((k, v) for k, v in self.headers if not is_secret_header(k)),
            "cloudflare_client_id": self.cloudflare_client_id,
            "timeout": (self.timeout.connect, self.timeout.read),
            "max_retries": self.max_retries,
            "stall_timeout": self.stall_timeout,
            "health": attrs.asdict(self.health),
            "telemetry": self.telemetry,
            "log_level": self.log_level,
        }

    @classmethod
    def from_public_state(
        cls,
        state: Mapping[str, Any],
        *,
        api_key: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ClientConfig:
        """Rebuild from :meth:`public_state`; secrets come from ``api_key``/this process's env."""
        env = os.environ if environ is None else environ
        connect, read = state.get("timeout", (DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT))
        cf_secret = env.get("CLOUDFLARE_ACCESS_CLIENT_SECRET") or None
        return cls(
            base_url=state["base_url"],
            credentials=Credentials.from_env(api_key, environ=env),
            project_id=state.get("project_id"),
            tags=tuple(state.get("tags", ())),
            headers=tuple(tuple(h) for h in state.get("headers", ())),
            cloudflare_client_id=state.get("cloudflare_client_id"),
            cloudflare_client_secret=Secret(cf_secret) if cf_secret else None,
            timeout=Timeout(read, connect=connect),
            max_retries=state.get("max_retries", DEFAULT_MAX_RETRIES),
            stall_timeout=state.get("stall_timeout", DEFAULT_STALL_TIMEOUT),
            health=HealthPolicy(**state.get("health", {})),
            telemetry=state.get("telemetry", True),
            log_level=state.get("log_level"),
        )

    def __reduce__(self) -> Any:
        return (_unpickle_client_config, (self.public_state(),))


def _unpickle_client_config(state: dict[str, Any]) -> ClientConfig:
    return ClientConfig.from_public_state(state)


# --------------------------------------------------------------------------------------------
# Server-side configuration (client/config and client/dynamic_config replies)
# --------------------------------------------------------------------------------------------


def _check_value(kind: type, value: object) -> object:
    """Return ``value`` coerced to ``kind`` or raise TypeError (lenient only for whole floats)."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif kind is str and isinstance(value, str):
        return value
    raise TypeError(type(value).__name__)


def _lenient_kwargs(cls: type, data: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if data is None:
        return kwargs
    if not isinstance(data, Mapping):
        logger.warning("%s reply is not an object; using defaults", what)
        return kwargs
    for field in attrs.fields(cls):
        if field.name not in data:
            continue
        value = data[field.name]
        if value is None:
            continue
        kind = field.metadata.get("kind", str)
        try:
            kwargs[field.name] = _check_value(kind, value)
        except TypeError:
            logger.warning(
                "%s field %r has type %s, expected %s; using the default %r",
                what,
                field.name,
                type(value).__name__,
                kind.__name__,
                field.default,
            )
    return kwargs


def _flag(default: bool) -> Any:
    return attrs.field(default=default, metadata={"kind": bool})


def _int(default: int) -> Any:
    return attrs.field(default=default, metadata={"kind": int})


def _str(default: str) -> Any:
    return attrs.field(default=default, metadata={"kind": str})


@attrs.frozen(kw_only=True)
class ServerConfig:
    """Flags from ``POST /api/v1/client/config`` (docs/design/protocol.md#client-config), with the
    official defaults.

    Build with :meth:`from_dict`: unknown keys are ignored, null means "default", and a value of
    the wrong type falls back to the default with a warning (never an exception).
    Thread safety: immutable. Fork safety: plain data.
    """

    pjwt_auth_enabled: bool = _flag(False)
    credential_default_source: str = _str("api_key")
    sample_dispatch_bytes_semaphore_size: int = _int(10 * 1024 * 1024)
    inflight_response_bytes_semaphore_size: int = _int(50 * 1024 * 1024)
    parallel_fwdbwd_chunks: bool = _flag(True)
    proto_compress_fwdbwd: bool = _flag(False)
    fwdbwd_max_chunk_len: int = _int(1024)
    fwdbwd_max_chunk_bytes_count: int = _int(5_000_000)
    fwdbwd_dispatch_bytes_semaphore_size: int = _int(50_000_000)
    billing_exception_max_pause_duration_sec: int = _int(3600)
    sample_no_retries: bool = _flag(False)
    sample_enable_stuck_detection: bool = _flag(True)
    sample_max_concurrent_requests: int = _int(2000)
    use_pyqwest_transport: bool = _flag(True)
    sample_use_retrieve_futures: bool = _flag(False)
    custom_loss_server_side: bool = _flag(False)
    sample_join_sampling_session: bool = _flag(False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ServerConfig:
        return cls(**_lenient_kwargs(cls, data, "client/config"))

    @property
    def uses_credential_command(self) -> bool:
        """True when the JWT exchange must use ``TINKER_CREDENTIAL_CMD``."""
        return self.credential_default_source == "credential_cmd"

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class DynamicConfig:
    """Reply of ``POST /api/v1/client/dynamic_config`` with defaults
    (docs/design/protocol.md#client-config).

    ``refresh_every`` is ``max(refresh_interval_sec, 10)`` seconds.
    Thread safety: immutable. Fork safety: plain data.
    """

    refresh_interval_sec: int = _int(300)
    sample_cancel_enabled: bool = _flag(False)
    sample_cancel_max_batch_size: int = _int(64)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> DynamicConfig:
        return cls(**_lenient_kwargs(cls, data, "client/dynamic_config"))

    @property
    def refresh_every(self) -> float:
        return float(max(self.refresh_interval_sec, 10))

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
