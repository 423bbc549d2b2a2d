"""Bounded replies: the content codings offered and decoded, the size cap, the attempt deadline.

Usage::

    headers["Accept-Encoding"] = ACCEPT_ENCODING      # exactly what decode() undoes
    limit = max_reply_bytes()                          # TINKER_SYNC_MAX_REPLY_BYTES or the default
    body = decode(raw, reply_headers.get("content-encoding", ""), limit)
    deadline = attempt_deadline(timeout)              # time.monotonic() value, or None

Both request paths read a reply's raw bytes under the cap and decode them here (urllib3 is
asked for undecoded bytes), so what ``Accept-Encoding`` offers and what a reply may use are one
fact, and a decoded body is bounded as well as a raw one (docs/transport.md#bounded-replies).

Thread safety: pure functions (``max_reply_bytes`` reads ``os.environ``).
"""

from __future__ import annotations

import functools
import os
import time
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded when an error needs their classes (docs/scale-out.md#start-up)
    import http.client

    import urllib3.exceptions

    from tinker_sync._config import Timeout

CODINGS = ("gzip", "deflate")
"""The content codings offered and decoded, in the order offered."""
ACCEPT_ENCODING = ", ".join(CODINGS)
"""The ``Accept-Encoding`` value of every request (built from :data:`CODINGS`)."""

MAX_REPLY_ENV = "TINKER_SYNC_MAX_REPLY_BYTES"
"""Environment variable overriding :data:`DEFAULT_MAX_REPLY_BYTES` (read when pools are made)."""
DEFAULT_MAX_REPLY_BYTES = 128 * 1024 * 1024
"""Largest reply body accepted, before and after decoding (arithmetic: docs/transport.md)."""
MAX_CODING_LAYERS = 4
"""Most content codings stacked in one reply (``gzip, gzip, ...``)."""
_STEP = 256 * 1024
DEADLINE_READS = 2
"""An attempt ends at the latest ``connect + DEADLINE_READS * read`` seconds after it began."""


# The two error classes derive from http.client's and urllib3's, which a first sample does not
# load (docs/scale-out.md#start-up): each is built on first use, and raised through
# protocol_error() / too_large(); ``_replies.ReplyProtocolError`` etc. still name them.


@functools.cache
def _protocol_error_class() -> type[http.client.HTTPException]:
    import http.client

    class ReplyProtocolError(http.client.HTTPException):
        """A reply refused as malformed (bad framing, both ``Content-Length`` and
        ``Transfer-Encoding``, an unexpected 101, too many interim replies, an oversized header
        block): its connection is closed, never reused."""

    ReplyProtocolError.__qualname__ = "ReplyProtocolError"
    return ReplyProtocolError


@functools.cache
def _too_large_class() -> type[urllib3.exceptions.HTTPError]:
    import urllib3.exceptions

    class ReplyTooLargeError(urllib3.exceptions.HTTPError):
        """A reply body (raw or decoded) above the cap: the connection is closed, never
        reused."""

    ReplyTooLargeError.__qualname__ = "ReplyTooLargeError"
    return ReplyTooLargeError


def __getattr__(name: str) -> Any:
    if name == "ReplyProtocolError":
        return _protocol_error_class()
    if name == "ReplyTooLargeError":
        return _too_large_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def protocol_error(message: str) -> http.client.HTTPException:
    """A ``ReplyProtocolError`` (an ``http.client.HTTPException``): a malformed reply."""
    return _protocol_error_class()(message)


def max_reply_bytes() -> int:
    """The reply cap: ``TINKER_SYNC_MAX_REPLY_BYTES`` when set to a positive integer, else the
    default."""
    raw = os.environ.get(MAX_REPLY_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_REPLY_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_REPLY_ENV} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{MAX_REPLY_ENV} must be a positive integer, got {raw!r}")
    return value


def attempt_deadline(timeout: Timeout) -> float | None:
    """When an attempt with ``timeout`` must be over (a ``time.monotonic()`` value), or None
    without a read timeout.

    The read timeout bounds each wait for a byte; this bounds the whole attempt, so a peer
    sending one byte per read timeout cannot hold a call for ever (docs/transport.md).
    """
    if timeout.read is None:
        return None
    return time.monotonic() + (timeout.connect or 0.0) + DEADLINE_READS * timeout.read


def check_length(declared: str, limit: int) -> None:
    """Refuse a reply whose ``Content-Length`` is repeated, unreadable or above ``limit``
    before reading its body (raises ``ReplyProtocolError`` or ``ReplyTooLargeError``)."""
    value = declared.strip()
    if not value.isdigit():  # "5, 5" (repeated), "-1", "x": a smuggling shape or garbage
        raise protocol_error(f"reply has an invalid Content-Length {value[:40]!r}")
    if len(value) > 20 or int(value) > limit:
        raise too_large(limit, "Content-Length")


def too_large(limit: int, what: str) -> urllib3.exceptions.HTTPError:
    """A ``ReplyTooLargeError`` (a urllib3 ``HTTPError``) for a reply above ``limit``."""
    return _too_large_class()(f"reply {what} is larger than the {limit}-byte cap ({MAX_REPLY_ENV})")


def decode(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo the content codings named by ``encoding`` (applied in order, so undone in reverse),
    never producing more than ``limit`` bytes per layer.

    Raises ``urllib3.exceptions.DecodeError`` for a coding not in :data:`CODINGS` or a corrupt
    body, :class:`ReplyTooLargeError` above the cap.
    """
    codings = [c.strip().lower() for c in encoding.split(",")]
    codings = [c for c in codings if c not in ("", "identity")]
    if not codings or not body:
        return body
    if len(codings) > MAX_CODING_LAYERS:
        raise _decode_error(
            f"Received response with {len(codings)} content codings (at most "
            f"{MAX_CODING_LAYERS} are decoded)."
        )
    for coding in reversed(codings):
        if coding in ("gzip", "x-gzip"):
            body = _inflate(body, 16 + zlib.MAX_WBITS, coding, limit, members=True)
        elif coding == "deflate":
            wbits = zlib.MAX_WBITS if _zlib_header(body) else -zlib.MAX_WBITS  # raw deflate too
            body = _inflate(body, wbits, coding, limit, members=False)
        else:
            raise _decode_error(
                f"Received response with content-encoding: {coding[:40]!r}, which the SDK "
                f"does not decode (it offers {ACCEPT_ENCODING})."
            )
    return body


def _decode_error(*args: object) -> urllib3.exceptions.DecodeError:
    import urllib3.exceptions  # loaded by the first failure (docs/scale-out.md#start-up)

    return urllib3.exceptions.DecodeError(*args)


def _zlib_header(body: bytes) -> bool:
    return len(body) >= 2 and body[0] & 0x0F == 8 and ((body[0] << 8) | body[1]) % 31 == 0


def _inflate(data: bytes, wbits: int, coding: str, limit: int, *, members: bool) -> bytes:
    out: list[bytes] = []
    size = 0
    try:
        while data:
            inflater = zlib.decompressobj(wbits)
            pending = data
            while pending:
                piece = inflater.decompress(pending, min(_STEP, limit - size + 1))
                size += len(piece)
                if size > limit:
                    raise too_large(limit, "body after decoding")
                out.append(piece)
                pending = inflater.unconsumed_tail
                if not piece and pending:  # no progress: a corrupt stream
                    raise zlib.error("stalled")
            if not inflater.eof:
                raise zlib.error("truncated stream")
            data = inflater.unused_data if members else b""  # gzip: further members follow
    except zlib.error as exc:
        raise _decode_error(
            f"Received response with content-encoding: {coding}, but failed to decode it.", exc
        ) from exc
    return b"".join(out)
