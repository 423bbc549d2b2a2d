"""tinker_sync.auth (the public module): credential lookups checked against the official
``tinker.auth`` as an oracle, and the accessibility check against a LocalServer."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tinker_sync
from tinker_sync import auth
from tinker_sync.exceptions import (
    APIConnectionError,
    AuthenticationError,
    BillingError,
    TinkerError,
)
from tinker_sync.local import LocalServer
from tinker_sync.testing import reset_process_state

official_auth = pytest.importorskip("tinker.auth")


def make_jwt(claims: dict[str, Any]) -> str:
    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'HS256'})}.{b64(claims)}.signature"


FRESH_JWT = make_jwt({"exp": time.time() + 3600, "sub": "u"})
EXPIRED_JWT = make_jwt({"exp": time.time() - 3600, "sub": "u"})
NO_EXP_JWT = make_jwt({"sub": "u"})


def stored(key: str, *, default: str | None = "k1") -> str:
    return json.dumps(
        {
            "version": 1,
            "default": default,
            "keys": {"k1": {"type": "manual", "key": key, "name": "k1"}},
        }
    )


# (name, TINKER_API_KEY, TINKER_CREDENTIAL_CMD, credentials.json text, expected token, expected has)
CASES: list[tuple[str, str | None, str | None, str | None, str | None, bool]] = [
    ("nothing", None, None, None, None, False),
    ("env key", "tml-env", None, None, "tml-env", True),
    ("env beats stored", "tml-env", None, stored("tml-stored"), "tml-env", True),
    ("empty env falls to stored", "", None, stored("tml-stored"), "tml-stored", True),
    ("bad env key", "sk-nope", None, stored("tml-stored"), None, False),
    ("bad env key with command", "sk-nope", "echo tml-cmd", None, None, True),
    ("command only", None, "echo tml-cmd", None, None, True),
    ("command and stored", None, "echo tml-cmd", stored("tml-stored"), "tml-stored", True),
    ("stored key", None, None, stored("tml-stored"), "tml-stored", True),
    ("stored bad key", None, None, stored("sk-bad"), None, False),
    ("stored without default", None, None, stored("tml-stored", default=None), None, False),
    ("stored default missing", None, None, stored("tml-stored", default="zz"), None, False),
    ("stored not json", None, None, "{not json", None, False),
    ("env jwt", FRESH_JWT, None, None, FRESH_JWT, True),
    ("env expired jwt", EXPIRED_JWT, None, None, EXPIRED_JWT, True),
    ("env jwt without exp", NO_EXP_JWT, None, None, None, False),
    ("env garbage jwt", "eyJgarbage", "echo tml-cmd", None, None, False),
    ("stored jwt", None, None, stored(FRESH_JWT), FRESH_JWT, True),
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("env_key", "command", "stored_text", "token", "has"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_local_lookups_match_official(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    env_key: str | None,
    command: str | None,
    stored_text: str | None,
    token: str | None,
    has: bool,
) -> None:
    if env_key is not None:
        monkeypatch.setenv("TINKER_API_KEY", env_key)
    if command is not None:
        # a command that would leave a trace if it ran: lookups must never run it
        marker = home / "ran"
        monkeypatch.setenv("TINKER_CREDENTIAL_CMD", f"touch {marker}; {command}")
    if stored_text is not None:
        (home / ".tinker").mkdir()
        (home / ".tinker" / "credentials.json").write_text(stored_text)
    assert auth.get_tinker_token() == token
    assert auth.tinker_has_credentials() is has
    assert official_auth.get_tinker_token() == token
    assert official_auth.tinker_has_credentials() is has
    assert not (home / "ran").exists()


def test_exported_as_package_attribute() -> None:
    assert tinker_sync.auth is auth
    assert set(auth.__all__) == set(official_auth.__all__)


# -- raise_if_tinker_not_accessible ------------------------------------------------------------


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[LocalServer]:
    with LocalServer(backend="instant") as srv:
        monkeypatch.setenv("TINKER_BASE_URL", srv.url)
        yield srv
    reset_process_state()


def test_accessible_with_a_valid_key(server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    assert auth.raise_if_tinker_not_accessible() is None
    assert server.requests.count("get_server_capabilities") == 1


def test_rejected_key_is_an_authentication_error(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-wrong")
    with pytest.raises(AuthenticationError):
        auth.raise_if_tinker_not_accessible()
    assert server.requests.count("client/config") == 1  # not retried


def test_billing_failure_is_not_retried(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    server.faults.add("get_server_capabilities 402 x*")
    start = time.monotonic()
    with pytest.raises(BillingError):
        auth.raise_if_tinker_not_accessible()
    assert time.monotonic() - start < 10
    assert server.requests.count("get_server_capabilities") == 1


def test_missing_credentials_is_a_tinker_error(server: LocalServer) -> None:
    with pytest.raises(TinkerError):
        auth.raise_if_tinker_not_accessible()
    assert server.requests.count("get_server_capabilities") == 0


def test_unreachable_service_is_a_connection_error(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("TINKER_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    with pytest.raises(APIConnectionError):
        auth.raise_if_tinker_not_accessible()
