"""Sessions and bootstrap: client config, JWT exchange, create / heartbeat / finish, telemetry and capabilities.

Usage (the app builds one and routes requests to it)::

    api = SessionApi(app)
    response = await api.client_config(request)

Every handler reads and writes the state of the one :class:`~tinker_sync.local._app.TinkerApp`
it serves (``self.app``), on the app's event loop.

Thread safety: event-loop only, like the app. Fork safety: not fork-safe.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from tinker_sync._runtime.redact import register_secret
from tinker_sync.local._body import (
    HttpError,
    json_body,
)
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._rest import OWNER
from tinker_sync.local._state import (
    SessionRuntime,
)
from tinker_sync.local._store import (
    SessionRow,
)
from tinker_sync.local.backends.base import (
    UserError,
)

if TYPE_CHECKING:
    from tinker_sync.local._app import TinkerApp

__all__ = ["SessionApi"]

#: Every flag of docs/design/protocol.md#client-config with its documented default, except the
#: pyqwest switch, which is always off so the official SDK keeps to httpx.
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

logger = logging.getLogger("tinker_sync.local")


class SessionApi:
    """The sessions and bootstrap endpoints of one :class:`TinkerApp` (its ``self.app``)."""

    def __init__(self, app: TinkerApp) -> None:
        self.app = app

    async def client_config(self, request: HttpRequest) -> HttpResponse:
        json_body(request, optional=True)
        with self.app._config_lock:
            config = dict(self.app._client_config)
        if self.app.protocol == "legacy":
            defaults = DEFAULT_CLIENT_CONFIG
            config = {k: v for k, v in config.items() if k not in defaults or v != defaults[k]}
            config["use_pyqwest_transport"] = False
            config["create_model_via_load_weights"] = False
            return HttpResponse.json(config)
        return HttpResponse.json(config, headers=self.app._future_api.advert())

    async def dynamic_config(self, request: HttpRequest) -> HttpResponse:
        if self.app.protocol == "legacy":
            raise HttpError(404, "client/dynamic_config is not served by this (legacy) server")
        json_body(request, optional=True)
        with self.app._config_lock:
            return HttpResponse.json(dict(self.app._dynamic_config))

    async def auth_token(self, request: HttpRequest) -> HttpResponse:
        json_body(request, optional=True)
        claims = {
            "sub": OWNER,
            "org_id": "local",
            "email": "local@tinker-sync.invalid",
            "iss": "passport-tinker-sync-local",
        }
        token = self.app._jwt.issue(claims, ttl_s=self.app.jwt_ttl_s, now=time.time())
        register_secret(token)
        return HttpResponse.json({"jwt": token})

    async def create_session(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        tags = b.opt_str_list("tags") or []
        user_metadata = b.opt_dict("user_metadata") or {}
        sdk_version = b.opt_str("sdk_version") or ""
        row = SessionRow(
            session_id=str(uuid.uuid4()),
            created_at=self.app._now(),
            tags=tags,
            user_metadata=user_metadata,
            sdk_version=sdk_version,
            project_id=b.opt_str("project_id"),
            display_name=b.opt_str("display_name"),
        )
        self.app._store.insert_session(row)
        self.app._sessions[row.session_id] = SessionRuntime(
            session_id=row.session_id, last_heartbeat=self.app._clock()
        )
        return HttpResponse.json({"session_id": row.session_id, "type": "create_session"})

    def require_active(self, session_id: str) -> None:
        gone = self._session_gone(session_id)
        if gone is not None:
            raise HttpError(410, f"session {session_id} has finished ({gone}); start a new session")

    def _session_gone(self, session_id: str) -> str | None:
        """Why the session no longer accepts heartbeats (None while active)."""
        row = self.app._store.get_session(session_id)
        if row is None:
            raise HttpError(404, f"unknown session_id {session_id!r}")
        if row.status.get("type") != "active":
            return str(row.status.get("type"))
        rt = self.app._session_rt(session_id)
        if (
            self.app.heartbeat_expiry_s is not None
            and self.app._clock() - rt.last_heartbeat > self.app.heartbeat_expiry_s
        ):
            self.expire_session(session_id)
            return "cancelled"
        return None

    def expire_session(self, session_id: str) -> None:
        rt = self.app._sessions.get(session_id)
        if rt is not None:
            rt.expired = True
        self.app._store.set_session_status(
            session_id, {"type": "cancelled", "detail": "no heartbeat received in time"}
        )
        now = self.app._clock()
        for s in self.app._samplers.values():
            if s.session_id == session_id:
                for rec in s.by_seq.values():
                    rec.fail("session expired (no heartbeat)", "user", now=now)
        logger.info(
            "session %s expired after %.1f s without a heartbeat",
            session_id,
            self.app.heartbeat_expiry_s or 0,
        )

    async def heartbeat(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        gone = self._session_gone(session_id)
        if gone is not None:
            raise HttpError(410, f"session {session_id} has finished ({gone})")
        self.app._session_rt(session_id).last_heartbeat = self.app._clock()
        return HttpResponse.json({"type": "session_heartbeat"})

    async def finish_session(self, request: HttpRequest, session_id: str) -> HttpResponse:
        b = json_body(request, optional=True)
        reason = b.opt_dict("reason") or {"type": "success"}
        rtype = reason.get("type", "success")
        if rtype not in ("success", "errored", "interrupted"):
            raise HttpError(
                400, f"reason.type: expected success|errored|interrupted, got {rtype!r}"
            )
        row = self.app._store.get_session(session_id)
        if row is None:
            raise HttpError(404, f"unknown session_id {session_id!r}")
        if row.status.get("type") != "active":
            return HttpResponse.json({})  # the first finish reason wins
        status = {
            "type": "client_finished",
            "reason": {"type": rtype},
            "detail": b.opt_str("detail"),
        }
        self.app._store.set_session_status(session_id, status)
        return HttpResponse.json({})

    async def telemetry(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        events = b.get("events")
        if events is not None and not isinstance(events, list):
            raise HttpError(400, "events: expected a list")
        self.app._telemetry_events += len(events or [])
        return HttpResponse.json({"status": "accepted"})

    async def capabilities(self, request: HttpRequest) -> HttpResponse:
        infos: list[tuple[str, int | None]] = []
        if self.app._models_list is not None:
            for name in self.app._models_list:
                try:
                    infos.append((name, self.app._backend.model_info(name).max_context_length))
                except UserError:
                    infos.append((name, None))
        else:
            infos = [
                (i.model_name, i.max_context_length) for i in self.app._backend.supported_models()
            ]
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

    async def healthz(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"status": "ok"})
