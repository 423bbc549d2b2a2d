"""The local server's request log (``LocalServer.requests``).

Usage::

    server.requests.wait_for("asample", count=2, timeout=5)
    assert server.requests.count("asample") == 2
    [rec] = server.requests.filter(endpoint="optim_step", status="dropped")
    assert rec.dropped == "before" and rec.fault == "optim_step drop-before"

``endpoint`` arguments are globs with the fault-rule syntax (``training_runs/*/checkpoints/**``,
a full path starting with ``/``, or ``*``); a plain name matches exactly.

Thread safety: every method may be called from any thread; ``wait_for`` blocks on a Condition.
Fork safety: a forked child gets a frozen copy that the server no longer updates.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeAlias

from tinker_sync._runtime.redact import redact_headers
from tinker_sync.local._faults import compile_glob

__all__ = ["DROPPED", "RecordedRequest", "RequestLog", "StatusFilter"]

#: ``status=DROPPED`` in :meth:`RequestLog.filter` selects requests answered by a dropped
#: connection (their ``status`` is None).
DROPPED: Literal["dropped"] = "dropped"
StatusFilter: TypeAlias = "int | Literal['dropped'] | None"


class RecordedRequest:
    """One request as the server saw it (read-only).

    ``status`` is None when the connection was dropped (``dropped`` is then ``"before"`` or
    ``"after"``: the handler did not run / ran and its reply was lost). ``headers`` are redacted
    (computed on first access from ``raw_headers``, so recording stays cheap; the raw values
    never appear in ``repr``, ``to_dict`` or pickles). ``json`` is the parsed JSON body (None for
    protobuf or empty bodies); ``proto`` the decoded protobuf summary (``model_id``, ``seq_id``,
    ``loss_fn``, ``forward_only``, datum count); ``fault`` the name of the fault rule applied.

    Thread safety: immutable once built (the lazy redaction is idempotent). Fork safety: plain data.
    """

    __slots__ = (
        "_headers",
        "_raw_headers",
        "dropped",
        "duration_s",
        "endpoint",
        "fault",
        "json",
        "method",
        "path",
        "proto",
        "query",
        "status",
        "time",
    )

    def __init__(
        self,
        *,
        time: float,
        method: str,
        path: str,
        endpoint: str,
        status: int | None,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        proto: Mapping[str, Any] | None = None,
        fault: str | None = None,
        duration_s: float = 0.0,
        query: Mapping[str, str] | None = None,
        dropped: Literal["before", "after"] | None = None,
        raw_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.time = time
        self.method = method
        self.path = path
        self.endpoint = endpoint
        self.status = status
        self._headers: dict[str, str] | None = (
            redact_headers(headers) if headers is not None else None
        )
        self._raw_headers = None if headers is not None else raw_headers
        self.json = json
        self.proto = proto
        self.fault = fault
        self.duration_s = duration_s
        self.query: Mapping[str, str] = query if query is not None else {}
        self.dropped = dropped

    @property
    def headers(self) -> dict[str, str]:
        """The request headers (lower-case names) with secret values replaced."""
        if self._headers is None:
            self._headers = redact_headers(self._raw_headers or {})
            self._raw_headers = None
        return self._headers

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the admin API's wire form)."""
        return {
            "time": self.time,
            "method": self.method,
            "path": self.path,
            "endpoint": self.endpoint,
            "status": self.status,
            "headers": dict(self.headers),
            "json": self.json,
            "proto": None if self.proto is None else dict(self.proto),
            "fault": self.fault,
            "duration_s": self.duration_s,
            "query": dict(self.query),
            "dropped": self.dropped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedRequest:
        return cls(
            time=float(data["time"]),
            method=str(data["method"]),
            path=str(data["path"]),
            endpoint=str(data["endpoint"]),
            status=None if data.get("status") is None else int(data["status"]),
            headers=dict(data.get("headers") or {}),
            json=data.get("json"),
            proto=data.get("proto"),
            fault=data.get("fault"),
            duration_s=float(data.get("duration_s") or 0.0),
            query=dict(data.get("query") or {}),
            dropped=data.get("dropped"),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordedRequest):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_dict, (self.to_dict(),))

    def __repr__(self) -> str:
        status = self.status if self.dropped is None else f"dropped-{self.dropped}"
        fault = f" fault={self.fault!r}" if self.fault else ""
        return f"<RecordedRequest {self.method} {self.path} -> {status}{fault}>"


