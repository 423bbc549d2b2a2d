"""Inspect the SDK's credentials, as the official ``tinker.auth`` module does.

Usage::

    import tinker_sync as tinker

    if not tinker.auth.tinker_has_credentials():
        sys.exit("set TINKER_API_KEY first")
    token = tinker.auth.get_tinker_token()          # the static key or None; runs no command
    tinker.auth.raise_if_tinker_not_accessible()    # one request; raises a TinkerError

The first two are local lookups (no network, and ``TINKER_CREDENTIAL_CMD`` is never run);
the third makes a single, non-retried request to the server.

Thread safety: the functions keep no state and may run in any thread. Fork safety: yes.
"""

from __future__ import annotations

import os

from tinker_sync._config import ClientConfig, ServerConfig
from tinker_sync._credentials import Credentials, CredentialSource, StaticKeyAuth, jwt_expiry
from tinker_sync.exceptions import TinkerError

__all__ = ["get_tinker_token", "raise_if_tinker_not_accessible", "tinker_has_credentials"]


def _usable_key(value: str) -> bool:
    """The official static-key check: a ``tml-`` key, or a JWT whose ``exp`` parses."""
    if value.startswith("tml-"):
        return True
    if value.startswith("eyJ"):
        try:
            jwt_expiry(value)
        except ValueError:
            return False
        return True
    return False


def get_tinker_token() -> str | None:
    """The configured static token (``TINKER_API_KEY``, else the stored default key), or None.

    A local lookup: ``TINKER_CREDENTIAL_CMD`` is never run. An invalid ``TINKER_API_KEY`` gives
    None (it does not fall back to the stored key).
    """
    env_key = os.environ.get("TINKER_API_KEY") or None
    credentials = Credentials(env_key, api_key_source=CredentialSource.ENV, command=None)
    try:
        resolved = credentials.resolve()
    except (OSError, TinkerError, ValueError):
        return None
    if resolved.key is None:
        return None
    value = resolved.key.reveal()
    return value if _usable_key(value) else None


def tinker_has_credentials() -> bool:
    """Whether a credential can be resolved locally (a set ``TINKER_CREDENTIAL_CMD`` counts,
    without being run)."""
    try:
        resolved = Credentials.from_env().resolve()
    except (OSError, TinkerError, ValueError):
        return False
    if resolved.key is None:
        return True  # the credential command, not run here
    return _usable_key(resolved.key.reveal())


def raise_if_tinker_not_accessible() -> None:
    """Return if the service accepts the configured credential, else raise a TinkerError.

    Sends ``client/config`` (and the JWT exchange when the server uses JWT auth), then one
    ``get_server_capabilities`` request, none of them retried, so a failure surfaces at once:
    :class:`~tinker_sync.MissingCredentialsError` (a TinkerError) without a credential,
    :class:`~tinker_sync.AuthenticationError` when it is rejected,
    :class:`~tinker_sync.BillingError` on 402, :class:`~tinker_sync.APIConnectionError` when the
    service is unreachable. Other failures are wrapped in a plain TinkerError.
    """
    try:
        _check_accessible()
    except TinkerError:
        raise
    except Exception as exc:
        raise TinkerError(str(exc)) from exc


def _check_accessible() -> None:
    from tinker_sync._config import PROTOCOL_VERSION
    from tinker_sync._flow.retry import send_with_retries
    from tinker_sync._session.jwt import make_auth
    from tinker_sync._transport import Pool, RequestSpec, Transport

    config = ClientConfig.from_env()
    raw = Transport(config, auth=StaticKeyAuth(config.credentials))
    transport: Transport | None = None
    try:
        reply = send_with_retries(
            raw,
            RequestSpec(
                method="POST",
                path="/api/v1/client/config",
                pool=Pool.SESSION,
                json={"sdk_version": PROTOCOL_VERSION},
                sdk_method=None,
            ),
            max_retries=0,
        )
        data = reply.json()
        server = ServerConfig.from_dict(data if isinstance(data, dict) else None)
        transport = raw.with_auth(make_auth(config.credentials, server, raw))
        send_with_retries(
            transport,
            RequestSpec(method="GET", path="/api/v1/get_server_capabilities", pool=Pool.REST),
            max_retries=0,
        )
    finally:
        if transport is not None:
            transport.close()
        raw.close()
