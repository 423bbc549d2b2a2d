"""Request/response helpers shared by the local server's protocol handlers.

Usage::

    body = json_body(request)                 # 400 on malformed JSON / not an object
    model_id = body.str_("model_id")          # 400 naming the field when missing or mistyped
    seq_id = body.int_("seq_id", minimum=1)
    raise HttpError(404, "unknown model_id 'x'")   # the app answers {"detail": ...}

Thread safety: stateless helpers; :class:`Body` wraps one request's data (not shared).
Fork safety: no state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from tinker_sync.local._httpapi import HttpRequest

#: Checkpoint path segment -> checkpoint type (docs/design/protocol.md#tinker-paths).
SEGMENT_TYPES = {
    "weights": "training",
    "sampler_weights": "sampler",
    "external_weights": "external",
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class HttpError(Exception):
    """Raised by handlers; becomes a JSON error reply ``{"detail": ...}`` with this status.

    Thread safety: immutable after construction. Fork safety: plain data.
    """

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def str_map(obj: Mapping[str, Any] | None) -> dict[str, str] | None:
    if obj is None:
        return None
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in obj.items()}


class Body:
    """Typed access to a JSON object body; every mistake becomes a 400 naming the field.

    Thread safety: one request's data; not shared. Fork safety: plain data.
    """

    def __init__(self, data: Any, what: str = "body") -> None:
        if not isinstance(data, dict):
            raise HttpError(400, f"{what}: expected a JSON object")
        self.data: dict[str, Any] = data
        self.what = what

    def _name(self, key: str) -> str:
        return key if self.what == "body" else f"{self.what}.{key}"

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def str_(self, key: str) -> str:
        value = self.data.get(key)
        if not isinstance(value, str):
            raise HttpError(400, f"{self._name(key)}: required string")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise HttpError(400, f"{self._name(key)}: expected a string")
        return value

    def int_(self, key: str, *, minimum: int | None = None) -> int:
        value = self.data.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise HttpError(400, f"{self._name(key)}: required integer")
        if not _INT64_MIN <= value <= _INT64_MAX:  # ids and counts are 64-bit on the wire
            raise HttpError(400, f"{self._name(key)}: out of the 64-bit integer range")
        if minimum is not None and value < minimum:
            raise HttpError(400, f"{self._name(key)}: must be >= {minimum}, got {value}")
        return value

    def opt_int(
        self, key: str, default: int | None = None, *, minimum: int | None = None
    ) -> int | None:
        if self.data.get(key) is None:
            return default
        return self.int_(key, minimum=minimum)

    def opt_num(self, key: str, default: float | None = None) -> float | None:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HttpError(400, f"{self._name(key)}: expected a number")
        return float(value)

    def int_or(self, key: str, default: int, *, minimum: int | None = None) -> int:
        if self.data.get(key) is None:
            return default
        return self.int_(key, minimum=minimum)

    def num_or(self, key: str, default: float) -> float:
        value = self.opt_num(key)
        return default if value is None else value

    def bool_(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise HttpError(400, f"{self._name(key)}: expected a boolean")
        return value

    def opt_dict(self, key: str) -> dict[str, Any] | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, dict):
            raise HttpError(400, f"{self._name(key)}: expected an object")
        return value

    def opt_str_list(self, key: str) -> list[str] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise HttpError(400, f"{self._name(key)}: expected a list of strings")
        return list(value)


def checkpoint_name(name: str) -> str:
    if not name or "/" in name or name in (".", "..") or "\x00" in name or len(name) > 255:
        raise HttpError(400, f"path: invalid checkpoint name {name!r} (no '/', 1-255 chars)")
    return name


def parse_tinker_path(path: str) -> tuple[str, str]:
    """``tinker://<run>/<segment>/<name>`` -> (run_id, "<segment>/<name>")."""
    if not path.startswith("tinker://"):
        raise HttpError(400, f"invalid tinker path {path!r}: must start with tinker://")
    parts = path[len("tinker://") :].split("/")
    if len(parts) != 3 or not all(parts) or parts[1] not in SEGMENT_TYPES:
        raise HttpError(
            400,
            f"invalid tinker path {path!r}: expected tinker://<run>/"
            "weights|sampler_weights|external_weights/<name>",
        )
    return parts[0], f"{parts[1]}/{parts[2]}"


def ttl_expiry(ttl: int | None, now: float) -> float | None:
    if ttl is None:
        return None
    if ttl <= 0:
        raise HttpError(400, f"ttl_seconds: must be positive, got {ttl}")
    return now + ttl


def json_body(request: HttpRequest, *, optional: bool = False) -> Body:
    if not request.body.strip():
        if optional:
            return Body({})
        raise HttpError(400, "request body must be a JSON object")
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"malformed JSON body: {exc}") from None
    request.log_json = data
    return Body(data)
