"""Minimal HS256 JWTs for the local server's ``/api/v1/auth/token`` exchange.

Usage::

    signer = JwtSigner(secret=b"...")
    token = signer.issue({"sub": "tml:user:local"}, ttl_s=3600.0, now=time.time())
    claims = signer.verify(token, now=time.time())   # None when invalid or expired

Only what the Tinker protocol needs (docs/design/protocol.md#authentication): ``exp``, ``iat``,
``sub``, ``org_id``, ``email``, ``iss``. Tokens are signed with a per-``data_dir`` secret, so they
survive a restart.

Thread safety: :class:`JwtSigner` is immutable and safe to share. Fork safety: plain data.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def looks_like_jwt(value: str) -> bool:
    """True for strings shaped like a compact JWS (``eyJ...`` with three segments)."""
    return value.startswith("eyJ") and value.count(".") == 2


class JwtSigner:
    """Issues and verifies HS256 JWTs. Immutable; thread-safe; fork-safe."""

    def __init__(self, secret: bytes) -> None:
        """``secret``: the HMAC key (at least 16 bytes)."""
        if len(secret) < 16:
            raise ValueError("JWT secret must be at least 16 bytes")
        self._secret = secret

    def __repr__(self) -> str:
        return "JwtSigner(<secret>)"

    def _sign(self, signing_input: bytes) -> str:
        return _b64(hmac.new(self._secret, signing_input, hashlib.sha256).digest())

    def issue(self, claims: dict[str, Any], *, ttl_s: float, now: float) -> str:
        """Return a token carrying ``claims`` plus ``iat`` and ``exp`` (whole seconds)."""
        body = dict(claims)
        body["iat"] = int(now)
        body["exp"] = int(now + ttl_s)
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
        payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        signing_input = f"{header}.{payload}".encode("ascii")
        return f"{header}.{payload}.{self._sign(signing_input)}"

    def verify(self, token: str, *, now: float) -> dict[str, Any] | None:
        """Return the claims of a valid, unexpired token signed by this signer, else None."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        header, payload, signature = parts
        expected = self._sign(f"{header}.{payload}".encode("ascii", "replace"))
        if not hmac.compare_digest(expected, signature):
            return None
        try:
            head = json.loads(_unb64(header))
            claims = json.loads(_unb64(payload))
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(head, dict) or head.get("alg") != "HS256" or not isinstance(claims, dict):
            return None
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)) or exp <= now:
            return None
        return claims


class UrlSigner:
    """Signs small JSON payloads into URL-safe tokens (for ``/_files/<token>/...`` links).

    Usage::

        token = signer.sign({"r": run_id, "c": checkpoint_id}, expires_at=time.time() + 3600)
        payload = signer.verify(token, now=time.time())   # None when tampered or expired

    Immutable; thread-safe; fork-safe.
    """

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("URL signing secret must be at least 16 bytes")
        self._secret = secret

    def __repr__(self) -> str:
        return "UrlSigner(<secret>)"

    def sign(self, payload: dict[str, Any], *, expires_at: float) -> str:
        body = dict(payload)
        body["x"] = int(expires_at)
        data = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        mac = _b64(hmac.new(self._secret, data.encode("ascii"), hashlib.sha256).digest()[:18])
        return f"{data}.{mac}"

    def verify(self, token: str, *, now: float) -> dict[str, Any] | None:
        data, _, mac = token.partition(".")
        expected = _b64(
            hmac.new(self._secret, data.encode("ascii", "replace"), hashlib.sha256).digest()[:18]
        )
        if not mac or not hmac.compare_digest(expected, mac):
            return None
        try:
            body = json.loads(_unb64(data))
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(body, dict):
            return None
        expiry = body.get("x")
        if not isinstance(expiry, int) or expiry <= now:
            return None
        return body
