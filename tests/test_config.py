"""Tests for tinker_sync._config: the environment, credential order, timeouts, base-URL
normalization and secrets (docs/design/behavior.md#environment,
docs/design/behavior.md#credential-order, docs/design/behavior.md#timeouts,
docs/design/behavior.md#limiter-registry, docs/design/behavior.md#secrets-never-leak)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import pickle
import shlex
import sys
import types
from pathlib import Path

import pytest

from tinker_sync._config import (
    DEFAULT_BASE_URL,
    ClientConfig,
    DynamicConfig,
    ServerConfig,
    Timeout,
    normalize_base_url,
    parse_tags,
    resolve_base_url,
    telemetry_enabled,
)
from tinker_sync._credentials import (
    CredentialAuth,
    Credentials,
    CredentialSource,
    Secret,
    StaticKeyAuth,
    jwt_claims,
    jwt_expiry,
)
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._runtime.redact import scrub
from tinker_sync.exceptions import MissingCredentialsError

KEY = "tml-unit-test-key-0123456789"
OTHER_KEY = "tml-other-key-abcdefghij"
WALL = 1_700_000_000.0


def make_jwt(exp: float, iat: float | None = None, **claims: object) -> str:
    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    payload: dict[str, object] = {"exp": exp, **claims}
    if iat is not None:
        payload["iat"] = iat
    return f"{b64({'alg': 'HS256', 'typ': 'JWT'})}.{b64(payload)}.c2lnbmF0dXJl"


@pytest.fixture
def no_creds_file(tmp_path: Path) -> Path:
    return tmp_path / "missing" / "credentials.json"


def write_creds(path: Path, key: str | None, *, default: str | None = "main") -> Path:
    keys = {} if key is None else {"main": {"type": "manual", "key": key, "name": "main"}}
    path.write_text(json.dumps({"version": 1, "default": default, "keys": keys}))
    return path


# ---------------------------------------------------------------------------------------------
# Timeout
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout", "expected"),
    [
        (Timeout(), (5.0, 60.0, 60.0, 60.0)),
        (Timeout(30.0), (5.0, 30.0, 30.0, 30.0)),
        (Timeout(2.0), (2.0, 2.0, 2.0, 2.0)),
        (Timeout(30.0, connect=1.5), (1.5, 30.0, 30.0, 30.0)),
        (Timeout(60, read=45, write=10, pool=3), (5.0, 45.0, 10.0, 3.0)),
        (Timeout(None), (5.0, None, None, None)),
        (Timeout.coerce(None), (5.0, 60.0, 60.0, 60.0)),
        (Timeout.coerce(30), (30.0, 30.0, 30.0, 30.0)),
        (Timeout.coerce(12.5), (12.5, 12.5, 12.5, 12.5)),
        (
            Timeout.coerce(types.SimpleNamespace(connect=2.0, read=9.0, write=None, pool=None)),
            (2.0, 9.0, 9.0, 9.0),
        ),
    ],
)
def test_timeout_parts(timeout: Timeout, expected: tuple[float | None, ...]) -> None:
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == expected
    assert timeout.as_tuple() == expected[:2]


def test_timeout_validation_and_identity() -> None:
    t = Timeout(10)
    assert Timeout.coerce(t) is t
    assert Timeout(10) == Timeout(10.0)
    with pytest.raises(ValueError):
        Timeout(0)
    with pytest.raises(ValueError):
        Timeout(10, connect=-1)
    with pytest.raises(TypeError):
        Timeout("10")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Timeout.coerce(True)
    with pytest.raises(TypeError):
        Timeout.coerce("60")
    with pytest.raises(AttributeError):
        t.read = 5.0  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Base URL: one normalization table for pools and limiters (docs/design/behavior.md#timeouts,
# docs/design/behavior.md#limiter-registry)
# ---------------------------------------------------------------------------------------------

NORMALIZATION_TABLE = [
    ("https://EXAMPLE.com:443/", "https://example.com"),
    ("https://example.com", "https://example.com"),
    ("HTTPS://Example.COM/", "https://example.com"),
    ("http://example.com:80", "http://example.com"),
    ("http://example.com:443", "http://example.com:443"),
    ("https://example.com:80/", "https://example.com:80"),
    (
        "https://example.com:8443/Services/Tinker-Prod/",
        "https://example.com:8443/Services/Tinker-Prod",
    ),
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://user:pw@host.test:9000/x//", "http://host.test:9000/x"),
    ("https://example.com/path?q=1#frag", "https://example.com/path"),
    ("http://[::1]:8080/", "http://[::1]:8080"),
    ("  https://example.com/  ", "https://example.com"),
    (DEFAULT_BASE_URL + "/", DEFAULT_BASE_URL),
]


@pytest.mark.parametrize(("url", "expected"), NORMALIZATION_TABLE)
def test_normalize_base_url(url: str, expected: str) -> None:
    assert normalize_base_url(url) == expected
    assert normalize_base_url(expected) == expected  # idempotent


@pytest.mark.parametrize("url", ["", "ftp://example.com", "https://", "http://host:notaport"])
def test_normalize_base_url_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        normalize_base_url(url)


@pytest.mark.parametrize(
    ("url", "suggestion"),
    [
        ("127.0.0.1:8000", "'http://127.0.0.1:8000'"),
        ("localhost:8000/api", "'http://localhost:8000/api'"),
        ("example.com", "'https://example.com'"),
        ("http:/127.0.0.1:8000", "'http://127.0.0.1:8000'"),
        ("https:example.com", "'https://example.com'"),
        ("http:///host.test", "'http://host.test'"),
    ],
)
def test_invalid_base_url_fails_at_construction_with_a_suggestion(
    url: str, suggestion: str
) -> None:
    """A URL that could only fail slowly on the network fails in ServiceClient() instead."""
    from tinker_sync import ServiceClient

    with pytest.raises(ValueError, match="did you mean") as info:
        ServiceClient(base_url=url, api_key="tml-x")
    assert suggestion in str(info.value)


def test_stall_timeout_knob_and_env() -> None:
    assert ClientConfig.from_env(api_key="tml-x", environ={}).stall_timeout == 600.0
    env = {"TINKER_STALL_TIMEOUT": "30"}
    assert ClientConfig.from_env(api_key="tml-x", environ=env).stall_timeout == 30.0
    got = ClientConfig.from_env(api_key="tml-x", environ=env, stall_timeout=5)
    assert got.stall_timeout == 5
    with pytest.raises(ValueError, match="TINKER_STALL_TIMEOUT"):
        ClientConfig.from_env(api_key="tml-x", environ={"TINKER_STALL_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="stall_timeout"):
        ClientConfig.from_env(api_key="tml-x", environ={}, stall_timeout=0)


@pytest.mark.parametrize(
    ("arg", "env", "expected"),
    [
        (None, {}, DEFAULT_BASE_URL),
        ("", {}, DEFAULT_BASE_URL),
        (None, {"TINKER_BASE_URL": ""}, DEFAULT_BASE_URL),
        ("", {"TINKER_BASE_URL": ""}, DEFAULT_BASE_URL),
        (None, {"TINKER_BASE_URL": "http://env.test/"}, "http://env.test"),
        ("", {"TINKER_BASE_URL": "http://env.test"}, "http://env.test"),
        ("http://arg.test//", {"TINKER_BASE_URL": "http://env.test"}, "http://arg.test"),
        ("http://Arg.test/Path/", {}, "http://Arg.test/Path"),
    ],
)
def test_resolve_base_url_precedence(arg: str | None, env: dict[str, str], expected: str) -> None:
    assert resolve_base_url(arg, env) == expected


# ---------------------------------------------------------------------------------------------
# Secret, JWT helpers
# ---------------------------------------------------------------------------------------------


def test_secret_is_redacted_everywhere() -> None:
    value = "plain-secret-value-xyz"  # does not look like a key: only registration hides it
    s = Secret(value)
    assert s.reveal() == value
    assert value not in repr(s) and value not in str(s) and value not in f"{s}"
    assert scrub(f"error with {value} inside") == "error with <redacted> inside"
    with pytest.raises(TypeError):
        pickle.dumps(s)
    assert s == Secret(value) and hash(s) == hash(Secret(value)) and s != Secret("other-value")
    assert s.sha256() == hashlib.sha256(value.encode()).hexdigest()
    assert not Secret("")
    with pytest.raises(TypeError):
        Secret(123)  # type: ignore[arg-type]


def test_jwt_helpers() -> None:
    token = make_jwt(WALL + 100, iat=WALL, sub="u")
    assert token.startswith("eyJ")
    assert jwt_claims(token)["sub"] == "u"
    assert jwt_expiry(token) == WALL + 100
    for bad in ["eyJ", "not.a.jwt", "eyJhbGciOiJub25lIn0.bm90IGpzb24.x"]:
        with pytest.raises(ValueError):
            jwt_claims(bad)
    with pytest.raises(ValueError):
        jwt_expiry(_jwt_without_exp())


def _jwt_without_exp() -> str:
    body = base64.urlsafe_b64encode(b'{"sub":"x"}').rstrip(b"=").decode()
    return f"eyJhbGciOiJIUzI1NiJ9.{body}.sig"


def _jwt_with_claims(claims: bytes) -> str:
    body = base64.urlsafe_b64encode(claims).rstrip(b"=").decode()
    return f"eyJhbGciOiJIUzI1NiJ9.{body}.sig"


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        (b'{"exp": 1700000000}', 1700000000.0),
        (b'{"exp": 1700000000.5}', 1700000000.5),
        (b'{"exp": "1700000000"}', 1700000000.0),  # float(exp), as the official client reads it
        (b'{"exp": true}', None),
        (b'{"exp": "soon"}', None),
        (b'{"exp": "nan"}', None),
        (b'{"exp": null}', None),
        (b'{"exp": [1]}', None),
    ],
)
def test_one_expiry_rule_for_static_keys_and_the_refresh_schedule(
    claims: bytes, expected: float | None
) -> None:
    """The static-key check and the JWT refresher read ``exp`` through the same parser."""
    from tinker_sync._session import jwt

    token = _jwt_with_claims(claims)
    if expected is None:
        with pytest.raises(ValueError, match="no numeric exp"):
            jwt_expiry(token)
    else:
        assert jwt_expiry(token) == expected
    assert jwt._expiry(token) == expected


# ---------------------------------------------------------------------------------------------
# Credentials (docs/design/behavior.md#environment, docs/design/behavior.md#credential-order)
# ---------------------------------------------------------------------------------------------


def creds(
    env: dict[str, str], path: Path, api_key: str | None = None, clock: FakeClock | None = None
) -> Credentials:
    return Credentials.from_env(
        api_key, environ=env, credentials_path=path, clock=clock or FakeClock(wall=WALL)
    )


def echo_cmd(text: str) -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(f'print({text!r})')}"


def test_precedence_argument_env_command_file(tmp_path: Path) -> None:
    stored = write_creds(tmp_path / "c.json", "tml-stored-key-123456")
    cmd = echo_cmd("tml-from-command-123456")
    full_env = {"TINKER_API_KEY": OTHER_KEY, "TINKER_CREDENTIAL_CMD": cmd}
    table = [
        # (argument, env, expected source, expected fetch)
        (KEY, full_env, CredentialSource.ARGUMENT, KEY),
        (None, full_env, CredentialSource.ENV, OTHER_KEY),
        ("", full_env, CredentialSource.ENV, OTHER_KEY),
        (
            None,
            {**full_env, "TINKER_API_KEY": ""},
            CredentialSource.COMMAND,
            "tml-from-command-123456",
        ),
        (None, {"TINKER_CREDENTIAL_CMD": cmd}, CredentialSource.COMMAND, "tml-from-command-123456"),
        (None, {"TINKER_CREDENTIAL_CMD": ""}, CredentialSource.STORED, "tml-stored-key-123456"),
        (None, {}, CredentialSource.STORED, "tml-stored-key-123456"),
    ]
    for arg, env, source, value in table:
        c = creds(env, stored, arg)
        assert c.source is source, (arg, env)
        assert c.fetch() == value, (arg, env)


def test_identity_is_hash_of_key_or_command(tmp_path: Path) -> None:
    path = tmp_path / "none.json"
    assert creds({}, path, KEY).identity == hashlib.sha256(KEY.encode()).hexdigest()
    cmd = echo_cmd("tml-from-command-123456")
    c = creds({"TINKER_CREDENTIAL_CMD": cmd}, path)
    assert c.identity == hashlib.sha256(cmd.encode()).hexdigest()
    assert creds({}, path, KEY).identity != creds({}, path, OTHER_KEY).identity


def test_missing_credential_is_lazy_and_names_the_variables(no_creds_file: Path) -> None:
    c = creds({}, no_creds_file)  # no error at construction
    with pytest.raises(MissingCredentialsError) as info:
        c.fetch()
    message = str(info.value)
    hints = ("api_key", "TINKER_API_KEY", "TINKER_CREDENTIAL_CMD", "tinker-sync serve")
    for hint in hints:
        assert hint in message
    assert info.value.outcome.value == "not_sent"
    with pytest.raises(MissingCredentialsError):
        _ = c.identity


def test_invalid_key_prefix(no_creds_file: Path) -> None:
    with pytest.raises(MissingCredentialsError, match="tml-"):
        creds({}, no_creds_file, "sk-wrong-prefix").fetch()
    # an invalid explicit key falls back to the command when one is set
    cmd = echo_cmd("tml-from-command-123456")
    c = creds({"TINKER_CREDENTIAL_CMD": cmd}, no_creds_file, "sk-wrong-prefix")
    assert c.source is CredentialSource.COMMAND


def test_credential_command_runs_on_every_fetch(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    counter.write_text("0")
    code = (
        f"import pathlib; p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) + 1; "
        "p.write_text(str(n)); print(f'tml-rotating-{n:06d}')"
    )
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    c = creds({"TINKER_CREDENTIAL_CMD": cmd}, tmp_path / "none.json")
    assert [c.fetch(), c.fetch()] == ["tml-rotating-000001", "tml-rotating-000002"]
    assert counter.read_text() == "2"


def test_credential_command_failures(no_creds_file: Path) -> None:
    empty = creds({"TINKER_CREDENTIAL_CMD": echo_cmd("")}, no_creds_file)
    with pytest.raises(MissingCredentialsError, match="empty"):
        empty.fetch()
    expired = creds({"TINKER_CREDENTIAL_CMD": echo_cmd(make_jwt(WALL - 1))}, no_creds_file)
    with pytest.raises(MissingCredentialsError, match="expired"):
        expired.fetch()


def test_static_jwt_expiry_checked_at_each_fetch(no_creds_file: Path) -> None:
    clock = FakeClock(wall=WALL)
    token = make_jwt(WALL + 100, iat=WALL)
    c = creds({}, no_creds_file, token, clock)
    assert c.fetch() == token
    clock.advance(100)
    with pytest.raises(MissingCredentialsError, match="expired"):
        c.fetch()
    bad = creds({}, no_creds_file, "eyJ-not-a-jwt", clock)
    with pytest.raises(MissingCredentialsError, match="JWT"):
        bad.fetch()


def test_static_key_for_servers_without_jwt(no_creds_file: Path) -> None:
    cmd_only = creds({"TINKER_CREDENTIAL_CMD": echo_cmd("tml-cmd-1234567")}, no_creds_file)
    with pytest.raises(MissingCredentialsError, match="TINKER_CREDENTIAL_CMD"):
        cmd_only.static_key()
    with pytest.raises(MissingCredentialsError):
        StaticKeyAuth(cmd_only).token()
    assert CredentialAuth(cmd_only).token() == "tml-cmd-1234567"
    assert StaticKeyAuth(creds({}, no_creds_file, KEY)).token() == KEY
    assert StaticKeyAuth(creds({}, no_creds_file, KEY)).replace(KEY) is None


def test_fetch_for_exchange_prefers_command_unless_key_is_jwt(no_creds_file: Path) -> None:
    cmd = echo_cmd("tml-cmd-1234567")
    c = creds({"TINKER_CREDENTIAL_CMD": cmd}, no_creds_file, KEY)
    assert c.fetch_for_exchange(False) == KEY
    assert c.fetch_for_exchange(True) == "tml-cmd-1234567"
    assert CredentialAuth(c, use_command=True).token() == "tml-cmd-1234567"
    jwt = make_jwt(WALL + 1000)
    assert creds({"TINKER_CREDENTIAL_CMD": cmd}, no_creds_file, jwt).fetch_for_exchange(True) == jwt
    with pytest.raises(MissingCredentialsError, match="dynamic credentials"):
        creds({}, no_creds_file, KEY).fetch_for_exchange(True)


def test_stored_credentials_file_layouts(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_creds(path, "tml-stored-key-123456")
    assert creds({}, path).fetch() == "tml-stored-key-123456"
    write_creds(path, "tml-stored-key-123456", default=None)
    with pytest.raises(MissingCredentialsError):
        creds({}, path).fetch()
    write_creds(path, "tml-stored-key-123456", default="other")
    with pytest.raises(MissingCredentialsError):
        creds({}, path).fetch()
    path.write_text("{not json")
    with pytest.raises(MissingCredentialsError, match="not valid JSON"):
        creds({}, path).fetch()
    write_creds(path, "bad-prefix-key")
    with pytest.raises(MissingCredentialsError, match="tml-"):
        creds({}, path).fetch()


def test_credentials_repr_and_pickle_hide_the_key(no_creds_file: Path) -> None:
    c = creds({}, no_creds_file, KEY)
    assert KEY not in repr(c)
    with pytest.raises(TypeError):
        pickle.dumps(c)


# ---------------------------------------------------------------------------------------------
# ClientConfig (docs/design/behavior.md#environment, docs/design/behavior.md#credential-order)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ()),
        ("", ()),
        ("a", ("a",)),
        ("a,b", ("a", "b")),
        (" b , a ,b,, a ", ("b", "a")),
        (",,", ()),
        ("x,y,x,z,y", ("x", "y", "z")),
    ],
)
def test_parse_tags(raw: str | None, expected: tuple[str, ...]) -> None:
    assert parse_tags(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, True),
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("Yes", True),
        ("on", True),
        (" on ", True),
        ("", False),
        ("0", False),
        ("false", False),
        ("off", False),
        ("enabled", False),
    ],
)
def test_telemetry_table(raw: str | None, expected: bool) -> None:
    assert telemetry_enabled(raw) is expected


def test_client_config_from_env(no_creds_file: Path) -> None:
    env = {
        "TINKER_BASE_URL": "http://EXAMPLE.com:80/base/",
        "TINKER_API_KEY": KEY,
        "TINKER_PROJECT_ID": "proj-env",
        "TINKER_TAGS": "a, b,a",
        "TINKER_TELEMETRY": "no",
        "TINKER_LOG": "DEBUG",
        "CLOUDFLARE_ACCESS_CLIENT_ID": "cf-id",
        "CLOUDFLARE_ACCESS_CLIENT_SECRET": "cf-secret-value-123",
    }
    config = ClientConfig.from_env(environ=env, credentials_path=no_creds_file)
    assert config.base_url == "http://EXAMPLE.com:80/base"
    assert config.normalized_base_url == "http://example.com/base"
    assert config.project_id == "proj-env"
    assert config.tags == ("a", "b")
    assert config.telemetry is False
    assert config.log_level == "debug"
    assert config.max_retries == 10
    assert config.timeout == Timeout(60.0, connect=5.0)
    assert config.credentials.fetch() == KEY
    assert config.credential_identity == hashlib.sha256(KEY.encode()).hexdigest()
    assert config.static_headers() == {
        "CF-Access-Client-Id": "cf-id",
        "CF-Access-Client-Secret": "cf-secret-value-123",
    }
    text = repr(config)
    assert KEY not in text and "cf-secret-value-123" not in text


def test_client_config_arguments_win(no_creds_file: Path) -> None:
    env = {"TINKER_PROJECT_ID": "proj-env", "TINKER_API_KEY": OTHER_KEY}
    config = ClientConfig.from_env(
        base_url="http://arg.test",
        api_key=KEY,
        project_id="proj-arg",
        timeout=30,
        max_retries=0,
        environ=env,
        credentials_path=no_creds_file,
    )
    assert config.project_id == "proj-arg"
    assert config.credentials.fetch() == KEY
    assert config.timeout.as_tuple() == (30.0, 30.0)
    assert config.max_retries == 0
    empty = ClientConfig.from_env(project_id="", environ={"TINKER_PROJECT_ID": ""})
    assert empty.project_id is None
    assert empty.base_url == DEFAULT_BASE_URL
    assert empty.tags == () and empty.telemetry is True and empty.log_level is None
    with pytest.raises(ValueError):
        ClientConfig.from_env(max_retries=-1, environ={})
    with pytest.raises(ValueError):
        ClientConfig.from_env(base_url="ftp://nope", environ={})


def test_headers_merge_overrides_win_case_insensitively() -> None:
    env = {
        "CLOUDFLARE_ACCESS_CLIENT_ID": "cf-id",
        "CLOUDFLARE_ACCESS_CLIENT_SECRET": "cf-sec-12345",
    }
    config = ClientConfig.from_env(
        default_headers={"X-A": "1", "x-b": "1", "X-Api-Key": "user-key-value"},
        default_headers_overrides={"x-a": "2", "cf-access-client-id": "mine"},
        environ=env,
    )
    assert config.user_headers == {
        "x-a": "2",
        "x-b": "1",
        "X-Api-Key": "user-key-value",
        "cf-access-client-id": "mine",
    }
    static = config.static_headers()
    assert static["cf-access-client-id"] == "mine"
    assert "CF-Access-Client-Id" not in static
    assert static["CF-Access-Client-Secret"] == "cf-sec-12345"
    assert "user-key-value" not in repr(config)
    with pytest.raises(TypeError):
        ClientConfig.from_env(default_headers={"X": 1}, environ={})  # type: ignore[dict-item]


def test_env_is_read_only_at_construction(no_creds_file: Path) -> None:
    env = {"TINKER_API_KEY": KEY, "TINKER_TAGS": "a"}
    config = ClientConfig.from_env(environ=env, credentials_path=no_creds_file)
    env["TINKER_API_KEY"] = OTHER_KEY
    env["TINKER_TAGS"] = "b"
    assert config.credentials.fetch() == KEY
    assert config.tags == ("a",)


def test_client_config_pickle_carries_no_secret(
    monkeypatch: pytest.MonkeyPatch, no_creds_file: Path
) -> None:
    config = ClientConfig.from_env(
        api_key=KEY,
        project_id="p",
        default_headers_overrides={"X-Trace": "t", "X-Session-Token": "tok-secret-999"},
        timeout=Timeout(20, connect=2),
        environ={
            "TINKER_TAGS": "x,y",
            "CLOUDFLARE_ACCESS_CLIENT_ID": "cf-id",
            "CLOUDFLARE_ACCESS_CLIENT_SECRET": "cf-sec-abcdef",
        },
        credentials_path=no_creds_file,
    )
    data = pickle.dumps(config)
    for secret in (KEY, "cf-sec-abcdef", "tok-secret-999"):
        assert secret.encode() not in data
    # the receiving process resolves its own credentials and Cloudflare secret
    monkeypatch.setenv("TINKER_API_KEY", OTHER_KEY)
    monkeypatch.setenv("CLOUDFLARE_ACCESS_CLIENT_SECRET", "child-cf-secret")
    clone = pickle.loads(data)
    assert clone.credentials.fetch() == OTHER_KEY
    assert clone.project_id == "p" and clone.tags == ("x", "y")
    assert clone.user_headers == {"X-Trace": "t"}
    assert clone.timeout.as_tuple() == (2.0, 20.0)
    assert clone.static_headers()["CF-Access-Client-Secret"] == "child-cf-secret"
    assert clone.normalized_base_url == config.normalized_base_url


# ---------------------------------------------------------------------------------------------
# ServerConfig / DynamicConfig
# ---------------------------------------------------------------------------------------------


def test_server_config_defaults_match_the_official_sdk() -> None:
    official = pytest.importorskip("tinker.types").ClientConfigResponse()
    ours = ServerConfig.from_dict({})
    for name, value in official.model_dump().items():
        assert getattr(ours, name) == value, name
    assert ServerConfig.from_dict(None) == ours


def test_server_config_is_lenient(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tinker_sync.config")
    config = ServerConfig.from_dict(
        {
            "pjwt_auth_enabled": True,
            "credential_default_source": "credential_cmd",
            "fwdbwd_max_chunk_len": 16.0,  # whole float accepted
            "sample_max_concurrent_requests": "many",  # wrong type -> default + warning
            "parallel_fwdbwd_chunks": 0,  # ints are not bools
            "billing_exception_max_pause_duration_sec": True,  # bools are not ints
            "proto_compress_fwdbwd": None,  # null -> default, silently
            "brand_new_flag": 1,  # unknown -> ignored
        }
    )
    assert config.pjwt_auth_enabled is True
    assert config.uses_credential_command
    assert config.fwdbwd_max_chunk_len == 16
    assert config.sample_max_concurrent_requests == 2000
    assert config.parallel_fwdbwd_chunks is True
    assert config.billing_exception_max_pause_duration_sec == 3600
    assert config.proto_compress_fwdbwd is False
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3
    assert any("sample_max_concurrent_requests" in m for m in warned)
    assert "brand_new_flag" not in config.to_dict()
    assert ServerConfig.from_dict(["not", "a", "dict"]) == ServerConfig()  # type: ignore[arg-type]


def test_dynamic_config() -> None:
    d = DynamicConfig.from_dict({"refresh_interval_sec": 3, "sample_cancel_enabled": True})
    assert d.refresh_interval_sec == 3 and d.refresh_every == 10.0
    assert d.sample_cancel_enabled is True and d.sample_cancel_max_batch_size == 64
    assert DynamicConfig().refresh_every == 300.0
    assert DynamicConfig.from_dict({"refresh_interval_sec": 1.5}).refresh_interval_sec == 300
