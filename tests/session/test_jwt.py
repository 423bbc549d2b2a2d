"""Tests for tinker_sync._session.jwt: JWT caching and refresh windows on the fake clock
(docs/design/behavior.md#jwt-auth)."""

from __future__ import annotations

import base64
import json
import math
import threading

import pytest

from tinker_sync._config import ClientConfig, ServerConfig
from tinker_sync._credentials import StaticKeyAuth
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._session.jwt import JwtAuth, make_auth
from tinker_sync._transport import Transport
from tinker_sync.exceptions import APIConnectionError, AuthenticationError, ResponseSnapshot

WALL = 1_700_000_000.0
LIFETIME = 3600.0


def make_jwt(iat: float, exp: float, n: int) -> str:
    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'HS256'})}.{b64({'iat': iat, 'exp': exp, 'n': n})}.sig{n}"


class Exchanger:
    """A token exchange double: mints JWTs from the fake clock; can be told to fail."""

    def __init__(self, clock: FakeClock, lifetime: float = LIFETIME) -> None:
        self.clock = clock
        self.lifetime = lifetime
        self.calls = 0
        self.fail_with: BaseException | None = None
        self.gate: threading.Event | None = None

    def __call__(self) -> str:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(60)
        if self.fail_with is not None:
            raise self.fail_with
        now = self.clock.time()
        return make_jwt(now, now + self.lifetime, self.calls)


def setup(rng: float = 0.0) -> tuple[JwtAuth, Exchanger, FakeClock]:
    clock = FakeClock(wall=WALL, rng=lambda: rng)
    exchange = Exchanger(clock)
    return JwtAuth(exchange, clock=clock), exchange, clock


def n_of(token: str) -> int:
    payload = token.split(".")[1]
    return int(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["n"])


def test_first_use_exchanges_once_and_caches() -> None:
    auth, exchange, _ = setup()
    assert auth.tick() == math.inf  # nothing to refresh before first use
    token = auth.token()
    assert n_of(token) == 1
    assert auth.token() == token and auth.token() == token
    assert exchange.calls == 1 == auth.exchanges


@pytest.mark.parametrize(("rng", "fraction"), [(0.0, 0.45), (1.0, 0.55), (0.5, 0.50)])
def test_background_refresh_at_45_to_55_percent(rng: float, fraction: float) -> None:
    auth, exchange, clock = setup(rng)
    auth.token()
    due = LIFETIME * fraction
    assert auth.next_refresh_in() == pytest.approx(due)
    clock.advance(due - 1)
    assert auth.tick() == pytest.approx(1.0)
    assert exchange.calls == 1
    clock.advance(1)
    next_in = auth.tick()
    assert exchange.calls == 2
    assert next_in == pytest.approx(due)  # rescheduled from the new token
    assert n_of(auth.token()) == 2


def test_on_demand_refresh_when_60_seconds_remain() -> None:
    auth, exchange, clock = setup()
    auth.token()
    clock.advance(LIFETIME - 61)  # background refresh never ran (no tick)
    assert n_of(auth.token()) == 1
    clock.advance(1)  # exactly 60 s left: refresh on demand
    assert n_of(auth.token()) == 2
    assert exchange.calls == 2


def test_failed_background_refresh_retries_in_60s_and_keeps_token() -> None:
    auth, exchange, clock = setup()
    first = auth.token()
    clock.advance(LIFETIME * 0.45)
    exchange.fail_with = APIConnectionError("down")
    assert auth.tick() == pytest.approx(60.0)
    assert auth.token() == first  # still valid, still used
    clock.advance(30)
    assert auth.tick() == pytest.approx(30.0)
    assert exchange.calls == 2
    clock.advance(30)
    exchange.fail_with = None
    auth.tick()
    assert exchange.calls == 3
    assert n_of(auth.token()) == 3


def test_failed_on_demand_refresh_keeps_token_until_expiry() -> None:
    auth, exchange, clock = setup()
    first = auth.token()
    clock.advance(LIFETIME - 30)
    exchange.fail_with = APIConnectionError("down")
    assert auth.token() == first  # 30 s left: refresh failed, the cached token is kept
    clock.advance(30)
    with pytest.raises(APIConnectionError):  # expired and the refresh fails: no token to send
        auth.token()


def test_rejected_credential_is_raised_on_demand() -> None:
    auth, exchange, clock = setup()
    auth.token()
    clock.advance(LIFETIME - 10)
    exchange.fail_with = AuthenticationError(
        "Error code: 401", response=ResponseSnapshot(401, {}, b"{}")
    )
    with pytest.raises(AuthenticationError):
        auth.token()


def test_background_auth_rejection_near_expiry_stops_refresh() -> None:
    auth, exchange, clock = setup()
    auth.token()
    clock.advance(LIFETIME - 100)  # 100 s left: 100 - 60 <= 60
    exchange.fail_with = AuthenticationError("no", response=ResponseSnapshot(401, {}, b""))
    assert auth.tick() == math.inf


def test_replace_is_single_flight() -> None:
    auth, exchange, _ = setup()
    rejected = auth.token()
    exchange.gate = threading.Event()
    barrier = threading.Barrier(5)
    results: list[str | None] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        new = auth.replace(rejected)
        with lock:
            results.append(new)

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for t in threads:
        t.start()
    exchange.gate.set()
    for t in threads:
        t.join(60)
    assert exchange.calls == 2  # the initial exchange + exactly one replacement
    assert len(set(results)) == 1 and n_of(results[0] or "") == 2
    assert auth.replace("some-older-token") == results[0]


def test_concurrent_first_use_shares_one_exchange() -> None:
    auth, exchange, _ = setup()
    exchange.gate = threading.Event()
    barrier = threading.Barrier(8)
    tokens: list[str] = []

    def worker() -> None:
        barrier.wait()
        tokens.append(auth.token())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    exchange.gate.set()
    for t in threads:
        t.join(60)
    assert exchange.calls == 1 and len(set(tokens)) == 1


def test_unparsable_jwt_is_refreshed_every_minute() -> None:
    clock = FakeClock(wall=WALL)
    calls = []

    def exchange() -> str:
        calls.append(1)
        return "eyJnot-a-real-jwt"

    auth = JwtAuth(exchange, clock=clock)
    assert auth.token() == "eyJnot-a-real-jwt"
    assert auth.next_refresh_in() == pytest.approx(60.0)


def test_close_stops_background_refresh() -> None:
    auth, exchange, clock = setup()
    auth.token()
    auth.close()
    clock.advance(LIFETIME)
    assert auth.tick() == math.inf
    assert exchange.calls == 1


def test_make_auth_picks_static_or_jwt() -> None:
    config = ClientConfig.from_env(
        base_url="http://127.0.0.1:9", api_key="tml-abcdefgh", environ={}
    )
    transport = Transport(config)
    try:
        assert isinstance(make_auth(config.credentials, ServerConfig(), transport), StaticKeyAuth)
        jwt_auth = make_auth(config.credentials, ServerConfig(pjwt_auth_enabled=True), transport)
        assert isinstance(jwt_auth, JwtAuth)
        assert isinstance(jwt_auth, JwtAuth) and "tml-" not in repr(jwt_auth)
        jwt_auth.close()
    finally:
        transport.close()
