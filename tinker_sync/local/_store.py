"""SQLite persistence for the local server: sessions, training runs, samplers, checkpoints.

Usage::

    store = Store(Path(data_dir) / "tinker.sqlite3")
    store.insert_session(SessionRow(session_id="s1", created_at=time.time()))
    rows, total = store.list_runs(limit=20, offset=0)
    store.close()

Weights and optimizer state live as files next to the database (see ``_app``); this module only
keeps their metadata. A new store on the same file sees everything an earlier one wrote.

Thread safety: one connection guarded by a lock; every method may be called from any thread.
Fork safety: not fork-safe (do not use an inherited store in a child process).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    tags TEXT NOT NULL,
    user_metadata TEXT NOT NULL,
    sdk_version TEXT NOT NULL,
    project_id TEXT,
    display_name TEXT,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    model_seq_id INTEGER NOT NULL,
    base_model TEXT NOT NULL,
    lora TEXT NOT NULL,
    optimizer_config TEXT NOT NULL,
    user_metadata TEXT,
    created_at REAL NOT NULL,
    last_request_time REAL NOT NULL,
    corrupted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS samplers (
    sampler_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    base_model TEXT NOT NULL,
    model_path TEXT,
    created_at REAL NOT NULL,
    ephemeral INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    checkpoint_type TEXT NOT NULL,
    created_at REAL NOT NULL,
    size_bytes INTEGER,
    public INTEGER NOT NULL DEFAULT 0,
    user_metadata TEXT,
    expires_at REAL,
    has_optimizer INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, checkpoint_id)
);
CREATE TABLE IF NOT EXISTS copies (
    idempotency_key TEXT PRIMARY KEY,
    tinker_path TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_time ON runs (created_at);
CREATE INDEX IF NOT EXISTS ckpt_by_time ON checkpoints (created_at);
"""


def _dump(obj: Any) -> str | None:
    return None if obj is None else json.dumps(obj, sort_keys=True)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass
class SessionRow:
    """A session record. Plain data (a copy; safe to hand across threads)."""

    session_id: str
    created_at: float
    tags: list[str] = field(default_factory=list)
    user_metadata: dict[str, Any] = field(default_factory=dict)
    sdk_version: str = ""
    project_id: str | None = None
    display_name: str | None = None
    #: A SessionStatus object, e.g. ``{"type": "active"}``.
    status: dict[str, Any] = field(default_factory=lambda: {"type": "active"})


@dataclass
class RunRow:
    """A training run record. Plain data (a copy; safe to hand across threads)."""

    run_id: str
    session_id: str
    model_seq_id: int
    base_model: str
    #: LoraConfig fields: rank, seed, train_unembed, train_mlp, train_attn.
    lora: dict[str, Any]
    optimizer_config: dict[str, Any]
    user_metadata: dict[str, Any] | None
    created_at: float
    last_request_time: float
    corrupted: bool = False


@dataclass
class SamplerRow:
    """A sampling session record. Plain data (a copy; safe to hand across threads)."""

    sampler_id: str
    session_id: str
    seq: int
    base_model: str
    model_path: str | None
    created_at: float
    #: Sampler weights taken from a live model and kept only in memory (not after a restart).
    ephemeral: bool = False


@dataclass
class CheckpointRow:
    """A checkpoint record. Plain data (a copy; safe to hand across threads)."""

    run_id: str
    checkpoint_id: str  # "<segment>/<name>"
    checkpoint_type: str  # training | sampler | external
    created_at: float
    size_bytes: int | None = None
    public: bool = False
    user_metadata: dict[str, Any] | None = None
    expires_at: float | None = None
    has_optimizer: bool = False

    @property
    def tinker_path(self) -> str:
        return f"tinker://{self.run_id}/{self.checkpoint_id}"


