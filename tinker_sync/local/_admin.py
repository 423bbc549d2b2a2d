"""Admin endpoints of the local server (``/_local/...``) and the parent-side proxies using them.

Not part of the Tinker protocol; no SDK calls them. They let a test drive a server that runs in
another process (``LocalServer(in_subprocess=True)``) with the same Python API::

    GET    /_local/info               pid, url, port, data_dir
    GET    /_local/state              LocalServer.state()
    GET    /_local/requests           ?endpoint=&method=&status=   -> {"requests": [...]}
    GET    /_local/requests/count     ?endpoint=&method=&status=   -> {"count": n}
    POST   /_local/requests/wait      {"endpoint", "count", "timeout", "method", "status"}
    DELETE /_local/requests
    GET    /_local/faults             -> {"rules": [...]}
    POST   /_local/faults             {"faults": [spec, ...]} (specs: dicts or compact strings)
    DELETE /_local/faults
    POST   /_local/pause              {"state", "reason", "kind"}
    POST   /_local/resume             {"kind"}
    POST   /_local/refuse             {"seconds"}
    POST   /_local/wait_listening     {"timeout"}  -> {"listening": bool}
    PUT    /_local/client_config      {flag: value, ...}
    PUT    /_local/dynamic_config     {flag: value, ...}

Authentication: ``X-API-Key`` (or ``Authorization: Bearer``) equal to the server's key; a server
with ``api_key=None`` accepts any ``tml-`` key.

Thread safety: :class:`AdminApi` runs on the server loop; the proxies (:class:`AdminChannel`,
:class:`RemoteFaultPlan`, :class:`RemoteRequestLog`) open one connection per call and may be
used from any thread. Fork safety: the proxies hold no sockets between calls, so a forked child
may keep using them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http.client
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlencode

from tinker_sync._runtime.redact import scrub
from tinker_sync.local._faults import FaultPlan, FaultRule, FaultSpec, parse_fault
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._log import DROPPED, RecordedRequest, RequestLog, StatusFilter

__all__ = ["AdminApi", "AdminChannel", "AdminTarget", "RemoteFaultPlan", "RemoteRequestLog"]

PREFIX = "/_local/"


class AdminTarget(Protocol):
    """What the admin endpoints control (implemented by the server; methods run on its loop)."""

    @property
    def faults(self) -> FaultPlan: ...

    @property
    def requests(self) -> RequestLog: ...

    def info(self) -> dict[str, Any]: ...

    async def state(self) -> dict[str, Any]: ...

    async def pause(self, state: str, reason: str | None, kind: str) -> None: ...

    async def resume(self, kind: str) -> None: ...

    async def refuse(self, seconds: float) -> None: ...

    async def wait_listening(self, timeout: float) -> bool: ...

    async def set_client_config(self, flags: dict[str, Any]) -> None: ...

    async def set_dynamic_config(self, flags: dict[str, Any]) -> None: ...


def _status_param(value: Any) -> StatusFilter:
    if value is None or value == "":
        return None
    if value == DROPPED:
        return DROPPED
    return int(value)


def check_key(headers: Mapping[str, str], api_key: str | None) -> bool:
    """Whether the request carries the server's key (any ``tml-`` key when ``api_key`` is None)."""
    given = headers.get("x-api-key")
    if not given:
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
    if not given:
        return False
    if api_key is None:
        return given.startswith("tml-")
    return hmac.compare_digest(given.encode(), api_key.encode())


