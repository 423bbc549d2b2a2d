"""The local server's Tinker protocol app: every ``/api/v1`` endpoint the SDKs call.

Usage (the HTTP layer owns the event loop and calls :meth:`TinkerApp.handle`)::

    app = TinkerApp("instant", api_key="tml-local", data_dir="/tmp/tinker-local")
    response = await app.handle(HttpRequest("POST", "/api/v1/create_session", {}, headers, body))
    app.pause("paused_capacity", "maintenance", kind="training"); app.resume("training")
    app.applied("sess:train:0")   # [(0, "CreateModel"), (1, "ForwardBackward"), ...]
    app.close()

Design: all protocol state lives on the HTTP layer's single event loop; model work runs in a
thread pool (one ordered asyncio worker per model feeds it, so each model applies its requests
strictly in seq_id order); long polls await asyncio events (no thread per poll); durable
metadata goes to SQLite and weights to files under ``data_dir`` (see ``_store``).

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
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import numpy as np
import numpy.typing as npt

from tinker_sync._pollhold import ADVERT_HEADER, HOLD_HEADER
from tinker_sync._redact import register_secret, scrub
from tinker_sync.local import _wirecodec as codec
from tinker_sync.local._age import age_recipients, encrypt_files
from tinker_sync.local._body import (
    Body,
    HttpError,
    checkpoint_name,
    json_body,
    ttl_expiry,
)
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._jwt import JwtSigner, UrlSigner, looks_like_jwt
from tinker_sync.local._ordering import Offer, SeqQueue
from tinker_sync.local._rest import FILES_PREFIX, OWNER, RestApi
from tinker_sync.local._state import (
    FutureRecord,
    FutureTable,
    ModelRuntime,
    SamplerRuntime,
    SessionRuntime,
    WorkItem,
)
from tinker_sync.local._store import (
    CheckpointFiles,
    CheckpointRow,
    RunRow,
    SamplerRow,
    SessionRow,
    Store,
)
from tinker_sync.local.backends import get_backend
from tinker_sync.local.backends._common import KNOWN_MODELS
from tinker_sync.local.backends.base import (
    BYTE_TOKENIZER_ID,
    Backend,
    ForwardResult,
    LoraSpec,
    SampleOptions,
    Sampler,
    SampleResult,
    UserError,
)
from tinker_sync.types import LOSS_FN_TYPES

__all__ = ["DEFAULT_CLIENT_CONFIG", "DEFAULT_DYNAMIC_CONFIG", "TinkerApp"]

logger = logging.getLogger("tinker_sync.local")

T = TypeVar("T")

API_PREFIX = "/api/v1/"

#: Every flag of PROTOCOL §1.1 with its documented default, except the pyqwest switch, which
#: is always off so the official SDK keeps to httpx.
DEFAULT_CLIENT_CONFIG: dict[str, Any] = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "sample_dispatch_bytes_semaphore_size": 10_485_760,
    "inflight_response_bytes_semaphore_size": 52_428_800,
    "parallel_fwdbwd_chunks": True,
    "proto_compress_fwdbwd": False,
    "fwdbwd_max_chunk_len": 1024,
    "fwdbwd_max_chunk_bytes_count": 5_000_000,
    "fwdbwd_dispatch_bytes_semaphore_size": 50_000_000,
    "billing_exception_max_pause_duration_sec": 3600,
    "sample_no_retries": False,
    "sample_enable_stuck_detection": True,
    "sample_max_concurrent_requests": 2000,
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "create_model_via_load_weights": True,
}
DEFAULT_DYNAMIC_CONFIG: dict[str, Any] = {
    "refresh_interval_sec": 300,
    "sample_cancel_enabled": False,
    "sample_cancel_max_batch_size": 64,
}

_PROTO_KINDS = frozenset({"Sample", "ForwardBackward", "Forward"})
_LOSS_FNS = frozenset(LOSS_FN_TYPES)
_QUEUE_STATES = ("active", "paused_capacity", "paused_rate_limit")
_SAMPLE_CLONE_STRIDE = 1_000_000_000
#: Upper bound of ``num_samples`` per asample: the sequence ids are built on the event loop,
#: so an unbounded value would stall every client of the server (and exhaust memory).
MAX_NUM_SAMPLES = 10_000
#: How long a poll on a paused queue is held before answering try_again (bounded by long_poll_s).
_PAUSED_POLL_S = 1.0


def _bounded(value: int, name: str, maximum: int) -> int:
    if value > maximum:
        raise HttpError(400, f"{name}: must be <= {maximum}, got {value}")
    return value


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
        if state not in _QUEUE_STATES:
            raise ValueError(f"state must be one of {_QUEUE_STATES}, got {state!r}")
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
                from tinker_sync._wire._zstd import decompress_body

                raw = decompress_body(request.body, request.headers.get("content-encoding"))
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
            return await handler(request, *params)
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
            ("POST", "client/config"): self._h_client_config,
            ("POST", "client/dynamic_config"): self._h_dynamic_config,
            ("POST", "auth/token"): self._h_auth_token,
            ("POST", "create_session"): self._h_create_session,
            ("POST", "session_heartbeat"): self._h_heartbeat,
            ("POST", "create_model"): self._h_create_model,
            ("POST", "get_info"): self._h_get_info,
            ("POST", "forward_backward"): self._h_forward_backward,
            ("POST", "forward"): self._h_forward_backward,
            ("POST", "optim_step"): self._h_optim_step,
            ("POST", "save_weights"): self._h_save_weights,
            ("POST", "save_weights_for_sampler"): self._h_save_weights_for_sampler,
            ("POST", "save_weights_external"): self._h_save_weights_external,
            ("POST", "load_weights"): self._h_load_weights,
            ("POST", "create_custom_loss"): self._h_create_custom_loss,
            ("POST", "create_sampling_session"): self._h_create_sampling_session,
            ("POST", "join_sampling_session"): self._h_join_sampling_session,
            ("POST", "asample"): self._h_asample,
            ("POST", "retrieve_future"): self._h_retrieve_future,
            ("POST", "retrieve_futures"): self._h_retrieve_futures,
            ("POST", "cancel_future"): self._h_cancel_future,
            ("POST", "telemetry"): self._h_telemetry,
            ("GET", "get_server_capabilities"): self._h_capabilities,
            ("GET", "healthz"): self._h_healthz,
            ("GET", "training_runs"): self._rest.list_runs,
            ("GET", "checkpoints"): self._rest.list_user_checkpoints,
            ("GET", "sessions"): self._rest.list_sessions,
            ("POST", "sessions/search"): self._rest.search_sessions,
            ("POST", "weights_info"): self._rest.weights_info,
            ("POST", "copy_weights"): self._rest.copy_weights,
            ("POST", "unload_model"): self._h_unload_model,
        }
        handler = exact.get((method, sub))
        if handler is not None:
            return handler, ()
        parts = sub.split("/")
        if parts[0] == "samplers" and len(parts) == 2 and method == "GET":
            return self._h_get_sampler, (parts[1],)
        if parts[0] == "sessions" and len(parts) >= 2 and parts[1]:
            sid = parts[1]
            rest = "/".join(parts[2:])
            table: dict[tuple[str, str], Callable[..., Awaitable[HttpResponse]]] = {
                ("GET", ""): self._rest.get_session,
                ("POST", "finish"): self._h_finish_session,
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
        if fut.done:  # failed by a fault rule or cancelled before its turn
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
        if kind in _PROTO_KINDS and self.protocol == "current":
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

    # ==================================================================== bootstrap & sessions

    async def _h_client_config(self, request: HttpRequest) -> HttpResponse:
        json_body(request, optional=True)
        with self._config_lock:
            config = dict(self._client_config)
        if self.protocol == "legacy":
            defaults = DEFAULT_CLIENT_CONFIG
            config = {k: v for k, v in config.items() if k not in defaults or v != defaults[k]}
            config["use_pyqwest_transport"] = False
            config["create_model_via_load_weights"] = False
            return HttpResponse.json(config)
        return HttpResponse.json(config, headers=self._advert())

    async def _h_dynamic_config(self, request: HttpRequest) -> HttpResponse:
        if self.protocol == "legacy":
            raise HttpError(404, "client/dynamic_config is not served by this (legacy) server")
        json_body(request, optional=True)
        with self._config_lock:
            return HttpResponse.json(dict(self._dynamic_config))

    async def _h_auth_token(self, request: HttpRequest) -> HttpResponse:
        json_body(request, optional=True)
        claims = {
            "sub": OWNER,
            "org_id": "local",
            "email": "local@tinker-sync.invalid",
            "iss": "passport-tinker-sync-local",
        }
        token = self._jwt.issue(claims, ttl_s=self.jwt_ttl_s, now=time.time())
        register_secret(token)
        return HttpResponse.json({"jwt": token})

    async def _h_create_session(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        tags = b.opt_str_list("tags") or []
        user_metadata = b.opt_dict("user_metadata") or {}
        sdk_version = b.opt_str("sdk_version") or ""
        row = SessionRow(
            session_id=str(uuid.uuid4()),
            created_at=self._now(),
            tags=tags,
            user_metadata=user_metadata,
            sdk_version=sdk_version,
            project_id=b.opt_str("project_id"),
            display_name=b.opt_str("display_name"),
        )
        self._store.insert_session(row)
        self._sessions[row.session_id] = SessionRuntime(
            session_id=row.session_id, last_heartbeat=self._clock()
        )
        return HttpResponse.json({"session_id": row.session_id, "type": "create_session"})

    def _require_active(self, session_id: str) -> None:
        gone = self._session_gone(session_id)
        if gone is not None:
            raise HttpError(410, f"session {session_id} has finished ({gone}); start a new session")

    def _session_gone(self, session_id: str) -> str | None:
        """Why the session no longer accepts heartbeats (None while active)."""
        row = self._store.get_session(session_id)
        if row is None:
            raise HttpError(404, f"unknown session_id {session_id!r}")
        if row.status.get("type") != "active":
            return str(row.status.get("type"))
        rt = self._session_rt(session_id)
        if (
            self.heartbeat_expiry_s is not None
            and self._clock() - rt.last_heartbeat > self.heartbeat_expiry_s
        ):
            self._expire_session(session_id)
            return "cancelled"
        return None

    def _expire_session(self, session_id: str) -> None:
        rt = self._sessions.get(session_id)
        if rt is not None:
            rt.expired = True
        self._store.set_session_status(
            session_id, {"type": "cancelled", "detail": "no heartbeat received in time"}
        )
        now = self._clock()
        for s in self._samplers.values():
            if s.session_id == session_id:
                for rec in s.by_seq.values():
                    rec.fail("session expired (no heartbeat)", "user", now=now)
        logger.info(
            "session %s expired after %.1f s without a heartbeat",
            session_id,
            self.heartbeat_expiry_s or 0,
        )

    async def _h_heartbeat(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        gone = self._session_gone(session_id)
        if gone is not None:
            raise HttpError(410, f"session {session_id} has finished ({gone})")
        self._session_rt(session_id).last_heartbeat = self._clock()
        return HttpResponse.json({"type": "session_heartbeat"})

    async def _h_finish_session(self, request: HttpRequest, session_id: str) -> HttpResponse:
        b = json_body(request, optional=True)
        reason = b.opt_dict("reason") or {"type": "success"}
        rtype = reason.get("type", "success")
        if rtype not in ("success", "errored", "interrupted"):
            raise HttpError(
                400, f"reason.type: expected success|errored|interrupted, got {rtype!r}"
            )
        row = self._store.get_session(session_id)
        if row is None:
            raise HttpError(404, f"unknown session_id {session_id!r}")
        if row.status.get("type") != "active":
            return HttpResponse.json({})  # the first finish reason wins
        status = {
            "type": "client_finished",
            "reason": {"type": rtype},
            "detail": b.opt_str("detail"),
        }
        self._store.set_session_status(session_id, status)
        return HttpResponse.json({})

    # ==================================================================== training submissions

    def _lora_spec(self, obj: dict[str, Any] | None) -> LoraSpec:
        if obj is None:
            return LoraSpec(rank=32)
        lb = Body(obj, "lora_config")
        rank = lb.int_("rank", minimum=1)
        return LoraSpec(
            rank=rank,
            seed=lb.opt_int("seed"),
            train_attn=lb.bool_("train_attn", True),
            train_mlp=lb.bool_("train_mlp", True),
            train_unembed=lb.bool_("train_unembed", True),
        )

    async def _h_create_model(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        model_seq_id = b.int_("model_seq_id", minimum=0)
        base_model = b.str_("base_model")
        lora = self._lora_spec(b.opt_dict("lora_config"))
        optimizer_config = b.opt_dict("optimizer_config") or {"type": "adamw"}
        user_metadata = b.opt_dict("user_metadata")
        rt = self._session_rt(session_id)
        existing = rt.create_futures.get(model_seq_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        if existing is not None:
            return self._future_reply(existing, model_id)
        self._require_active(session_id)
        self._check_base_model(base_model)
        m = self._new_model_runtime(
            model_id=model_id,
            session_id=session_id,
            model_seq_id=model_seq_id,
            base_model=base_model,
            lora=lora,
            optimizer_config=optimizer_config,
            user_metadata=user_metadata,
        )
        rec = self._futures.create("CreateModel", owner=model_id, seq_id=0)
        rt.create_futures[model_seq_id] = rec
        rt.models_by_seq[model_seq_id] = model_id

        def run() -> dict[str, Any]:
            seed = lora.seed if lora.seed is not None else self.seed
            m.model = self._backend.new_model(base_model, lora, seed)
            now = self._now()
            self._store.insert_run(self._run_row(m, now))
            return {"model_id": model_id, "type": "create_model"}

        self._submit(m, 0, WorkItem("CreateModel", rec, run))
        return self._future_reply(rec, model_id)

    def _run_row(self, m: ModelRuntime, now: float) -> RunRow:
        return RunRow(
            run_id=m.model_id,
            session_id=m.session_id,
            model_seq_id=m.model_seq_id,
            base_model=m.base_model,
            lora={
                "rank": m.lora.rank,
                "seed": m.lora.seed,
                "train_attn": m.lora.train_attn,
                "train_mlp": m.lora.train_mlp,
                "train_unembed": m.lora.train_unembed,
            },
            optimizer_config=m.optimizer_config,
            user_metadata=m.user_metadata,
            created_at=now,
            last_request_time=now,
        )

    async def _h_get_info(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        model_id = b.str_("model_id")
        m = self._models.get(model_id)
        if m is not None:
            base_model, rank, opt = m.base_model, m.lora.rank, m.optimizer_config
        else:
            run = self._store.get_run(model_id)
            if run is None:
                raise HttpError(404, f"unknown model_id {model_id!r}")
            base_model, rank, opt = (
                run.base_model,
                int(run.lora.get("rank", 32)),
                run.optimizer_config,
            )
        try:
            info = self._backend.model_info(base_model)
            arch, tokenizer_id = info.arch, info.tokenizer_id
        except UserError:
            arch, tokenizer_id = self.backend_name, BYTE_TOKENIZER_ID
        return HttpResponse.json(
            {
                "model_id": model_id,
                "model_data": {
                    "arch": arch,
                    "model_name": base_model,
                    "tokenizer_id": tokenizer_id,
                },
                "optimizer_config": opt,
                "is_lora": True,
                "lora_rank": rank,
                "model_name": base_model,
                "type": "get_info",
            }
        )

    async def _h_forward_backward(self, request: HttpRequest) -> HttpResponse:
        content_type = request.headers.get("content-type", "")
        if "json" in content_type:
            request.log_json = self._json_cached(request)
        try:
            fb = await self._run_io(
                functools.partial(
                    codec.decode_forward_backward,
                    request.body,
                    content_type,
                    request.headers.get("content-encoding"),
                )
            )
        except codec.WireError as exc:
            detail = f"malformed forward_backward request: {exc}"
            raise self._reject_undecodable(request, detail) from None
        if request.path.endswith("/forward"):
            fb.forward_only = True
        request.log_proto = {
            "model_id": fb.model_id,
            "seq_id": fb.seq_id,
            "loss_fn": fb.loss_fn,
            "forward_only": fb.forward_only,
            "datums": len(fb.datums),
        }
        if not fb.model_id:
            raise HttpError(400, "model_id: required")
        m = self._model_for_submission(fb.model_id)
        seq_id = fb.seq_id
        if seq_id < 1:
            raise HttpError(
                400, f"seq_id: must be >= 1 (seq 0 is the model's creation), got {seq_id}"
            )
        dup = self._duplicate(m, seq_id)
        if dup is not None:
            return self._future_reply(dup)
        if fb.loss_fn not in _LOSS_FNS:
            raise self._reject(m, seq_id, 400, f"loss_fn: unknown loss function {fb.loss_fn!r}")
        if not fb.datums:
            raise self._reject(m, seq_id, 400, "data: at least one datum is required")
        kind = "Forward" if fb.forward_only else "ForwardBackward"
        rec = self._futures.create(kind, owner=m.model_id, seq_id=seq_id)

        def run() -> ForwardResult:
            assert m.model is not None
            return m.model.forward_backward(fb.datums, fb.loss_fn, fb.config, not fb.forward_only)

        return self._future_reply(self._submit(m, seq_id, WorkItem(kind, rec, run)))

    def _seq_submission(self, request: HttpRequest) -> tuple[Body, ModelRuntime, int]:
        b = json_body(request)
        model_id = b.str_("model_id")
        m = self._model_for_submission(model_id)
        seq_id = b.int_("seq_id", minimum=1)
        return b, m, seq_id

    def _validated(self, m: ModelRuntime, seq_id: int, fn: Callable[[], T]) -> T:
        """Run submission validation; a 4xx counts the seq_id as processed."""
        try:
            return fn()
        except HttpError as exc:
            if 400 <= exc.status < 500:
                raise self._reject(m, seq_id, exc.status, exc.detail) from None
            raise

    async def _h_optim_step(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self._duplicate(m, seq_id)
        if dup is not None:
            return self._future_reply(dup)

        def params() -> dict[str, Any]:
            adam = b.opt_dict("adam_params")
            other = b.opt_dict("optimizer_params")
            if adam is not None:
                ab = Body(adam, "adam_params")
                out: dict[str, Any] = {}
                for key in (
                    "learning_rate",
                    "beta1",
                    "beta2",
                    "eps",
                    "weight_decay",
                    "grad_clip_norm",
                ):
                    value = ab.opt_num(key)
                    if value is not None:
                        out[key] = value
                return out
            if other is not None:
                return dict(other)
            return {}

        p = self._validated(m, seq_id, params)
        rec = self._futures.create("OptimStep", owner=m.model_id, seq_id=seq_id)
        legacy = self.protocol == "legacy"

        def run() -> dict[str, Any]:
            assert m.model is not None
            metrics = m.model.optim_step(cast("dict[str, float]", p))
            return {} if legacy else {"metrics": codec.fix_metrics(metrics)}

        return self._future_reply(self._submit(m, seq_id, WorkItem("OptimStep", rec, run)))

    async def _h_save_weights(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self._duplicate(m, seq_id)
        if dup is not None:
            return self._future_reply(dup)

        def validate() -> tuple[str, int | None, bool, dict[str, Any] | None]:
            return (
                checkpoint_name(b.str_("path")),
                b.opt_int("ttl_seconds"),
                b.bool_("overwrite", False),
                b.opt_dict("user_metadata"),
            )

        name, ttl, overwrite, meta = self._validated(m, seq_id, validate)
        rec = self._futures.create("SaveWeights", owner=m.model_id, seq_id=seq_id)
        ckpt_id = f"weights/{name}"

        def run() -> dict[str, Any]:
            assert m.model is not None
            self._check_overwrite(m.model_id, ckpt_id, overwrite)
            files = {
                CheckpointFiles.WEIGHTS: m.model.state_bytes(False),
                CheckpointFiles.FULL: m.model.state_bytes(True),
            }
            size = self._files.write(m.model_id, ckpt_id, files)
            now = self._now()
            row = CheckpointRow(
                run_id=m.model_id,
                checkpoint_id=ckpt_id,
                checkpoint_type="training",
                created_at=now,
                size_bytes=size,
                user_metadata=meta,
                expires_at=ttl_expiry(ttl, now),
                has_optimizer=True,
            )
            self._store.put_checkpoint(row)
            return {"path": row.tinker_path, "type": "save_weights"}

        return self._future_reply(self._submit(m, seq_id, WorkItem("SaveWeights", rec, run)))

    def _check_overwrite(self, run_id: str, ckpt_id: str, overwrite: bool) -> None:
        if not overwrite and self._store.get_checkpoint(run_id, ckpt_id) is not None:
            raise UserError(
                f"checkpoint tinker://{run_id}/{ckpt_id} already exists; pass overwrite=True to replace it"
            )

    async def _h_save_weights_for_sampler(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self._duplicate(m, seq_id)
        if dup is not None:
            return self._future_reply(dup)

        def validate() -> tuple[str | None, int | None, int | None, dict[str, Any] | None]:
            path = b.opt_str("path")
            b.opt_str("kind")
            sseq = b.opt_int("sampling_session_seq_id", minimum=0)
            if path is None and sseq is None:
                raise HttpError(
                    400, "either path (a named save) or sampling_session_seq_id is required"
                )
            return (
                None if path is None else checkpoint_name(path),
                b.opt_int("ttl_seconds"),
                sseq,
                b.opt_dict("user_metadata"),
            )

        name, ttl, sseq, meta = self._validated(m, seq_id, validate)
        rec = self._futures.create("SaveWeightsForSampler", owner=m.model_id, seq_id=seq_id)
        if name is not None:
            ckpt_id = f"sampler_weights/{name}"

            def run_named() -> dict[str, Any]:
                assert m.model is not None
                self._check_overwrite(m.model_id, ckpt_id, True)
                size = self._files.write(
                    m.model_id, ckpt_id, {CheckpointFiles.SAMPLER: m.model.sampler_weights()}
                )
                now = self._now()
                row = CheckpointRow(
                    run_id=m.model_id,
                    checkpoint_id=ckpt_id,
                    checkpoint_type="sampler",
                    created_at=now,
                    size_bytes=size,
                    user_metadata=meta,
                    expires_at=ttl_expiry(ttl, now),
                )
                self._store.put_checkpoint(row)
                return {"path": row.tinker_path, "type": "save_weights_for_sampler"}

            item = WorkItem("SaveWeightsForSampler", rec, run_named)
        else:
            assert sseq is not None
            rt = self._session_rt(m.session_id)
            sampler_id = f"{m.session_id}:sample:{sseq}"

            def run_ephemeral() -> Sampler:
                assert m.model is not None
                return self._backend.sampler(m.base_model, m.model.sampler_weights())

            def register(sampler: Sampler) -> dict[str, Any]:
                self._samplers[sampler_id] = SamplerRuntime(
                    sampler_id=sampler_id,
                    session_id=m.session_id,
                    base_model=m.base_model,
                    model_path=None,
                    sampler=sampler,
                )
                self._remember_ephemeral(sampler_id)
                rt.samplers_by_seq[sseq] = sampler_id
                self._store.insert_sampler(
                    SamplerRow(
                        sampler_id,
                        m.session_id,
                        sseq,
                        m.base_model,
                        None,
                        self._now(),
                        ephemeral=True,
                    )
                )
                return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

            item = WorkItem("SaveWeightsForSampler", rec, run_ephemeral, on_loop=register)
        return self._future_reply(self._submit(m, seq_id, item))

    async def _h_save_weights_external(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self._duplicate(m, seq_id)
        if dup is not None:
            return self._future_reply(dup)

        def validate() -> tuple[str, int | None, list[Any]]:
            recipients = age_recipients(b.opt_str_list("age_encryption_recipients"))
            return checkpoint_name(b.str_("path")), b.opt_int("ttl_seconds"), recipients

        name, ttl, recipients = self._validated(m, seq_id, validate)
        rec = self._futures.create("SaveWeightsExternal", owner=m.model_id, seq_id=seq_id)
        ckpt_id = f"external_weights/{name}"

        def run() -> dict[str, Any]:
            assert m.model is not None
            exported = m.model.export_files()
            if recipients:
                exported = encrypt_files(exported, recipients)
            files = {f"{CheckpointFiles.FILES}/{rel}": data for rel, data in exported.items()}
            size = self._files.write(m.model_id, ckpt_id, files)
            now = self._now()
            row = CheckpointRow(
                run_id=m.model_id,
                checkpoint_id=ckpt_id,
                checkpoint_type="external",
                created_at=now,
                size_bytes=size,
                expires_at=ttl_expiry(ttl, now),
            )
            self._store.put_checkpoint(row)
            return {"path": row.tinker_path, "size_bytes": size, "type": "save_weights_external"}

        return self._future_reply(
            self._submit(m, seq_id, WorkItem("SaveWeightsExternal", rec, run))
        )

    async def _h_load_weights(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        if b.has("model_id"):
            return await self._load_in_place(b)
        if self.protocol == "legacy":
            raise HttpError(
                422,
                "load_weights needs model_id and seq_id on this server "
                "(create the model with create_model, then load into it)",
            )
        session_id = b.str_("session_id")
        model_seq_id = b.int_("model_seq_id", minimum=0)
        path = b.str_("path")
        optimizer = b.bool_("optimizer", False)
        rt = self._session_rt(session_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        existing = rt.create_futures.get(model_seq_id)
        if existing is not None:
            return self._future_reply(existing, model_id)
        self._require_active(session_id)
        try:
            row = self._rest.live_checkpoint(path, want="training")
        except HttpError as exc:
            # 400, not 404: clients treat 404/422 on create-via-load as "old server" (B64).
            raise HttpError(400, exc.detail) from None
        run = self._store.get_run(row.run_id)
        if run is None:
            raise HttpError(400, f"training run {row.run_id} of {path} not found")
        base_model = b.opt_str("base_model") or run.base_model
        self._check_base_model(base_model)
        lora = self._lora_spec(run.lora)
        optimizer_config = b.opt_dict("optimizer_config") or run.optimizer_config
        m = self._new_model_runtime(
            model_id=model_id,
            session_id=session_id,
            model_seq_id=model_seq_id,
            base_model=base_model,
            lora=lora,
            optimizer_config=optimizer_config,
            user_metadata=b.opt_dict("user_metadata"),
        )
        rec = self._futures.create("LoadWeights", owner=model_id, seq_id=0)
        rt.create_futures[model_seq_id] = rec
        rt.models_by_seq[model_seq_id] = model_id

        def run_load() -> dict[str, Any]:
            seed = lora.seed if lora.seed is not None else self.seed
            model = self._backend.new_model(base_model, lora, seed)
            self._load_into(model, row, optimizer)
            m.model = model
            self._store.insert_run(self._run_row(m, self._now()))
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        self._submit(m, 0, WorkItem("LoadWeights", rec, run_load))
        return self._future_reply(rec, model_id)

    def _load_into(self, model: Any, row: CheckpointRow, optimizer: bool) -> None:
        name = CheckpointFiles.FULL if optimizer else CheckpointFiles.WEIGHTS
        try:
            blob = self._files.read(row.run_id, row.checkpoint_id, name)
        except FileNotFoundError:
            raise UserError(f"checkpoint {row.tinker_path} has no stored weights") from None
        model.load_state_bytes(blob, optimizer)

    async def _load_in_place(self, b: Body) -> HttpResponse:
        model_id = b.str_("model_id")
        m = self._model_for_submission(model_id)
        seq_id = b.int_("seq_id", minimum=1)
        dup = self._duplicate(m, seq_id)
        if dup is not None:
            return self._future_reply(dup)
        path = self._validated(m, seq_id, lambda: b.str_("path"))
        optimizer = self._validated(m, seq_id, lambda: b.bool_("optimizer", False))
        row = self._validated(m, seq_id, lambda: self._rest.live_checkpoint(path, want="training"))
        rec = self._futures.create("LoadWeights", owner=model_id, seq_id=seq_id)

        def run() -> dict[str, Any]:
            assert m.model is not None
            self._load_into(m.model, row, optimizer)
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        return self._future_reply(self._submit(m, seq_id, WorkItem("LoadWeights", rec, run)))

    async def _h_unload_model(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        model_id = b.str_("model_id")
        m = self._models.get(model_id)
        if m is None:
            raise HttpError(404, f"unknown model_id {model_id!r}")
        rec = self._futures.create("UnloadModel", owner=model_id, seq_id=None)
        m.unloaded = True
        m.unload_futures.append(rec)
        m.wake.set()
        return self._future_reply(rec, model_id)

    async def _h_create_custom_loss(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        seq = b.int_("custom_loss_seq_id", minimum=0)
        name = b.str_("name")
        inputs = b.get("inputs")
        graph = b.opt_dict("graph")
        if not isinstance(inputs, list) or not inputs or len(inputs) > 16:
            raise HttpError(400, "inputs: expected a list of 1..16 {name, rank} objects")
        for i, item in enumerate(inputs):
            ib = Body(item, f"inputs[{i}]")
            ib.str_("name")
            if ib.int_("rank") not in (0, 1, 2):
                raise HttpError(400, f"inputs[{i}].rank: must be 0, 1 or 2")
        if graph is None or not isinstance(graph.get("nodes"), list):
            raise HttpError(400, "graph: expected {format, nodes: [...]}")
        rt = self._session_rt(session_id)
        existing = rt.custom_losses.get(seq)
        if existing is not None:
            return self._future_reply(existing)
        self._require_active(session_id)
        loss_id = f"{session_id}:loss:{seq}"
        self._custom_losses[loss_id] = {"name": name, "inputs": inputs, "graph": graph}
        rec = self._futures.create("CreateCustomLoss", owner=session_id, seq_id=seq)
        rt.custom_losses[seq] = rec
        rec.complete({"loss_id": loss_id, "type": "create_custom_loss"}, now=self._clock())
        return self._future_reply(rec)

    # ==================================================================== sampling

    async def _sampler_weights_for(self, row: CheckpointRow, base_model: str) -> bytes:
        if row.checkpoint_type == "sampler":
            return await self._run_io(
                lambda: self._files.read(row.run_id, row.checkpoint_id, CheckpointFiles.SAMPLER)
            )
        if row.checkpoint_type == "training":
            run = self._store.get_run(row.run_id)
            lora = self._lora_spec(run.lora if run else None)

            def build() -> bytes:
                model = self._backend.new_model(base_model, lora, self.seed)
                self._load_into(model, row, False)
                return model.sampler_weights()

            return await self._run(build)
        raise HttpError(
            400, f"cannot sample from an {row.checkpoint_type} checkpoint ({row.tinker_path})"
        )

    async def _h_create_sampling_session(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        seq = b.int_("sampling_session_seq_id", minimum=0)
        base_model = b.opt_str("base_model")
        model_path = b.opt_str("model_path")
        rt = self._session_rt(session_id)
        existing = rt.samplers_by_seq.get(seq)
        if existing is not None:
            return HttpResponse.json(
                {"sampling_session_id": existing, "type": "create_sampling_session"}
            )
        if base_model is None and model_path is None:
            raise HttpError(400, "either base_model or model_path is required")
        self._require_active(session_id)
        weights: bytes | None = None
        if model_path is not None:
            row = self._rest.live_checkpoint(model_path)
            run = self._store.get_run(row.run_id)
            if base_model is None:
                if run is None:
                    raise HttpError(404, f"training run {row.run_id} of {model_path} not found")
                base_model = run.base_model
            self._check_base_model(base_model)
            weights = await self._sampler_weights_for(row, base_model)
        else:
            assert base_model is not None
            self._check_base_model(base_model)
        existing = rt.samplers_by_seq.get(seq)  # a concurrent duplicate may have won meanwhile
        if existing is not None:
            return HttpResponse.json(
                {"sampling_session_id": existing, "type": "create_sampling_session"}
            )
        sampler_id = f"{session_id}:sample:{seq}"
        bm = base_model
        sampler = await self._run(lambda: self._backend.sampler(bm, weights))
        self._samplers[sampler_id] = SamplerRuntime(
            sampler_id=sampler_id,
            session_id=session_id,
            base_model=base_model,
            model_path=model_path,
            sampler=sampler,
        )
        rt.samplers_by_seq[seq] = sampler_id
        self._store.insert_sampler(
            SamplerRow(sampler_id, session_id, seq, base_model, model_path, self._now())
        )
        return HttpResponse.json(
            {"sampling_session_id": sampler_id, "type": "create_sampling_session"}
        )

    def _remember_ephemeral(self, sampler_id: str) -> None:
        """Keep at most ``max_ephemeral_samplers`` unsaved-weight samplers in memory."""
        self._ephemeral.append(sampler_id)
        while len(self._ephemeral) > self.max_ephemeral_samplers:
            old = self._ephemeral.popleft()
            self._samplers.pop(old, None)

    def _sampler_rt(self, sampler_id: str) -> SamplerRuntime:
        s = self._samplers.get(sampler_id)
        if s is not None:
            return s
        row = self._store.get_sampler(sampler_id)
        if row is None:
            raise HttpError(404, f"unknown sampling session {sampler_id!r}")
        if row.ephemeral:
            raise HttpError(
                404,
                f"sampling session {sampler_id!r} held unsaved weights that are gone (an "
                "earlier server process, or evicted after newer samplers); save named sampler "
                "weights to sample from them later",
            )
        s = SamplerRuntime(
            sampler_id=sampler_id,
            session_id=row.session_id,
            base_model=row.base_model,
            model_path=row.model_path,
        )
        self._samplers[sampler_id] = s
        return s

    async def _ensure_sampler(self, s: SamplerRuntime) -> Sampler:
        if s.sampler is not None:
            return s.sampler
        async with s.load_lock:
            if s.sampler is None:
                weights = s.weights
                if weights is None and s.model_path is not None:
                    row = self._rest.live_checkpoint(s.model_path)
                    weights = await self._sampler_weights_for(row, s.base_model)
                s.sampler = await self._run(lambda: self._backend.sampler(s.base_model, weights))
            return s.sampler

    async def _h_join_sampling_session(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        s = self._sampler_rt(b.str_("sampling_session_id"))
        s.client_counter += 1
        return HttpResponse.json(
            {"client_counter": s.client_counter, "type": "join_sampling_session"}
        )

    async def _h_get_sampler(self, request: HttpRequest, sampler_id: str) -> HttpResponse:
        s = self._samplers.get(sampler_id)
        if s is not None:
            base_model, model_path = s.base_model, s.model_path
        else:
            row = self._store.get_sampler(sampler_id)
            if row is None:
                raise HttpError(404, f"unknown sampler {sampler_id!r}")
            base_model, model_path = row.base_model, row.model_path
        return HttpResponse.json(
            {
                "sampler_id": sampler_id,
                "base_model": base_model,
                "model_path": model_path,
                "tokenizer_id": BYTE_TOKENIZER_ID,
            }
        )

    def _sample_options(self, b: Body) -> tuple[npt.NDArray[np.int64], SampleOptions]:
        prompt_obj = b.get("prompt")
        if prompt_obj is None:
            raise HttpError(400, "prompt: required")
        prompt = codec.tokens_from_model_input_json(prompt_obj, "prompt")
        sp = Body(b.get("sampling_params") or {}, "sampling_params")
        stop = sp.get("stop")
        stop_strings: list[str] | None = None
        stop_tokens: list[int] | None = None
        if isinstance(stop, str):
            stop_strings = [stop]
        elif isinstance(stop, list):
            if all(isinstance(x, str) for x in stop):
                stop_strings = list(stop)
                if not stop:
                    stop_tokens = []
            elif all(isinstance(x, int) and not isinstance(x, bool) for x in stop):
                stop_tokens = list(stop)
            else:
                raise HttpError(
                    400,
                    "sampling_params.stop: expected a string, a list of strings or a list of ints",
                )
        elif stop is not None:
            raise HttpError(
                400, "sampling_params.stop: expected a string, a list of strings or a list of ints"
            )
        target = b.get("target_prompt_logprobs")
        target_arr = None
        if target is not None:
            target_arr = codec.tensor_from_json(target, "target_prompt_logprobs", pad=-1).astype(
                np.int64
            )
        opts = SampleOptions(
            num_samples=_bounded(
                b.int_or("num_samples", 1, minimum=1), "num_samples", MAX_NUM_SAMPLES
            ),
            max_tokens=sp.opt_int("max_tokens", minimum=0),
            temperature=sp.num_or("temperature", 1.0),
            top_k=sp.int_or("top_k", -1),
            top_p=sp.num_or("top_p", 1.0),
            seed=sp.opt_int("seed"),
            stop_strings=stop_strings,
            stop_tokens=stop_tokens,
            prompt_logprobs=b.bool_("prompt_logprobs", False),
            prompt_logprobs_last_n=b.opt_int("prompt_logprobs_last_n", minimum=1),
            topk_prompt_logprobs=b.int_or("topk_prompt_logprobs", 0, minimum=0),
            topk_sample_logprobs=b.int_or("topk_sample_logprobs", 0, minimum=0),
            target_prompt_logprobs=target_arr,
            prompt_alt_tokens_k=b.int_or("prompt_alt_tokens_k", 0, minimum=0),
        )
        b.bool_("record_stability_info", False)
        return prompt, opts

    async def _h_asample(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        sid = b.opt_str("sampling_session_id")
        seq_id = b.int_("seq_id", minimum=0) if b.has("seq_id") else None
        if sid is not None:
            s = self._sampler_rt(sid)
        else:
            base_model, model_path = b.opt_str("base_model"), b.opt_str("model_path")
            if base_model is None and model_path is None:
                raise HttpError(400, "sampling_session_id (or base_model / model_path) is required")
            s = await self._anonymous_sampler(base_model, model_path)
        if seq_id is not None:
            existing = s.by_seq.get(seq_id)
            if existing is not None:
                return self._sample_reply(existing)
        prompt, opts = self._sample_options(b)
        rec = self._futures.create("Sample", owner=s.sampler_id, seq_id=seq_id)
        rec.sample_sequence_ids = [f"{rec.request_id}:{i}" for i in range(opts.num_samples)]
        rec.cloned_sampler_id = (seq_id or 0) // _SAMPLE_CLONE_STRIDE
        if seq_id is not None:
            s.by_seq[seq_id] = rec
        rt = self._sessions.get(s.session_id)
        if rt is not None and rt.expired:
            rec.fail("session expired (no heartbeat)", "user", now=self._clock())
        self._spawn(self._run_sample(s, rec, prompt, opts))
        return self._sample_reply(rec)

    def _sample_reply(self, rec: FutureRecord) -> HttpResponse:
        body: dict[str, Any] = {"request_id": rec.request_id}
        if self.protocol == "current":
            body["sample_sequence_ids"] = list(rec.sample_sequence_ids or [])
        return HttpResponse.json(body)

    async def _anonymous_sampler(
        self, base_model: str | None, model_path: str | None
    ) -> SamplerRuntime:
        key = f"anon:{base_model or ''}:{model_path or ''}"
        s = self._samplers.get(key)
        if s is not None:
            return s
        weights = None
        if model_path is not None:
            row = self._rest.live_checkpoint(model_path)
            if base_model is None:
                run = self._store.get_run(row.run_id)
                if run is None:
                    raise HttpError(404, f"training run {row.run_id} of {model_path} not found")
                base_model = run.base_model
            weights = await self._sampler_weights_for(row, base_model)
        assert base_model is not None
        self._check_base_model(base_model)
        s = self._samplers.setdefault(
            key,
            SamplerRuntime(
                sampler_id=key,
                session_id="",
                base_model=base_model,
                model_path=model_path,
                weights=weights,
            ),
        )
        return s

    async def _run_sample(
        self,
        s: SamplerRuntime,
        rec: FutureRecord,
        prompt: npt.NDArray[np.int64],
        opts: SampleOptions,
    ) -> None:
        try:
            await self._wait_unpaused("sampling")
            if self.work_delay_s > 0:
                await asyncio.sleep(self.work_delay_s)
            if rec.done:
                return
            sampler = await self._ensure_sampler(s)
            seq_ids = rec.sample_sequence_ids

            def work() -> tuple[SampleResult, dict[str, bytes]]:
                result = sampler.sample(prompt, opts)
                return result, self._encode_primary("Sample", result, seq_ids)

            result, encoded = await self._run(work)
            if len(result.sequences) != opts.num_samples:
                raise RuntimeError(
                    f"backend returned {len(result.sequences)} sequences for num_samples={opts.num_samples}"
                )
            rec.complete(result, now=self._clock(), encoded=encoded)
        except asyncio.CancelledError:
            raise
        except (UserError, HttpError, ValueError, LookupError) as exc:
            rec.fail(
                exc.detail if isinstance(exc, HttpError) else str(exc), "user", now=self._clock()
            )
        except Exception as exc:
            logger.exception("sampler %s: sample failed", s.sampler_id)
            rec.fail(
                scrub(f"internal error: {type(exc).__name__}: {exc}"), "server", now=self._clock()
            )
        finally:
            if rec.done:
                completion: dict[str, Any]
                if rec.state == "done":
                    completion = {
                        "state": "finished",
                        "request_id": rec.request_id,
                        "response_payload_uncompressed_size": rec.size,
                    }
                else:
                    completion = {"state": "failed", "request_id": rec.request_id}
                s.channel(rec.cloned_sampler_id).push(completion, self._clock())

    # ==================================================================== polling

    async def _payload(self, rec: FutureRecord, form: str) -> bytes:
        blob = rec.encoded.get(form)
        if blob is None:
            result, kind, ids = rec.result, rec.kind, rec.sample_sequence_ids
            blob = await self._run_io(lambda: self._encode(kind, result, form, ids))
            rec.encoded[form] = blob
        return blob

    def _try_again(
        self, rec: FutureRecord, state: str = "active", reason: str | None = None
    ) -> HttpResponse:
        body: dict[str, Any] = {
            "type": "try_again",
            "request_id": rec.request_id,
            "queue_state": state,
        }
        if reason is not None:
            body["queue_state_reason"] = reason
        return HttpResponse.json(body)

    def _poll_hold(self, request: HttpRequest) -> float:
        """How long to hold this poll: ``long_poll_s``, or less if the client asked for less
        with ``X-Tinker-Poll-Hold`` (advertised on poll replies with ``X-Tinker-Poll-Hold-Max``)."""
        raw = request.headers.get(HOLD_HEADER.lower())
        if raw is None:
            return self.long_poll_s
        try:
            asked = float(raw)
        except ValueError:
            raise HttpError(400, f"{HOLD_HEADER}: expected seconds, got {raw!r}") from None
        if not asked >= 0.0:  # also NaN
            raise HttpError(400, f"{HOLD_HEADER}: expected seconds >= 0, got {raw!r}")
        return min(self.long_poll_s, asked)

    def _advert(self) -> dict[str, str]:
        """The header telling clients which poll hold they may ask for (the current protocol
        only: an older server knows nothing of requested holds)."""
        if self.protocol == "legacy":
            return {}
        return {ADVERT_HEADER: f"{self.long_poll_s:g}"}

    async def _hold_poll(self, rec: FutureRecord, hold_s: float) -> HttpResponse | None:
        """Long-poll a pending future: None once it is done, else a try_again answer.

        Held up to ``hold_s``; while its queue is paused, up to ``min(hold_s, 1 s)`` and
        answered with the paused state (so the client learns it promptly).
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        kind = self._pause_kind(rec.kind)
        while not rec.done and not self._closed:
            pause = self._paused[kind]
            limit = hold_s if pause is None else min(hold_s, _PAUSED_POLL_S)
            remaining = start + limit - loop.time()
            if remaining <= 0:
                state, reason = pause or ("active", None)
                return self._try_again(rec, state, reason)
            await rec.wait(remaining)
        if not rec.done:
            return self._try_again(rec)
        return None

    async def _h_retrieve_future(self, request: HttpRequest) -> HttpResponse:
        answer = await self._retrieve_future(request)
        if answer.status < 400:
            answer.headers.update(self._advert())
        return answer

    async def _retrieve_future(self, request: HttpRequest) -> HttpResponse:
        hold_s = self._poll_hold(request)
        b = json_body(request)
        request_id = b.str_("request_id")
        allow_metadata = b.bool_("allow_metadata_only", False)
        rec = self._futures.get(request_id)
        fault = request.poll_fault
        if rec is None:
            raise HttpError(410, f"future {request_id} is unknown or has expired")
        if fault is not None:
            if fault.expire:
                raise HttpError(410, f"future {request_id} has expired (injected: {fault.name})")
            if fault.queue_state is not None:
                return self._try_again(rec, fault.queue_state, fault.reason)
            if fault.fail is not None:
                message = fault.message or f"injected failure ({fault.name})"
                rec.force_fail(message, fault.fail, now=self._clock())
                return HttpResponse.json({"error": rec.error, "category": rec.category})
        if not rec.done:
            answer = await self._hold_poll(rec, hold_s)
            if answer is not None:
                return answer
        if rec.state == "failed":
            return HttpResponse.json({"error": rec.error, "category": rec.category})
        if rec.result is None and not rec.encoded:
            raise HttpError(410, f"future {request_id}'s result was already retrieved and released")
        want_proto = (
            rec.kind in _PROTO_KINDS
            and self.protocol == "current"
            and "application/x-protobuf" in request.headers.get("accept", "")
        )
        form = "proto" if want_proto else "json"
        blob = await self._payload(rec, form)
        forced = fault is not None and fault.metadata_only
        if (
            allow_metadata
            and not rec.metadata_sent
            and (forced or len(blob) > self.metadata_threshold_bytes)
        ):
            rec.metadata_sent = True
            return HttpResponse.json(
                {
                    "status": "complete_metadata",
                    "request_id": rec.request_id,
                    "response_payload_size": len(blob),
                }
            )
        ctype = "application/x-protobuf" if want_proto else "application/json"
        return HttpResponse(200, {"content-type": ctype}, blob)

    async def _h_retrieve_futures(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        target = Body(b.get("target"), "target")
        ttype = target.opt_str("type") or "sampling_session"
        if ttype != "sampling_session":
            raise HttpError(400, f"target.type: unsupported target {ttype!r}")
        s = self._sampler_rt(target.str_("sampling_session_id"))
        cloned = target.int_or("cloned_sampler_id", 0, minimum=0)
        prev = b.int_or("prev_cursor", 0, minimum=0)
        timeout = b.opt_num("timeout")
        acked = b.opt_str_list("retrieved_request_ids") or []
        if request.poll_fault is not None and request.poll_fault.expire:
            raise HttpError(410, f"injected: {request.poll_fault.name}")
        for rid in acked:
            rec = self._futures.get(rid)
            if rec is not None and rec.owner == s.sampler_id:
                self._futures.forget(rid)
        ch = s.channel(cloned)
        ch.ack(prev)
        ch.prune(self._clock() - 3600.0)
        wait_s = self.long_poll_s if timeout is None else max(0.0, min(timeout, self.long_poll_s))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            completions = ch.after(prev)
            remaining = deadline - loop.time()
            if completions or remaining <= 0 or self._closed:
                break
            event = ch.changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        cursor = max(prev, ch.last_cursor) if completions else prev
        return HttpResponse.json(
            {"completions": completions, "cursor": cursor}, headers=self._advert()
        )

    async def _h_cancel_future(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        rec = self._futures.get(b.str_("request_id"))
        if rec is not None and not rec.done:
            rec.cancelled = True
            rec.fail("cancelled by the client", "user", now=self._clock())
        return HttpResponse.json({})

    async def _h_telemetry(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        events = b.get("events")
        if events is not None and not isinstance(events, list):
            raise HttpError(400, "events: expected a list")
        self._telemetry_events += len(events or [])
        return HttpResponse.json({"status": "accepted"})

    async def _h_capabilities(self, request: HttpRequest) -> HttpResponse:
        infos: list[tuple[str, int | None]] = []
        if self._models_list is not None:
            for name in self._models_list:
                try:
                    infos.append((name, self._backend.model_info(name).max_context_length))
                except UserError:
                    infos.append((name, None))
        else:
            infos = [(i.model_name, i.max_context_length) for i in self._backend.supported_models()]
        return HttpResponse.json(
            {
                "supported_models": [
                    {
                        "model_name": n,
                        "max_context_length": c,
                        "trainable": True,
                        "sampleable": True,
                    }
                    for n, c in infos
                ]
            }
        )

    async def _h_healthz(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"status": "ok"})

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
                                self._expire_session(sid)
            except RuntimeError:
                if self._closed:
                    return
                raise
            except Exception:
                logger.exception("local server housekeeping failed")
