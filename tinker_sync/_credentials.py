"""Credentials: the API key or credential command, how it is resolved, secrets and JWT claims.

Usage::

    creds = Credentials(api_key=None)     # resolved lazily: argument, env, command, stored file
    key = creds.fetch()                   # the raw credential for X-API-Key
    creds.identity                        # sha256 of the key or command text (limiter key)
    expires_at = jwt_expiry(token)        # the one JWT expiry parser of the SDK

Everything here is about what the SDK holds to authenticate and how it finds it
(docs/design/behavior.md#credential-order, docs/design/behavior.md#secrets-never-leak); the
token exchange of servers with JWT auth is in ``_session.jwt`` (it needs the transport), and the
public helpers of ``tinker_sync.auth`` read from here.

Secrets (API keys, JWTs, the Cloudflare secret) are held in :class:`Secret`, whose repr/str is
``<redacted>``, which registers itself with :mod:`tinker_sync._runtime.redact` and which refuses
to pickle.

Thread safety: :class:`Secret` is immutable; :class:`Credentials` resolves lazily under a
fork-safe lock. Fork safety: plain data; a forked child keeps the resolved values.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.fork import make_lock
from tinker_sync._runtime.redact import REDACTED, register_secret
from tinker_sync.exceptions import MissingCredentialsError

__all__ = [
    "MISSING_CREDENTIALS_MESSAGE",
    "AuthProvider",
    "CredentialAuth",
    "CredentialSource",
    "Credentials",
    "ResolvedCredential",
    "Secret",
    "StaticKeyAuth",
    "default_credentials_path",
    "jwt_claims",
    "jwt_expiry",
    "read_stored_default_key",
]


_COMMAND_TIMEOUT = 120.0


MISSING_CREDENTIALS_MESSAGE = (
    "No Tinker credential found: pass api_key=... to the client (--api-key for tinker-sync), "
    "set the TINKER_API_KEY environment variable, set TINKER_CREDENTIAL_CMD to a command that "
    "prints one, or keep a default key in ~/.tinker/credentials.json. For a local server, "
    "`tinker-sync serve` prints the TINKER_BASE_URL and TINKER_API_KEY to export."
)


class Secret:
    """A secret string: ``repr``/``str`` show ``<redacted>``, ``reveal()`` gives the value.

    Creating one registers the value with :func:`tinker_sync._runtime.redact.register_secret`, so
    it is scrubbed from every exception message and log line. Pickling raises TypeError: carrying a
    secret across processes must be an explicit ``reveal()`` by the caller.
    Thread safety: immutable. Fork safety: plain data.
    """

    __slots__ = ("__weakref__", "_value")

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError("Secret value must be a str")
        self._value = value
        register_secret(value, holder=self)  # forgotten once the last Secret of it is gone

    def reveal(self) -> str:
        """Return the secret value. Never log or embed the result."""
        return self._value

    def sha256(self) -> str:
        """Hex SHA-256 of the value (safe to use as an identity key)."""
        return hashlib.sha256(self._value.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Secret('{REDACTED}')"

    def __str__(self) -> str:
        return REDACTED

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> Any:
        raise TypeError("Secret values are not picklable; pass secret.reveal() explicitly")


def jwt_claims(token: str) -> dict[str, Any]:
    """Decode a JWT's payload claims without verifying the signature.

    Raises ValueError (secret-free message) when the token is not a decodable JWT.
    """
    try:
        payload = token.split(".")[1]
        payload += "=" * (-len(payload) % 4)
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except Exception as exc:
        raise ValueError(f"cannot decode JWT claims ({type(exc).__name__})") from None
    if not isinstance(claims, dict):
        raise ValueError("JWT payload is not a JSON object")
    return claims


def jwt_expiry(token: str) -> float:
    """The ``exp`` claim (epoch seconds) of a JWT: the one expiry parser of the SDK.

    Read as the official client reads it, ``float(exp)``: a JSON number or a numeric string.
    Raises ValueError (secret-free) when the claim is missing, a boolean, NaN or not numeric.
    """
    exp = jwt_claims(token).get("exp")
    if isinstance(exp, bool) or not isinstance(exp, (int, float, str)):
        raise ValueError("JWT has no numeric exp claim")
    try:
        value = float(exp)
    except ValueError:
        raise ValueError("JWT has no numeric exp claim") from None
    if math.isnan(value):
        raise ValueError("JWT has no numeric exp claim")
    return value


def _is_jwt(value: str) -> bool:
    return value.startswith("eyJ")


class CredentialSource(str, enum.Enum):
    """Where the credential came from, in precedence order."""

    ARGUMENT = "api_key argument"
    ENV = "TINKER_API_KEY"
    COMMAND = "TINKER_CREDENTIAL_CMD"
    STORED = "credentials file"

    def __str__(self) -> str:
        return self.value


@attrs.frozen
class ResolvedCredential:
    """Outcome of the precedence rules: a static key, or a command run on every fetch."""

    source: CredentialSource
    key: Secret | None = attrs.field(repr=False)
    command: str | None = attrs.field(repr=False)
    identity: str


def default_credentials_path() -> Path:
    """``~/.tinker/credentials.json`` (written by the official ``tinker auth login``)."""
    return Path("~/.tinker/credentials.json").expanduser()


def read_stored_default_key(path: Path) -> str | None:
    """The default key of a credentials file, or None (missing file, no default).

    Layout (official ``lib/credentials.py``, version 1)::

        {"version": 1, "default": "<key id>", "keys": {"<key id>": {"type": "manual"|"generated",
                                                                     "key": "tml-...", ...}}}

    A file that exists but cannot be parsed raises MissingCredentialsError.
    """
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MissingCredentialsError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise MissingCredentialsError(f"{path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise MissingCredentialsError(f"{path} does not hold a credentials object")
    default = data.get("default")
    keys = data.get("keys")
    if default is None or not isinstance(keys, dict):
        return None
    record = keys.get(default)
    if not isinstance(record, dict):
        return None
    key = record.get("key")
    return key if isinstance(key, str) and key else None


class Credentials:
    """The caller's raw credential, resolved lazily in the official precedence order.

    Order (docs/design/behavior.md#credential-order): ``api_key`` argument, ``TINKER_API_KEY``,
    ``TINKER_CREDENTIAL_CMD`` (run on every :meth:`fetch`), then the default key of
    ``~/.tinker/credentials.json``. A key must start with ``tml-`` or be a JWT (``eyJ...``, whose
    ``exp`` is checked at each fetch). An invalid argument/env key falls back to the command when
    one is set. Nothing is read or run until first use; a missing credential raises
    :class:`MissingCredentialsError` then.

    Usage::

        creds = Credentials.from_env(api_key)          # env captured now
        creds.identity      # sha256 hex of the key, or of the command text
        creds.fetch()       # raw credential for X-API-Key / the JWT exchange
        creds.static_key()  # for servers without JWT auth (command-only is an error)

    Thread safety: resolution happens once under a lock; the command may run concurrently.
    Fork safety: plain data. Not picklable (holds secrets).
    """

    def __init__(
        self,
        api_key: str | Secret | None = None,
        *,
        api_key_source: CredentialSource = CredentialSource.ARGUMENT,
        command: str | None = None,
        credentials_path: Path | str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        command_timeout: float = _COMMAND_TIMEOUT,
    ) -> None:
        if isinstance(api_key, str):
            api_key = Secret(api_key) if api_key else None
        self._api_key: Secret | None = api_key or None
        self._api_key_source = api_key_source
        self._command = command or None
        self._path = Path(credentials_path) if credentials_path else default_credentials_path()
        self._clock = clock
        self._command_timeout = command_timeout
        self._lock = make_lock()
        self._resolved: ResolvedCredential | None = None

    @classmethod
    def from_env(
        cls,
        api_key: str | Secret | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        credentials_path: Path | str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Credentials:
        """Capture the argument, ``TINKER_API_KEY`` and ``TINKER_CREDENTIAL_CMD`` now."""
        env = os.environ if environ is None else environ
        source = CredentialSource.ARGUMENT
        if not api_key:
            api_key = env.get("TINKER_API_KEY") or None
            source = CredentialSource.ENV
        return cls(
            api_key,
            api_key_source=source,
            command=env.get("TINKER_CREDENTIAL_CMD") or None,
            credentials_path=credentials_path,
            clock=clock,
        )

    # -- resolution --------------------------------------------------------------------------
    def resolve(self) -> ResolvedCredential:
        """Apply the precedence rules (once; failures are not cached)."""
        resolved = self._resolved
        if resolved is not None:
            return resolved
        with self._lock:
            if self._resolved is None:
                self._resolved = self._resolve()
            return self._resolved

    def _resolve(self) -> ResolvedCredential:
        key = self._api_key
        if key is not None:
            value = key.reveal()
            if _is_jwt(value) or value.startswith("tml-"):
                return ResolvedCredential(self._api_key_source, key, None, key.sha256())
            if self._command is None:
                raise MissingCredentialsError(
                    f"The api_key (from the {self._api_key_source}) must start with the "
                    "'tml-' prefix (or be a JWT)."
                )
        if self._command is not None:
            identity = hashlib.sha256(self._command.encode()).hexdigest()
            return ResolvedCredential(CredentialSource.COMMAND, None, self._command, identity)
        stored = read_stored_default_key(self._path)
        if stored is None:
            raise MissingCredentialsError(MISSING_CREDENTIALS_MESSAGE)
        secret = Secret(stored)
        if not (_is_jwt(stored) or stored.startswith("tml-")):
            raise MissingCredentialsError(
                f"The default key in {self._path} must start with the 'tml-' prefix."
            )
        return ResolvedCredential(CredentialSource.STORED, secret, None, secret.sha256())

    @property
    def identity(self) -> str:
        """SHA-256 hex of the static key or of the command text (never of an exchanged JWT)."""
        return self.resolve().identity

    @property
    def source(self) -> CredentialSource:
        return self.resolve().source

    @property
    def has_command(self) -> bool:
        """True when ``TINKER_CREDENTIAL_CMD`` was set."""
        return self._command is not None

    # -- fetching ----------------------------------------------------------------------------
    def fetch(self) -> str:
        """The raw credential by the default order; runs the command on every call if chosen."""
        resolved = self.resolve()
        if resolved.key is not None:
            return self._checked_static(resolved.key.reveal(), resolved.source)
        assert resolved.command is not None
        return self._run_command(resolved.command)

    def fetch_for_exchange(self, use_command: bool) -> str:
        """The credential for ``POST /api/v1/auth/token`` (server ``pjwt_auth_enabled``).

        ``use_command`` is ``server.credential_default_source == "credential_cmd"``: then the
        command is used unless the api key is itself a JWT (official ``resolve_auth_provider``).
        """
        if not use_command:
            return self.fetch()
        key = self._api_key
        if key is not None and _is_jwt(key.reveal()):
            return self._checked_static(key.reveal(), self._api_key_source)
        if self._command is None:
            raise MissingCredentialsError(
                "Your organization requires dynamic credentials: set TINKER_CREDENTIAL_CMD to a "
                "command that prints a valid credential."
            )
        return self._run_command(self._command)

    def static_key(self) -> str:
        """The API key for a server without JWT auth (official: command-only is an error)."""
        resolved = self.resolve()
        if resolved.key is None:
            raise MissingCredentialsError(
                "This server does not enable JWT auth, so TINKER_CREDENTIAL_CMD cannot be used "
                "alone: pass api_key=... or set TINKER_API_KEY."
            )
        return self._checked_static(resolved.key.reveal(), resolved.source)

    def _checked_static(self, value: str, source: CredentialSource) -> str:
        if _is_jwt(value):
            try:
                exp = jwt_expiry(value)
            except ValueError as exc:
                raise MissingCredentialsError(
                    f"The api_key from the {source} looks like a JWT but {exc}."
                ) from None
            if self._clock.time() >= exp:
                raise MissingCredentialsError(
                    "The api_key JWT has expired. Pass a fresh one, or remove it and set "
                    "TINKER_CREDENTIAL_CMD to a command that prints one."
                )
        return value

    def _run_command(self, command: str) -> str:
        import subprocess  # here, not at import: most processes never run a credential command

        try:
            proc = subprocess.run(
                command,
                shell=True,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self._command_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise MissingCredentialsError(
                f"TINKER_CREDENTIAL_CMD did not finish within {self._command_timeout:g} s."
            ) from None
        except OSError as exc:
            raise MissingCredentialsError(
                f"TINKER_CREDENTIAL_CMD could not run: {exc.strerror}"
            ) from None
        credential = proc.stdout.decode("utf-8", "replace").strip()
        if not credential:
            raise MissingCredentialsError(
                f"TINKER_CREDENTIAL_CMD returned an empty credential (exit status {proc.returncode})."
            )
        register_secret(credential)
        if _is_jwt(credential):
            try:
                exp = jwt_expiry(credential)
            except ValueError:
                exp = math.inf
            if self._clock.time() >= exp:
                raise MissingCredentialsError("TINKER_CREDENTIAL_CMD printed an expired JWT.")
        return credential

    def __repr__(self) -> str:
        parts = []
        if self._api_key is not None:
            parts.append(f"api_key=<redacted> ({self._api_key_source})")
        if self._command is not None:
            parts.append("command=<set>")
        return f"<Credentials {' '.join(parts) or 'unresolved'}>"

    def __reduce__(self) -> Any:
        raise TypeError("Credentials are not picklable (they hold secrets)")


class AuthProvider(Protocol):
    """What the transport asks for the ``X-API-Key`` value of each request.

    * ``token()``: the value to send (may block for a JWT exchange; raises on failure).
    * ``replace(rejected)``: after a 401 with ``error="invalid_token"`` for ``rejected``: a new
      token to replay the request once with, or None when this provider cannot refresh.
    """

    def token(self) -> str: ...

    def replace(self, rejected: str) -> str | None: ...


class StaticKeyAuth:
    """``X-API-Key`` = the static API key (servers without JWT auth).

    Thread safety: stateless. Fork safety: yes.
    """

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def token(self) -> str:
        return self.credentials.static_key()

    def replace(self, rejected: str) -> str | None:
        return None

    def __repr__(self) -> str:
        return "<StaticKeyAuth>"


class CredentialAuth:
    """``X-API-Key`` = the raw credential by the default order (command run per request).

    Used for ``client/config`` (always the raw credential) and for the JWT exchange.
    Thread safety: stateless. Fork safety: yes.
    """

    def __init__(self, credentials: Credentials, *, use_command: bool = False) -> None:
        self.credentials = credentials
        self.use_command = use_command

    def token(self) -> str:
        if self.use_command:
            return self.credentials.fetch_for_exchange(True)
        return self.credentials.fetch()

    def replace(self, rejected: str) -> str | None:
        return None

    def __repr__(self) -> str:
        return f"<CredentialAuth use_command={self.use_command}>"
