"""Proxy and CA-bundle variables are honoured, resolved once per server (not per request)."""

from __future__ import annotations

import pytest

from tinker_sync._transport import HttpPools, Pool
from tinker_sync._transport._pools import _Route
from tinker_sync._transport._settings import _environment_settings


@pytest.fixture(autouse=True)
def _clean_proxy_env(monkeypatch):
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    ):
        monkeypatch.delenv(name, raising=False)


def test_proxy_from_the_environment_is_used(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    proxies, verify = _environment_settings("https://tinker.example.com/services/x")
    assert proxies == {"https": "http://proxy.example:3128"}
    assert verify is True


def test_no_proxy_bypasses_the_host(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "tinker.example.com,127.0.0.1")
    assert _environment_settings("https://tinker.example.com")[0] == {}
    assert _environment_settings("http://127.0.0.1:8000")[0] == {}


def test_ca_bundle_is_read_once_per_server(monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/custom.pem")
    pools = HttpPools("https://tinker.example.com")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/changed-later.pem")
    route = pools.route(Pool.TRAIN)
    assert route.origin.ca_certs == "/etc/ssl/custom.pem"
    assert route.origin.cert_reqs == "CERT_REQUIRED"
    pools.close()


def test_default_ca_bundle_is_certifi_like_requests():
    import requests.utils

    route = _Route("https://tinker.example.com", 4, None, ({}, True))
    assert route.origin.ca_certs == requests.utils.DEFAULT_CA_BUNDLE_PATH
    route.close()


def test_proxied_routes(monkeypatch):
    tunnel = _Route("https://tinker.example.com", 4, None, ({"https": "http://proxy:3128"}, True))
    assert not tunnel.forward  # CONNECT tunnel: path-only requests on the origin pool
    assert tunnel.origin.proxy is not None and tunnel.origin.proxy.host == "proxy"
    forward = _Route("http://tinker.example.com", 4, None, ({"all": "http://proxy:3128"}, True))
    assert forward.forward  # plain HTTP via a proxy: absolute URLs through the manager
    direct = _Route("http://tinker.example.com", 4, None, ({"https": "http://proxy:3128"}, True))
    assert not direct.forward and direct.origin.proxy is None
    for route in (tunnel, forward, direct):
        route.close()


def test_a_socks_proxy_without_pysocks_fails_before_sending_naming_the_extra(monkeypatch):
    import importlib.util

    monkeypatch.setenv("ALL_PROXY", "socks5://user:pw@proxy.example:1080")
    if importlib.util.find_spec("socks") is None:
        with pytest.raises(ImportError, match=r"tinker-sync\[socks\]") as info:
            HttpPools("https://tinker.example.com")
        assert "pw" not in str(info.value)  # the proxy URL (and its password) is not shown
    else:
        pools = HttpPools("https://tinker.example.com")
        assert type(pools.route(Pool.TRAIN).manager).__name__ == "SOCKSProxyManager"
        pools.close()


def test_connections_get_urllib3s_socket_options_plus_keepalive():
    import socket

    from urllib3.connection import HTTPConnection

    route = _Route("http://tinker.example.com", 4, None, ({}, True), Pool.SAMPLE)
    options = route.origin.conn_kw["socket_options"]
    route.close()
    assert options[: len(HTTPConnection.default_socket_options)] == (
        HTTPConnection.default_socket_options
    )
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in options
    # every option is one the platform accepts, and reads back as set
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as sock,
    ):
        for level, name, value in options:
            sock.setsockopt(level, name, value)
            assert sock.getsockopt(level, name) == value
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux: a vanished peer is noticed in ~30 s
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 15
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"HTTP_PROXY": ""},  # empty: ignored, as urllib.request ignores it
        {"no_proxy": "*"},  # a bypass list alone names no proxy
        {"Https_Proxy": "http://proxy.example:3128"},  # any case
        {"ftp_proxy": "http://proxy.example:21"},  # a scheme the SDK does not use
    ],
)
def test_proxy_lookup_without_urllib_request_finds_what_it_would(monkeypatch, env):
    """The proxy lookup skips importing urllib.request only when getproxies() would find
    nothing, so the proxies found are the same either way (docs/scale-out.md#start-up)."""
    import urllib.request

    from tinker_sync._transport._settings import _may_have_proxies

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _may_have_proxies() == bool(urllib.request.getproxies())
    expected = {
        k: v for k, v in urllib.request.getproxies().items() if k in ("http", "https", "all")
    }
    assert _environment_settings("https://tinker.example.com")[0] == expected


def test_a_direct_route_builds_urllib3s_pools_on_first_use():
    """With a direct pool, the urllib3 pool manager (and urllib3) waits for a request that
    needs it, e.g. a redirect; a route without one builds it at once (docs/scale-out.md)."""
    from tinker_sync._transport._direct import HAVE_HTTPTOOLS

    route = _Route("http://tinker.example.com", 4, None, ({}, True), Pool.SAMPLE)
    assert (route.direct is not None) == HAVE_HTTPTOOLS
    assert (route._manager is None) == HAVE_HTTPTOOLS
    assert route.origin.host == "tinker.example.com" and route._manager is route.manager
    route.close()
    proxied = _Route("http://tinker.example.com", 4, None, ({"all": "http://proxy:3128"}, True))
    assert proxied.direct is None and proxied._manager is not None
    proxied.close()