def _from_dict(data: Mapping[str, Any]) -> RecordedRequest:
    return RecordedRequest.from_dict(data)


def _status_ok(rec_status: int | None, wanted: StatusFilter) -> bool:
    if wanted is None:
        return True
    if wanted == DROPPED:
        return rec_status is None
    return rec_status == wanted


def _selector(
    endpoint: str | None, method: str | None, status: StatusFilter
) -> Callable[[str, str, str, int | None], bool]:
    """``select(path, endpoint, method, status)`` for the given filters."""
    matcher = compile_glob(endpoint) if endpoint is not None else None
    method_u = method.upper() if method is not None else None

    def select(path: str, ep: str, meth: str, st: int | None) -> bool:
        if method_u is not None and meth != method_u:
            return False
        if not _status_ok(st, status):
            return False
        return matcher is None or matcher(path, ep)

    return select


class RequestLog:
    """Every request the server answered (or dropped), in completion order.

    Usage: ``log.count("asample")``, ``log.filter(endpoint="forward_backward", status=200)``,
    ``log.wait_for("retrieve_future", count=3)``, ``log.clear()``.

    ``max_entries`` bounds the retained records (oldest evicted); ``count`` and ``wait_for``
    stay exact regardless. Thread safety: any thread. Fork safety: see module docstring.
    """

    def __init__(self, max_entries: int | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._entries: collections.deque[RecordedRequest] = collections.deque(maxlen=max_entries)
        # (path, endpoint, method, status) -> count; exact even when entries are evicted.
        self._counts: collections.Counter[tuple[str, str, str, int | None]] = collections.Counter()
        self._listeners: list[Callable[[], None]] = []

    # -- writing -----------------------------------------------------------------------------

    def record(self, entry: RecordedRequest) -> None:
        """Append one record and wake waiters (called by the HTTP layer)."""
        with self._cond:
            self._entries.append(entry)
            self._counts[(entry.path, entry.endpoint, entry.method, entry.status)] += 1
            self._cond.notify_all()
            listeners = list(self._listeners) if self._listeners else None
        if listeners:
            for listener in listeners:
                listener()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after every record / clear; returns the unsubscribe function."""
        with self._cond:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._cond:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def clear(self) -> None:
        """Forget every record (counts restart from zero)."""
        with self._cond:
            self._entries.clear()
            self._counts.clear()
            self._cond.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    # -- reading -----------------------------------------------------------------------------

    def all(self) -> list[RecordedRequest]:
        """A snapshot of the retained records."""
        with self._cond:
            return list(self._entries)

    def __iter__(self) -> Iterator[RecordedRequest]:
        return iter(self.all())

    def __len__(self) -> int:
        with self._cond:
            return sum(self._counts.values())

    def filter(
        self,
        endpoint: str | None = None,
        method: str | None = None,
        status: StatusFilter = None,
    ) -> list[RecordedRequest]:
        """Records matching every given filter (``status="dropped"`` for dropped ones)."""
        select = _selector(endpoint, method, status)
        with self._cond:
            entries = list(self._entries)
        return [e for e in entries if select(e.path, e.endpoint, e.method, e.status)]

    def _count_locked(self, select: Callable[[str, str, str, int | None], bool]) -> int:
        return sum(n for key, n in self._counts.items() if select(*key))

    def count(
        self,
        endpoint: str | None = None,
        method: str | None = None,
        status: StatusFilter = None,
    ) -> int:
        """Number of requests matching the filters (exact even after eviction)."""
        select = _selector(endpoint, method, status)
        with self._cond:
            return self._count_locked(select)

    def wait_for(
        self,
        endpoint: str | None,
        count: int = 1,
        timeout: float = 5.0,
        *,
        method: str | None = None,
        status: StatusFilter = None,
    ) -> list[RecordedRequest]:
        """Block until at least ``count`` matching requests are recorded; return them.

        Raises TimeoutError (naming what was seen) after ``timeout`` seconds.
        """
        select = _selector(endpoint, method, status)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                seen = self._count_locked(select)
                if seen >= count:
                    entries = list(self._entries)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"waited {timeout:g}s for {count} request(s) to {endpoint!r}"
                        f" (method={method}, status={status}); saw {seen}"
                    )
                self._cond.wait(remaining)
        return [e for e in entries if select(e.path, e.endpoint, e.method, e.status)]

    def __repr__(self) -> str:
        return f"<RequestLog {len(self)} requests>"
