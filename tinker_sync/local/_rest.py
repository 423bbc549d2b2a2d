"""The REST side of the local server: runs, checkpoints, sessions, signed file links.

Usage (the protocol app routes to it)::

    rest = RestApi(store, files, url_signer, run_io=app._run_io, trace=app._trace)
    response = await rest.list_runs(request)
    row = rest.live_checkpoint("tinker://run/weights/step1")

Everything here reads and writes the SQLite store and the checkpoint files; nothing depends on
live models except the session trace, which comes from the ``trace`` callback.

Thread safety: handlers run on the app's event loop; blocking file work goes through
``run_io``. Fork safety: not fork-safe (holds the store).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import io
import tarfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from tinker_sync.local._body import (
    SEGMENT_TYPES,
    Body,
    HttpError,
    iso,
    json_body,
    parse_tinker_path,
    str_map,
    ttl_expiry,
)
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._jwt import UrlSigner
from tinker_sync.local._store import CheckpointFiles, CheckpointRow, RunRow, SessionRow, Store

#: A semantic conflict is a final answer: tell clients not to retry it (they would for 409).
_FINAL = {"x-should-retry": "false"}

#: The single owner of everything on a local server.
OWNER = "tml:user:local"
#: Signed checkpoint file links are served under this prefix (outside ``/_local/`` admin).
FILES_PREFIX = "/_files/"
URL_TTL_S = 3600.0
_MAX_SQL_INT = 2**63 - 1
#: The longest ``Retry-After`` an archive that is still being created answers with.
ARCHIVE_RETRY_S = 2.0
#: Archives kept in memory (each is built once, then served from there).
ARCHIVES_HELD = 2


#: A file's bytes and the headers that describe them (:func:`_with_validators`).
_Served = tuple[bytes, dict[str, str]]


@dataclass
class _Archive:
    """One checkpoint's archive: ready at ``ready_at`` (server time); built on first use."""

    ready_at: float
    served: _Served | None = None


def _archive_key(row: CheckpointRow) -> tuple[str, str, str]:
    """One archive per checkpoint version (a checkpoint saved again gets a new one)."""
    return (row.run_id, row.checkpoint_id, str(row.created_at))


def _with_validators(data: bytes) -> _Served:
    """``data`` with its ``etag`` (strong, from the content) and ``repr-digest`` (RFC 9530,
    sha-256); run on the I/O pool, never on the event loop (a large archive takes a while)."""
    digest = hashlib.sha256(data).digest()
    return data, {
        "etag": f'"{digest[:16].hex()}"',
        "repr-digest": f"sha-256=:{base64.b64encode(digest).decode()}:",
        "accept-ranges": "bytes",
    }


def _ranged(request: HttpRequest, served: _Served, content_type: str) -> HttpResponse:
    """A GET of a file honouring one ``Range: bytes=a-[b]`` and ``If-Range`` (docs/downloads.md).

    The ETag and Repr-Digest describe the whole file on 200 and 206 alike. A fault rule with
    ``no_ranges`` makes this answer 200 with everything, like a server without range support.
    """
    data, validators = served
    headers = {"content-type": content_type, **validators}
    spec = request.headers.get("range", "")
    if not spec or request.meta.get("fault.no_ranges"):
        if request.meta.get("fault.no_ranges"):
            headers.pop("accept-ranges")
        return HttpResponse(200, headers, data)
    if_range = request.headers.get("if-range")
    if if_range is not None and if_range.strip() != headers["etag"]:
        return HttpResponse(200, headers, data)  # changed since: the whole new representation
    unit, _, ranges = spec.partition("=")
    first, _, last = ranges.strip().partition("-")
    try:
        if unit.strip().lower() != "bytes" or "," in ranges or not first.strip():
            raise ValueError(spec)
        start = int(first)
        end = int(last) if last.strip() else len(data) - 1
    except ValueError:
        return HttpResponse(200, headers, data)  # unsupported forms are ignored (RFC 9110)
    if start >= len(data) or start < 0 or end < start:
        headers["content-range"] = f"bytes */{len(data)}"
        return HttpResponse(416, headers, b"")
    end = min(end, len(data) - 1)
    headers["content-range"] = f"bytes {start}-{end}/{len(data)}"
    return HttpResponse(206, headers, data[start : end + 1])


