"""The local server's Tinker protocol app: every ``/api/v1`` endpoint the SDKs call.

Usage (the HTTP layer owns the event loop and calls :meth:`TinkerApp.handle`)::

    app = TinkerApp("instant", api_key="tml-local", data_dir="/tmp/tinker-local")
    response = await app.handle(HttpRequest("POST", "/api/v1/create_session", {}, headers, body))
    app.pause("paused_capacity", "maintenance", kind="training"); app.resume("training")
    app.applied("sess:train:0")   # [(0, "CreateModel"), (1, "ForwardBackward"), ...]
    app.close()

Design: all protocol state lives on this one object, on the HTTP layer's single event loop;
the endpoints are grouped by resource in modules that share it -- ``_sessions`` (bootstrap,
sessions, telemetry), ``_training`` (models, forward/backward, optimizer steps, saves and
loads), ``_sampling`` (sampling sessions, asample), ``_polls`` (retrieve_future(s), cancels)
and ``_rest`` (runs, checkpoints, files) -- while this module keeps routing, authentication,
the control API and the per-model workers. Model work runs in a thread pool (one ordered asyncio
worker per model feeds it, so each model applies its requests strictly in seq_id order); long
polls await asyncio events (no thread per poll); durable metadata goes to SQLite and weights to
files under ``data_dir`` (see ``_store``).

Thread safety: :meth:`handle` must be awaited on one event loop; :meth:`pause`,
:meth:`resume`, :meth:`set_client_config`, :meth:`set_dynamic_config`, :meth:`state`,
:meth:`applied` and :meth:`close` may be called from any thread. Fork safety: not fork-safe.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from tinker_sync._runtime.redact import register_secret, scrub
from tinker_sync.local import _wirecodec as codec
from tinker_sync.local._body import (
    HttpError,
)
from tinker_sync.local._httpapi import QUEUE_STATES, HttpRequest, HttpResponse
from tinker_sync.local._jwt import JwtSigner, UrlSigner, looks_like_jwt
from tinker_sync.local._ordering import Offer, SeqQueue
from tinker_sync.local._polls import FutureApi
from tinker_sync.local._rest import FILES_PREFIX, RestApi
from tinker_sync.local._sampling import SamplingApi
from tinker_sync.local._sessions import DEFAULT_CLIENT_CONFIG, DEFAULT_DYNAMIC_CONFIG, SessionApi
from tinker_sync.local._state import (
    PROTO_KINDS,
    FutureRecord,
    FutureTable,
    ModelRuntime,
    SamplerRuntime,
    SessionRuntime,
    WorkItem,
)
from tinker_sync.local._store import (
    CheckpointFiles,
    Store,
)
from tinker_sync.local._training import TrainingApi
from tinker_sync.local.backends import get_backend
from tinker_sync.local.backends._common import KNOWN_MODELS
from tinker_sync.local.backends.base import (
    Backend,
    ForwardResult,
    LoraSpec,
    SampleResult,
    UserError,
)

__all__ = ["DEFAULT_CLIENT_CONFIG", "DEFAULT_DYNAMIC_CONFIG", "TinkerApp"]

logger = logging.getLogger("tinker_sync.local")

T = TypeVar("T")

API_PREFIX = "/api/v1/"


class TinkerApp:
    """The Tinker protocol app of ``tinker_sync.local`` (see the module docstring).

    Thread safety: ``handle`` on one event loop; control methods from any thread.
    Fork safety: not fork-safe.
    """

    def __init__(
        self,
        backend: str = "instant",
        *,
        api_key: str | None = "tml-local",
        data_dir: str | Path | None = None,
        client_config: Mapping[str, Any] | None = None,
        dynamic_config: Mapping[str, Any] | None = None,
        long_poll_s: float = 20.0,
        work_delay_s: float = 0.0,
        heartbeat_expiry_s: float | None = None,
        models: Sequence[str] | None = None,
        accept_any_model: bool = True,
        seed: int = 0,
        protocol: Literal["current", "legacy"] = "current",
        metadata_threshold_bytes: int = 4 * 1024 * 1024,
        gap_grace_s: float = 30.0,
        future_ttl_s: float = 900.0,
        jwt_ttl_s: float = 3600.0,
        max_workers: int = 4,
        max_ephemeral_samplers: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Build the app (no I/O besides opening ``data_dir``; no threads until work arrives).

        :param backend: ``"instant"`` (deterministic, microseconds) or ``"tiny"`` (a real
            small numpy LM), resolved with ``backends.get_backend``.
        :param api_key: the only accepted ``X-API-Key``; ``None`` accepts any key starting with
            ``tml-``. JWTs issued by ``/api/v1/auth/token`` are accepted in its place.
        :param data_dir: where the SQLite database and checkpoint files live. ``None`` makes a
            temporary directory that :meth:`close` removes. A new app on the same directory
            lists the old sessions, runs and checkpoints and can load or sample from them.
        :param client_config: overrides of the ``/client/config`` flags (see
            :data:`DEFAULT_CLIENT_CONFIG`; e.g. ``sample_use_retrieve_futures``,
            ``proto_compress_fwdbwd``, ``pjwt_auth_enabled``, ``fwdbwd_max_chunk_len``).
        :param dynamic_config: overrides of ``/client/dynamic_config`` (see
            :data:`DEFAULT_DYNAMIC_CONFIG`).
        :param long_poll_s: how long ``retrieve_future`` / ``retrieve_futures`` hold a poll
            before answering try_again / an empty batch (keep below the client's 45 s); a
            client may ask for less (``X-Tinker-Poll-Hold``, advertised on ``client/config``
            and poll replies as ``X-Tinker-Poll-Hold-Max``).
        :param work_delay_s: simulated processing time added to every future.
        :param heartbeat_expiry_s: end sessions without a heartbeat for this long (their
            heartbeats then get 410); ``None`` never expires sessions.
        :param models: base model names to advertise (``get_server_capabilities``); with
            ``accept_any_model=False`` also the only ones accepted.
        :param accept_any_model: accept any base model name (the backend's defaults otherwise).
        :param seed: backend seed (determinism of the instant backend, tiny's initialisation).
        :param protocol: ``"current"`` (0.38 protocol) or ``"legacy"`` (an older revision: JSON
            results only, no ``sample_sequence_ids``, empty metrics, create-via-load -> 422,
            404 on ``client/dynamic_config``).
        :param metadata_threshold_bytes: results larger than this are first announced with
            ``complete_metadata`` when the poll allows metadata-only answers.
        :param gap_grace_s: how long a model waits for a missing seq_id once a later one is
            queued before skipping it (with a logged warning).
        :param future_ttl_s: finished futures are forgotten this long after completion
            (polls then get 410).
        :param jwt_ttl_s: lifetime of issued JWTs.
        :param max_workers: threads running model work (shared by all models and samplers).
        :param max_ephemeral_samplers: samplers made by ``save_weights_and_get_sampling_client``
            hold unsaved weights in memory; beyond this many, the oldest are dropped (their
            ``asample`` then answers 404).
        :param clock: monotonic clock used for every wait and expiry (tests inject one).
        """
        if protocol not in ("current", "legacy"):
            raise ValueError(f"protocol must be 'current' or 'legacy', got {protocol!r}")
        self.backend_name = backend
        self.protocol = protocol
        self.api_key = api_key
        if api_key:
            register_secret(api_key)
        self.long_poll_s = float(long_poll_s)
        self.work_delay_s = float(work_delay_s)
        self.heartbeat_expiry_s = heartbeat_expiry_s
        self.metadata_threshold_bytes = int(metadata_threshold_bytes)
        self.gap_grace_s = float(gap_grace_s)
        self.jwt_ttl_s = float(jwt_ttl_s)
        self.seed = int(seed)
        self.accept_any_model = accept_any_model
        self._models_list = list(models) if models is not None else None
        self._clock = clock
        self._config_lock = threading.Lock()
        self._client_config = dict(DEFAULT_CLIENT_CONFIG)
        self._client_config.update(client_config or {})
        self._client_config["use_pyqwest_transport"] = bool(
            (client_config or {}).get("use_pyqwest_transport", False)
        )
        self._dynamic_config = dict(DEFAULT_DYNAMIC_CONFIG)
        self._dynamic_config.update(dynamic_config or {})

        self._backend: Backend = get_backend(
            backend, seed=self.seed, accept_any_model=accept_any_model or models is not None
        )
        self._backend_name = backend
        self._warned_models: set[str] = set()
        self._owns_dir = data_dir is None
        self.data_dir = Path(
            tempfile.mkdtemp(prefix="tinker-local-") if data_dir is None else data_dir
        )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._store = Store(self.data_dir / "tinker.sqlite3")
        self._files = CheckpointFiles(self.data_dir / "checkpoints")
        self._jwt = JwtSigner(
            self._store.setdefault_meta("jwt_secret", secrets.token_hex(32)).encode()
        )
        self._urls = UrlSigner(
            self._store.setdefault_meta("url_secret", secrets.token_hex(32)).encode()
        )
        self._rest = RestApi(
            self._store, self._files, self._urls, run_io=self._run_io, trace=self._trace
        )

        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="tinker-local-work"
        )
        self._io_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tinker-local-io")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

        self._futures = FutureTable(clock=clock, ttl_s=future_ttl_s)
        self._models: dict[str, ModelRuntime] = {}
        self._samplers: dict[str, SamplerRuntime] = {}
        self._sessions: dict[str, SessionRuntime] = {}
        self._custom_losses: dict[str, dict[str, Any]] = {}
        self._paused: dict[str, tuple[str, str | None] | None] = {
            "training": None,
            "sampling": None,
        }
        self._resumed = asyncio.Event()
        self._telemetry_events = 0
        self._skips_logged: dict[str, int] = {}
        self.max_ephemeral_samplers = int(max_ephemeral_samplers)
        self._ephemeral: collections.deque[str] = collections.deque()

        # Endpoint handlers, grouped by resource around this state object.
        self._session_api = SessionApi(self)
        self._training_api = TrainingApi(self)
        self._sampling_api = SamplingApi(self)
        self._future_api = FutureApi(self)

    # ==================================================================== control API

    def __repr__(self) -> str:
        return f"TinkerApp(backend={self.backend_name!r}, protocol={self.protocol!r}, data_dir={str(self.data_dir)!r})"

    def _on_loop(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn`` on the app's loop (directly when already there or no loop runs)."""
        loop = self._loop
        if (
            loop is None
            or loop.is_closed()
            or not loop.is_running()
            or threading.get_ident() == self._loop_thread
        ):
            return fn()

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout)

    def pause(
        self,
        state: str = "paused_capacity",
        reason: str | None = None,
        kind: Literal["all", "sampling", "training"] = "all",
    ) -> None:
        """Stop work from advancing; polls of pending futures answer try_again with ``state``.

        ``kind`` picks the queues: ``"training"`` (every non-sample future), ``"sampling"``
        or ``"all"``. Thread-safe.
        """
        if kind not in ("all", "sampling", "training"):
            raise ValueError(f"kind must be 'all', 'sampling' or 'training', got {kind!r}")
        if state not in QUEUE_STATES:
            raise ValueError(f"state must be one of {QUEUE_STATES}, got {state!r}")
        kinds = ("training", "sampling") if kind == "all" else (kind,)

        def apply() -> None:
            for k in kinds:
                self._paused[k] = (state, reason)

        self._on_loop(apply)

    def resume(self, kind: Literal["all", "sampling", "training"] = "all") -> None:
        """Undo :meth:`pause` for ``kind``; waiting work proceeds. Thread-safe."""
        kinds = ("training", "sampling") if kind == "all" else (kind,)

        def apply() -> None:
            for k in kinds:
                self._paused[k] = None
            self._resumed.set()
            self._resumed = asyncio.Event()

        self._on_loop(apply)

    def set_client_config(self, **flags: Any) -> None:
        """Override ``/client/config`` flags for clients that start afterwards. Thread-safe."""
        with self._config_lock:
            self._client_config.update(flags)

    def set_dynamic_config(self, **flags: Any) -> None:
        """Override ``/client/dynamic_config`` values. Thread-safe."""
        with self._config_lock:
            self._dynamic_config.update(flags)

    @property
    def client_config(self) -> dict[str, Any]:
        with self._config_lock:
            return dict(self._client_config)

    def applied(self, model_id: str) -> list[tuple[int, str]]:
        """``(seq_id, kind)`` of every operation applied to ``model_id``, in order."""
        return self._on_loop(
            lambda: list(self._models[model_id].applied) if model_id in self._models else []
        )

    def state(self) -> dict[str, Any]:
        """A JSON-able snapshot: sessions, models (last processed seq_id, applied log, skipped
        gaps), samplers, futures, checkpoint counts, pause state. Thread-safe."""
        return self._on_loop(self._snapshot)

    def _snapshot(self) -> dict[str, Any]:
        models = {
            mid: {
                "session_id": m.session_id,
                "base_model": m.base_model,
                "last_seq": m.last_seq,
                "next_seq": m.queue.next_seq,
                "waiting": m.queue.waiting,
                "applied": [list(a) for a in m.applied],
                "skipped": [list(s) for s in m.queue.skipped],
                "broken": m.broken,
                "unloaded": m.unloaded,
            }
            for mid, m in self._models.items()
        }
        samplers = {
            sid: {
                "session_id": s.session_id,
                "base_model": s.base_model,
                "model_path": s.model_path,
                "requests": len(s.by_seq),
                "client_counter": s.client_counter,
            }
            for sid, s in self._samplers.items()
        }
        sessions = {}
        for row in self._store.all_sessions() if not self._closed else []:
            rt = self._sessions.get(row.session_id)
            sessions[row.session_id] = {
                "status": row.status,
                "live": rt is not None,
                "models": sorted(rt.models_by_seq.values()) if rt else [],
                "samplers": sorted(rt.samplers_by_seq.values()) if rt else [],
            }
        return {
            "backend": self.backend_name,
            "protocol": self.protocol,
            "sessions": sessions,
            "models": models,
            "samplers": samplers,
            "futures": {"live": len(self._futures), "pending": len(self._futures.pending())},
            "checkpoints": self._store.count_checkpoints() if not self._closed else {},
            "paused": {
                k: (None if v is None else {"state": v[0], "reason": v[1]})
                for k, v in self._paused.items()
            },
            "telemetry_events": self._telemetry_events,
        }

    def close(self) -> None:
        """Stop workers, release threads, close the database and remove a temporary
        ``data_dir``. Idempotent; thread-safe; never waits for running model work."""
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        tasks = list(self._tasks)
        if loop is not None and not loop.is_closed():
            for task in tasks:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task.cancel)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._io_executor.shutdown(wait=False, cancel_futures=True)
        self._store.close()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    async def aclose(self) -> None:
        """:meth:`close` from the loop, also awaiting the cancelled worker tasks."""
        tasks = list(self._tasks)
        self.close()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ==================================================================== seam: App protocol

    def endpoint_name(self, request: HttpRequest) -> str:
        """The path after ``/api/v1/`` (the full path otherwise)."""
        path = request.path
        return path[len(API_PREFIX) :] if path.startswith(API_PREFIX) else path

    def match_fields(self, request: HttpRequest) -> dict[str, Any]:
        """``request_type`` of the polled future for retrieve_future; decoded proto header
        fields (``model_id``, ``seq_id``, ``loss_fn``, ``forward_only``) for forward_backward;
        plus the JSON body's fields."""
        fields: dict[str, Any] = {}
        body = self._json_cached(request)
        if isinstance(body, dict):
            fields.update(body)
        endpoint = self.endpoint_name(request)
        if endpoint == "retrieve_future" and isinstance(body, dict):
            rid = body.get("request_id")
            rec = self._futures.get(rid) if isinstance(rid, str) else None
            if rec is not None:
                fields["request_type"] = rec.kind
        elif endpoint == "forward_backward" and "json" not in request.headers.get(
            "content-type", ""
        ):
            summary = self.proto_summary(request)
            if summary is not None:
                fields.update(summary)
        return fields

    def _json_cached(self, request: HttpRequest) -> Any:
        if "json" not in request.meta:
            body: Any = None
            if request.body[:1] in (b"{", b"[", b" ", b"\n", b"\r", b"\t"):
                try:
                    body = json.loads(request.body)
                except (ValueError, UnicodeDecodeError):
                    body = None
            request.meta["json"] = body
        return request.meta["json"]

    def proto_summary(self, request: HttpRequest) -> dict[str, Any] | None:
        """The decoded header fields of a protobuf forward_backward body (for the log)."""
        if "proto_summary" not in request.meta:
            summary: dict[str, Any] | None = None
            try:
                raw = codec.decompress_body(request.body, request.headers.get("content-encoding"))
                summary = codec.proto_summary(raw)
            except ValueError:
                summary = None
            request.meta["proto_summary"] = summary
        return cast("dict[str, Any] | None", request.meta["proto_summary"])

    async def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer one request; never raises (errors become JSON 4xx/5xx with a body)."""
        self._bind_loop()
        if not request.endpoint:
            request.endpoint = self.endpoint_name(request)
        try:
            if self._closed:
                raise HttpError(503, "local server is shutting down")
            path = request.path
            if path.startswith(FILES_PREFIX) or path.startswith("/_local/files/"):
                return await self._rest.serve_file(request)
            if not path.startswith(API_PREFIX):
                raise HttpError(404, f"no such endpoint: {request.method} {path}")
            sub = path[len(API_PREFIX) :].strip("/")
            handler, params = self._route(request.method, sub)
            if sub != "healthz":
                self._authenticate(request)
            answer = await handler(request, *params)
            if request.poll_fault is not None and request.poll_fault.lose:
                self._lose(answer)
            return answer
        except HttpError as exc:
            return HttpResponse.json({"detail": exc.detail}, exc.status, exc.headers or None)
        except codec.WireError as exc:
            return HttpResponse.json({"detail": scrub(str(exc))}, 400)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("local server failed on %s %s", request.method, request.path)
            return HttpResponse.json(
                {"detail": scrub(f"local server error: {type(exc).__name__}: {exc}")}, 500
            )

    def _lose(self, answer: HttpResponse) -> None:
        """A ``lose`` fault: the accepted request's future never runs nor completes (its seq_id
        counts as processed, so later training ops go on in order)."""
        if answer.status >= 300 or "json" not in answer.headers.get("content-type", ""):
            return
        try:
            request_id = json.loads(answer.body).get("request_id")
        except (ValueError, AttributeError):
            return
        if isinstance(request_id, str):
            self._futures.lose(request_id)

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            self._spawn(self._janitor())

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _run(self, fn: Callable[[], T]) -> T:
        """Run model work (training, sampling, model construction) in the worker pool."""
        return await self._in_pool(self._executor, fn)

    async def _run_io(self, fn: Callable[[], T]) -> T:
        """Run short blocking work (decoding, encoding, file I/O) in the I/O pool, so that
        submissions are never stuck behind long model computations."""
        return await self._in_pool(self._io_executor, fn)

    async def _in_pool(self, pool: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(pool, fn)
        except RuntimeError as exc:
            if self._closed:
                raise HttpError(503, "local server is shutting down") from exc
            raise

    # ==================================================================== auth

    def _authenticate(self, request: HttpRequest) -> None:
        key = request.headers.get("x-api-key", "")
        if not key:
            raise HttpError(401, "missing X-API-Key header")
        if self._key_ok(key):
            return
        if looks_like_jwt(key):
            if self._jwt.verify(key, now=time.time()) is not None:
                return
            raise HttpError(
                401,
                "invalid or expired token",
                {"www-authenticate": 'Bearer error="invalid_token"'},
            )
        raise HttpError(401, "invalid API key")

    def _key_ok(self, key: str) -> bool:
        if self.api_key is None:
            return key.startswith("tml-") and len(key) > 4
        return secrets.compare_digest(key.encode(), self.api_key.encode())

    # ==================================================================== routing

    def _route(
        self, method: str, sub: str
    ) -> tuple[Callable[..., Awaitable[HttpResponse]], tuple[str, ...]]:
        exact: dict[tuple[str, str], Callable[..., Awaitable[HttpResponse]]] = {
            ("POST", "client/config"): self._session_api.client_config,
            ("POST", "client/dynamic_config"): self._session_api.dynamic_config,
            ("POST", "auth/token"): self._session_api.auth_token,
            ("POST", "create_session"): self._session_api.create_session,
            ("POST", "session_heartbeat"): self._session_api.heartbeat,
            ("POST", "create_model"): self._training_api.create_model,
            ("POST", "get_info"): self._training_api.get_info,
            ("POST", "forward_backward"): self._training_api.forward_backward,
            ("POST", "forward"): self._training_api.forward_backward,
            ("POST", "optim_step"): self._training_api.optim_step,
            ("POST", "save_weights"): self._training_api.save_weights,
            ("POST", "save_weights_for_sampler"): self._training_api.save_weights_for_sampler,
            ("POST", "save_weights_external"): self._training_api.save_weights_external,
            ("POST", "load_weights"): self._training_api.load_weights,
            ("POST", "create_custom_loss"): self._training_api.create_custom_loss,
            ("POST", "create_sampling_session"): self._sampling_api.create_sampling_session,
            ("POST", "join_sampling_session"): self._sampling_api.join_sampling_session,
            ("POST", "asample"): self._sampling_api.asample,
            ("POST", "retrieve_future"): self._future_api.retrieve_future,
            ("POST", "retrieve_futures"): self._future_api.retrieve_futures,
            ("POST", "cancel_future"): self._future_api.cancel_future,
            ("POST", "telemetry"): self._session_api.telemetry,
            ("GET", "get_server_capabilities"): self._session_api.capabilities,
            ("GET", "healthz"): self._session_api.healthz,
            ("GET", "training_runs"): self._rest.list_runs,
            ("GET", "checkpoints"): self._rest.list_user_checkpoints,
            ("GET", "sessions"): self._rest.list_sessions,
            ("POST", "sessions/search"): self._rest.search_sessions,
            ("POST", "weights_info"): self._rest.weights_info,
            ("POST", "copy_weights"): self._rest.copy_weights,
            ("POST", "unload_model"): self._training_api.unload_model,
        }
        handler = exact.get((method, sub))
        if handler is not None:
            return handler, ()
        parts = sub.split("/")
        if parts[0] == "samplers" and len(parts) == 2 and method == "GET":
            return self._sampling_api.get_sampler, (parts[1],)
        if parts[0] == "sessions" and len(parts) >= 2 and parts[1]:
            sid = parts[1]
            rest = "/".join(parts[2:])
            table: dict[tuple[str, str], Callable[..., Awaitable[HttpResponse]]] = {
                ("GET", ""): self._rest.get_session,
                ("POST", "finish"): self._session_api.finish_session,
                ("PUT", "project"): self._rest.session_project,
                ("GET", "trace_export"): self._rest.trace_export,
            }
            h = table.get((method, rest))
            if h is not None:
                return h, (sid,)
        if parts[0] == "training_runs" and len(parts) >= 2 and parts[1]:
            run_id = parts[1]
            if len(parts) == 2 and method == "GET":
                return self._rest.get_run, (run_id,)
            if len(parts) == 3 and parts[2] == "checkpoints" and method == "GET":
                return self._rest.run_checkpoints, (run_id,)
            if len(parts) >= 5 and parts[2] == "checkpoints":
                ckpt = parts[3:]
                if len(ckpt) == 2 and method == "DELETE":
                    return self._rest.delete_checkpoint, (run_id, "/".join(ckpt))
                if len(ckpt) == 3:
                    ckpt_id, action = "/".join(ckpt[:2]), ckpt[2]
                    table2: dict[tuple[str, str], Callable[..., Awaitable[HttpResponse]]] = {
                        ("POST", "publish"): self._rest.publish,
                        ("DELETE", "publish"): self._rest.unpublish,
                        ("PUT", "ttl"): self._rest.set_ttl,
                        ("GET", "external_weights_urls"): self._rest.external_urls,
                        ("GET", "archive"): self._rest.archive,
                    }
                    h = table2.get((method, action))
                    if h is not None:
                        return h, (run_id, ckpt_id)
        known = {p for _, p in exact}
        if sub in known:
            raise HttpError(405, f"method {method} not allowed on /api/v1/{sub}")
        raise HttpError(404, f"no such endpoint: {method} /api/v1/{sub}")

    # ==================================================================== helpers

    def _now(self) -> float:
        return time.time()

    def _session_rt(self, session_id: str) -> SessionRuntime:
        rt = self._sessions.get(session_id)
        if rt is not None:
            return rt
        row = self._store.get_session(session_id)
        if row is None:
            raise HttpError(404, f"unknown session_id {session_id!r}")
        rt = SessionRuntime(session_id=session_id, last_heartbeat=self._clock())
        self._sessions[session_id] = rt
        return rt

    def _check_base_model(self, base_model: str) -> None:
        if (
            not self.accept_any_model
            and self._models_list is not None
            and base_model not in self._models_list
        ):
            raise HttpError(
                400, f"unknown base model {base_model!r}; this server serves {self._models_list}"
            )
        try:
            self._backend.model_info(base_model)
        except UserError as exc:
            raise HttpError(400, str(exc)) from None
        known = self._models_list if self._models_list is not None else KNOWN_MODELS
        if base_model not in known and base_model not in self._warned_models:
            self._warned_models.add(base_model)
            logger.warning(
                "serving the unknown base model %r with the local %s model; results say "
                "nothing about that model. Reject unknown names like the hosted service with "
                "LocalServer(accept_any_model=False) or `tinker-sync serve "
                "--reject-unknown-models`",
                base_model,
                self._backend_name,
            )

    def _model_for_submission(self, model_id: str) -> ModelRuntime:
        m = self._models.get(model_id)
        if m is None:
            if self._store.get_run(model_id) is not None:
                raise HttpError(
                    404,
                    f"model {model_id!r} is not loaded in this server process; "
                    "create a training client from one of its checkpoints",
                )
            raise HttpError(404, f"unknown model_id {model_id!r}")
        if m.unloaded:
            raise HttpError(404, f"model {model_id!r} was unloaded")
        return m

    def _future_reply(self, rec: FutureRecord, model_id: str | None = None) -> HttpResponse:
        body: dict[str, Any] = {"request_id": rec.request_id}
        if model_id is not None:
            body["model_id"] = model_id
        return HttpResponse.json(body)

    def _pause_kind(self, kind: str) -> str:
        return "sampling" if kind == "Sample" else "training"

    async def _wait_unpaused(self, kind: str) -> None:
        while self._paused[kind] is not None and not self._closed:
            await self._resumed.wait()

    # ==================================================================== model workers

    def _new_model_runtime(
        self,
        *,
        model_id: str,
        session_id: str,
        model_seq_id: int,
        base_model: str,
        lora: LoraSpec,
        optimizer_config: dict[str, Any],
        user_metadata: dict[str, Any] | None,
    ) -> ModelRuntime:
        m = ModelRuntime(
            model_id=model_id,
            session_id=session_id,
            model_seq_id=model_seq_id,
            base_model=base_model,
            lora=lora,
            optimizer_config=optimizer_config,
            user_metadata=user_metadata,
            queue=SeqQueue(next_seq=0, gap_grace_s=self.gap_grace_s, clock=self._clock),
        )
        self._models[model_id] = m
        m.task = self._spawn(self._model_worker(m))
        return m

    def _submit(self, m: ModelRuntime, seq_id: int, item: WorkItem) -> FutureRecord:
        """Queue ``item`` at ``seq_id``; a repeated seq_id returns the original future."""
        outcome = m.queue.offer(seq_id, item)
        if outcome is Offer.DUPLICATE:
            original = m.queue.original(seq_id)
            if original is None:
                status, body = m.rejected.get(
                    seq_id, (400, {"detail": f"seq_id {seq_id} was rejected"})
                )
                raise HttpError(status, str(body.get("detail", "rejected")))
            return original.future
        if outcome is Offer.STALE:
            raise HttpError(
                400,
                f"seq_id {seq_id} of model {m.model_id!r} arrived after the model moved past it "
                f"(next expected seq_id is {m.queue.next_seq})",
            )
        m.wake.set()
        return item.future

    def _reject(self, m: ModelRuntime, seq_id: int, status: int, detail: str) -> HttpError:
        """Count a rejected submission as processed so later seq_ids need not wait for it."""
        if seq_id not in m.queue and m.queue.consume(seq_id) is Offer.ACCEPTED:
            m.rejected[seq_id] = (status, {"detail": detail})
            m.wake.set()
        return HttpError(status, detail)

    def _reject_undecodable(self, request: HttpRequest, detail: str) -> HttpError:
        """A 400 for a body whose datums cannot be decoded; when its model_id and seq_id can
        still be read, the seq_id counts as processed (a repeat gets the same answer)."""
        header: Any = None
        if "json" in request.headers.get("content-type", ""):
            header = self._json_cached(request)
        elif not request.headers.get("content-encoding"):
            header = self.proto_summary(request)
        if isinstance(header, dict):
            model_id, seq_id = header.get("model_id"), header.get("seq_id")
            m = self._models.get(model_id) if isinstance(model_id, str) else None
            if (
                m is not None
                and isinstance(seq_id, int)
                and not isinstance(seq_id, bool)
                and seq_id >= 1
            ):
                dup = self._duplicate(m, seq_id)
                if dup is None:
                    return self._reject(m, seq_id, 400, detail)
        return HttpError(400, detail)

    def _duplicate(self, m: ModelRuntime, seq_id: int) -> FutureRecord | None:
        if seq_id in m.queue:
            original = m.queue.original(seq_id)
            if original is None:
                status, body = m.rejected.get(seq_id, (400, {"detail": "rejected"}))
                raise HttpError(status, str(body["detail"]))
            return original.future
        return None

    async def _model_worker(self, m: ModelRuntime) -> None:
        while not self._closed:
            ready = m.queue.pop_ready()
            self._log_skips(m)
            if not ready:
                if m.unloaded and not m.queue.waiting:
                    m.model = None
                    for rec in m.unload_futures:
                        rec.complete(
                            {"model_id": m.model_id, "type": "unload_model"}, now=self._clock()
                        )
                    m.unload_futures.clear()
                deadline = m.queue.next_deadline()
                m.wake.clear()
                timeout = None if deadline is None else max(0.0, deadline - self._clock())
                try:
                    await asyncio.wait_for(m.wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
                continue
            for seq_id, item in ready:
                await self._wait_unpaused("training")
                if self.work_delay_s > 0:
                    await asyncio.sleep(self.work_delay_s)
                await self._apply(m, seq_id, item)
                m.last_seq = seq_id

    def _log_skips(self, m: ModelRuntime) -> None:
        logged = self._skips_logged.get(m.model_id, 0)
        for first, last in m.queue.skipped[logged:]:
            logger.warning(
                "model %s: seq_id %s never arrived within %.1f s; skipped",
                m.model_id,
                first if first == last else f"{first}..{last}",
                self.gap_grace_s,
            )
        self._skips_logged[m.model_id] = len(m.queue.skipped)

    async def _apply(self, m: ModelRuntime, seq_id: int, item: WorkItem) -> None:
        try:
            await self._apply_once(m, seq_id, item)
        finally:
            item.release()

    async def _apply_once(self, m: ModelRuntime, seq_id: int, item: WorkItem) -> None:
        fut = item.future
        if fut.done or fut.lost:  # failed by a fault rule, cancelled or lost before its turn
            return
        if m.broken is not None and seq_id != 0:
            fut.fail(f"model {m.model_id} is unusable: {m.broken}", "user", now=self._clock())
            return
        try:
            result, encoded = await self._run(functools.partial(self._execute, m, item))
            if item.on_loop is not None:
                result = item.on_loop(result)
                encoded = self._encode_primary(item.kind, result, None)
        except asyncio.CancelledError:
            raise
        except (UserError, HttpError, LookupError, ValueError) as exc:
            message = exc.detail if isinstance(exc, HttpError) else str(exc)
            if seq_id == 0:
                m.broken = message
            fut.fail(message, "user", now=self._clock())
            return
        except Exception as exc:
            logger.exception("model %s: %s (seq_id %s) failed", m.model_id, item.kind, seq_id)
            if seq_id == 0:
                m.broken = f"{type(exc).__name__}: {exc}"
            fut.fail(
                scrub(f"internal error: {type(exc).__name__}: {exc}"), "server", now=self._clock()
            )
            return
        m.applied.append((seq_id, item.kind))
        fut.complete(result, now=self._clock(), encoded=encoded)

    def _execute(self, m: ModelRuntime, item: WorkItem) -> tuple[Any, dict[str, bytes]]:
        """Worker-thread part: run the op, encode the primary form of its result."""
        result = item.run()
        with contextlib.suppress(RuntimeError):
            self._store.touch_run(m.model_id, self._now())
        if item.on_loop is not None:
            return result, {}
        return result, self._encode_primary(item.kind, result, None)

    def _encode_primary(
        self, kind: str, result: Any, sequence_ids: list[str] | None
    ) -> dict[str, bytes]:
        if kind in PROTO_KINDS and self.protocol == "current":
            return {"proto": self._encode(kind, result, "proto", sequence_ids)}
        return {"json": self._encode(kind, result, "json", sequence_ids)}

    def _encode(self, kind: str, result: Any, form: str, sequence_ids: list[str] | None) -> bytes:
        legacy = self.protocol == "legacy"
        if kind == "Sample":
            assert isinstance(result, SampleResult)
            if form == "proto":
                return codec.encode_sample_proto(result)
            return json.dumps(
                codec.sample_result_to_json(result, None if legacy else sequence_ids)
            ).encode()
        if kind in ("ForwardBackward", "Forward"):
            assert isinstance(result, ForwardResult)
            if form == "proto":
                return codec.encode_forward_output_proto(result)
            return json.dumps(
                codec.forward_output_to_json(result, with_metrics=not legacy)
            ).encode()
        return json.dumps(result).encode()

    # ==================================================================== polling

    def _trace(self, session_id: str) -> dict[str, Any]:
        rt = self._sessions.get(session_id)
        models = {}
        for model_id in rt.models_by_seq.values() if rt else []:
            m = self._models.get(model_id)
            if m is not None:
                models[model_id] = [{"seq_id": s, "kind": k} for s, k in m.applied]
        return {"session_id": session_id, "models": models}

    # ==================================================================== housekeeping

    async def _janitor(self) -> None:
        """Expire futures, checkpoints and silent sessions about once a second."""
        while not self._closed:
            await asyncio.sleep(1.0)
            try:
                self._futures.expire()
                if self.heartbeat_expiry_s is not None:
                    now = self._clock()
                    for sid, rt in list(self._sessions.items()):
                        if not rt.expired and now - rt.last_heartbeat > self.heartbeat_expiry_s:
                            row = self._store.get_session(sid)
                            if row is not None and row.status.get("type") == "active":
                                self._session_api.expire_session(sid)
            except RuntimeError:
                if self._closed:
                    return
                raise
            except Exception:
                logger.exception("local server housekeeping failed")