class Store:
    """SQLite-backed metadata store (WAL). Thread-safe (one lock); not fork-safe."""

    def __init__(self, path: Path) -> None:
        """``path``: the database file; created with its schema when missing."""
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
        self._closed = False

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise RuntimeError("store is closed")
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            if self._closed:
                raise RuntimeError("store is closed")
            return list(self._conn.execute(sql, args).fetchall())

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    # ------------------------------------------------------------------ meta
    def setdefault_meta(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless present; return the stored value."""
        with self._tx() as conn:
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, value))
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row["value"])

    # ------------------------------------------------------------------ sessions
    def insert_session(self, row: SessionRow) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.session_id,
                    row.created_at,
                    json.dumps(row.tags),
                    json.dumps(row.user_metadata),
                    row.sdk_version,
                    row.project_id,
                    row.display_name,
                    json.dumps(row.status),
                ),
            )

    @staticmethod
    def _session(r: sqlite3.Row) -> SessionRow:
        return SessionRow(
            session_id=r["session_id"],
            created_at=r["created_at"],
            tags=json.loads(r["tags"]),
            user_metadata=json.loads(r["user_metadata"]),
            sdk_version=r["sdk_version"],
            project_id=r["project_id"],
            display_name=r["display_name"],
            status=json.loads(r["status"]),
        )

    def get_session(self, session_id: str) -> SessionRow | None:
        rows = self._query("SELECT * FROM sessions WHERE session_id = ?", (session_id,))
        return self._session(rows[0]) if rows else None

    def list_sessions(self, *, limit: int, offset: int) -> tuple[list[SessionRow], int]:
        """Newest first."""
        rows = self._query(
            "SELECT * FROM sessions ORDER BY created_at DESC, session_id DESC LIMIT ? OFFSET ?",
            (limit, offset),
        )
        total = self._query("SELECT COUNT(*) AS n FROM sessions")[0]["n"]
        return [self._session(r) for r in rows], int(total)

    def all_sessions(self) -> list[SessionRow]:
        rows = self._query("SELECT * FROM sessions ORDER BY created_at DESC, session_id DESC")
        return [self._session(r) for r in rows]

    def set_session_status(self, session_id: str, status: dict[str, Any]) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE sessions SET status = ? WHERE session_id = ?",
                (json.dumps(status), session_id),
            )

    def set_session_project(self, session_id: str, project_id: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE sessions SET project_id = ? WHERE session_id = ?", (project_id, session_id)
            )

    # ------------------------------------------------------------------ runs
    def insert_run(self, row: RunRow) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.run_id,
                    row.session_id,
                    row.model_seq_id,
                    row.base_model,
                    json.dumps(row.lora, sort_keys=True),
                    json.dumps(row.optimizer_config, sort_keys=True),
                    _dump(row.user_metadata),
                    row.created_at,
                    row.last_request_time,
                    int(row.corrupted),
                ),
            )

    @staticmethod
    def _run(r: sqlite3.Row) -> RunRow:
        return RunRow(
            run_id=r["run_id"],
            session_id=r["session_id"],
            model_seq_id=r["model_seq_id"],
            base_model=r["base_model"],
            lora=json.loads(r["lora"]),
            optimizer_config=json.loads(r["optimizer_config"]),
            user_metadata=_load(r["user_metadata"]),
            created_at=r["created_at"],
            last_request_time=r["last_request_time"],
            corrupted=bool(r["corrupted"]),
        )

    def get_run(self, run_id: str) -> RunRow | None:
        rows = self._query("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return self._run(rows[0]) if rows else None

    def list_runs(
        self, *, limit: int, offset: int, project_id: str | None = None
    ) -> tuple[list[RunRow], int]:
        """Newest first; ``project_id`` filters by the owning session's project."""
        where = ""
        args: tuple[str, ...] = ()
        if project_id is not None:
            where = " WHERE session_id IN (SELECT session_id FROM sessions WHERE project_id = ?)"
            args = (project_id,)
        rows = self._query(
            f"SELECT * FROM runs{where} ORDER BY created_at DESC, run_id DESC LIMIT ? OFFSET ?",
            (*args, limit, offset),
        )
        total = self._query(f"SELECT COUNT(*) AS n FROM runs{where}", args)[0]["n"]
        return [self._run(r) for r in rows], int(total)

    def runs_of_session(self, session_id: str) -> list[str]:
        rows = self._query(
            "SELECT run_id FROM runs WHERE session_id = ? ORDER BY model_seq_id", (session_id,)
        )
        return [str(r["run_id"]) for r in rows]

    def touch_run(self, run_id: str, when: float) -> None:
        with self._tx() as conn:
            conn.execute("UPDATE runs SET last_request_time = ? WHERE run_id = ?", (when, run_id))

    # ------------------------------------------------------------------ samplers
    def insert_sampler(self, row: SamplerRow) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO samplers VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    row.sampler_id,
                    row.session_id,
                    row.seq,
                    row.base_model,
                    row.model_path,
                    row.created_at,
                    int(row.ephemeral),
                ),
            )

    @staticmethod
    def _sampler(r: sqlite3.Row) -> SamplerRow:
        return SamplerRow(
            sampler_id=r["sampler_id"],
            session_id=r["session_id"],
            seq=r["seq"],
            base_model=r["base_model"],
            model_path=r["model_path"],
            created_at=r["created_at"],
            ephemeral=bool(r["ephemeral"]),
        )

    def get_sampler(self, sampler_id: str) -> SamplerRow | None:
        rows = self._query("SELECT * FROM samplers WHERE sampler_id = ?", (sampler_id,))
        return self._sampler(rows[0]) if rows else None

    def samplers_of_session(self, session_id: str) -> list[str]:
        rows = self._query(
            "SELECT sampler_id FROM samplers WHERE session_id = ? ORDER BY seq", (session_id,)
        )
        return [str(r["sampler_id"]) for r in rows]

    # ------------------------------------------------------------------ checkpoints
    def put_checkpoint(self, row: CheckpointRow) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.run_id,
                    row.checkpoint_id,
                    row.checkpoint_type,
                    row.created_at,
                    row.size_bytes,
                    int(row.public),
                    _dump(row.user_metadata),
                    row.expires_at,
                    int(row.has_optimizer),
                ),
            )

    @staticmethod
    def _checkpoint(r: sqlite3.Row) -> CheckpointRow:
        return CheckpointRow(
            run_id=r["run_id"],
            checkpoint_id=r["checkpoint_id"],
            checkpoint_type=r["checkpoint_type"],
            created_at=r["created_at"],
            size_bytes=r["size_bytes"],
            public=bool(r["public"]),
            user_metadata=_load(r["user_metadata"]),
            expires_at=r["expires_at"],
            has_optimizer=bool(r["has_optimizer"]),
        )

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> CheckpointRow | None:
        rows = self._query(
            "SELECT * FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?",
            (run_id, checkpoint_id),
        )
        return self._checkpoint(rows[0]) if rows else None

    def checkpoints_of_run(self, run_id: str) -> list[CheckpointRow]:
        """Newest first."""
        rows = self._query(
            "SELECT * FROM checkpoints WHERE run_id = ? ORDER BY created_at DESC, checkpoint_id",
            (run_id,),
        )
        return [self._checkpoint(r) for r in rows]

    def list_checkpoints(self, *, limit: int, offset: int) -> tuple[list[CheckpointRow], int]:
        """Every checkpoint, newest first."""
        rows = self._query(
            "SELECT * FROM checkpoints ORDER BY created_at DESC, run_id, checkpoint_id "
            "LIMIT ? OFFSET ?",
            (limit, offset),
        )
        total = self._query("SELECT COUNT(*) AS n FROM checkpoints")[0]["n"]
        return [self._checkpoint(r) for r in rows], int(total)

    def count_checkpoints(self) -> dict[str, int]:
        rows = self._query(
            "SELECT checkpoint_type, COUNT(*) AS n FROM checkpoints GROUP BY checkpoint_type"
        )
        return {str(r["checkpoint_type"]): int(r["n"]) for r in rows}

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> bool:
        with self._tx() as conn:
            cur = conn.execute(
                "DELETE FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?",
                (run_id, checkpoint_id),
            )
            return cur.rowcount > 0

    def expired_checkpoints(self, now: float) -> list[CheckpointRow]:
        rows = self._query(
            "SELECT * FROM checkpoints WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
        )
        return [self._checkpoint(r) for r in rows]

    # ------------------------------------------------------------------ copy_weights
    def get_copy(self, key: str) -> str | None:
        rows = self._query("SELECT tinker_path FROM copies WHERE idempotency_key = ?", (key,))
        return str(rows[0]["tinker_path"]) if rows else None

    def put_copy(self, key: str, tinker_path: str, when: float) -> None:
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO copies VALUES (?, ?, ?)", (key, tinker_path, when))