class AdminApi:
    """Answers ``/_local/`` requests for one server.

    Usage: ``HttpServer(app, admin=AdminApi(target, api_key))``.

    Thread safety: called on the server loop only. Fork safety: not applicable (loop-bound).
    """

    def __init__(self, target: AdminTarget, api_key: str | None) -> None:
        self._target = target
        self._api_key = api_key
        self._routes: dict[tuple[str, str], Callable[[HttpRequest], Awaitable[HttpResponse]]] = {
            ("GET", "info"): self._info,
            ("GET", "state"): self._state,
            ("GET", "requests"): self._requests,
            ("GET", "requests/count"): self._requests_count,
            ("POST", "requests/wait"): self._requests_wait,
            ("DELETE", "requests"): self._requests_clear,
            ("GET", "faults"): self._faults_get,
            ("POST", "faults"): self._faults_add,
            ("DELETE", "faults"): self._faults_clear,
            ("POST", "pause"): self._pause,
            ("POST", "resume"): self._resume,
            ("POST", "refuse"): self._refuse,
            ("POST", "wait_listening"): self._wait_listening,
            ("PUT", "client_config"): self._client_config,
            ("PUT", "dynamic_config"): self._dynamic_config,
        }

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if not check_key(request.headers, self._api_key):
            return HttpResponse.error(401, "admin endpoints need the server's API key")
        name = request.path[len(PREFIX) :].strip("/")
        handler = self._routes.get((request.method, name))
        if handler is None:
            if any(n == name for _, n in self._routes):
                return HttpResponse.error(405, f"method {request.method} not allowed on {name}")
            return HttpResponse.error(404, f"no admin endpoint {name!r}")
        try:
            return await handler(request)
        except (ValueError, TypeError, KeyError) as exc:
            return HttpResponse.error(400, scrub(f"bad admin request: {exc}"))
        except Exception as exc:
            return HttpResponse.error(500, scrub(f"admin call failed: {type(exc).__name__}: {exc}"))

    @staticmethod
    def _body(request: HttpRequest) -> Any:
        if not request.body:
            return {}
        return json.loads(request.body)

    @staticmethod
    def _filters(params: Mapping[str, Any]) -> tuple[str | None, str | None, StatusFilter]:
        return (
            params.get("endpoint") or None,
            params.get("method") or None,
            _status_param(params.get("status")),
        )

    async def _info(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(self._target.info())

    async def _state(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(await self._target.state())

    async def _requests(self, request: HttpRequest) -> HttpResponse:
        endpoint, method, status = self._filters(request.query)
        records = self._target.requests.filter(endpoint=endpoint, method=method, status=status)
        return HttpResponse.json({"requests": [r.to_dict() for r in records]})

    async def _requests_count(self, request: HttpRequest) -> HttpResponse:
        endpoint, method, status = self._filters(request.query)
        n = self._target.requests.count(endpoint=endpoint, method=method, status=status)
        return HttpResponse.json({"count": n})

    async def _requests_wait(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        endpoint, method, status = self._filters(body)
        count = int(body.get("count", 1))
        timeout = float(body.get("timeout", 5.0))
        log = self._target.requests
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(changed.set)

        unsubscribe = log.subscribe(wake)
        deadline = loop.time() + timeout
        try:
            while True:
                changed.clear()
                seen = log.count(endpoint=endpoint, method=method, status=status)
                if seen >= count:
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return HttpResponse.json(
                        {
                            "detail": f"waited {timeout:g}s for {count} request(s) to"
                            f" {endpoint!r} (method={method}, status={status}); saw {seen}",
                            "seen": seen,
                        },
                        408,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        finally:
            unsubscribe()
        records = log.filter(endpoint=endpoint, method=method, status=status)
        return HttpResponse.json({"requests": [r.to_dict() for r in records]})

    async def _requests_clear(self, request: HttpRequest) -> HttpResponse:
        self._target.requests.clear()
        return HttpResponse.json({"ok": True})

    async def _faults_get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"rules": self._target.faults.to_list()})

    async def _faults_add(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        specs = body.get("faults") if isinstance(body, Mapping) else body
        if isinstance(specs, (str, Mapping)):
            specs = [specs]
        if not isinstance(specs, list):
            raise ValueError("expected {'faults': [spec, ...]}")
        rules = self._target.faults.extend([parse_fault(s) for s in specs])
        return HttpResponse.json({"rules": [r.to_dict() for r in rules]})

    async def _faults_clear(self, request: HttpRequest) -> HttpResponse:
        self._target.faults.clear()
        return HttpResponse.json({"ok": True})

    async def _pause(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        await self._target.pause(
            str(body.get("state", "paused_capacity")),
            body.get("reason"),
            str(body.get("kind", "all")),
        )
        return HttpResponse.json({"ok": True})

    async def _resume(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        await self._target.resume(str(body.get("kind", "all")))
        return HttpResponse.json({"ok": True})

    async def _refuse(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        await self._target.refuse(float(body["seconds"]))
        return HttpResponse.json({"ok": True})

    async def _wait_listening(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        listening = await self._target.wait_listening(float(body.get("timeout", 10.0)))
        return HttpResponse.json({"listening": listening})

    async def _client_config(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        if not isinstance(body, dict):
            raise ValueError("expected a JSON object of flags")
        await self._target.set_client_config(body)
        return HttpResponse.json({"ok": True})

    async def _dynamic_config(self, request: HttpRequest) -> HttpResponse:
        body = self._body(request)
        if not isinstance(body, dict):
            raise ValueError("expected a JSON object of flags")
        await self._target.set_dynamic_config(body)
        return HttpResponse.json({"ok": True})


# ---------------------------------------------------------------------------------------------
# parent side


class AdminError(RuntimeError):
    """An admin call answered with an error status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"admin call failed ({status}): {detail}")
        self.status = status
        self.detail = detail


class AdminChannel:
    """Calls the admin endpoints of a server at ``host:port``.

    Usage: ``AdminChannel("127.0.0.1", port, "tml-local").call("GET", "state")``.

    Thread safety: one connection per call; any thread. Fork safety: safe (no kept sockets).
    """

    def __init__(self, host: str, port: int, api_key: str | None, timeout: float = 30.0) -> None:
        self.host = host
        self.port = port
        self._key = api_key or "tml-local-admin"
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<AdminChannel {self.host}:{self.port}>"

    def call(
        self,
        method: str,
        name: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send one admin request; returns the decoded JSON (raises :class:`AdminError`)."""
        path = PREFIX + name
        if query:
            params = {k: v for k, v in query.items() if v is not None}
            if params:
                path += "?" + urlencode(params)
        headers = {"X-API-Key": self._key, "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(
            self.host, self.port, timeout=self.timeout if timeout is None else timeout
        )
        try:
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = {"detail": data.decode("utf-8", "replace")}
        if resp.status >= 400:
            detail = decoded.get("detail") if isinstance(decoded, dict) else decoded
            raise AdminError(resp.status, str(detail))
        return decoded


class RemoteFaultPlan(FaultPlan):
    """The fault plan of a server in another process (same API; ``rules`` are snapshots).

    Thread safety: any thread. Fork safety: safe.
    """

    def __init__(self, channel: AdminChannel) -> None:
        super().__init__()
        self._channel = channel

    def add(self, spec: FaultSpec) -> FaultRule:
        return self.extend([spec])[0]

    def extend(self, specs: Iterable[FaultSpec]) -> list[FaultRule]:
        if isinstance(specs, (str, Mapping)):
            specs = [specs]
        payload = [parse_fault(s).to_dict() for s in specs]
        out = self._channel.call("POST", "faults", {"faults": payload})
        return [FaultRule.from_dict(r) for r in out["rules"]]

    def clear(self) -> None:
        self._channel.call("DELETE", "faults")

    @property
    def rules(self) -> list[FaultRule]:
        out = self._channel.call("GET", "faults")
        return [FaultRule.from_dict(r) for r in out["rules"]]

    def to_list(self) -> list[dict[str, Any]]:
        return list(self._channel.call("GET", "faults")["rules"])

    def __len__(self) -> int:
        return len(self.rules)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a remote fault plan is evaluated by the server process")

    def __repr__(self) -> str:
        return f"<RemoteFaultPlan via {self._channel!r}>"


class RemoteRequestLog(RequestLog):
    """The request log of a server in another process (same reading API).

    Thread safety: any thread. Fork safety: safe.
    """

    def __init__(self, channel: AdminChannel) -> None:
        super().__init__()
        self._channel = channel

    @staticmethod
    def _query(endpoint: str | None, method: str | None, status: StatusFilter) -> dict[str, Any]:
        return {"endpoint": endpoint, "method": method, "status": status}

    def record(self, entry: RecordedRequest) -> None:
        raise RuntimeError("a remote request log is written by the server process")

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        raise RuntimeError("a remote request log cannot be subscribed to")

    def clear(self) -> None:
        self._channel.call("DELETE", "requests")

    def all(self) -> list[RecordedRequest]:
        return self.filter()

    def __len__(self) -> int:
        return self.count()

    def filter(
        self,
        endpoint: str | None = None,
        method: str | None = None,
        status: StatusFilter = None,
    ) -> list[RecordedRequest]:
        out = self._channel.call("GET", "requests", query=self._query(endpoint, method, status))
        return [RecordedRequest.from_dict(r) for r in out["requests"]]

    def count(
        self,
        endpoint: str | None = None,
        method: str | None = None,
        status: StatusFilter = None,
    ) -> int:
        out = self._channel.call(
            "GET", "requests/count", query=self._query(endpoint, method, status)
        )
        return int(out["count"])

    def wait_for(
        self,
        endpoint: str | None,
        count: int = 1,
        timeout: float = 5.0,
        *,
        method: str | None = None,
        status: StatusFilter = None,
    ) -> list[RecordedRequest]:
        body = {**self._query(endpoint, method, status), "count": count, "timeout": timeout}
        try:
            out = self._channel.call("POST", "requests/wait", body, timeout=timeout + 30.0)
        except AdminError as exc:
            if exc.status == 408:
                raise TimeoutError(exc.detail) from None
            raise
        return [RecordedRequest.from_dict(r) for r in out["requests"]]

    def __repr__(self) -> str:
        return f"<RemoteRequestLog via {self._channel!r}>"
