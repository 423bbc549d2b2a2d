"""What the transport sends and gets back: traffic types, :class:`RequestSpec`, :class:`Reply`.

Usage::

    spec = RequestSpec(method="POST", path="/api/v1/asample", pool=Pool.SAMPLE, json=body)
    reply.status, reply.headers["content-type"], reply.json()

Thread safety: immutable data. Fork safety: data.
"""

from __future__ import annotations

import enum
import json as _json
import os
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import attrs

from tinker_sync._config import Timeout
from tinker_sync._runtime.fork import register_after_fork
from tinker_sync._runtime.redact import redact_headers
from tinker_sync._transport._context import current_sdk_method
from tinker_sync.exceptions import (
    APIResponseValidationError,
    RequestSnapshot,
    ResponseSnapshot,
)

T = TypeVar("T")


class Pool(str, enum.Enum):
    """Traffic types; each has its own connection pool."""

    SESSION = "session"
    SAMPLE = "sample"
    TRAIN = "train"
    REST = "rest"
    RETRIEVE_PROMISE = "retrieve_promise"
    RETRIEVE_FUTURES = "retrieve_futures"
    TELEMETRY = "telemetry"
    AUTH = "auth"

    def __str__(self) -> str:
        return self.value


DEFAULT_POOL_SIZES: Mapping[Pool, int] = {
    Pool.SESSION: 32,
    Pool.SAMPLE: 512,
    Pool.TRAIN: 256,
    Pool.REST: 32,
    Pool.RETRIEVE_PROMISE: 512,
    Pool.RETRIEVE_FUTURES: 16,
    Pool.TELEMETRY: 8,
    Pool.AUTH: 4,
}
"""``pool_maxsize`` per pool: above the SDK's thread counts, so no request waits or churns."""


#: Keys drawn per ``os.urandom`` call: each call is a syscall that releases the GIL (a thread
#: hand-off when the caller's code keeps the GIL busy), so keys come from blocks of random bytes.
KEY_BLOCK = 64
_key_bytes: deque[bytes] = deque()  # 16 unused random bytes per entry; popleft is atomic
register_after_fork(_key_bytes.clear)  # a forked child never reuses its parent's bytes


def _random16() -> bytes:
    try:
        return _key_bytes.popleft()
    except IndexError:
        raw = os.urandom(16 * KEY_BLOCK)
        _key_bytes.extend(raw[i : i + 16] for i in range(16, len(raw), 16))
        return raw[:16]


def new_idempotency_key() -> str:
    """A fresh ``X-Idempotency-Key`` value (one per logical request): a random UUID4."""
    raw = bytearray(_random16())  # what uuid.uuid4() does, without its object (hot path)
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"tinker_sync-retry-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def quote_path(segment: str) -> str:
    """Percent-encode a path parameter, keeping ``/`` and ``:`` literal."""
    from urllib.parse import quote

    return quote(str(segment), safe="/:")


def _headers_repr(headers: Mapping[str, str]) -> str:
    return repr(redact_headers(headers))


def _upper(method: str) -> str:
    return method.upper()


def _coerce_timeout(value: object) -> Timeout | None:
    return None if value is None else Timeout.coerce(value)


def _default_key(self: RequestSpec) -> str | None:
    return None if self.method == "GET" else new_idempotency_key()


def _default_sdk_method() -> str | None:
    return current_sdk_method.get()