class CheckpointFiles:
    """Checkpoint payloads on disk: ``<root>/<quoted run id>/<segment>/<quoted name>/``.

    Training checkpoints hold ``weights.bin`` (adapter weights) and ``full.bin`` (weights plus
    optimizer state); sampler checkpoints ``sampler.bin``; external ones a ``files/`` tree.
    Writes go to a temporary directory renamed into place, so a crash never leaves a partial
    checkpoint. Thread-safe for distinct checkpoints (callers order writes per model).
    Fork safety: plain paths.
    """

    WEIGHTS = "weights.bin"
    FULL = "full.bin"
    SAMPLER = "sampler.bin"
    FILES = "files"

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, run_id: str, checkpoint_id: str) -> Path:
        segment, _, name = checkpoint_id.partition("/")
        return self.root / quote(run_id, safe="") / segment / quote(name, safe="")

    def exists(self, run_id: str, checkpoint_id: str) -> bool:
        return self.path(run_id, checkpoint_id).is_dir()

    def write(self, run_id: str, checkpoint_id: str, files: dict[str, bytes]) -> int:
        """Atomically (re)place the checkpoint with ``files`` (relative path -> bytes).

        :returns: total size in bytes.
        :raises ValueError: a relative path escaping the checkpoint directory.
        """
        final = self.path(run_id, checkpoint_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
        total = 0
        try:
            for rel, data in files.items():
                target = (tmp / rel).resolve()
                if not str(target).startswith(str(tmp.resolve()) + os.sep):
                    raise ValueError(f"file path {rel!r} escapes the checkpoint directory")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                total += len(data)
            tmp.mkdir(parents=True, exist_ok=True)
            if final.exists():
                old = final.parent / f".old-{uuid.uuid4().hex}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return total

    def read(self, run_id: str, checkpoint_id: str, rel: str) -> bytes:
        """Read one file; :raises FileNotFoundError: when missing or outside the checkpoint."""
        base = self.path(run_id, checkpoint_id).resolve()
        target = (base / rel).resolve()
        if not str(target).startswith(str(base) + os.sep) or not target.is_file():
            raise FileNotFoundError(rel)
        return target.read_bytes()

    def list_files(self, run_id: str, checkpoint_id: str, sub: str = "") -> list[str]:
        """Relative paths (``/``-separated) of the files under the checkpoint (or ``sub``)."""
        base = self.path(run_id, checkpoint_id) / sub if sub else self.path(run_id, checkpoint_id)
        if not base.is_dir():
            return []
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())

    def delete(self, run_id: str, checkpoint_id: str) -> None:
        shutil.rmtree(self.path(run_id, checkpoint_id), ignore_errors=True)

    def copy(self, src: tuple[str, str], dst: tuple[str, str]) -> int:
        """Copy a checkpoint; :returns: total size in bytes."""
        names = self.list_files(*src)
        return self.write(*dst, {rel: self.read(*src, rel) for rel in names})