class RestApi:
    """REST endpoints over the store and checkpoint files. Loop-owned; not fork-safe."""

    def __init__(
        self,
        store: Store,
        files: CheckpointFiles,
        urls: UrlSigner,
        *,
        run_io: Callable[[Callable[[], Any]], Awaitable[Any]],
        trace: Callable[[str], dict[str, Any]],
    ) -> None:
        """``run_io`` runs blocking file work off the loop; ``trace(session_id)`` describes a
        session's applied operations for ``trace_export``."""
        self._store = store
        self._files = files
        self._urls = urls
        self._run_io = run_io
        self._trace_fn = trace
        self._archives: dict[tuple[str, str, str], _Archive] = {}

    def _now(self) -> float:
        return time.time()

    def live_checkpoint(self, path: str, *, want: str | None = None) -> CheckpointRow:
        """The unexpired checkpoint at ``path`` (404 when missing; 400 for another ``want`` type)."""
        run_id, ckpt_id = parse_tinker_path(path)
        row = self._store.get_checkpoint(run_id, ckpt_id)
        if row is None or (row.expires_at is not None and row.expires_at <= self._now()):
            raise HttpError(404, f"checkpoint {path} not found")
        if want is not None and row.checkpoint_type != want:
            raise HttpError(
                400, f"checkpoint {path} is a {row.checkpoint_type} checkpoint, not {want}"
            )
        return row

    def _page(self, request: HttpRequest, default_limit: int) -> tuple[int, int]:
        def num(key: str, default: int) -> int:
            raw = request.query.get(key)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise HttpError(
                    400, f"query parameter {key}: expected an integer, got {raw!r}"
                ) from None
            if value < 0:
                raise HttpError(400, f"query parameter {key}: must be >= 0")
            if value > _MAX_SQL_INT:  # SQLite integers are 64-bit signed
                raise HttpError(400, f"query parameter {key}: must be <= {_MAX_SQL_INT}")
            return value

        return min(num("limit", default_limit), 10_000), num("offset", 0)

    def _checkpoint_json(self, row: CheckpointRow) -> dict[str, Any]:
        return {
            "checkpoint_id": row.checkpoint_id,
            "checkpoint_type": row.checkpoint_type,
            "time": iso(row.created_at),
            "tinker_path": row.tinker_path,
            "size_bytes": row.size_bytes,
            "public": row.public,
            "user_metadata": str_map(row.user_metadata),
            "expires_at": iso(row.expires_at),
        }

    def purge_expired(self) -> None:
        """Delete checkpoints whose TTL has passed (rows and files)."""
        for row in self._store.expired_checkpoints(self._now()):
            self._store.delete_checkpoint(row.run_id, row.checkpoint_id)
            self._files.delete(row.run_id, row.checkpoint_id)

    def _run_json(self, run: RunRow) -> dict[str, Any]:
        ckpts = self._store.checkpoints_of_run(run.run_id)
        last_train = next((c for c in ckpts if c.checkpoint_type == "training"), None)
        last_sampler = next((c for c in ckpts if c.checkpoint_type == "sampler"), None)
        return {
            "training_run_id": run.run_id,
            "base_model": run.base_model,
            "model_owner": OWNER,
            "is_lora": True,
            "corrupted": run.corrupted,
            "lora_rank": run.lora.get("rank"),
            "last_request_time": iso(run.last_request_time),
            "last_checkpoint": None if last_train is None else self._checkpoint_json(last_train),
            "last_sampler_checkpoint": None
            if last_sampler is None
            else self._checkpoint_json(last_sampler),
            "user_metadata": str_map(run.user_metadata),
        }

    async def list_runs(self, request: HttpRequest) -> HttpResponse:
        limit, offset = self._page(request, 20)
        scope = request.query.get("access_scope", "owned")
        if scope not in ("owned", "accessible"):
            raise HttpError(400, f"access_scope: expected owned|accessible, got {scope!r}")
        self.purge_expired()
        runs, total = self._store.list_runs(
            limit=limit, offset=offset, project_id=request.query.get("project_id")
        )
        return HttpResponse.json(
            {
                "training_runs": [self._run_json(r) for r in runs],
                "cursor": {"offset": offset, "limit": limit, "total_count": total},
            }
        )

    async def get_run(self, request: HttpRequest, run_id: str) -> HttpResponse:
        self.purge_expired()
        run = self._store.get_run(run_id)
        if run is None:
            raise HttpError(404, f"training run {run_id!r} not found")
        return HttpResponse.json(self._run_json(run))

    async def run_checkpoints(self, request: HttpRequest, run_id: str) -> HttpResponse:
        self.purge_expired()
        if self._store.get_run(run_id) is None:
            raise HttpError(404, f"training run {run_id!r} not found")
        rows = self._store.checkpoints_of_run(run_id)
        return HttpResponse.json({"checkpoints": [self._checkpoint_json(r) for r in rows]})

    async def list_user_checkpoints(self, request: HttpRequest) -> HttpResponse:
        limit, offset = self._page(request, 100)
        self.purge_expired()
        rows, total = self._store.list_checkpoints(limit=limit, offset=offset)
        return HttpResponse.json(
            {
                "checkpoints": [self._checkpoint_json(r) for r in rows],
                "cursor": {"offset": offset, "limit": limit, "total_count": total},
            }
        )

    def _checkpoint_row(self, run_id: str, ckpt_id: str) -> CheckpointRow:
        self.purge_expired()
        if ckpt_id.split("/", 1)[0] not in SEGMENT_TYPES:
            raise HttpError(400, f"invalid checkpoint id {ckpt_id!r}")
        row = self._store.get_checkpoint(run_id, ckpt_id)
        if row is None:
            raise HttpError(404, f"checkpoint tinker://{run_id}/{ckpt_id} not found")
        return row

    async def delete_checkpoint(
        self, request: HttpRequest, run_id: str, ckpt_id: str
    ) -> HttpResponse:
        row = self._checkpoint_row(run_id, ckpt_id)
        self._store.delete_checkpoint(row.run_id, row.checkpoint_id)
        await self._run_io(lambda: self._files.delete(row.run_id, row.checkpoint_id))
        return HttpResponse.json({})

    async def publish(self, request: HttpRequest, run_id: str, ckpt_id: str) -> HttpResponse:
        row = self._checkpoint_row(run_id, ckpt_id)
        if row.public:
            raise HttpError(409, f"checkpoint {row.tinker_path} is already public", _FINAL)
        row.public = True
        self._store.put_checkpoint(row)
        return HttpResponse.json({})

    async def unpublish(self, request: HttpRequest, run_id: str, ckpt_id: str) -> HttpResponse:
        row = self._checkpoint_row(run_id, ckpt_id)
        if not row.public:
            raise HttpError(409, f"checkpoint {row.tinker_path} is not public", _FINAL)
        row.public = False
        self._store.put_checkpoint(row)
        return HttpResponse.json({})

    async def set_ttl(self, request: HttpRequest, run_id: str, ckpt_id: str) -> HttpResponse:
        b = json_body(request)
        if "ttl_seconds" not in b.data:
            raise HttpError(400, "ttl_seconds: required (an integer, or null to remove the TTL)")
        ttl = b.opt_int("ttl_seconds")
        row = self._checkpoint_row(run_id, ckpt_id)
        row.expires_at = ttl_expiry(ttl, self._now())
        self._store.put_checkpoint(row)
        return HttpResponse.json({})

    def _base_url(self, request: HttpRequest) -> str:
        host = request.headers.get("host") or "127.0.0.1"
        return f"http://{host}"

    def _file_url(
        self, request: HttpRequest, payload: dict[str, Any], rel: str, expires: float
    ) -> str:
        token = self._urls.sign(payload, expires_at=expires)
        return f"{self._base_url(request)}{FILES_PREFIX}{token}/{quote(rel)}"

    async def external_urls(self, request: HttpRequest, run_id: str, ckpt_id: str) -> HttpResponse:
        if not ckpt_id.startswith("external_weights/"):
            raise HttpError(400, f"checkpoint id {ckpt_id!r} is not an external_weights checkpoint")
        row = self._checkpoint_row(run_id, ckpt_id)
        expires = self._now() + request.meta.get("fault.url_ttl", URL_TTL_S)
        names = await self._run_io(
            lambda: self._files.list_files(row.run_id, row.checkpoint_id, CheckpointFiles.FILES)
        )
        payload = {"k": "ckpt", "r": row.run_id, "c": row.checkpoint_id}
        urls = {rel: self._file_url(request, payload, rel, expires) for rel in names}
        return HttpResponse.json({"urls": urls, "expires": iso(expires)})

    async def archive(self, request: HttpRequest, run_id: str, ckpt_id: str) -> HttpResponse:
        """The archive's signed URL (302, with the JSON body too), or 503 + ``Retry-After``
        while the archive is being created (fault ``generating=N``: it takes N seconds)."""
        row = self._checkpoint_row(run_id, ckpt_id)
        now = self._now()
        key = _archive_key(row)
        state = self._archives.get(key)
        if state is None:
            state = _Archive(ready_at=now + request.meta.get("fault.generating", 0.0))
            self._archives[key] = state
        if now < state.ready_at:
            wait = max(state.ready_at - now, 0.001)
            return HttpResponse.json(
                {"detail": "creating checkpoint archive", "retry_after_s": wait},
                503,
                {"retry-after": f"{min(wait, ARCHIVE_RETRY_S):.3f}".rstrip("0").rstrip(".")},
            )
        expires = now + request.meta.get("fault.url_ttl", URL_TTL_S)
        url = self._file_url(
            request,
            {"k": "archive", "r": row.run_id, "c": row.checkpoint_id},
            "archive.tar",
            expires,
        )
        headers = {"location": url, "expires": email.utils.formatdate(expires, usegmt=True)}
        return HttpResponse.json({"url": url, "expires": iso(expires)}, 302, headers)

    async def weights_info(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        path = b.str_("tinker_path")
        row = self.live_checkpoint(path)
        run = self._store.get_run(row.run_id)
        if run is None:
            raise HttpError(404, f"training run {row.run_id} not found")
        return HttpResponse.json(
            {
                "base_model": run.base_model,
                "optimizer_config": run.optimizer_config,
                "is_lora": True,
                "lora_rank": run.lora.get("rank"),
                "train_unembed": run.lora.get("train_unembed", True),
                "train_mlp": run.lora.get("train_mlp", True),
                "train_attn": run.lora.get("train_attn", True),
            }
        )

    async def copy_weights(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        key = request.headers.get("x-idempotency-key")
        source = b.str_("source_path")
        session_id = b.opt_str("session_id")
        model_seq_id = b.opt_int("model_seq_id", minimum=0)
        project = b.opt_str("destination_project_id")
        ttl = b.opt_int("ttl_seconds")
        b.opt_str("weights_access_token")
        if key:
            done = self._store.get_copy(key)
            if done is not None:
                return HttpResponse.json({"tinker_path": done})
        if (session_id is None) != (model_seq_id is None):
            raise HttpError(400, "session_id and model_seq_id must be given together")
        if session_id is None and project is None:
            raise HttpError(
                400, "either destination_project_id or session_id + model_seq_id is required"
            )
        row = self.live_checkpoint(source)
        src_run = self._store.get_run(row.run_id)
        if src_run is None:
            raise HttpError(404, f"training run {row.run_id} not found")
        now = self._now()
        if session_id is not None:
            if self._store.get_session(session_id) is None:
                raise HttpError(404, f"unknown session_id {session_id!r}")
            dest_run = f"{session_id}:train:{model_seq_id}"
            dest_session = session_id
        else:
            dest_session = f"copy-{uuid.uuid4().hex[:12]}"
            self._store.insert_session(SessionRow(dest_session, now, project_id=project))
            dest_run = f"{dest_session}:train:0"
        if self._store.get_checkpoint(dest_run, row.checkpoint_id) is not None:
            raise HttpError(409, f"tinker://{dest_run}/{row.checkpoint_id} already exists", _FINAL)
        if self._store.get_run(dest_run) is None:
            self._store.insert_run(
                RunRow(
                    run_id=dest_run,
                    session_id=dest_session,
                    model_seq_id=model_seq_id or 0,
                    base_model=src_run.base_model,
                    lora=src_run.lora,
                    optimizer_config=src_run.optimizer_config,
                    user_metadata=src_run.user_metadata,
                    created_at=now,
                    last_request_time=now,
                )
            )
        size = await self._run_io(
            lambda: self._files.copy((row.run_id, row.checkpoint_id), (dest_run, row.checkpoint_id))
        )
        copy = CheckpointRow(
            run_id=dest_run,
            checkpoint_id=row.checkpoint_id,
            checkpoint_type=row.checkpoint_type,
            created_at=now,
            size_bytes=size,
            user_metadata=row.user_metadata,
            expires_at=ttl_expiry(ttl, now),
            has_optimizer=row.has_optimizer,
        )
        self._store.put_checkpoint(copy)
        if key:
            self._store.put_copy(key, copy.tinker_path, now)
        return HttpResponse.json({"tinker_path": copy.tinker_path})

    async def list_sessions(self, request: HttpRequest) -> HttpResponse:
        limit, offset = self._page(request, 20)
        rows, _ = self._store.list_sessions(limit=limit, offset=offset)
        return HttpResponse.json({"sessions": [r.session_id for r in rows]})

    async def get_session(self, request: HttpRequest, session_id: str) -> HttpResponse:
        row = self._store.get_session(session_id)
        if row is None:
            raise HttpError(404, f"unknown session {session_id!r}")
        return HttpResponse.json(
            {
                "training_run_ids": self._store.runs_of_session(session_id),
                "sampler_ids": self._store.samplers_of_session(session_id),
                "user_metadata": str_map(row.user_metadata),
                "display_name": row.display_name,
            }
        )

    async def session_project(self, request: HttpRequest, session_id: str) -> HttpResponse:
        b = json_body(request)
        project_id = b.str_("project_id")
        if self._store.get_session(session_id) is None:
            raise HttpError(404, f"unknown session {session_id!r}")
        self._store.set_session_project(session_id, project_id)
        return HttpResponse.json({})

    async def trace_export(self, request: HttpRequest, session_id: str) -> HttpResponse:
        if self._store.get_session(session_id) is None:
            raise HttpError(404, f"unknown session {session_id!r}")
        url = self._file_url(
            request, {"k": "trace", "s": session_id}, "trace.json", self._now() + URL_TTL_S
        )
        return HttpResponse.json({"status": "ready", "url": url})

    async def search_sessions(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request, optional=True)
        limit = b.int_or("limit", 50, minimum=1)
        wanted_id = b.opt_str("session_id")
        projects = b.opt_str_list("project_ids")
        name = b.opt_str("display_name")
        meta = b.opt_dict("user_metadata") or {}
        statuses = b.get("statuses")
        status_types = None
        if statuses is not None:
            if not isinstance(statuses, list):
                raise HttpError(400, "statuses: expected a list")
            status_types = {Body(s, "statuses[]").str_("type") for s in statuses}
        cursor = b.opt_dict("cursor")
        counts: dict[str, tuple[int, int]] = {}
        rows = self._store.all_sessions()
        out = []
        past_cursor = cursor is None
        for row in rows:
            if not past_cursor:
                assert cursor is not None
                if row.session_id == cursor.get("last_session_id"):
                    past_cursor = True
                continue
            if wanted_id is not None and row.session_id != wanted_id:
                continue
            if projects is not None and row.project_id not in projects:
                continue
            if name is not None and name.lower() not in (row.display_name or "").lower():
                continue
            if any(row.user_metadata.get(k) != v for k, v in meta.items()):
                continue
            if status_types is not None and row.status.get("type") not in status_types:
                continue
            if row.session_id not in counts:
                n = size = 0
                for run_id in self._store.runs_of_session(row.session_id):
                    for c in self._store.checkpoints_of_run(run_id):
                        n += 1
                        size += c.size_bytes or 0
                counts[row.session_id] = (n, size)
            n, size = counts[row.session_id]
            out.append(
                {
                    "session_id": row.session_id,
                    "created_at": iso(row.created_at),
                    "owner": OWNER,
                    "project_id": row.project_id or "default",
                    "status": row.status,
                    "checkpoints_count": n,
                    "display_name": row.display_name,
                    "user_metadata": str_map(row.user_metadata),
                    "checkpoint_storage_bytes": size,
                }
            )
            if len(out) > limit:
                break
        next_cursor = None
        if len(out) > limit:
            out = out[:limit]
            last = out[-1]
            next_cursor = {
                "last_created_at": last["created_at"],
                "last_session_id": last["session_id"],
            }
        body: dict[str, Any] = {"sessions": out}
        if next_cursor is not None:
            body["next_cursor"] = next_cursor
        return HttpResponse.json(body)

    # ---------------------------------------------------------------- signed files

    async def serve_file(self, request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, "signed file links answer GET only")
        prefix = FILES_PREFIX if request.path.startswith(FILES_PREFIX) else "/_local/files/"
        token, _, rel = request.path[len(prefix) :].partition("/")
        payload = self._urls.verify(token, now=self._now())
        if payload is None:
            raise HttpError(403, "this link is invalid or has expired")
        kind = payload.get("k")
        if kind == "trace":
            trace = self._trace_fn(str(payload.get("s")))
            return HttpResponse.json(trace)
        run_id, ckpt_id = str(payload.get("r")), str(payload.get("c"))
        if self._store.get_checkpoint(run_id, ckpt_id) is None:
            raise HttpError(404, "checkpoint no longer exists")
        if kind == "archive":
            return _ranged(
                request, await self._archive_served(run_id, ckpt_id), "application/x-tar"
            )
        path = f"{CheckpointFiles.FILES}/{rel}"
        try:
            served = await self._run_io(
                lambda: _with_validators(self._files.read(run_id, ckpt_id, path))
            )
        except FileNotFoundError:
            raise HttpError(404, f"no file {rel!r} in this checkpoint") from None
        return _ranged(request, served, "application/octet-stream")

    async def _archive_served(self, run_id: str, ckpt_id: str) -> _Served:
        """The checkpoint's tar and its validators, built once per checkpoint version (the
        ranges of one download agree); the ``ARCHIVES_HELD`` most recent stay in memory."""
        key = _archive_key(self._checkpoint_row(run_id, ckpt_id))
        state = self._archives.setdefault(key, _Archive(ready_at=self._now()))
        if state.served is None:
            served = await self._run_io(lambda: _with_validators(self._tar(run_id, ckpt_id)))
            self._archives = {k: v for k, v in self._archives.items() if k[:2] != key[:2]}
            state.served = served
            self._archives[key] = state
            held = [v for v in self._archives.values() if v.served is not None]
            for old in held[:-ARCHIVES_HELD]:  # the oldest are built again if asked for
                old.served = None
        return state.served

    def _tar(self, run_id: str, ckpt_id: str) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel in self._files.list_files(run_id, ckpt_id):
                data = self._files.read(run_id, ckpt_id, rel)
                info = tarfile.TarInfo(rel)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()
