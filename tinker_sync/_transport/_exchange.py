"""One HTTP exchange: send, read the whole reply, follow redirects.

Usage::

    response, url = exchange(route, "POST", "/api/v1/asample", url, body, headers, timeout)
    response.status, response.headers["content-type"], response.content

A request to the base URL's origin takes the route's direct pool when it has one (``_direct``,
docs/transport.md). Otherwise it is one ``urlopen`` call on the route's pool for the origin
(or on the pool manager, for a plain-HTTP proxy and for redirects), with urllib3's retries and
redirects off (the SDK owns both), the per-request ``(connect, read)`` timeout, and the body
read in full before returning (``preload_content``), which hands the connection back to its
pool. Nothing here touches urllib3's or http.client's private parts; the cheap options are
chosen instead: the request target is already a path (no URL parsing, no same-host check) and
the retry and timeout objects are built once, not per request.

Thread safety: stateless functions; urllib3 pools are thread-safe.
"""

from __future__ import annotations

import functools
import time
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tinker_sync._config import Timeout
from tinker_sync._runtime.redact import is_secret_header
from tinker_sync._transport._connection import DEADLINES
from tinker_sync._transport._pools import _Route
from tinker_sync._transport._replies import (
    attempt_deadline,
    check_length,
    decode,
    protocol_error,
    too_large,
)
from tinker_sync.exceptions import APIConnectionError

if TYPE_CHECKING:  # urllib3 loads with the first urllib3 pool (docs/scale-out.md#start-up)
    from urllib3 import BaseHTTPResponse
    from urllib3 import Timeout as _Urllib3Timeout
    from urllib3.util import Retry

MAX_REDIRECTS = 30
"""Redirects followed per attempt (as requests does); one more is a connection error."""
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@functools.cache
def _no_retries() -> Retry:
    """urllib3 retries nothing and raises the original error (urllib3 reuses this object as
    is)."""
    from urllib3.util import Retry

    return Retry(total=False, redirect=False)


@functools.lru_cache(maxsize=64)
def _timeout(timeout: Timeout) -> _Urllib3Timeout:
    from urllib3 import Timeout as _Urllib3Timeout

    return _Urllib3Timeout(connect=timeout.connect, read=timeout.read)


class _Response:
    """A fully read response: status, lower-cased (merged) headers and the decoded body."""

    __slots__ = ("content", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status = status
        self.headers = headers
        self.content = content


_READ_STEP = 256 * 1024


def _read(response: BaseHTTPResponse, limit: int, deadline: float | None) -> _Response:
    """Read a urllib3 reply's raw body under the cap and the deadline (checked between reads)
    and decode it. A 101 or a reply with both ``Content-Length`` and ``Transfer-Encoding`` is
    refused and its connection closed (never another request's reply)."""
    headers = {name.lower(): value for name, value in response.headers.itermerged()}
    try:
        if response.status == 101:
            raise protocol_error("unexpected 101 Switching Protocols (no upgrade was asked)")
        if response.status < 200:  # http.client skips only 100 Continue, e.g. not a 103
            raise protocol_error(f"interim reply {response.status} where a reply was due")
        declared = headers.get("content-length")
        if declared is not None and response.status not in (204, 304):
            if "transfer-encoding" in headers:
                raise protocol_error("reply has both Content-Length and Transfer-Encoding")
            check_length(declared, limit)
        parts: list[bytes] = []
        size = 0
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the reply did not complete within the attempt deadline")
            piece = response.read(_READ_STEP, decode_content=False)
            if not piece:
                break
            size += len(piece)
            if size > limit:
                raise too_large(limit, "body")
            parts.append(piece)
    except BaseException:
        response.close()  # closes the connection: it is not reused
        response.release_conn()
        raise
    response.release_conn()
    raw = b"".join(parts)
    return _Response(
        response.status, headers, decode(raw, headers.get("content-encoding", ""), limit)
    )


def _via_manager(
    route: _Route,
    method: str,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: Timeout,
    deadline: float | None,
) -> _Response:
    """One exchange through urllib3's pool manager: a plain-HTTP proxy, redirects anywhere."""
    return _read(
        route.manager.urlopen(
            method,
            url,
            body=body,
            headers=headers,
            timeout=_timeout(timeout),
            retries=_no_retries(),
            redirect=False,
            preload_content=False,
            decode_content=False,
        ),
        route.limit,
        deadline,
    )


def _via_origin(
    route: _Route,
    method: str,
    target: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: Timeout,
    deadline: float | None,
) -> _Response:
    """One exchange on the pool of the base URL's origin (``target`` is a path)."""
    return _read(
        route.origin.urlopen(
            method,
            target,
            body=body,
            headers=headers,
            retries=_no_retries(),
            redirect=False,
            assert_same_host=False,
            timeout=_timeout(timeout),
            preload_content=False,
            decode_content=False,
        ),
        route.limit,
        deadline,
    )


def exchange(
    route: _Route,
    method: str,
    target: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: Timeout,
    follow_redirects: bool = True,
) -> tuple[_Response, str]:
    """One HTTP exchange, following redirects; returns the fully read response and its URL.

    ``follow_redirects=False`` returns a 3xx reply unfollowed.

    The body is read (and decoded) before returning, which hands the connection back to its
    pool. Cross-origin redirects drop secret headers; 301/302/303 turn into a bodyless GET
    like a browser (and requests) would. Requests through a plain-HTTP proxy, and redirects,
    go through urllib3's pool manager (:func:`_via_manager`); the rest to the direct pool when
    the route has one, else straight to the origin's pool (:func:`_via_origin`, also through a
    CONNECT tunnel).
    """
    deadline = attempt_deadline(timeout)
    watch = None
    try:
        if route.direct is not None:  # bounds its own reads by the deadline
            status, reply_headers, raw = route.direct.exchange(
                method, target, body, headers, timeout, deadline
            )
            coding = reply_headers.get("content-encoding")
            content = raw if coding is None else decode(raw, coding, route.limit)
            response = _Response(status, reply_headers, content)
            if response.status not in _REDIRECT_STATUSES or not follow_redirects:
                return response, url
        if deadline is not None:
            watch = DEADLINES.start(deadline, route.tracker)
        if route.direct is None:
            if route.forward:
                response = _via_manager(route, method, url, body, headers, timeout, deadline)
            else:
                response = _via_origin(route, method, target, body, headers, timeout, deadline)
        if not follow_redirects:
            return response, url
        return _follow(route, method, url, body, headers, timeout, deadline, response)
    except Exception as exc:
        if watch is not None and watch.fired:
            raise TimeoutError("the reply did not complete within the attempt deadline") from exc
        raise
    finally:
        if watch is not None:
            DEADLINES.stop(watch)
        route.tracker.end()


def _follow(
    route: _Route,
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: Timeout,
    deadline: float | None,
    response: _Response,
) -> tuple[_Response, str]:
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
        response = _via_manager(route, method, url, body, headers, timeout, deadline)
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
