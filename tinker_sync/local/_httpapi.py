"""The seam between the local server's HTTP layer (``_http``) and its protocol app (``_app``).

The HTTP layer parses bytes into an :class:`HttpRequest`, consults the fault plan, then awaits
``app.handle(request)`` and writes the :class:`HttpResponse`. The app never sees sockets; the
HTTP layer never interprets the Tinker protocol.

Fault rules whose action only makes sense inside the protocol (``queue_state``, ``fail``,
``expire``, ``metadata_only`` on polls; ``lose`` on submissions) are handed to the app in ``request.poll_fault``; the
extra match fields those rules can test (e.g. ``request_type`` of a polled future) come from
``app.match_fields(request)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

QueueState = Literal["active", "paused_capacity", "paused_rate_limit"]
#: The queue states a ``try_again`` poll answer reports (and ``pause`` / fault rules accept).
QUEUE_STATES: tuple[str, ...] = get_args(QueueState)


@dataclass
class PollFault:
    """A protocol-level fault action for the app to carry out on this request."""

    name: str
    queue_state: str | None = None
    reason: str | None = None
    fail: str | None = None  # "user" | "server" | "unknown"
    message: str | None = None
    expire: bool = False
    metadata_only: bool = False
    #: Accept the submission (answer its request id), then lose it: never run or complete it;
    #: polled alone it answers 404 (docs/design/local-server.md#fault-format).
    lose: bool = False


@dataclass
class HttpRequest:
    method: str
    path: str  # percent-decoded path without the query string, e.g. "/api/v1/asample"
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    raw_path: str = ""  # as received, still percent-encoded, with the query
    poll_fault: PollFault | None = None
    #: Filled by the app for the request log: parsed JSON body and decoded proto summary.
    log_json: Any = None
    log_proto: dict[str, Any] | None = None
    #: Filled by the app: the logical endpoint name, e.g. "asample", "training_runs/*".
    endpoint: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class HttpResponse:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: Set by a ``cut_at`` fault: send the head (full ``content-length``) and only this many
    #: bytes of the body, then close the connection.
    cut_at: int | None = None

    @classmethod
    def json(
        cls, obj: Any, status: int = 200, headers: dict[str, str] | None = None
    ) -> HttpResponse:
        h = {"content-type": "application/json"}
        if headers:
            h.update(headers)
        return cls(status, h, json.dumps(obj, separators=(",", ":")).encode())

    @classmethod
    def error(cls, status: int, detail: str) -> HttpResponse:
        return cls.json({"detail": detail}, status)


class App(Protocol):
    async def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer one request. Must never raise; errors become 4xx/5xx JSON bodies."""
        ...

    def match_fields(self, request: HttpRequest) -> dict[str, Any]:
        """Extra fields fault rules may match on (``request_type`` for polls, body fields)."""
        ...

    def proto_summary(self, request: HttpRequest) -> dict[str, Any] | None:
        """Decoded header fields of a protobuf body, for the request log (None if not proto)."""
        ...

    def endpoint_name(self, request: HttpRequest) -> str:
        """The path after ``/api/v1/`` (or the admin path), used by fault rules and the log."""
        ...