Expect = Literal["json", "proto", "none", "any"]
_JSON_ENCODER = _json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@attrs.frozen(kw_only=True)
class RequestSpec:
    """One logical request; reused unchanged by every retry of it.

    Usage::

        RequestSpec(method="POST", path="/api/v1/asample", pool=Pool.SAMPLE, json=body,
                    headers={"X-Tinker-Sampling-Backpressure": "1"}, max_retries=0)

    * ``json`` is encoded once into ``content`` (``application/json``); or pass ``content`` +
      ``content_type`` (protobuf). No body: no Content-Type.
    * ``timeout``: a :class:`Timeout` or number (all parts); None = the client's default.
    * ``idempotency_key``: defaults to a new key for non-GET, None for GET.
    * ``sdk_method``: defaults to :data:`current_sdk_method` *at construction*, so the spec
      carries it into pool threads.
    * ``expect``: ``"proto"`` sends ``Accept: application/x-protobuf``; informative otherwise.
    * ``max_retries``: HTTP-level retry override (None = the client's ``max_retries``).
    * ``logical_key``: what one logical request is, for the tenant's circuit breaker
      (docs/health.md): polls of one future share their request id; default the
      idempotency key.
    * ``follow_redirects``: False returns a 3xx reply as is (the checkpoint archive endpoint
      answers 302 to a signed URL that the downloader fetches itself, docs/downloads.md).

    Thread safety: immutable (do not mutate ``json`` after construction). Fork safety: data.
    """

    method: str = attrs.field(converter=_upper)
    path: str
    pool: Pool
    json: Any = attrs.field(default=None, eq=False, repr=False)
    content: bytes | None = attrs.field(default=None, eq=False, repr=False)
    content_type: str | None = None
    params: Mapping[str, Any] | None = None
    timeout: Timeout | None = attrs.field(default=None, converter=_coerce_timeout)
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=_headers_repr)
    idempotency_key: str | None = attrs.field(default=attrs.Factory(_default_key, takes_self=True))
    sdk_method: str | None = attrs.field(factory=_default_sdk_method)
    expect: Expect = "json"
    max_retries: int | None = None
    logical_key: str | None = None
    follow_redirects: bool = True

    def __attrs_post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"RequestSpec.path must start with '/': {self.path!r}")
        if self.json is not None:
            if self.content is not None:
                raise ValueError("RequestSpec takes json or content, not both")
            encoded = _JSON_ENCODER.encode(self.json).encode()
            object.__setattr__(self, "content", encoded)
            if self.content_type is None:
                object.__setattr__(self, "content_type", "application/json")
        elif self.content is not None and self.content_type is None:
            object.__setattr__(self, "content_type", "application/octet-stream")


@attrs.frozen(kw_only=True)
class Reply:
    """An HTTP response, fully read. ``headers`` has lower-case names.

    ``request`` is a redacted :class:`RequestSnapshot`, set only for error statuses (>= 400).
    Thread safety: immutable. Fork safety: data.
    """

    status: int
    headers: Mapping[str, str] = attrs.field(repr=False)
    content: bytes = attrs.field(repr=False)
    elapsed: float
    method: str
    url: str
    request: RequestSnapshot | None = attrs.field(default=None, repr=False, eq=False)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    @property
    def is_protobuf(self) -> bool:
        return "application/x-protobuf" in self.content_type

    def json(self) -> Any:
        """The body parsed as JSON; :class:`APIResponseValidationError` when it is not JSON."""
        try:
            return _json.loads(self.content)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the stack
            raise APIResponseValidationError(
                f"{self.method} {self.url}: response body is not JSON "
                f"(status {self.status}, {len(self.content)} bytes)",
                response=self.snapshot(),
                request=self.request,
            ) from None

    def parse(self, cls: type[T]) -> T:
        """The JSON body converted to ``cls``; :class:`APIResponseValidationError` (a
        TinkerError, outcome UNKNOWN) when it is not JSON or does not fit ``cls``."""
        from tinker_sync._wire._converter import from_json

        data = self.json()
        try:
            return from_json(cls, data)
        except (TypeError, ValueError, RecursionError) as exc:
            raise APIResponseValidationError(
                f"{self.method} {self.url}: unexpected reply: {exc}"[:2000],
                response=self.snapshot(),
                request=self.request,
            ) from exc

    def snapshot(self) -> ResponseSnapshot:
        """A redacted, picklable copy for exceptions."""
        return ResponseSnapshot(self.status, self.headers, self.content, self.url)
