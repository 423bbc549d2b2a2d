"""The tinker_sync exception tree.

Every error the SDK raises for a failed operation is a :class:`TinkerError`, and each one says
what the server did through ``outcome`` (a :class:`RequestOutcome`)::

    TinkerError                                   outcome varies
    |
    |-- never reached the server (NOT_SENT: retrying is always safe)
    |   |-- APIConnectError                       connection refused, DNS, TLS
    |   |   `-- APIConnectTimeoutError            (also an APITimeoutError)
    |   |-- CircuitOpenError                      fail_fast: the tenant's circuit is open
    |   |-- ClientClosedError                     use after close(); pending at close
    |   |-- ForkedProcessError                    parent's future / sequence in a forked child
    |   `-- MissingCredentialsError               no API key could be resolved
    |
    |-- server may have acted (UNKNOWN: retry only through seq_ids / idempotency keys)
    |   |-- APIConnectionError                    reset or dropped mid-response
    |   |   |-- APITimeoutError                   read timeout
    |   |   `-- SamplingStuckError                no sampling progress for progress_timeout
    |   |-- InternalServerError                   5xx after retries (an APIStatusError)
    |   |   `-- PersistentServerError             the same 5xx again and again, others fine
    |   |-- APIResponseValidationError            a 2xx body that does not fit the schema
    |   |-- FutureExpiredError                    a poll got 410 (sampling resubmits)
    |   |-- FuturePollError                       polling an accepted future failed for good
    |   |   `-- RequestLostError                  the server accepted the request, then lost it
    |   `-- StalledError                          no useful answer for stall_timeout seconds
    |
    `-- server said no (REJECTED: the operation did not take effect)
        |-- APIStatusError                        any other status after retries
        |   |-- BadRequestError 400, AuthenticationError 401, BillingError 402,
        |   |   PermissionDeniedError 403, NotFoundError 404, ConflictError 409,
        |   |   UnprocessableEntityError 422, RateLimitError 429
        `-- RequestFailedError                    accepted, then failed on the server

    TokenizerLoadError                            local: a tokenizer could not be loaded
    DownloadError                                 a checkpoint download gave up (archive
    |                                             not ready by the deadline)
    `-- DownloadVerificationError                 the bytes fail the digest, length or tar
                                                  check (nothing is left at the target)

    tinker_sync.types.ValidationError             a field value that does not fit its type
                                                  (a ValueError and a TypeError, not a
                                                  TinkerError: raised before anything is sent)

``APIError`` is the base of the HTTP-level errors (status, connection, validation). Every
exception here pickles and carries no secret: messages are scrubbed and ``request`` /
``response`` are redacted snapshots, never live HTTP objects.

Thread safety: exceptions are immutable after construction. Fork safety: plain data.
"""

from __future__ import annotations

import enum
import json as _json
from collections.abc import Mapping
from typing import Any

from tinker_sync._runtime.redact import redact_headers, scrub

__all__ = [
    "APIConnectError",
    "APIConnectTimeoutError",
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BillingError",
    "CircuitOpenError",
    "ClientClosedError",
    "ConflictError",
    "DownloadError",
    "DownloadVerificationError",
    "ExperimentalWarning",
    "ForkedProcessError",
    "FutureExpiredError",
    "FuturePollError",
    "FutureRetrievalError",
    "InternalServerError",
    "MissingCredentialsError",
    "NotFoundError",
    "PermissionDeniedError",
    "PersistentServerError",
    "PromiseExpiredError",
    "RateLimitError",
    "RequestErrorCategory",
    "RequestFailedError",
    "RequestLostError",
    "RequestOutcome",
    "RequestSnapshot",
    "ResponseSnapshot",
    "SamplingStuckError",
    "StalledError",
    "TinkerError",
    "TokenizerLoadError",
    "TokenizerUnavailableError",
    "UnprocessableEntityError",
    "server_words",
    "status_error_class",
]

#: Longest excerpt of a server's reply kept in an exception message.
SERVER_WORDS_MAX = 500


