"""Failures as SDK exceptions: error replies and urllib3 / OS errors.

Usage::

    raise error_from_reply(reply)                        # 404 -> NotFoundError, ...
    mapped = map_transport_error(exc, request_snapshot)  # None: not a transport failure

Thread safety: pure functions.
"""

from __future__ import annotations

import json as _json
from typing import Any

from tinker_sync._lazynp import loaded_isinstance
from tinker_sync._runtime.causes import related
from tinker_sync._runtime.redact import scrub
from tinker_sync._transport._models import Reply
from tinker_sync.exceptions import (
    APIConnectError,
    APIConnectionError,
    APIConnectTimeoutError,
    APIStatusError,
    APITimeoutError,
    RequestSnapshot,
    status_error_class,
)

_U3 = "urllib3.exceptions"
"""urllib3's exceptions, checked without importing urllib3 (none exists before it loads; the
same for http.client's): docs/scale-out.md#start-up."""

#: Longest body excerpt kept in a status error's message (the full body stays on ``.body``).
MAX_SHOWN_BODY = 2000


def error_from_reply(reply: Reply) -> APIStatusError:
    """The status exception for an error reply (400 -> BadRequestError, ..., 5xx -> Internal).

    ``body`` is the parsed JSON (or the text) and the message reads
    ``"Error code: 404 - {...}"`` like the official client, bounded to 2,000 characters, plus
    ``(request id ...)`` when the reply names one in ``x-request-id``.
    """
    snapshot = reply.snapshot()  # scrubbed: the body must not smuggle a secret either
    try:
        body: Any = _json.loads(snapshot.content) if snapshot.content else None
    except ValueError:
        body = snapshot.text
    cls = status_error_class(reply.status)
    shown = str(body) if body is not None else "(empty body)"
    if len(shown) > MAX_SHOWN_BODY:  # the server's words, bounded
        shown = shown[: MAX_SHOWN_BODY - 3] + "..."
    request_id = snapshot.request_id
    if request_id:
        shown += f" (request id {request_id})"
    return cls(
        f"Error code: {reply.status} - {shown}",
        response=snapshot,
        body=body,
        request=reply.request,
    )


def is_invalid_token(reply: Reply) -> bool:
    """A 401 whose ``WWW-Authenticate`` says ``error="invalid_token"`` (RFC 6750)."""
    return reply.status == 401 and 'error="invalid_token"' in reply.headers.get(
        "www-authenticate", ""
    )


def _is_programming_error(exc: BaseException) -> bool:
    """A malformed URL or header: a bug to raise as is, not a transport failure."""
    return loaded_isinstance(exc, _U3, "LocationValueError")


def map_transport_error(
    exc: BaseException, request: RequestSnapshot | None = None
) -> APIConnectionError | None:
    """Map a urllib3 / http.client / OS failure to the SDK exception, or None if it is not one.

    * connect timeout -> :class:`APIConnectTimeoutError` (NOT_SENT)
    * refused / DNS / TLS / proxy / closed pool -> :class:`APIConnectError` (NOT_SENT)
    * read timeout -> :class:`APITimeoutError`
    * any other transport failure, e.g. reset, dropped mid-response, EBADF -> APIConnectionError
    """
    if isinstance(exc, APIConnectionError):
        return exc
    if _is_programming_error(exc):
        return None
    chain = list(related(exc))
    detail = scrub(_describe(exc))[:300]
    if any(
        loaded_isinstance(e, _U3, "ConnectTimeoutError")
        and not loaded_isinstance(e, _U3, "NewConnectionError")
        for e in chain
    ):
        return APIConnectTimeoutError(f"Connect timed out: {detail}", request)
    refused = ("NewConnectionError", "ClosedPoolError", "ProxyError", "SSLError")
    if any(
        isinstance(e, ConnectionRefusedError) or loaded_isinstance(e, _U3, *refused) for e in chain
    ):
        return APIConnectError(f"Connection failed: {detail}", request)
    if any(
        isinstance(e, TimeoutError) or loaded_isinstance(e, _U3, "ReadTimeoutError") for e in chain
    ):
        return APITimeoutError(f"Request timed out: {detail}", request)
    # http.client.HTTPException: IncompleteRead, BadStatusLine, LineTooLong, ...
    if (
        isinstance(exc, OSError)
        or loaded_isinstance(exc, _U3, "HTTPError")
        or loaded_isinstance(exc, "http.client", "HTTPException")
    ):
        return APIConnectionError(f"Connection error: {detail}", request)
    return None


def _describe(exc: BaseException) -> str:
    innermost = exc
    for e in related(exc):
        innermost = e
    text = str(innermost) or type(innermost).__name__
    if innermost is exc:
        return f"{type(exc).__name__}: {text}"
    return f"{type(exc).__name__} ({type(innermost).__name__}: {text})"
