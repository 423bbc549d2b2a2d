"""``ServiceClient``: the entry point; creates training, sampling and REST clients.

Usage::

    with tinker_sync.ServiceClient() as service:        # no I/O until first use
        training = service.create_lora_training_client("Qwen/Qwen3-8B", rank=32)
        sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")

Creation methods block and return the client (0.2x style); ``.result()`` on the returned client
returns it at once, so 0.38-style ``create_...(...).result()`` also runs.

Thread safety: share freely; the session starts once however many threads race
(docs/design/behavior.md#lazy-single-init). Fork safety: in a forked child the REST helpers work,
while ``create_*`` methods start a new session only if this client was never started in the parent,
else raise ForkedProcessError.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from tinker_sync import _pending, types  # its names load on first use (docs/scale-out.md)
from tinker_sync._config import ClientConfig, HealthPolicy, Timeout, normalize_base_url
from tinker_sync._flow.health import (
    PendingFuture,
    TenantState,
    pending_entry,
    recorded_tenant_state,
    summarize,
    tenant_state,
)
from tinker_sync._flow.limiter import existing_limiter
from tinker_sync._futures import APIFuture
from tinker_sync._polling.decide import Decision
from tinker_sync._polling.loop import Poll
from tinker_sync._polling.queuestate import QueueStateReporter
from tinker_sync._runtime.asyncio_bridge import blocking_alias
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.imports import imported
from tinker_sync._session.state import Session
from tinker_sync._session.telemetry import captures_exceptions
from tinker_sync._transport import Hook, Pool, RequestSpec, quote_path, sdk_method_scope
from tinker_sync._wire._converter import from_json, omit_new_defaults, to_json
from tinker_sync.exceptions import (
    BadRequestError,
    ExperimentalWarning,
    MissingCredentialsError,
    NotFoundError,
    UnprocessableEntityError,
)
from tinker_sync.types import UntypedAPIFuture

if TYPE_CHECKING:
    from tinker_sync._sampling.retry import RetryConfig
    from tinker_sync.rest_client import RestClient
    from tinker_sync.sampling_client import SamplingClient
    from tinker_sync.training_client import LossHandle, PerDatumLossFn, TrainingClient
    from tinker_sync.types import (
        GetInfoResponse,
        GetSamplerResponse,
        GetServerCapabilitiesResponse,
        LoraConfig,
        OptimizerConfig,
    )

log = logging.getLogger("tinker_sync.service")

#: Servers known to answer create-via-load with 404/422 (docs/design/behavior.md#older-servers):
#: they get the older flow.
_legacy_load_servers: set[str] = set()
_legacy_lock = threading.Lock()


class ServiceClient:
    """Entry point to the Tinker service. Thread-safe; see the module docs for fork rules.

    :param user_metadata: attached to the session.
    :param project_id: session project (falls back to ``TINKER_PROJECT_ID``).
    :param base_url: falls back to ``TINKER_BASE_URL``, then the hosted service.
    :param api_key: falls back to ``TINKER_API_KEY``, ``TINKER_CREDENTIAL_CMD``,
        ``~/.tinker/credentials.json`` (resolved at first use).
    :param timeout: seconds or :class:`Timeout` for ordinary requests (default 60, connect 5).
    :param max_retries: retries per request (default 10), across every retry layer: ``0``
        means one attempt. A server that never answered is given up on after ``timeout``
        seconds of retries (default 60).
    :param stall_timeout: seconds a pending call may go without a useful answer (only
        connection errors, timeouts or 5xx) before it fails with
        :class:`~tinker_sync.StalledError` (default ``TINKER_STALL_TIMEOUT``, else 600: long
        enough to ride out a server restart).
    :param health: the :class:`~tinker_sync.HealthPolicy` of the circuit breaker and retry
        budget shared by every client of this base URL and API key (default
        ``TINKER_SYNC_HEALTH``, else the defaults of docs/health.md); ``fail_fast=True`` makes
        new calls raise :class:`~tinker_sync.CircuitOpenError` while the server is failing.
    :param pickle_credentials: let pickled SamplingClients carry the API key (default False).
    :param max_workers: accepted for compatibility and validated, but it sizes nothing: the
        SDK's thread pools are process-wide and shared by every client (sizes per role:
        ``tinker_sync._runtime.executor.configure_threads``, before the first request).
    :param hooks: callables receiving ``HookEvent`` objects (requests, retries, backoffs).
    """

    def __init__(
        self,
        user_metadata: dict[str, str] | None = None,
        project_id: str | None = None,
        *,
        display_name: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        default_headers_overrides: Mapping[str, str] | None = None,
        default_headers: Mapping[str, str] | None = None,
        timeout: float | Timeout | None = None,
        max_retries: int | None = None,
        stall_timeout: float | None = None,
        health: HealthPolicy | None = None,
        max_workers: int | None = None,
        pickle_credentials: bool = False,
        hooks: tuple[Hook, ...] | list[Hook] | None = None,
        _clock: Clock = SYSTEM_CLOCK,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            warnings.warn(
                f"ServiceClient ignores unknown keyword arguments: {', '.join(sorted(kwargs))}",
                FutureWarning,
                stacklevel=2,
            )
        if max_workers is not None and (isinstance(max_workers, bool) or max_workers < 1):
            raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
        self._config = ClientConfig.from_env(
            base_url=base_url,
            api_key=api_key,
            project_id=project_id,
            default_headers=default_headers,
            default_headers_overrides=default_headers_overrides,
            timeout=timeout,
            max_retries=max_retries,
            stall_timeout=stall_timeout,
            health=health,
            clock=_clock,
        )
        self._clock = _clock
        self._hooks: tuple[Hook, ...] = tuple(hooks or ())
        self._session = Session(
            self._config,
            clock=_clock,
            hooks=self._hooks,
            user_metadata=user_metadata,
            display_name=display_name,
        )
        self.pickle_credentials = bool(pickle_credentials)
        self._close_future: APIFuture[None] | None = None
        self._rest: RestClient | None = None
        self._session.add_close_listener(self._fail_pending)
        self._session.health.describe_pending = self._describe_pending

    def _fail_pending(self) -> None:
        from tinker_sync._futures import fail_pending
        from tinker_sync.exceptions import ClientClosedError

        fail_pending(
            lambda fut: ClientClosedError(f"{fut!r} was still pending when its client closed"),
            owner=self._session,
        )

    def pending(self) -> list[PendingFuture]:
        """Every call of this client (and its RestClient) that has not finished, oldest first.

        Each entry has ``kind``, ``request_id``, ``age`` (s), ``attempts``, ``last_status``
        (e.g. ``"HTTP 503"``, ``"APIConnectError"``, ``"try_again"``), ``queue_state``
        (e.g. ``"paused_rate_limit"``), the server's last answer (``last_answer``) with when
        (``last_answer_at``, wall clock) and how long ago (``last_answer_age``, s), and
        ``tenant``: the tenant's health (:meth:`health`), one snapshot shared by every entry.
        The answer to "why is my run stuck?" (docs/health.md#liveness)::

            for p in service.pending():
                print(p.kind, p.request_id, f"{p.age:.0f}s", p.last_answer, p.queue_state,
                      p.tenant.state)
        """
        from tinker_sync._futures import pending_futures

        sessions = [self._session]
        owners: list[object] = [self._session]
        if self._rest is not None:
            sessions.append(self._rest._session)
            owners.append(self._rest)
        progress = {p.request_id: p for s in sessions for p in s.health.tracked()}
        tenant = self.health()
        clock = self._session.health.clock
        now = time.monotonic()
        out: list[PendingFuture] = []
        for fut in pending_futures():
            if not any(getattr(fut, "_owner", None) is owner for owner in owners):
                continue
            rid = fut.request_id
            found = [progress.pop(r) for r in fut.request_ids if r in progress]
            kind = fut._description or "call"
            age = now - fut._created
            out.append(pending_entry(kind, rid, age, found, clock, tenant, submitting=not rid))
        for p in progress.values():  # polls without a future (blocking creation calls)
            out.append(pending_entry(p.kind, p.request_id, now - p.started, [p], clock, tenant))
        out.sort(key=lambda p: -p.age)
        return out

    def health(self) -> TenantState:
        """The health of this client's tenant (its base URL and API key): the circuit's state,
        since when and why, the next probe, parked requests, the retry budget, paused queues.

        Usage::

            h = service.health()
            if h.state != "closed":
                print(f"the server is failing since {h.open_for:.0f} s: {h.reason}")

        One consistent snapshot; it never holds the API key. Before this client's first
        request it shows the tenant as another client of this process sees it, else as the
        circuit record shared by this user's processes shows it (docs/health.md#liveness).
        """
        health = self._session.health
        if health.tenant is not None:
            return tenant_state(health.tenant, health.url)
        config = self._config
        try:
            identity = config.credential_identity
        except MissingCredentialsError:  # no key yet: no tenant to look up
            return tenant_state(None, health.url)
        limiter = existing_limiter(config.normalized_base_url, identity)
        if limiter is not None:
            return tenant_state(limiter.tenant, health.url)
        return recorded_tenant_state(
            config.normalized_base_url, identity, config.health, self._clock.time()
        )

    def _describe_pending(self) -> str:
        return summarize([p.kind for p in self.pending()])

    def __repr__(self) -> str:
        sid = self._session.session_id
        return f"<ServiceClient base_url={self._config.base_url!r} session_id={sid!r}>"

    def __reduce__(self) -> Any:
        raise TypeError(
            "ServiceClient cannot be pickled; build one in each process: "
            "tinker_sync.ServiceClient() (it reads TINKER_API_KEY), or pickle a "
            "SamplingClient, which is meant to travel"
        )

    # ---------------------------------------------------------------- training clients

    @captures_exceptions
    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: OptimizerConfig | None = None,
    ) -> TrainingClient:
        """Create a LoRA training run and return its client (blocks through queueing).

        Awaitable too: in async code ``await service.create_lora_training_client(...)``
        creates on an SDK thread and never blocks the event loop (see ``_pending``).
        """
        if not isinstance(base_model, str) or not base_model:
            raise ValueError("base_model must be a non-empty str")
        if not (train_mlp or train_attn or train_unembed):
            raise ValueError("at least one of train_mlp, train_attn, train_unembed must be True")
        lora = types.LoraConfig(
            rank=rank,
            seed=seed,
            train_unembed=train_unembed,
            train_mlp=train_mlp,
            train_attn=train_attn,
        )
        return _pending.create(
            _pending_training_client,
            "create_lora_training_client",
            self._session,
            self._create_lora,
            base_model,
            lora,
            optimizer,
            user_metadata,
        )

    def _create_lora(
        self,
        base_model: str,
        lora: LoraConfig,
        optimizer: OptimizerConfig | None,
        user_metadata: dict[str, str] | None,
    ) -> TrainingClient:
        with sdk_method_scope("ServiceClient.create_lora_training_client"):
            session = self._started_session()
            model_seq = session.next_counter("model")
            body: dict[str, Any] = {
                "session_id": session.session_id,
                "model_seq_id": model_seq,
                "base_model": base_model,
                "lora_config": to_json(lora),
                "optimizer_config": to_json(optimizer or types.AdamOptimizerConfig()),
                "type": "create_model",
            }
            if user_metadata is not None:
                body["user_metadata"] = dict(user_metadata)
            # AdamW is the default: left out unless asked for, so 0.25 servers accept the body
            body = omit_new_defaults(body, keep=() if optimizer is None else ("optimizer_config",))
            created = self._submit_and_wait(
                RequestSpec(method="POST", path="/api/v1/create_model", pool=Pool.TRAIN, json=body),
                "CreateModel",
                lambda d: from_json(types.CreateModelResponse, d.body),
                loop=False,
                observer=QueueStateReporter(
                    "training", session.clock, identifier=base_model, prefix="Model creation"
                ),
            )
            return self._training_client(created.model_id)

    def _training_client(self, model_id: str) -> TrainingClient:
        imported("tinker_sync.training_client")  # a first import a signal cannot cut
        from tinker_sync.training_client import TrainingClient

        info = self._get_info(model_id)
        return TrainingClient(self, model_id, info)

    def _get_info(self, model_id: str) -> GetInfoResponse:
        reply = self._session.request(
            RequestSpec(
                method="POST",
                path="/api/v1/get_info",
                pool=Pool.TRAIN,
                json={"model_id": model_id, "type": "get_info"},
            )
        )
        info = reply.parse(types.GetInfoResponse)
        tokenizer_id = info.model_data.tokenizer_id
        if tokenizer_id and ":" in tokenizer_id:
            info = info.model_copy(
                update={
                    "model_data": info.model_data.model_copy(
                        update={"tokenizer_id": tokenizer_id.split(":", 1)[0]}
                    )
                }
            )
        return info

    @captures_exceptions
    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: OptimizerConfig | None = None,
    ) -> TrainingClient:
        """A new run initialised from checkpoint weights; the optimizer starts fresh (awaitable)."""
        types.ParsedCheckpointTinkerPath.from_tinker_path(path)
        return _pending.create(
            _pending_training_client,
            "create_training_client_from_state",
            self._session,
            self._from_state,
            "ServiceClient.create_training_client_from_state",
            path,
            False,
            base_model,
            user_metadata,
            weights_access_token,
            optimizer,
        )

    @captures_exceptions
    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> TrainingClient:
        """A new run restored from a checkpoint, optimizer state included: how to resume.

        Awaitable too, like every creation method.
        """
        types.ParsedCheckpointTinkerPath.from_tinker_path(path)
        return _pending.create(
            _pending_training_client,
            "create_training_client_from_state_with_optimizer",
            self._session,
            self._from_state,
            "ServiceClient.create_training_client_from_state_with_optimizer",
            path,
            True,
            base_model,
            user_metadata,
            weights_access_token,
            None,
        )

    def _from_state(
        self,
        sdk_method: str,
        path: str,
        with_optimizer: bool,
        base_model: str | None,
        user_metadata: dict[str, str] | None,
        weights_access_token: str | None,
        optimizer: OptimizerConfig | None,
    ) -> TrainingClient:
        with sdk_method_scope(sdk_method):
            return self._from_state_in_scope(
                path, with_optimizer, base_model, user_metadata, weights_access_token, optimizer
            )

    def _from_state_in_scope(
        self,
        path: str,
        with_optimizer: bool,
        base_model: str | None,
        user_metadata: dict[str, str] | None,
        weights_access_token: str | None,
        optimizer: OptimizerConfig | None,
    ) -> TrainingClient:
        session = self._started_session()
        server_key = normalize_base_url(self._config.base_url)
        if server_key not in _legacy_load_servers:
            model_seq = session.next_counter("model")
            body: dict[str, Any] = {
                "session_id": session.session_id,
                "model_seq_id": model_seq,
                "path": path,
                "optimizer": with_optimizer,
                "type": "load_weights",
            }
            if base_model is not None:
                body["base_model"] = base_model
            if user_metadata is not None:
                body["user_metadata"] = dict(user_metadata)
            if optimizer is not None:
                body["optimizer_config"] = to_json(optimizer)
            if weights_access_token is not None:
                body["weights_access_token"] = weights_access_token
            try:
                loaded = self._submit_and_wait(
                    RequestSpec(
                        method="POST", path="/api/v1/load_weights", pool=Pool.TRAIN, json=body
                    ),
                    "LoadWeights",
                    lambda d: from_json(types.LoadWeightsResponse, d.body),
                    observer=QueueStateReporter(
                        "training", session.clock, identifier=path, prefix="Model creation"
                    ),
                )
            except (BadRequestError, NotFoundError, UnprocessableEntityError) as exc:
                if not _rejects_request_shape(exc):
                    raise
                with _legacy_lock:
                    _legacy_load_servers.add(server_key)
                log.info(
                    "server rejected create-via-load (%s); using the older "
                    "weights_info -> create_model -> load_weights flow",
                    exc.status_code,
                )
            else:
                model_id = loaded.model_id or f"{session.session_id}:train:{model_seq}"
                return self._training_client(model_id)
        return self._from_state_legacy(
            path, with_optimizer, base_model, user_metadata, weights_access_token, optimizer
        )

    def _from_state_legacy(
        self,
        path: str,
        with_optimizer: bool,
        base_model: str | None,
        user_metadata: dict[str, str] | None,
        weights_access_token: str | None,
        optimizer: OptimizerConfig | None,
    ) -> TrainingClient:
        info = self.create_rest_client().get_weights_info_by_tinker_path(path).result()
        training = self.create_lora_training_client(
            base_model or info.base_model,
            rank=info.lora_rank or 32,
            train_mlp=info.train_mlp if info.train_mlp is not None else True,
            train_attn=info.train_attn if info.train_attn is not None else True,
            train_unembed=info.train_unembed if info.train_unembed is not None else True,
            user_metadata=user_metadata,
            optimizer=optimizer,
        )
        if with_optimizer:
            training.load_state_with_optimizer(path, weights_access_token).result()
        else:
            training.load_state(path, weights_access_token).result()
        return training

    # ---------------------------------------------------------------- sampling clients

    @captures_exceptions
    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
    ) -> SamplingClient:
        """Create a sampling session on saved weights (``tinker://``) or a base model.

        Awaitable too: in async code ``await service.create_sampling_client(...)`` never
        blocks the event loop.
        """
        if model_path is None and base_model is None:
            raise ValueError("create_sampling_client needs model_path or base_model")
        if model_path is not None and (
            not isinstance(model_path, str) or not model_path.startswith("tinker://")
        ):
            raise ValueError(f"model_path must start with 'tinker://', got {model_path!r}")
        return _pending.create(
            _pending_sampling_client,
            "create_sampling_client",
            self._session,
            self._create_sampling,
            model_path,
            base_model,
            retry_config,
            record_stability_info,
        )

    def _create_sampling(
        self,
        model_path: str | None,
        base_model: str | None,
        retry_config: RetryConfig | None,
        record_stability_info: bool,
    ) -> SamplingClient:
        with sdk_method_scope("ServiceClient.create_sampling_client"):
            imported("tinker_sync.sampling_client")
            from tinker_sync.sampling_client import SamplingClient

            session = self._started_session()
            seq = session.next_counter("sampling")
            body: dict[str, Any] = {
                "session_id": session.session_id,
                "sampling_session_seq_id": seq,
                "type": "create_sampling_session",
            }
            if base_model is not None:
                body["base_model"] = base_model
            if model_path is not None:
                body["model_path"] = model_path
            reply = session.request(
                RequestSpec(
                    method="POST",
                    path="/api/v1/create_sampling_session",
                    pool=Pool.SESSION,
                    json=body,
                ),
                loop=False,
            )
            data = reply.json()
            sampler_id = data.get("sampling_session_id") if isinstance(data, dict) else None
            if not isinstance(sampler_id, str):
                from tinker_sync.exceptions import APIResponseValidationError

                raise APIResponseValidationError(
                    "create_sampling_session answered without sampling_session_id",
                    response=reply.snapshot(),
                )
            tokenizer_id: str | None = None
            if base_model is None:
                sampler = self._get_sampler(sampler_id)
                base_model = sampler.base_model
                tokenizer_id = getattr(sampler, "tokenizer_id", None)
            return SamplingClient._create(
                self,
                sampler_id,
                base_model=base_model,
                model_path=model_path,
                tokenizer_id=tokenizer_id,
                retry_config=retry_config,
                record_stability_info=record_stability_info,
            )

    def _get_sampler(self, sampler_id: str) -> GetSamplerResponse:
        reply = self._session.request(
            RequestSpec(
                method="GET", path=f"/api/v1/samplers/{quote_path(sampler_id)}", pool=Pool.TRAIN
            )
        )
        return from_json(types.GetSamplerResponse, reply.json())

    # ---------------------------------------------------------------- other operations

    @captures_exceptions
    def get_server_capabilities(self) -> GetServerCapabilitiesResponse:
        """Models the server offers (blocks)."""
        with sdk_method_scope("ServiceClient.get_server_capabilities"):
            return self.create_rest_client().get_server_capabilities().result()

    def create_rest_client(self) -> RestClient:
        """A RestClient with this client's base URL, key, headers and knobs."""
        imported("tinker_sync.rest_client")  # a first import a signal cannot cut
        from tinker_sync.rest_client import RestClient

        if self._rest is None:
            self._rest = RestClient._from_config(self._config, hooks=self._hooks, clock=self._clock)
        return self._rest

    @captures_exceptions
    def copy_weights(
        self,
        path: str,
        *,
        ttl_seconds: int | None = None,
        weights_access_token: str | None = None,
    ) -> APIFuture[str]:
        """Server-side copy of a checkpoint into this client's project."""
        with sdk_method_scope("ServiceClient.copy_weights"):
            return self.create_rest_client().copy_weights(
                path,
                self._config.project_id,
                ttl_seconds=ttl_seconds,
                weights_access_token=weights_access_token,
            )

    def create_custom_loss(
        self, fn: PerDatumLossFn, input_ranks: Mapping[str, int]
    ) -> APIFuture[LossHandle]:
        """(alpha) A handle that ``forward_backward_custom`` runs client-side; no request."""
        from tinker_sync._futures import completed

        imported("tinker_sync.training_client")
        from tinker_sync.training_client import LossHandle

        warnings.warn("create_custom_loss is experimental", ExperimentalWarning, stacklevel=2)
        if not callable(fn):
            raise TypeError("fn must be callable")
        for name, rank in input_ranks.items():
            if rank not in (0, 1, 2):
                raise ValueError(f"input_ranks[{name!r}] must be 0, 1 or 2, got {rank!r}")
        return completed(LossHandle(fn, input_ranks))

    def get_console_url(self) -> str:
        sid = self._session.session_id
        base = "https://tinker-console.thinkingmachines.ai"
        return f"{base}/sessions/{sid}" if sid else f"{base}/sessions"

    # ---------------------------------------------------------------- lifecycle

    def close(
        self,
        status: Literal["success", "errored", "interrupted"] = "success",
        detail: str | None = None,
    ) -> APIFuture[None]:
        """Finish the session and release resources; idempotent (the first reason wins).

        Returns a done future: None, or the error that kept the server from being told (logged
        as one WARNING). Its finish request gets at most 3 close attempts within a 5 s close
        budget, one while the circuit is open (docs/health.md#close-during-an-outage).
        """
        if status not in ("success", "errored", "interrupted"):
            raise ValueError(f"status must be success, errored or interrupted, got {status!r}")
        if self._close_future is not None:
            return self._close_future
        fut: APIFuture[None] = APIFuture(cancellable=False, description="close")
        self._close_future = fut
        try:
            failure = self._session.close(status, detail)
        except BaseException as exc:
            fut._fail(exc)
        else:
            if failure is None:
                fut._resolve(None)
            else:
                fut._fail(failure)
        if self._rest is not None:
            self._rest.close()
        return fut

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            status: Literal["success", "errored", "interrupted"] = "success"
        elif isinstance(exc, Exception):
            status = "errored"
        else:
            status = "interrupted"
        closed = self.close(status, None if exc is None else f"{type(exc).__name__}: {exc}")
        if exc is None:
            closed.result()  # a finish the server was not told of raises, as in the official SDK
        # else the block's own exception goes on (the close failure was logged as a WARNING)

    # ---------------------------------------------------------------- async aliases

    create_lora_training_client_async = blocking_alias(create_lora_training_client)
    create_training_client_from_state_async = blocking_alias(create_training_client_from_state)
    create_training_client_from_state_with_optimizer_async = blocking_alias(
        create_training_client_from_state_with_optimizer
    )
    create_sampling_client_async = blocking_alias(create_sampling_client)
    get_server_capabilities_async = blocking_alias(get_server_capabilities)

    # ---------------------------------------------------------------- internals

    def _started_session(self) -> Session:
        session = self._session
        session.check_open()
        session.ensure_started()
        return session

    def _submit_and_wait(
        self,
        spec: RequestSpec,
        request_type: str,
        decode: Callable[[Decision], Any],
        *,
        loop: bool = True,
        observer: QueueStateReporter | None = None,
    ) -> Any:
        """Submit, then poll in this thread until the future's result is known."""
        session = self._session
        created_at = session.clock.monotonic()
        reply = session.request(spec, loop=loop)
        request_id = from_json(UntypedAPIFuture, reply.json()).request_id
        outcome: list[Any] = [None, None]

        def done(value: Any, error: BaseException | None) -> None:
            outcome[0], outcome[1] = value, error

        Poll(
            session,
            request_id,
            request_type,
            decode=decode,
            on_done=done,
            created_at=created_at,
            sdk_method=spec.sdk_method,
            on_queue_state=observer,
        ).run()
        if outcome[1] is not None:
            raise outcome[1]
        return outcome[0]


def _pending_training_client(future: APIFuture[TrainingClient]) -> TrainingClient:
    from tinker_sync.training_client import PendingTrainingClient

    return PendingTrainingClient(future)


def _pending_sampling_client(future: APIFuture[SamplingClient]) -> SamplingClient:
    from tinker_sync.sampling_client import PendingSamplingClient

    return PendingSamplingClient(future)


def _rejects_request_shape(
    exc: BadRequestError | NotFoundError | UnprocessableEntityError,
) -> bool:
    """True when a create-via-load was refused for its shape, not for a missing resource
    (docs/design/behavior.md#older-servers).

    A 422 always means the server does not understand the request; a 404 only when it is
    about the route itself (an older server without the endpoint), not a missing checkpoint;
    a 400 only when it asks for the ``model_id`` this request leaves out (servers that load
    weights only into an existing model, such as TuFT: ``"Missing model_id"``).
    """
    if isinstance(exc, UnprocessableEntityError):
        return True
    try:
        detail = exc.response.json().get("detail")
    except Exception:
        detail = None
    if isinstance(exc, BadRequestError):
        return isinstance(detail, str) and "missing model_id" in detail.lower()
    return detail in (None, "Not Found") or "endpoint" in str(detail).lower()