def server_words(body: object, limit: int = SERVER_WORDS_MAX) -> str:
    """The server's own words in a reply body, scrubbed and at most ``limit`` characters.

    A JSON object's ``detail`` / ``message`` / ``error`` (FastAPI validation lists are joined),
    else the text itself; ``""`` when there is nothing to show::

        server_words({"detail": "LoRA rank 1000 must be between 1 and 32"})
        == "LoRA rank 1000 must be between 1 and 32"
    """
    if isinstance(body, (bytes, bytearray)):
        text = bytes(body[: 4 * limit + 4096]).decode("utf-8", "replace")
        try:
            body = _json.loads(text)
        except ValueError:
            body = text
    words = _words(body)
    words = " ".join(scrub(words).split())
    if len(words) > limit:
        words = words[: limit - 3].rstrip() + "..."
    return words


def _words(body: object) -> str:
    if body is None:
        return ""
    if isinstance(body, str):
        return body
    if isinstance(body, dict):
        for key in ("detail", "message", "error", "msg"):
            if key in body and body[key] not in (None, ""):
                return _words(body[key])
        return _json.dumps(body, default=str)
    if isinstance(body, (list, tuple)):
        return "; ".join(w for w in (_words(item) for item in body) if w)
    return str(body)


class RequestOutcome(str, enum.Enum):
    """What the server did with a request whose call failed."""

    NOT_SENT = "not_sent"
    """Never reached the server; retrying anything is safe."""
    UNKNOWN = "unknown"
    """The server may have acted."""
    REJECTED = "rejected"
    """The server said no; the operation did not take effect."""

    def __str__(self) -> str:
        return self.value


class RequestErrorCategory(str, enum.Enum):
    """Category of a request that failed on the server (``RequestFailedError.category``).

    Parsing is case-insensitive and unrecognised values become ``Unknown``::

        RequestErrorCategory("User") is RequestErrorCategory.User
        RequestErrorCategory("junk") is RequestErrorCategory.Unknown
    """

    Unknown = "unknown"
    Server = "server"
    User = "user"

    @classmethod
    def _missing_(cls, value: object) -> RequestErrorCategory:
        if isinstance(value, str):
            lowered = value.strip().lower()
            for member in cls:
                if member.value == lowered:
                    return member
        return cls.Unknown

    def __str__(self) -> str:
        return self.value


class ExperimentalWarning(FutureWarning):
    """Emitted by alpha or experimental APIs."""


