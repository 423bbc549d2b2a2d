"""Per-server settings read from the environment once: proxies and the CA bundle.

Usage::

    proxies, verify = environment_settings("https://tinker.example.com")
    pool_kw = tls_settings(verify)

Thread safety: pure functions (they read ``os.environ``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def _environment_settings(base_url: str) -> tuple[dict[str, str], bool | str]:
    """Proxies and CA bundle from the environment, resolved once per server.

    The variables ``requests`` honours, read once rather than per request: ``HTTP(S)_PROXY`` /
    ``ALL_PROXY`` unless ``NO_PROXY`` bypasses the host, and ``REQUESTS_CA_BUNDLE`` /
    ``CURL_CA_BUNDLE``. Returns ``(proxies by scheme, verify)``.
    """
    import urllib.request

    host = urllib.parse.urlsplit(base_url).hostname or ""
    found = urllib.request.getproxies()
    proxies: dict[str, str] = {}
    if found and not urllib.request.proxy_bypass(host):
        proxies = {k: v for k, v in found.items() if k in ("http", "https", "all")}
    verify: bool | str = (
        os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    )
    return proxies, verify


def _proxy_for(proxies: Mapping[str, str], scheme: str) -> str | None:
    return proxies.get(scheme) or proxies.get("all")


def _tls_settings(verify: bool | str) -> dict[str, Any]:
    """urllib3 keyword arguments for ``verify`` (True: the certifi bundle, as requests does)."""
    if verify is False:
        return {"cert_reqs": "CERT_NONE"}
    if verify is True:
        from requests.utils import DEFAULT_CA_BUNDLE_PATH  # certifi's bundle

        return {"cert_reqs": "CERT_REQUIRED", "ca_certs": DEFAULT_CA_BUNDLE_PATH}
    if os.path.isdir(verify):
        return {"cert_reqs": "CERT_REQUIRED", "ca_cert_dir": verify}
    return {"cert_reqs": "CERT_REQUIRED", "ca_certs": verify}
