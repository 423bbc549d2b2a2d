"""One HTTP exchange on urllib3: send, read the whole reply, follow redirects.

Thread safety: stateless functions; urllib3 pools are thread-safe.
"""

from __future__ import annotations

import errno
import functools
import http.client
import io
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import cast

import urllib3.exceptions
import urllib3.response
from urllib3 import Timeout as _Urllib3Timeout
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.util.ssl_match_hostname import CertificateError

from tinker_sync._config import Timeout
from tinker_sync._redact import is_secret_header
from tinker_sync._transport._headers import _COALESCE_LIMIT, _PreparedHeaders
from tinker_sync._transport._pools import _Route
from tinker_sync.exceptions import APIConnectionError

MAX_REDIRECTS = 30
"""Redirects followed per attempt (as requests does); one more is a connection error."""
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@functools.lru_cache(maxsize=64)
def _timeout(timeout: Timeout) -> _Urllib3Timeout:
    return _Urllib3Timeout(connect=timeout.connect, read=timeout.read)


class _Response:
    """A fully read response: status, lower-cased (merged) headers and the decoded body."""

    __slots__ = ("content", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status = status
        self.headers = headers
        self.content = content


def _via_manager(
    route: _Route,
    method: str,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: Timeout,
) -> _Response:
    """One exchange through urllib3's pool manager: proxies, and redirects to any origin."""
    response = route.manager.urlopen(
        method,
        url,
        body=body,
        headers=headers,
        timeout=_timeout(timeout),
        retries=False,
        redirect=False,
    )
    merged = {k.lower(): v for k, v in response.headers.itermerged()}
    return _Response(response.status, merged, response.data)


def _exchange_pooled(
    pool: HTTPConnectionPool,
    method: str,
    target: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: Timeout,
) -> _Response:
    """One request on a connection of ``pool`` (no proxy), read with ``http.client``.

    urllib3 still owns the connections (pooling, dropped-connection checks, TCP and TLS setup,
    the in-flight tracking of B55); this replaces only ``urlopen`` and its response wrapper,
    which together cost as much client CPU as the HTTP exchange itself. The steps and error
    handling follow urllib3's ``_make_request``: connect errors surface as urllib3's
    (never-sent) connect errors, a reset while sending still reads the reply the server may
    have sent, and on any failure the connection is closed, never reused.
    """
    conn = cast(HTTPConnection, pool._get_conn())
    reusable = False
    try:
        if conn.is_closed:
            conn.timeout = timeout.connect
            try:
                conn.connect()
            except (ssl.SSLError, CertificateError) as exc:
                raise urllib3.exceptions.SSLError(exc) from exc
        conn.timeout = timeout.read
        conn.sock.settimeout(timeout.read)
        if body and len(body) <= _COALESCE_LIMIT and isinstance(conn, _PreparedHeaders):
            conn.hold_head()
        try:
            http.client.HTTPConnection.request(conn, method, target, body, headers)
        except BrokenPipeError:
            pass  # the server may close after a complete early reply: read it
        except OSError as exc:
            if exc.errno not in (errno.EPROTOTYPE, errno.ECONNRESET):
                raise
        raw = http.client.HTTPConnection.getresponse(conn)
        content = raw.read()
        reusable = True  # http.client closed the socket itself if the server asked to
    finally:
        if not reusable:
            conn.close()
        pool._put_conn(conn if reusable else None)
    merged: dict[str, str] = {}
    for name, value in raw.msg.items():
        key = name.lower()
        merged[key] = f"{merged[key]}, {value}" if key in merged else value
    encoding = merged.get("content-encoding")
    if encoding and encoding.strip().lower() != "identity":
        content = urllib3.response.HTTPResponse(
            body=io.BytesIO(content), headers=merged, status=raw.status, preload_content=True
        ).data  # urllib3's decoders (gzip, deflate, and br / zstd when installed)
    return _Response(raw.status, merged, content)


def exchange(
    route: _Route,
    method: str,
    target: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: Timeout,
) -> tuple[_Response, str]:
    """One HTTP exchange, following redirects; returns the fully read response and its URL.

    The body is read (and decoded) before returning, which hands the connection back to its
    pool. Cross-origin redirects drop secret headers; 301/302/303 turn into a bodyless GET
    like a browser (and requests) would. Requests through a proxy, and redirects, go through
    urllib3's pool manager (:func:`_via_manager`); the rest through :func:`_exchange_pooled`.
    """
    if route.forward or route.origin.proxy is not None:
        response = _via_manager(route, method, url, body, headers, timeout)
    else:
        response = _exchange_pooled(route.origin, method, target, body, headers, timeout)
    redirects = 0
    while response.status in _REDIRECT_STATUSES:
        location = response.headers.get("location")
        if not location:
            break
        if redirects >= MAX_REDIRECTS:
            raise APIConnectionError(f"{method} {url}: more than {MAX_REDIRECTS} redirects")
        redirects += 1
        new_url = urllib.parse.urljoin(url, location)
        status = response.status
        if (status in (302, 303) and method != "HEAD") or (status == 301 and method == "POST"):
            method = "GET"
        if status not in (307, 308):
            body = None
            headers = {
                k: v
                for k, v in headers.items()
                if k.lower() not in ("content-type", "content-length", "transfer-encoding")
            }
        if _crosses_origin(url, new_url):
            headers = {k: v for k, v in headers.items() if not is_secret_header(k)}
        url = new_url
        response = _via_manager(route, method, url, body, headers, timeout)
    return response, url


def _crosses_origin(old_url: str, new_url: str) -> bool:
    """Whether credentials must be dropped on a redirect from ``old_url`` to ``new_url``.

    Like requests: another host, port or scheme does, except the http -> https upgrade on
    default ports of the same host.
    """
    old, new = urllib.parse.urlsplit(old_url), urllib.parse.urlsplit(new_url)
    if old.hostname != new.hostname:
        return True
    if (
        (old.scheme, new.scheme) == ("http", "https")
        and old.port in (80, None)
        and (new.port in (443, None))
    ):
        return False
    default = {"http": 80, "https": 443}
    return old.scheme != new.scheme or (old.port or default.get(old.scheme)) != (
        new.port or default.get(new.scheme)
    )
