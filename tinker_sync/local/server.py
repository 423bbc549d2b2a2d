"""``LocalServer``: a protocol-faithful Tinker server on loopback
(docs/design/local-server.md#localserver).

Usage::

    from tinker_sync.local import LocalServer

    with LocalServer(faults=["asample 429 x2 retry_after=0.5"]) as server:
        os.environ.update(server.env)          # TINKER_BASE_URL / TINKER_API_KEY
        ...                                    # run any Tinker client against server.url
        server.requests.wait_for("asample", count=3)
        server.faults.assert_exhausted()

``in_subprocess=True`` runs the server in a child Python process (for fork and multiprocess
tests) and drives it through the admin endpoints (``/_local/``) with the same API.

Thread safety: every public method may be called from any thread. Fork safety: a forked child
must not use a parent's in-process server (its loop thread does not exist there); a subprocess
server's proxies hold no sockets and keep working in a forked child, but only the creating
process may stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from tinker_sync.local._admin import AdminApi, AdminChannel, RemoteFaultPlan, RemoteRequestLog
from tinker_sync.local._faults import FaultPlan, FaultSpec, as_plan, parse_fault
from tinker_sync.local._http import HttpServer
from tinker_sync.local._httpapi import QUEUE_STATES, App, QueueState
from tinker_sync.local._log import RequestLog

__all__ = ["LocalServer"]

Backend = Literal["instant", "tiny"]
Kind = Literal["all", "sampling", "training"]

_KINDS = ("all", "sampling", "training")
_CHILD_READY_TIMEOUT_S = 120.0
#: Records kept by ``LocalServer.requests`` (older ones are evicted; counts stay exact).
_LOG_MAX_ENTRIES = 50_000


class LocalServer:
    """A local Tinker server: real HTTP on 127.0.0.1, an ``instant`` or ``tiny`` backend.

    Usage: ``with LocalServer() as server: ...`` (or ``server = LocalServer().start()``).

    Params (docs/design/local-server.md#localserver): ``backend``; ``host``/``port`` (0 = any free
    port); ``api_key`` (None accepts any ``tml-`` key); ``data_dir`` (None = a temporary directory
    removed on stop); ``faults`` (a FaultPlan, or Fault / dict / compact-string specs);
    ``client_config`` (overrides of the reported client flags); ``long_poll_s``; ``work_delay_s``
    (simulated time per future); ``heartbeat_expiry_s``; ``models``; ``accept_any_model``; ``seed``;
    ``in_subprocess``; ``protocol`` (``"current"`` or ``"legacy"``). Beyond the spec:
    ``gap_grace_s`` (how long a model waits for a missing seq_id before skipping it, default 30 s)
    and ``metadata_threshold_bytes`` (results above this size are first announced with a
    metadata-only answer, default 4 MiB); ``tls`` (``(certfile, keyfile)``: serve HTTPS with this
    certificate, e.g. a throwaway one; ``url`` then starts with ``https://``).

    With ``in_subprocess=True`` the rules and the log live in the child: ``faults`` and
    ``requests`` are proxies over the admin port (a separate port that ``refuse_connections``
    never closes); at ``stop()`` they are replaced by local snapshots. ``requests`` keeps the
    last 50,000 records (counts stay exact).

    Thread safety: any thread. Fork safety: see the module docstring.
    """

    def __init__(
        self,
        backend: Backend = "instant",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = "tml-local",
        data_dir: str | os.PathLike[str] | None = None,
        faults: FaultPlan | Sequence[FaultSpec] | None = None,
        client_config: Mapping[str, Any] | None = None,
        long_poll_s: float = 20.0,
        work_delay_s: float = 0.0,
        heartbeat_expiry_s: float | None = None,
        models: Sequence[str] | None = None,
        accept_any_model: bool = True,
        seed: int = 0,
        in_subprocess: bool = False,
        protocol: Literal["current", "legacy"] = "current",
        gap_grace_s: float = 30.0,
        metadata_threshold_bytes: int = 4 * 1024 * 1024,
        tls: tuple[str, str] | None = None,
    ) -> None:
        if backend not in ("instant", "tiny"):
            raise ValueError(f"backend must be 'instant' or 'tiny', got {backend!r}")
        if protocol not in ("current", "legacy"):
            raise ValueError(f"protocol must be 'current' or 'legacy', got {protocol!r}")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"bad port {port!r}")
        if api_key is not None and not api_key:
            raise ValueError("api_key must be a non-empty string or None")
        self._backend: Backend = backend
        self._gap_grace_s = float(gap_grace_s)
        self._metadata_threshold_bytes = int(metadata_threshold_bytes)
        self._host = host
        self._port = port
        self._api_key = api_key
        self._data_dir_arg = None if data_dir is None else Path(data_dir)
        self._client_config = dict(client_config or {})
        self._dynamic_config: dict[str, Any] = {}
        self._long_poll_s = float(long_poll_s)
        self._work_delay_s = float(work_delay_s)
        self._heartbeat_expiry_s = heartbeat_expiry_s
        self._models = None if models is None else list(models)
        self._accept_any_model = accept_any_model
        self._seed = seed
        self._in_subprocess = in_subprocess
        self._protocol: Literal["current", "legacy"] = protocol
        self._admin_listener = False  # set in a subprocess child
        self._tls = None if tls is None else (str(tls[0]), str(tls[1]))

        self._lock = threading.RLock()
        self._started = False
        self._stopped = False
        self._data_dir: Path | None = None
        self._temp_dir = False
        # in-process
        self._plan: FaultPlan = (
            as_plan(faults) if not in_subprocess else FaultPlan(self._specs(faults))
        )
        self._log: RequestLog = RequestLog(max_entries=_LOG_MAX_ENTRIES)
        self._app: App | None = None
        self._http: HttpServer | None = None
        # subprocess
        self._proc: subprocess.Popen[bytes] | None = None
        self._channel: AdminChannel | None = None
        self._child_info: dict[str, Any] = {}

    @staticmethod
    def _specs(faults: FaultPlan | Sequence[FaultSpec] | None) -> list[FaultSpec]:
        return [r.fault for r in as_plan(faults).rules]

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> LocalServer:
        """Start serving (idempotent); returns ``self``."""
        with self._lock:
            if self._started:
                if self._stopped:
                    raise RuntimeError(
                        "a stopped LocalServer cannot be restarted; create a new one"
                    )
                return self
            self._started = True
            try:
                if self._in_subprocess:
                    self._start_child()
                else:
                    self._start_in_process()
            except BaseException:
                self._stop_locked(5.0)
                raise
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener, drop held long polls, join threads, remove a temporary data_dir.

        Idempotent.
        """
        with self._lock:
            if not self._started or self._stopped:
                self._stopped = self._stopped or self._started
                return
            self._stop_locked(timeout)

    def _stop_locked(self, timeout: float) -> None:
        self._stopped = True
        if self._http is not None:
            self._http.stop(timeout)
        if self._proc is not None:
            self._stop_child(timeout)
        if self._app is not None:
            close = getattr(self._app, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    pass
        if self._temp_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        # Best effort for a forgotten subprocess server; in-process threads are daemons.
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(Exception):
                proc.kill()

    def __repr__(self) -> str:
        where = "subprocess" if self._in_subprocess else "in-process"
        if self._started and not self._stopped:
            return f"<LocalServer {self.url} backend={self._backend} {where}>"
        state = "stopped" if self._stopped else "not started"
        return f"<LocalServer {state} backend={self._backend} {where}>"

    # -- in-process --------------------------------------------------------------------------

    def _make_data_dir(self) -> Path:
        if self._data_dir_arg is not None:
            self._data_dir_arg.mkdir(parents=True, exist_ok=True)
            return self._data_dir_arg
        self._temp_dir = True
        return Path(tempfile.mkdtemp(prefix="tinker-sync-local-"))

    def _build_app(self, data_dir: Path) -> App:
        from tinker_sync.local._app import TinkerApp

        app: App = TinkerApp(
            backend=self._backend,
            api_key=self._api_key,
            data_dir=data_dir,
            client_config=self._client_config,
            dynamic_config=self._dynamic_config,
            long_poll_s=self._long_poll_s,
            work_delay_s=self._work_delay_s,
            heartbeat_expiry_s=self._heartbeat_expiry_s,
            models=self._models,
            accept_any_model=self._accept_any_model,
            seed=self._seed,
            protocol=self._protocol,
            gap_grace_s=self._gap_grace_s,
            metadata_threshold_bytes=self._metadata_threshold_bytes,
        )
        return app

    def _start_in_process(self) -> None:
        self._data_dir = self._make_data_dir()
        app = self._build_app(self._data_dir)
        self._app = app

        async def on_stop() -> None:
            # cancels the app's worker tasks on the loop (close() later is idempotent)
            await _maybe_call(app, "aclose")

        self._http = HttpServer(
            app,
            host=self._host,
            port=self._port,
            faults=self._plan,
            log=self._log,
            admin=AdminApi(_Controls(self), self._api_key),
            admin_listener=self._admin_listener,
            on_stop=on_stop,
            tls=self._tls,
        )
        self._http.start()

    # -- subprocess --------------------------------------------------------------------------

    def _child_config(self) -> dict[str, Any]:
        return {
            "backend": self._backend,
            "host": self._host,
            "port": self._port,
            "api_key": self._api_key,
            "data_dir": None if self._data_dir_arg is None else str(self._data_dir_arg),
            "faults": [r.fault.to_dict() for r in self._plan.rules],
            "client_config": self._client_config,
            "long_poll_s": self._long_poll_s,
            "work_delay_s": self._work_delay_s,
            "heartbeat_expiry_s": self._heartbeat_expiry_s,
            "models": self._models,
            "accept_any_model": self._accept_any_model,
            "seed": self._seed,
            "protocol": self._protocol,
            "gap_grace_s": self._gap_grace_s,
            "metadata_threshold_bytes": self._metadata_threshold_bytes,
            "tls": self._tls,
        }

    def _start_child(self) -> None:
        config = json.dumps(self._child_config())
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        )
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tinker_sync.local.server import _child_main; _child_main()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(config.encode() + b"\n")
        self._proc.stdin.flush()
        line = _readline_with_timeout(self._proc.stdout, _CHILD_READY_TIMEOUT_S)
        if not line:
            code = self._proc.poll()
            raise RuntimeError(f"local server subprocess did not start (exit code {code})")
        info = json.loads(line)
        if not info.get("ok"):
            raise RuntimeError(f"local server subprocess failed to start: {info.get('error')}")
        self._child_info = info
        self._port = int(info["port"])
        self._data_dir = Path(info["data_dir"])
        self._channel = AdminChannel(self._host, int(info["admin_port"]), self._api_key)
        self._plan = RemoteFaultPlan(self._channel)
        self._log = RemoteRequestLog(self._channel)
        if self._dynamic_config:
            self._channel.call("PUT", "dynamic_config", self._dynamic_config)

    def _stop_child(self, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        # Keep the log and the rule counters readable after stop (as for in-process servers).
        if self._channel is not None and proc.poll() is None:
            with contextlib.suppress(Exception):
                records = self._log.all()
                rules = self._plan.rules
                log = RequestLog(max_entries=_LOG_MAX_ENTRIES)
                for record in records:
                    log.record(record)
                self._log = log
                self._plan = FaultPlan.from_rules(rules)
        if proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.write(b"stop\n")
                proc.stdin.flush()
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout + 2.0)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def pid(self) -> int:
        """The pid of the process serving (this one, or the child with ``in_subprocess``)."""
        if self._proc is not None:
            return self._proc.pid
        return os.getpid()

    # -- properties --------------------------------------------------------------------------

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("LocalServer is not started; call start() or use 'with'")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (``https://`` when serving TLS)."""
        self._require_started()
        host = f"[{self._host}]" if ":" in self._host else self._host
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    base_url = url

    @property
    def port(self) -> int:
        if self._http is not None:
            return self._http.port
        return self._port

    @property
    def host(self) -> str:
        return self._host

    @property
    def api_key(self) -> str | None:
        return self._api_key

    @property
    def data_dir(self) -> Path:
        self._require_started()
        assert self._data_dir is not None
        return self._data_dir

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def env(self) -> dict[str, str]:
        """``{"TINKER_BASE_URL": url, "TINKER_API_KEY": key}``."""
        return {"TINKER_BASE_URL": self.url, "TINKER_API_KEY": self._api_key or "tml-local"}

    @property
    def faults(self) -> FaultPlan:
        """The live fault plan (add / extend / clear / rules / assert_exhausted)."""
        return self._plan

    @property
    def requests(self) -> RequestLog:
        """The request log (filter / count / wait_for / clear)."""
        return self._log

    @property
    def app(self) -> App | None:
        """The protocol app of an in-process server (None in subprocess mode)."""
        return self._app

    # -- controls ----------------------------------------------------------------------------

    def _run_control(self, name: str, *args: Any) -> Any:
        self._require_started()
        if self._stopped:
            raise RuntimeError("LocalServer is stopped")
        assert self._http is not None
        controls = _Controls(self)
        return self._http.run_coroutine(getattr(controls, name)(*args))

    def pause(
        self,
        state: QueueState = "paused_capacity",
        reason: str | None = None,
        *,
        kind: Kind = "all",
    ) -> None:
        """Pause work: polls answer ``try_again`` with ``state`` and nothing advances.

        ``state="active"`` only stops work (polls are held as long as for any pending
        future), which is how a slow or busy server looks to clients.
        """
        if state not in QUEUE_STATES:
            raise ValueError(f"state must be one of {QUEUE_STATES}, got {state!r}")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if self._channel is not None:
            self._channel.call("POST", "pause", {"state": state, "reason": reason, "kind": kind})
            return
        self._run_control("pause", state, reason, kind)

    def resume(self, kind: Kind = "all") -> None:
        """End a :meth:`pause` (for ``kind``)."""
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if self._channel is not None:
            self._channel.call("POST", "resume", {"kind": kind})
            return
        self._run_control("resume", kind)

    def refuse_connections(self, seconds: float) -> None:
        """Close the listener and idle keep-alive connections for ``seconds``.

        New requests meanwhile fail with "connection refused"; then the server listens again on
        the same port. Returns once the listener is closed.
        """
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        if self._channel is not None:
            self._channel.call("POST", "refuse", {"seconds": seconds})
            return
        self._require_started()
        assert self._http is not None
        self._http.refuse_connections(seconds)

    def wait_listening(self, timeout: float = 10.0) -> bool:
        """Block until the server accepts connections again (after a refusal); False on timeout."""
        if self._channel is not None:
            out = self._channel.call(
                "POST", "wait_listening", {"timeout": timeout}, timeout=timeout + 30.0
            )
            return bool(out["listening"])
        self._require_started()
        assert self._http is not None
        return self._http.wait_listening(timeout)

    def set_client_config(self, **flags: Any) -> None:
        """Change the flags ``/api/v1/client/config`` reports (clients that start afterwards)."""
        if self._channel is not None:
            self._channel.call("PUT", "client_config", flags)
            return
        if not self._started:
            self._client_config.update(flags)
            return
        self._run_control("set_client_config", flags)

    def set_dynamic_config(self, **flags: Any) -> None:
        """Change what ``/api/v1/client/dynamic_config`` reports."""
        if self._channel is not None:
            self._channel.call("PUT", "dynamic_config", flags)
            return
        if not self._started:
            self._dynamic_config.update(flags)
            return
        self._run_control("set_dynamic_config", flags)

    def state(self) -> dict[str, Any]:
        """Snapshot: sessions, models (last processed seq_id), samplers, checkpoint counts."""
        if self._channel is not None:
            return dict(self._channel.call("GET", "state"))
        return dict(self._run_control("state"))


async def _maybe_call(obj: Any, name: str, *args: Any) -> Any:
    """Call ``obj.name(*args)`` if it exists, awaiting the result when it is awaitable."""
    fn = getattr(obj, name, None)
    if fn is None or not callable(fn):
        return None
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _must_call(obj: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    fn = getattr(obj, name, None)
    if fn is None or not callable(fn):
        raise NotImplementedError(f"the local server app does not implement {name}()")
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class _Controls:
    """The admin target of one in-process server; coroutines run on its loop."""

    def __init__(self, server: LocalServer) -> None:
        self._server = server

    @property
    def faults(self) -> FaultPlan:
        return self._server._plan

    @property
    def requests(self) -> RequestLog:
        return self._server._log

    def info(self) -> dict[str, Any]:
        s = self._server
        return {
            "pid": os.getpid(),
            "url": s.url,
            "port": s.port,
            "data_dir": str(s._data_dir),
            "backend": s._backend,
        }

    async def state(self) -> dict[str, Any]:
        result = await _must_call(self._server._app, "state")
        return dict(result)

    async def pause(self, state: str, reason: str | None, kind: str) -> None:
        if state not in QUEUE_STATES:
            raise ValueError(f"state must be one of {QUEUE_STATES}, got {state!r}")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        await _must_call(self._server._app, "pause", state, reason, kind=kind)

    async def resume(self, kind: str) -> None:
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        await _must_call(self._server._app, "resume", kind=kind)

    async def refuse(self, seconds: float) -> None:
        http = self._server._http
        assert http is not None
        await http._refuse(seconds)

    async def wait_listening(self, timeout: float) -> bool:
        http = self._server._http
        assert http is not None
        return await asyncio.to_thread(http.wait_listening, timeout)

    async def set_client_config(self, flags: dict[str, Any]) -> None:
        self._server._client_config.update(flags)
        await _must_call(self._server._app, "set_client_config", **flags)

    async def set_dynamic_config(self, flags: dict[str, Any]) -> None:
        self._server._dynamic_config.update(flags)
        await _must_call(self._server._app, "set_dynamic_config", **flags)


# ---------------------------------------------------------------------------------------------
# the child process of LocalServer(in_subprocess=True)


def _readline_with_timeout(stream: IO[bytes], timeout: float) -> bytes:
    """Read one line from a pipe, giving up after ``timeout`` seconds (returns b"")."""
    result: list[bytes] = []
    done = threading.Event()

    def reader() -> None:
        try:
            result.append(stream.readline())
        except (OSError, ValueError):
            result.append(b"")
        finally:
            done.set()

    threading.Thread(target=reader, name="tinker-sync-local-child-ready", daemon=True).start()
    if not done.wait(timeout):
        return b""
    return result[0]


def _child_main() -> None:
    """Entry point of the server child: config on stdin, ready line on stdout, stop on stdin."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and stops us
    out = sys.stdout
    sys.stdout = sys.stderr  # keep the protocol pipe clean of stray prints
    config = json.loads(sys.stdin.readline())
    config["faults"] = [parse_fault(f) for f in config.get("faults") or []]
    if config.get("tls") is not None:
        config["tls"] = tuple(config["tls"])
    server = LocalServer(**config)
    server._admin_listener = True
    try:
        server.start()
    except BaseException as exc:
        out.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        raise SystemExit(1) from None
    http = server._http
    assert http is not None
    out.write(
        json.dumps(
            {
                "ok": True,
                "pid": os.getpid(),
                "port": server.port,
                "admin_port": http.admin_port,
                "data_dir": str(server.data_dir),
            }
        )
        + "\n"
    )
    out.flush()
    try:
        for line in sys.stdin:  # until "stop" or EOF (the parent died or closed the pipe)
            if line.strip() == "stop":
                break
    finally:
        server.stop()
