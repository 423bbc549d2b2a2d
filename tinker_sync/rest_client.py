"""``RestClient``: runs, checkpoints, sessions and other REST calls, without a session.

Usage::

    with tinker_sync.RestClient() as rest:              # no I/O until the first call
        runs = rest.list_training_runs(limit=50).result()
        for ckpt in rest.list_checkpoints(runs.training_runs[0].training_run_id).result().checkpoints:
            print(ckpt.tinker_path)
        rest.publish_checkpoint_from_tinker_path("tinker://run-1/weights/step1").result()
        for run in rest.iter_training_runs(page_size=100):   # follows cursor.total_count
            print(run.training_run_id)

Every method returns an :class:`~tinker_sync.APIFuture` at once (the request runs on the SDK's
``rest`` thread pool, inside the submission loop with HTTP retries); each has an ``*_async``
twin that resolves to the plain value. Argument errors raise ``ValueError``/``TypeError`` in the
caller's thread before anything is sent. ``cancel()`` on a returned future works only before
its request is sent.

Thread safety: share one client between threads freely. Fork safety: a child process may keep
using the client (its connections are rebuilt); futures pending at fork time fail in the child.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from tinker_sync._config import ClientConfig, Timeout
from tinker_sync._credentials import jwt_claims
from tinker_sync._flow.retry import send_with_retries
from tinker_sync._futures import APIFuture, fail_pending
from tinker_sync._paths import CheckpointPath, parse_checkpoint_path
from tinker_sync._runtime.asyncio_bridge import awaiting_alias
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.executor import pool
from tinker_sync._runtime.imports import imported
from tinker_sync._runtime.redact import register_secret
from tinker_sync._session.state import Session
from tinker_sync._transport import (
    Hook,
    Pool,
    Reply,
    RequestSpec,
    Transport,
    current_sdk_method,
    quote_path,
    sdk_method_scope,
)
from tinker_sync._validate import (
    AccessScope,
    check_int,
    check_opt_str,
    check_scope,
    check_str,
    check_ttl,
)
from tinker_sync._wire._converter import from_json, to_json
from tinker_sync.exceptions import (
    APIResponseValidationError,
    ClientClosedError,
    MissingCredentialsError,
)
from tinker_sync.types import (
    Checkpoint,
    CheckpointsListResponse,
    CopyWeightsRequest,
    CopyWeightsResponse,
    ExternalWeightsUrlsResponse,
    GetSamplerResponse,
    GetServerCapabilitiesResponse,
    GetSessionResponse,
    ListSessionsResponse,
    ParsedCheckpointTinkerPath,
    TraceExportResponse,
    TrainingRun,
    TrainingRunsResponse,
    WeightsInfoResponse,
    WhoamiResponse,
)

__all__ = ["TRACE_EXPORT_POLL_INTERVAL_S", "RestClient"]

log = logging.getLogger("tinker_sync.rest")

T = TypeVar("T")

TRACE_EXPORT_POLL_INTERVAL_S = 5.0
"""Seconds between two polls of a session trace export that is still ``pending``."""

_CLASS = "RestClient"


def _parse_path(tinker_path: object) -> CheckpointPath:
    return parse_checkpoint_path(tinker_path)


def _checkpoint_path(run_id: str, checkpoint_id: str) -> str:
    return f"/api/v1/training_runs/{quote_path(run_id)}/checkpoints/{quote_path(checkpoint_id)}"


def _decode(cls: type[T], reply: Reply) -> T:
    """Decode a 2xx JSON reply into ``cls``; APIResponseValidationError when it does not fit."""
    data = reply.json()
    try:
        return from_json(cls, data)
    except (TypeError, ValueError) as exc:
        raise APIResponseValidationError(
            f"{reply.method} {reply.url}: unexpected reply: {exc}",
            response=reply.snapshot(),
            body=data,
        ) from None


# --------------------------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------------------------


class RestClient:
    """REST operations of the Tinker API (runs, checkpoints, sessions, samplers).

    Construct it directly (no ServiceClient, project or session needed) or get one from
    ``ServiceClient.create_rest_client()``. Nothing is sent and no thread starts until the first
    call; connections are shared process-wide per (base URL, key) and ``close()`` (or leaving a
    ``with`` block) releases this client's share.

    :param base_url: falls back to ``TINKER_BASE_URL``, then the hosted service.
    :param api_key: falls back to ``TINKER_API_KEY``, ``TINKER_CREDENTIAL_CMD``,
        ``~/.tinker/credentials.json`` (resolved at first use).
    :param timeout: seconds or :class:`~tinker_sync.Timeout` per request (default 60, connect 5).
    :param max_retries: HTTP-level retries per request (default 10).
    :param stall_timeout: seconds a call may go without a useful answer before it fails with
        :class:`~tinker_sync.StalledError` (default ``TINKER_STALL_TIMEOUT``, else 600), as
        for :class:`~tinker_sync.ServiceClient`.
    :param default_headers_overrides: headers merged into every request (alias
        ``default_headers``).

    Thread safety: thread-safe. Fork safety: usable in a forked child (connections rebuilt).
    """

    _config: ClientConfig
    _session: Session
    _closed_event: threading.Event

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | Timeout | None = None,
        max_retries: int | None = None,
        default_headers_overrides: Mapping[str, str] | None = None,
        default_headers: Mapping[str, str] | None = None,
        hooks: tuple[Hook, ...] | list[Hook] | None = None,
        stall_timeout: float | None = None,
        _clock: Clock = SYSTEM_CLOCK,
        _submission_loop: bool = True,
    ) -> None:
        config = ClientConfig.from_env(
            base_url=base_url,
            api_key=api_key,
            default_headers=default_headers,
            default_headers_overrides=default_headers_overrides,
            timeout=timeout,
            max_retries=max_retries,
            stall_timeout=stall_timeout,
            clock=_clock,
        )
        self._setup(config, tuple(hooks or ()), _clock, loop=_submission_loop)

    @classmethod
    def _from_config(
        cls,
        config: ClientConfig,
        *,
        hooks: tuple[Hook, ...] | list[Hook] = (),
        clock: Clock = SYSTEM_CLOCK,
        loop: bool = True,
    ) -> RestClient:
        """A client sharing an already resolved config (used by ``ServiceClient``, and by the
        CLI's ``health --probe`` with ``loop=False``: HTTP-level retries only)."""
        self = cls.__new__(cls)
        self._setup(config, tuple(hooks), clock, loop=loop)
        return self

    def _setup(
        self, config: ClientConfig, hooks: tuple[Hook, ...], clock: Clock, *, loop: bool = True
    ) -> None:
        self._config = config
        session_class = Session if loop else _HttpRetriesOnlySession
        self._session = session_class(config, clock=clock, hooks=hooks, with_session=False)
        self._closed_event = threading.Event()

    # ---------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        """The resolved base URL (no trailing slash)."""
        return self._config.base_url

    @property
    def closed(self) -> bool:
        return self._closed_event.is_set()

    def close(self) -> None:
        """Release this client's connections; pending futures fail with ClientClosedError.

        Idempotent. Later calls raise :class:`~tinker_sync.ClientClosedError`.
        """
        if self._closed_event.is_set():
            return
        self._closed_event.set()
        fail_pending(lambda fut: ClientClosedError(f"{fut!r}: the RestClient was closed"), self)
        self._session.close()

    def __enter__(self) -> RestClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<RestClient base_url={self._config.base_url!r} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError(
            "RestClient cannot be pickled; build one in each process: "
            "tinker_sync.ServiceClient().create_rest_client()"
        )

    # ---------------------------------------------------------------- plumbing

    def _check_open(self) -> None:
        if self._closed_event.is_set():
            raise ClientClosedError("this RestClient was closed; create a new one")

    def _submit(self, name: str, work: Callable[[], T]) -> APIFuture[T]:
        """Run ``work`` on the ``rest`` pool and return its future (cancellable until it starts)."""
        self._check_open()
        fut: APIFuture[T] = APIFuture(description=f"{_CLASS}.{name}")
        fut._owner = self  # type: ignore[attr-defined]  # for fail_pending at close

        def job() -> None:
            if not fut.set_running_or_notify_cancel():
                return  # cancelled before sending
            try:
                self._check_open()
                value = work()
            except BaseException as exc:
                fut._fail(exc)
            else:
                fut._resolve(value)

        pool("rest").submit(job)
        return fut

    def _spec(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> RequestSpec:
        """A spec carrying the caller's ``x-sdk-method`` (built in the caller's thread)."""
        extra: dict[str, Any] = {}
        if idempotency_key is not None:
            extra["idempotency_key"] = idempotency_key
        return RequestSpec(
            method=method,
            path=path,
            pool=Pool.REST,
            params=params,
            json=json,
            headers=dict(headers or {}),
            sdk_method=current_sdk_method.get(),
            **extra,
        )

    def _call(self, name: str, spec: RequestSpec, decode: Callable[[Reply], T]) -> APIFuture[T]:
        session = self._session
        return self._submit(name, lambda: decode(session.request(spec)))

    def send_once(self, spec: RequestSpec) -> Reply:
        """Send ``spec`` once in the caller's thread, with this client's URL, credentials and
        hooks: no retry, no session, and an error status is returned, not raised.

        For SDK modules that poll an endpoint themselves (``checkpoints``: the archive being
        created); ``RequestSpec`` comes from ``tinker_sync._transport``. Raises
        :class:`~tinker_sync.ClientClosedError` after ``close()``, or the transport's exception.
        """
        self._check_open()
        return self._session.transport.send_once(spec)

    # ---------------------------------------------------------------- capabilities

    def get_server_capabilities(self) -> APIFuture[GetServerCapabilitiesResponse]:
        """The models the caller can use: ``.result().supported_models``."""
        with sdk_method_scope(f"{_CLASS}.get_server_capabilities"):
            spec = self._spec("GET", "/api/v1/get_server_capabilities")
            return self._call(
                "get_server_capabilities",
                spec,
                lambda r: _decode(GetServerCapabilitiesResponse, r),
            )

    # ---------------------------------------------------------------- training runs

    def get_training_run(
        self, training_run_id: str, access_scope: AccessScope = "owned"
    ) -> APIFuture[TrainingRun]:
        """Metadata of one training run (``access_scope="accessible"`` includes shared runs)."""
        with sdk_method_scope(f"{_CLASS}.get_training_run"):
            return self._get_training_run("get_training_run", training_run_id, access_scope)

    def _get_training_run(
        self, name: str, training_run_id: object, access_scope: object
    ) -> APIFuture[TrainingRun]:
        run_id = check_str("training_run_id", training_run_id)
        scope = check_scope(access_scope)
        spec = self._spec(
            "GET", f"/api/v1/training_runs/{quote_path(run_id)}", params={"access_scope": scope}
        )
        return self._call(name, spec, lambda r: _decode(TrainingRun, r))

    def get_training_run_by_tinker_path(
        self, tinker_path: str, access_scope: AccessScope = "owned"
    ) -> APIFuture[TrainingRun]:
        """The training run a ``tinker://`` checkpoint path belongs to."""
        with sdk_method_scope(f"{_CLASS}.get_training_run_by_tinker_path"):
            parsed = _parse_path(tinker_path)
            return self._get_training_run(
                "get_training_run_by_tinker_path", parsed.training_run_id, access_scope
            )

    def get_weights_info_by_tinker_path(self, tinker_path: str) -> APIFuture[WeightsInfoResponse]:
        """Base model, LoRA rank, train flags and optimizer of a checkpoint."""
        with sdk_method_scope(f"{_CLASS}.get_weights_info_by_tinker_path"):
            _parse_path(tinker_path)
            spec = self._spec("POST", "/api/v1/weights_info", json={"tinker_path": tinker_path})
            return self._call(
                "get_weights_info_by_tinker_path",
                spec,
                lambda r: _decode(WeightsInfoResponse, r),
            )

    def list_training_runs(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: AccessScope = "owned",
        project_id: str | None = None,
    ) -> APIFuture[TrainingRunsResponse]:
        """One page of training runs; ``.cursor.total_count`` tells how many exist.

        ``project_id`` is sent only when given.
        """
        with sdk_method_scope(f"{_CLASS}.list_training_runs"):
            params: dict[str, Any] = {
                "limit": check_int("limit", limit),
                "offset": check_int("offset", offset),
                "access_scope": check_scope(access_scope),
            }
            if check_opt_str("project_id", project_id) is not None:
                params["project_id"] = project_id
            spec = self._spec("GET", "/api/v1/training_runs", params=params)
            return self._call(
                "list_training_runs", spec, lambda r: _decode(TrainingRunsResponse, r)
            )

    def iter_training_runs(
        self,
        page_size: int = 100,
        access_scope: AccessScope = "owned",
        project_id: str | None = None,
    ) -> Iterator[TrainingRun]:
        """Every training run, fetching pages of ``page_size`` lazily (blocks per page).

        Follows ``cursor.total_count``; stops early on a short or empty page.
        """
        check_int("page_size", page_size, minimum=1)
        check_scope(access_scope)
        check_opt_str("project_id", project_id)
        return self._iter_training_runs(page_size, access_scope, project_id)

    def _iter_training_runs(
        self, page_size: int, access_scope: AccessScope, project_id: str | None
    ) -> Iterator[TrainingRun]:
        offset = 0
        while True:
            page = self.list_training_runs(page_size, offset, access_scope, project_id).result()
            yield from page.training_runs
            offset += len(page.training_runs)
            if (
                not page.training_runs
                or len(page.training_runs) < page_size
                or offset >= page.cursor.total_count
            ):
                return

    # ---------------------------------------------------------------- checkpoints

    def list_checkpoints(self, training_run_id: str) -> APIFuture[CheckpointsListResponse]:
        """Training, sampler and external checkpoints of one run."""
        with sdk_method_scope(f"{_CLASS}.list_checkpoints"):
            run_id = check_str("training_run_id", training_run_id)
            spec = self._spec("GET", f"/api/v1/training_runs/{quote_path(run_id)}/checkpoints")
            return self._call(
                "list_checkpoints", spec, lambda r: _decode(CheckpointsListResponse, r)
            )

    def list_user_checkpoints(
        self, limit: int = 100, offset: int = 0
    ) -> APIFuture[CheckpointsListResponse]:
        """One page of all the caller's checkpoints, newest first."""
        with sdk_method_scope(f"{_CLASS}.list_user_checkpoints"):
            params = {"limit": check_int("limit", limit), "offset": check_int("offset", offset)}
            spec = self._spec("GET", "/api/v1/checkpoints", params=params)
            return self._call(
                "list_user_checkpoints", spec, lambda r: _decode(CheckpointsListResponse, r)
            )

    def iter_user_checkpoints(self, page_size: int = 100) -> Iterator[Checkpoint]:
        """Every checkpoint of the caller, newest first, fetched lazily page by page."""
        check_int("page_size", page_size, minimum=1)
        return self._iter_user_checkpoints(page_size)

    def _iter_user_checkpoints(self, page_size: int) -> Iterator[Checkpoint]:
        offset = 0
        while True:
            page = self.list_user_checkpoints(page_size, offset).result()
            yield from page.checkpoints
            offset += len(page.checkpoints)
            if not page.checkpoints or len(page.checkpoints) < page_size:
                return
            if page.cursor is not None and offset >= page.cursor.total_count:
                return

    def get_external_weights_urls(self, tinker_path: str) -> APIFuture[ExternalWeightsUrlsResponse]:
        """Signed per-file download URLs of an ``external_weights`` checkpoint."""
        with sdk_method_scope(f"{_CLASS}.get_external_weights_urls"):
            parsed = _parse_path(tinker_path)
            if parsed.checkpoint_type != "external":
                raise ValueError(
                    "get_external_weights_urls only accepts external weights checkpoints "
                    f"(tinker://<training_run_id>/external_weights/<name>), got {tinker_path!r}"
                )
            path = _checkpoint_path(parsed.training_run_id, parsed.checkpoint_id)
            spec = self._spec("GET", f"{path}/external_weights_urls")
            return self._call(
                "get_external_weights_urls",
                spec,
                lambda r: _decode(ExternalWeightsUrlsResponse, r),
            )

    def delete_checkpoint(self, training_run_id: str, checkpoint_id: str) -> APIFuture[None]:
        """Delete a checkpoint; ``checkpoint_id`` includes its kind (``weights/step1``)."""
        with sdk_method_scope(f"{_CLASS}.delete_checkpoint"):
            return self._delete("delete_checkpoint", training_run_id, checkpoint_id)

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        """Delete the checkpoint at a ``tinker://`` path."""
        with sdk_method_scope(f"{_CLASS}.delete_checkpoint_from_tinker_path"):
            parsed = _parse_path(tinker_path)
            path = _checkpoint_path(parsed.training_run_id, parsed.checkpoint_id)
            spec = self._spec("DELETE", path)
            return self._call("delete_checkpoint_from_tinker_path", spec, _ignore)

    def _delete(self, name: str, training_run_id: object, checkpoint_id: object) -> APIFuture[None]:
        run_id = check_str("training_run_id", training_run_id)
        ckpt = check_str("checkpoint_id", checkpoint_id)
        try:
            ParsedCheckpointTinkerPath.from_tinker_path(f"tinker://{run_id}/{ckpt}")
        except ValueError:
            raise ValueError(
                "checkpoint_id must look like '<weights|sampler_weights|external_weights>/<name>' "
                f"and training_run_id must not contain '/', got {run_id!r}, {ckpt!r}"
            ) from None
        spec = self._spec("DELETE", _checkpoint_path(run_id, ckpt))
        return self._call(name, spec, _ignore)

    def publish_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        """Make a checkpoint public (owner only; 409 when it already is)."""
        with sdk_method_scope(f"{_CLASS}.publish_checkpoint_from_tinker_path"):
            parsed = _parse_path(tinker_path)
            path = _checkpoint_path(parsed.training_run_id, parsed.checkpoint_id)
            spec = self._spec("POST", f"{path}/publish")
            return self._call("publish_checkpoint_from_tinker_path", spec, _ignore)

    def unpublish_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        """Make a checkpoint private again (owner only; 409 when it is not public)."""
        with sdk_method_scope(f"{_CLASS}.unpublish_checkpoint_from_tinker_path"):
            parsed = _parse_path(tinker_path)
            path = _checkpoint_path(parsed.training_run_id, parsed.checkpoint_id)
            spec = self._spec("DELETE", f"{path}/publish")
            return self._call("unpublish_checkpoint_from_tinker_path", spec, _ignore)

    def set_checkpoint_ttl_from_tinker_path(
        self, tinker_path: str, ttl_seconds: int | None
    ) -> APIFuture[None]:
        """Expire a checkpoint ``ttl_seconds`` from now; ``None`` removes the expiry."""
        with sdk_method_scope(f"{_CLASS}.set_checkpoint_ttl_from_tinker_path"):
            parsed = _parse_path(tinker_path)
            ttl = check_ttl(ttl_seconds)
            path = _checkpoint_path(parsed.training_run_id, parsed.checkpoint_id)
            spec = self._spec("PUT", f"{path}/ttl", json={"ttl_seconds": ttl})
            return self._call("set_checkpoint_ttl_from_tinker_path", spec, _ignore)

    def copy_weights(
        self,
        path: str,
        destination_project_id: str | None = None,
        *,
        ttl_seconds: int | None = None,
        weights_access_token: str | None = None,
    ) -> APIFuture[str]:
        """Server-side copy of a checkpoint into a project; resolves to the new tinker path.

        The destination is ``destination_project_id``, else ``TINKER_PROJECT_ID`` read now,
        else ``ValueError``. One idempotency key covers every retry, so a retried request never
        makes two copies. ``weights_access_token`` travels only in the
        ``X-Tinker-Weights-Access-Token`` header and is never logged.
        """
        with sdk_method_scope(f"{_CLASS}.copy_weights"):
            _parse_path(path)
            project = check_opt_str("destination_project_id", destination_project_id)
            if project is None:
                project = os.environ.get("TINKER_PROJECT_ID") or None
            if project is None:
                raise ValueError(
                    "copy_weights needs destination_project_id (or set TINKER_PROJECT_ID)"
                )
            ttl = check_ttl(ttl_seconds)
            headers: dict[str, str] = {}
            if weights_access_token is not None:
                check_str("weights_access_token", weights_access_token)
                register_secret(weights_access_token)
                headers["X-Tinker-Weights-Access-Token"] = weights_access_token
            body = to_json(
                CopyWeightsRequest(
                    source_path=path, destination_project_id=project, ttl_seconds=ttl
                )
            )
            spec = self._spec(
                "POST",
                "/api/v1/copy_weights",
                json=body,
                headers=headers,
                idempotency_key=str(uuid.uuid4()),
            )

            def decode(reply: Reply) -> str:
                new_path = _decode(CopyWeightsResponse, reply).tinker_path
                log.info("copied %s to %s", path, new_path)
                return new_path

            return self._call("copy_weights", spec, decode)

    # ---------------------------------------------------------------- sessions and samplers

    def get_session(
        self, session_id: str, access_scope: AccessScope = "owned"
    ) -> APIFuture[GetSessionResponse]:
        """The training runs and samplers of a session."""
        with sdk_method_scope(f"{_CLASS}.get_session"):
            sid = check_str("session_id", session_id)
            spec = self._spec(
                "GET",
                f"/api/v1/sessions/{quote_path(sid)}",
                params={"access_scope": check_scope(access_scope)},
            )
            return self._call("get_session", spec, lambda r: _decode(GetSessionResponse, r))

    def list_sessions(
        self, limit: int = 20, offset: int = 0, access_scope: AccessScope = "owned"
    ) -> APIFuture[ListSessionsResponse]:
        """One page of session ids."""
        with sdk_method_scope(f"{_CLASS}.list_sessions"):
            params = {
                "limit": check_int("limit", limit),
                "offset": check_int("offset", offset),
                "access_scope": check_scope(access_scope),
            }
            spec = self._spec("GET", "/api/v1/sessions", params=params)
            return self._call("list_sessions", spec, lambda r: _decode(ListSessionsResponse, r))

    def assign_session_project(self, session_id: str, project_id: str) -> APIFuture[None]:
        """Move a session (and its runs) into a project."""
        with sdk_method_scope(f"{_CLASS}.assign_session_project"):
            sid = check_str("session_id", session_id)
            project = check_str("project_id", project_id)
            spec = self._spec(
                "PUT", f"/api/v1/sessions/{quote_path(sid)}/project", json={"project_id": project}
            )
            return self._call("assign_session_project", spec, _ignore)

    def export_session_trace(self, session_id: str) -> APIFuture[str]:
        """A signed URL of the session's Perfetto trace (polls every 5 s until it is built).

        The future fails with ``RuntimeError`` when the server reports the export failed.
        """
        with sdk_method_scope(f"{_CLASS}.export_session_trace"):
            sid = check_str("session_id", session_id)
            spec = self._spec("GET", f"/api/v1/sessions/{quote_path(sid)}/trace_export")
            return self._submit("export_session_trace", lambda: self._poll_trace(sid, spec))

    def _poll_trace(self, session_id: str, spec: RequestSpec) -> str:
        session = self._session
        first = True
        while True:
            reply = session.request(spec)
            status = _decode(TraceExportResponse, reply)
            if status.status == "ready":
                if not status.url:
                    raise APIResponseValidationError(
                        "trace_export is ready but has no url", response=reply.snapshot()
                    )
                return status.url
            if status.status == "failed":
                raise RuntimeError(f"Trace export failed for session {session_id}: {status.error}")
            if status.status != "pending":
                raise APIResponseValidationError(
                    f"trace_export answered an unknown status {status.status!r}",
                    response=reply.snapshot(),
                )
            if first:
                log.warning(
                    "building the trace export of session %s (this may take a while)", session_id
                )
                first = False
            session.clock.sleep(TRACE_EXPORT_POLL_INTERVAL_S, "trace-export-poll")
            self._check_open()

    def get_sampler(self, sampler_id: str) -> APIFuture[GetSamplerResponse]:
        """Base model and weights path of a sampler (``<session>:sample:<n>``)."""
        with sdk_method_scope(f"{_CLASS}.get_sampler"):
            sid = check_str("sampler_id", sampler_id)
            spec = self._spec("GET", f"/api/v1/samplers/{quote_path(sid)}")
            return self._call("get_sampler", spec, lambda r: _decode(GetSamplerResponse, r))

    def whoami(self) -> APIFuture[WhoamiResponse]:
        """The caller's user URN, organization URN and email, read from the auth JWT's claims.

        No dedicated request: the JWT held for auth is used (exchanged first if none is cached).
        The future fails with ``RuntimeError`` when only a plain API key is available.
        """
        with sdk_method_scope(f"{_CLASS}.whoami"):
            return self._submit("whoami", self._whoami)

    def _whoami(self) -> WhoamiResponse:
        jwt = self._identity_jwt()
        if jwt is None:
            raise RuntimeError(
                "whoami requires JWT auth, but the server has it disabled and the credential "
                "is a plain API key."
            )
        try:
            claims = jwt_claims(jwt)
            return WhoamiResponse(
                user_urn=str(claims["sub"]),
                org_urn=f"tml:organization:{claims['org_id']}",
                email=str(claims["email"]) if claims.get("email") else None,
            )
        except (KeyError, ValueError) as exc:
            raise RuntimeError(f"the auth JWT lacks identity claims ({exc})") from None

    def _identity_jwt(self) -> str | None:
        imported("tinker_sync._session.jwt")  # a first import a signal cannot cut
        from tinker_sync._session.jwt import JwtAuth

        session = self._session
        auth = session.transport.auth  # starts the client (config, JWT exchange) if needed
        if isinstance(auth, JwtAuth):
            return auth.token()
        try:
            key = session.config.credentials.static_key()
        except MissingCredentialsError:
            return None
        if not key.startswith("eyJ"):
            return None
        try:
            issuer = str(jwt_claims(key).get("iss", ""))
        except ValueError:
            return None
        return key if issuer.startswith("passport-") else None

    # ---------------------------------------------------------------- async aliases

    get_server_capabilities_async = awaiting_alias(get_server_capabilities)
    get_training_run_async = awaiting_alias(get_training_run)
    get_training_run_by_tinker_path_async = awaiting_alias(get_training_run_by_tinker_path)
    get_weights_info_by_tinker_path_async = awaiting_alias(get_weights_info_by_tinker_path)
    list_training_runs_async = awaiting_alias(list_training_runs)
    list_checkpoints_async = awaiting_alias(list_checkpoints)
    list_user_checkpoints_async = awaiting_alias(list_user_checkpoints)
    get_external_weights_urls_async = awaiting_alias(get_external_weights_urls)
    delete_checkpoint_async = awaiting_alias(delete_checkpoint)
    delete_checkpoint_from_tinker_path_async = awaiting_alias(delete_checkpoint_from_tinker_path)
    publish_checkpoint_from_tinker_path_async = awaiting_alias(publish_checkpoint_from_tinker_path)
    unpublish_checkpoint_from_tinker_path_async = awaiting_alias(
        unpublish_checkpoint_from_tinker_path
    )
    set_checkpoint_ttl_from_tinker_path_async = awaiting_alias(set_checkpoint_ttl_from_tinker_path)
    copy_weights_async = awaiting_alias(copy_weights)
    get_session_async = awaiting_alias(get_session)
    list_sessions_async = awaiting_alias(list_sessions)
    assign_session_project_async = awaiting_alias(assign_session_project)
    export_session_trace_async = awaiting_alias(export_session_trace)
    whoami_async = awaiting_alias(whoami)
    get_sampler_async = awaiting_alias(get_sampler)


def _ignore(reply: Reply) -> None:
    return None


class _HttpRetriesOnlySession(Session):
    """A Session whose requests (start-up included) get HTTP-level retries only.

    For interactive tools (the CLI) that must fail within seconds rather than ride out a
    restarting server for ``stall_timeout`` in the submission loop. Thread and fork safety: as Session.
    """

    def _loop(self, transport: Transport, spec: RequestSpec) -> Reply:
        return send_with_retries(transport, spec)
