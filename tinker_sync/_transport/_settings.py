"""Connection settings: proxies and the CA bundle (read from the environment once per server),
and the urllib3 keyword arguments every pool of a traffic type is built with.

Usage::

    proxies, verify = _environment_settings("https://tinker.example.com")
    kw = connection_settings(maxsize, verify, Pool.SAMPLE)   # -> PoolManager(**kw)

Where to change how connections behave (all documented urllib3 knobs, one place each):

* TCP options (``TCP_NODELAY``, keepalive, ...): :func:`socket_options`, per traffic type.
* TLS verification: :func:`ca_locations` (both request paths), :func:`_tls_settings` (urllib3's).
* Timeouts are per request (``RequestSpec.timeout`` or the client's), turned into a
  ``urllib3.Timeout`` by the exchange; pools carry none of their own.

Thread safety: pure functions (they read ``os.environ``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from urllib3 import ProxyManager

    from tinker_sync._transport._models import Pool

SocketOption = tuple[int, int, int | bytes]
#: Certificate verification: True (certifi's bundle) or a CA bundle file or directory. It cannot
#: be turned off (docs/transport.md#certificate-verification).
Verify = Literal[True] | str


def _environment_settings(base_url: str) -> tuple[dict[str, str], Verify]:
    """Proxies and CA bundle from the environment, resolved once per server.

    The variables ``requests`` honours, read once rather than per request: ``HTTP(S)_PROXY`` /
    ``ALL_PROXY`` unless ``NO_PROXY`` bypasses the host, and ``REQUESTS_CA_BUNDLE`` /
    ``CURL_CA_BUNDLE``. Returns ``(proxies by scheme, verify)``.
    """
    proxies: dict[str, str] = {}
    if _may_have_proxies():
        import urllib.request

        host = urllib.parse.urlsplit(base_url).hostname or ""
        found = urllib.request.getproxies()
        if found and not urllib.request.proxy_bypass(host):
            proxies = {k: v for k, v in found.items() if k in ("http", "https", "all")}
    verify: Verify = (
        os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    )
    return proxies, verify


def _may_have_proxies() -> bool:
    """False when ``urllib.request.getproxies()`` is sure to be empty: elsewhere than macOS and
    Windows (whose system settings it also reads) it reads only the non-empty ``*_proxy``
    variables (any case). Spares a first sample importing urllib.request, http.client and
    email (docs/scale-out.md#start-up)."""
    if sys.platform == "darwin" or os.name == "nt":
        return True
    return any(value and name.lower().endswith("_proxy") for name, value in os.environ.items())


def _proxy_for(proxies: Mapping[str, str], scheme: str) -> str | None:
    return proxies.get(scheme) or proxies.get("all")


def ca_locations(verify: Verify) -> dict[str, str]:
    """Where the CA certificates for ``verify`` are, in urllib3's keyword names: ``ca_certs``
    (a bundle file; True means certifi's, as requests does) or ``ca_cert_dir``. The one mapping
    both request paths use (docs/transport.md)."""
    if verify is True:
        from requests.utils import DEFAULT_CA_BUNDLE_PATH  # certifi's bundle

        return {"ca_certs": DEFAULT_CA_BUNDLE_PATH}
    if os.path.isdir(verify):
        return {"ca_cert_dir": verify}
    return {"ca_certs": verify}


def _tls_settings(verify: Verify) -> dict[str, Any]:
    """urllib3 keyword arguments for ``verify`` (see :func:`ca_locations`)."""
    return {"cert_reqs": "CERT_REQUIRED", **ca_locations(verify)}


#: TCP keepalive on every connection: probe after 15 s of silence, every 5 s, give up after 3
#: unanswered probes, so a peer that vanished (a half-open connection under a long poll or a
#: pooled connection) is noticed in about 30 s instead of the system's two hours.
KEEPALIVE_IDLE_S = 15
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3


def _keepalive_options() -> list[SocketOption]:
    """``SO_KEEPALIVE`` plus the timing options this platform's ``socket`` module has."""
    options: list[SocketOption] = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    # Linux and recent macOS/Windows name the idle time TCP_KEEPIDLE; older macOS TCP_KEEPALIVE.
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    for name, value in (
        (idle, KEEPALIVE_IDLE_S),
        (getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_S),
        (getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_COUNT),
    ):
        if name is not None:
            options.append((socket.IPPROTO_TCP, name, value))
    return options


URLLIB3_DEFAULT_OPTIONS: list[SocketOption] = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
"""urllib3's ``HTTPConnection.default_socket_options`` (``TCP_NODELAY``; a test holds them
equal), spelled out so the direct path does not load urllib3 (docs/scale-out.md#start-up)."""


def socket_options(pool: Pool | None = None) -> list[SocketOption]:
    """The ``setsockopt`` calls for every new connection of ``pool`` (urllib3's
    ``socket_options``): urllib3's defaults (``TCP_NODELAY``) plus TCP keepalive."""
    return [*URLLIB3_DEFAULT_OPTIONS, *_keepalive_options()]


def connection_settings(
    size: int, verify: Verify | None, pool: Pool | None = None
) -> dict[str, Any]:
    """Keyword arguments for the urllib3 pool manager of one traffic type.

    ``size`` connections are kept per origin and more are opened when needed (``block=False``,
    so a request never waits for a connection); urllib3 retries nothing (the SDK owns retries);
    ``verify`` is None for plain HTTP, else as for :func:`_tls_settings`.
    """
    kw: dict[str, Any] = {
        "maxsize": size,
        "block": False,
        "retries": False,
        "socket_options": socket_options(pool),
    }
    if verify is not None:
        kw.update(_tls_settings(verify))
    return kw


SOCKS_MISSING = (
    "A SOCKS proxy is configured (HTTPS_PROXY / HTTP_PROXY / ALL_PROXY) but PySocks is not "
    "installed: pip install 'tinker-sync[socks]'"
)


def socks_manager() -> type[ProxyManager]:
    """urllib3's SOCKS proxy manager; ImportError naming the ``socks`` extra without PySocks."""
    # urllib3 imports PySocks (module ``socks``) itself, but only warns when it is missing.
    if importlib.util.find_spec("socks") is None:
        raise ImportError(SOCKS_MISSING)
    from urllib3.contrib.socks import SOCKSProxyManager

    return SOCKSProxyManager  # type: ignore[return-value]


def check_proxies(proxies: Mapping[str, str], base_url: str) -> None:
    """Fail now (before anything is sent) if the proxy for ``base_url`` cannot be used."""
    proxy = _proxy_for(proxies, urllib.parse.urlsplit(base_url).scheme or "http")
    if proxy is not None and proxy.lower().startswith("socks"):
        socks_manager()