def _restore(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    obj = cls.__new__(cls)
    BaseException.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class RequestSnapshot:
    """A secret-free, picklable record of the request that failed."""

    __slots__ = ("headers", "method", "url")

    def __init__(self, method: str, url: str, headers: Mapping[str, str] | None = None) -> None:
        self.method = method
        self.url = scrub(url)
        self.headers = redact_headers(headers or {})

    def __repr__(self) -> str:
        return f"<RequestSnapshot {self.method} {self.url}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (RequestSnapshot, (self.method, self.url, self.headers))


class ResponseSnapshot:
    """A secret-free, picklable record of the HTTP response that caused an error."""

    __slots__ = ("content", "headers", "status_code", "url")

    def __init__(
        self,
        status_code: int,
        headers: Mapping[str, str] | None = None,
        content: bytes = b"",
        url: str = "",
    ) -> None:
        self.status_code = status_code
        self.headers = redact_headers(headers or {})
        self.content = scrub(content[:65536].decode("utf-8", "replace")).encode()
        self.url = scrub(url)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def request_id(self) -> str | None:
        """The server's ``x-request-id`` (or ``request-id``) header, if it sent one."""
        for key, value in self.headers.items():
            if key.lower() in ("x-request-id", "request-id") and value:
                return str(value)
        return None

    def json(self) -> Any:
        return _json.loads(self.content)

    def __repr__(self) -> str:
        return f"<ResponseSnapshot {self.status_code}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ResponseSnapshot, (self.status_code, self.headers, self.content, self.url))


class TinkerError(Exception):
    """Root of every tinker_sync error. ``outcome`` tells what the server did."""

    outcome: RequestOutcome = RequestOutcome.UNKNOWN

    def __init__(self, message: str = "", *, outcome: RequestOutcome | None = None) -> None:
        message = scrub(str(message))
        super().__init__(message)
        self.message = message
        if outcome is not None:
            self.outcome = outcome

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class APIError(TinkerError):
    """Base for HTTP-level failures; ``request`` is a redacted snapshot, ``body`` the payload."""

    def __init__(
        self,
        message: str,
        request: RequestSnapshot | None = None,
        *,
        body: object | None = None,
        outcome: RequestOutcome | None = None,
    ) -> None:
        super().__init__(message, outcome=outcome)
        self.request = request
        self.body = body


class APIStatusError(APIError):
    """The server answered with an error status that was not retried (or retries ran out)."""

    outcome = RequestOutcome.REJECTED
    status_code: int = 0

    def __init__(
        self,
        message: str,
        *,
        response: ResponseSnapshot,
        body: object | None = None,
        request: RequestSnapshot | None = None,
    ) -> None:
        outcome = RequestOutcome.UNKNOWN if response.status_code >= 500 else None
        super().__init__(message, request, body=body, outcome=outcome)
        self.response = response
        self.status_code = response.status_code


class BadRequestError(APIStatusError):
    """HTTP 400."""


class AuthenticationError(APIStatusError):
    """HTTP 401."""


class BillingError(APIStatusError):
    """HTTP 402, raised only after the billing pause window has passed."""


class PermissionDeniedError(APIStatusError):
    """HTTP 403."""


class NotFoundError(APIStatusError):
    """HTTP 404."""


class ConflictError(APIStatusError):
    """HTTP 409."""


class UnprocessableEntityError(APIStatusError):
    """HTTP 422."""


class RateLimitError(APIStatusError):
    """HTTP 429 after retries ran out."""


class InternalServerError(APIStatusError):
    """HTTP >= 500 after retries ran out; the server may have acted."""

    outcome = RequestOutcome.UNKNOWN


class PersistentServerError(InternalServerError):
    """One request answered with the same 5xx error ``HealthPolicy.same_error_repeats`` times
    in a row while the server answers the tenant's other requests: the server fails this
    request, not the traffic, so it is not retried (docs/health.md). The message and
    ``response`` carry the server's words."""


_STATUS_CLASSES: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    402: BillingError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """Return the exception class for an HTTP error status."""
    if status_code >= 500:
        return InternalServerError
    return _STATUS_CLASSES.get(status_code, APIStatusError)


class APIConnectionError(APIError):
    """The transport failed after the request may have been sent."""

    outcome = RequestOutcome.UNKNOWN

    def __init__(
        self,
        message: str = "Connection error.",
        request: RequestSnapshot | None = None,
        *,
        outcome: RequestOutcome | None = None,
    ) -> None:
        super().__init__(message, request, outcome=outcome)


class APIConnectError(APIConnectionError):
    """The connection could not be made (refused, DNS, TLS): the request was never sent."""

    outcome = RequestOutcome.NOT_SENT


class APITimeoutError(APIConnectionError):
    """The server did not answer within the read timeout."""

    outcome = RequestOutcome.UNKNOWN

    def __init__(
        self, message: str = "Request timed out.", request: RequestSnapshot | None = None
    ) -> None:
        super().__init__(message, request)


class APIConnectTimeoutError(APIConnectError, APITimeoutError):
    """Connecting timed out: never sent, and still an :class:`APITimeoutError`."""

    outcome = RequestOutcome.NOT_SENT

    def __init__(
        self, message: str = "Connect timed out.", request: RequestSnapshot | None = None
    ) -> None:
        APIConnectionError.__init__(self, message, request)


class SamplingStuckError(APIConnectionError):
    """No sampling request completed for ``RetryConfig.progress_timeout`` seconds."""


class APIResponseValidationError(APIError):
    """A 2xx body that does not match the expected schema."""

    outcome = RequestOutcome.UNKNOWN

    def __init__(
        self,
        message: str = "Data returned by API invalid for expected schema.",
        *,
        response: ResponseSnapshot | None = None,
        body: object | None = None,
        request: RequestSnapshot | None = None,
    ) -> None:
        super().__init__(message, request, body=body)
        self.response = response
        self.status_code = response.status_code if response is not None else None


class RequestFailedError(TinkerError):
    """An accepted request finished *failed* on the server. Never retried automatically."""

    outcome = RequestOutcome.REJECTED

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None = None,
        category: RequestErrorCategory | str = RequestErrorCategory.Unknown,
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.category = RequestErrorCategory(category)

    def __str__(self) -> str:
        return f"{self.message} (request_id={self.request_id}, category={self.category.value})"


class FutureExpiredError(TinkerError):
    """A poll answered 410: the server forgot the request. Sampling resubmits it."""

    outcome = RequestOutcome.UNKNOWN


class FuturePollError(TinkerError, ValueError):
    """Polling an accepted future failed for good (401/403/404/409/422, 400s, 402).

    The message carries the status, the request id and the server's own words.
    """

    outcome = RequestOutcome.UNKNOWN

    def __init__(
        self, message: str, *, status_code: int | None = None, request_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.request_id = request_id


class RequestLostError(FuturePollError):
    """The server accepted a request, then lost it: polled alone by its request id it answers
    404 (docs/polling.md#lost-requests). ``op`` names the operation (``"Sample"``,
    ``"ForwardBackward"``, ...) and ``request_id`` the lost request.

    A sample is resubmitted under a new seq_id a bounded number of times before this is
    raised; a training op is never resubmitted (it may have been applied), so its future fails
    with this error and later ops keep their turns (docs/sequencer.md#failure-rules).
    """

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        request_id: str | None = None,
        status_code: int | None = 404,
    ) -> None:
        super().__init__(message, status_code=status_code, request_id=request_id)
        self.op = op


class StalledError(TinkerError):
    """A pending call had no useful answer for ``stall_timeout`` seconds: every attempt was a
    connection error, a timeout or a 5xx. The message names the last status or error and the
    server's last words; ``__cause__`` is the last failure. Not retried automatically.
    ``outcome`` is NOT_SENT when no attempt of the call reached the server, else UNKNOWN.
    """

    outcome = RequestOutcome.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        request_id: str | None = None,
        stalled_for: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.request_id = request_id
        self.stalled_for = stalled_for


class CircuitOpenError(TinkerError):
    """With ``HealthPolicy(fail_fast=True)``: a new call while the server is failing (its
    tenant's circuit is open, docs/health.md). Nothing was sent. ``since`` is the wall-clock
    time the circuit opened, ``reason`` why (e.g. "5 failed attempts of 3 requests ...")."""

    outcome = RequestOutcome.NOT_SENT

    def __init__(self, message: str, *, since: float | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.since = since
        self.reason = reason


class ClientClosedError(TinkerError, RuntimeError):
    """The client was closed: later use, and futures still pending at close."""

    outcome = RequestOutcome.NOT_SENT


class ForkedProcessError(TinkerError, RuntimeError):
    """A parent's future or sequence number was used in a forked child."""

    outcome = RequestOutcome.NOT_SENT


class MissingCredentialsError(TinkerError):
    """No credential could be resolved (argument, env, credential command, credentials file)."""

    outcome = RequestOutcome.NOT_SENT


class TokenizerLoadError(TinkerError):
    """A tokenizer could not be resolved or loaded."""

    outcome = RequestOutcome.NOT_SENT


class DownloadError(TinkerError):
    """A checkpoint download gave up, e.g. the archive was still being created at the
    deadline (docs/downloads.md). Nothing is left at the target."""

    outcome = RequestOutcome.UNKNOWN


class DownloadVerificationError(DownloadError):
    """Downloaded bytes failed verification: ``check`` is ``"digest"`` (the server's
    ``Repr-Digest``), ``"length"`` or ``"tar"``. Nothing is moved into place."""

    def __init__(self, message: str, *, check: str = "digest") -> None:
        super().__init__(message)
        self.check = check


# Names used by the behaviour spec and by older code.
PromiseExpiredError = FutureExpiredError
FutureRetrievalError = FuturePollError
TokenizerUnavailableError = TokenizerLoadError
