"""The sampling backoff deadline shared by every process of one user on one machine.

Usage::

    shared = open_shared_deadline(normalized_base_url, credential_identity)   # or None
    if shared is not None:
        shared.publish(wall_deadline)          # after a 429 (only ever moves forward)
        wall = shared.read()                   # before each dispatch; None when absent/invalid

Why: eight data-loader processes with one API key are one tenant to the server. When one of
them is told to back off, the seven others should stop too instead of collecting more 429s.

The file: one tiny memory-mapped file per tenant, named by a SHA-256 of the normalized base
URL and the credential identity (itself a SHA-256; never the key), in a per-user runtime
directory: ``$TINKER_SYNC_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/tinker_sync``, else
``<tempdir>/tinker_sync-<uid>``. The directory must be ours and closed to others (0700).
The record is 24 bytes: magic, version, the deadline as wall-clock seconds (processes do not
share a monotonic clock origin on every platform) and a checksum. Writers serialise on
``flock`` and write the record with one slice assignment; readers take no lock and ignore a
torn or corrupt record, so a writer that crashed mid-write costs one lost deadline, never a
stuck reader. Stale deadlines are simply in the past; deadlines implausibly far ahead
(:data:`MAX_SHARED_WAIT_S`) are ignored. The tenant circuit's record
(:mod:`tinker_sync._flow.sharedcircuit`, a ``.circuit`` file) uses the same file handling:
:func:`open_tenant_file` and :class:`MappedRecord`.

Failing soft: no ``fcntl``/``mmap``, a missing or read-only directory, a foreign owner, or
``TINKER_SYNC_SHARED_BACKOFF=0`` give None: the backoff is then per process (logged once at
debug level). Thread safety: ``read``/``publish`` are thread-safe. Fork safety: a forked
child inherits the mapping, which stays valid and shared; the limiter registry opens its own
after fork anyway. Spawned and forkserver children open the file by name.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import stat
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

log = logging.getLogger("tinker_sync.ratelimit")

ENV_DIR = "TINKER_SYNC_RUNTIME_DIR"
ENV_SWITCH = "TINKER_SYNC_SHARED_BACKOFF"
MAGIC = b"TSBO"
VERSION = 1
_RECORD = struct.Struct("<4sIdQ")  # magic, version, wall deadline, checksum
RECORD_SIZE = _RECORD.size
#: A shared deadline further ahead than this is garbage (Retry-After is honoured up to 60 s).
MAX_SHARED_WAIT_S = 61.0
_READ_ATTEMPTS = 3
T = TypeVar("T")

_warned: set[str] = set()  # what has been logged as per process (once each)
_warned_lock = threading.Lock()


def _checksum(deadline: float) -> int:
    digest = hashlib.blake2b(MAGIC + struct.pack("<Id", VERSION, deadline), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def encode(deadline: float) -> bytes:
    """The 24-byte record of a wall-clock deadline."""
    return _RECORD.pack(MAGIC, VERSION, deadline, _checksum(deadline))


def decode(raw: bytes) -> float | None:
    """The deadline in a record, or None when it is empty, torn or corrupt."""
    if len(raw) != RECORD_SIZE:
        return None
    magic, version, deadline, check = _RECORD.unpack(raw)
    if magic != MAGIC or version != VERSION or check != _checksum(deadline):
        return None
    return float(deadline)


def tenant_file_name(
    normalized_base_url: str, credential_identity: str, suffix: str = ".backoff"
) -> str:
    """``<sha256 of url and identity><suffix>`` (the key itself never appears)."""
    digest = hashlib.sha256(f"{normalized_base_url}\n{credential_identity}".encode()).hexdigest()
    return f"{digest[:40]}{suffix}"


def runtime_dir() -> str | None:
    """The per-user directory for shared state (not created here); None when unknown."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "tinker_sync")
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return None
    return os.path.join(tempfile.gettempdir(), f"tinker_sync-{getuid()}")


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def _fallback(what: str, reason: str) -> None:
    with _warned_lock:
        if what in _warned:
            return
        _warned.add(what)
    log.debug("%s is per process: %s", what, reason)


class MappedRecord:
    """One tenant file's mapped record: lock-free reads, writes under ``flock``.

    Subclasses decode the bytes (:meth:`_read_raw` retries a torn read) and change them with
    :meth:`_update` (read-modify-write under the lock). Create through :func:`open_tenant_file`.
    Bytes equal to the last ones read or written here give the same value object again
    without decoding them (a cheap unchanged-check: callers may compare with ``is``).
    """

    def __init__(self, path: str, fd: int, mapped: mmap.mmap, size: int) -> None:
        self.path = path
        self._fd = fd
        self._map = mapped
        self._size = size
        self._lock = threading.Lock()  # flock is per open file: serialise our own threads too
        self._never_written = bytes(size)  # a new file: nobody has written yet
        #: The bytes last read or written here and their value: an unchanged record (the
        #: common case: it is read before every request) is compared, not decoded again.
        self._last: tuple[bytes, Any] | None = None

    def _read_raw(self, decode: Callable[[bytes], T | None]) -> T | None:
        """The decoded record, or None (never written, torn three times, corrupt, closed)."""
        if self._map.closed:
            return None
        for _ in range(_READ_ATTEMPTS):  # a torn record (a write in progress) is read again
            raw = self._map[: self._size]
            last = self._last
            if last is not None and raw == last[0]:
                return cast("T | None", last[1])  # the same object as the last time
            if raw == self._never_written:
                value = None
            else:
                value = decode(raw)
                if value is None:
                    continue
            self._last = (raw, value)
            return value
        return None

    def holds(self, value: object) -> bool:
        """Whether the record still holds the bytes last read or written here as ``value``
        (that very object): one compare, no decode. The cheap unchanged-check."""
        with self._lock:
            last = self._last
            return (
                last is not None
                and last[1] is value
                and not self._map.closed
                and self._map[: self._size] == last[0]
            )

    @contextmanager
    def _locked(self) -> Iterator[bool]:
        """Hold our thread lock and the file's ``flock``; yields False once closed."""
        import fcntl

        with self._lock:
            if self._map.closed:
                yield False
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _update(
        self,
        decode: Callable[[bytes], T | None],
        encode: Callable[[T], bytes],
        change: Callable[[T | None], T | None],
    ) -> T | None:
        """Under ``flock``: ``change(current)`` gives the value to write (one slice
        assignment), or None to keep the file as it is. Returns the value the file holds
        afterwards (None: unreadable, or closed)."""
        with self._locked() as usable:
            if not usable:
                return None
            current = self._read_raw(decode)
            new = change(current)
            if new is None:
                return current
            raw = encode(new)
            self._map[: self._size] = raw
            self._last = (raw, new)  # read back as this very object until someone writes
            return new

    def close(self) -> None:
        """Unmap and close the file (idempotent); later reads see nothing."""
        with self._lock:
            if self._map.closed:
                return
            try:
                self._map.close()
            finally:
                os.close(self._fd)


class SharedDeadline(MappedRecord):
    """The mapped deadline record of one tenant. Create with :func:`open_shared_deadline`."""

    def read(self) -> float | None:
        """The published wall-clock deadline, or None (absent, torn, corrupt or closed)."""
        with self._lock:
            return self._read_raw(decode)

    def publish(self, deadline: float) -> float:
        """Move the shared deadline to ``deadline`` unless it is later; returns the result."""

        def later(current: float | None) -> float | None:
            # A record implausibly far beyond ours (a clock jump, garbage) is overwritten.
            if current is not None and deadline <= current <= deadline + MAX_SHARED_WAIT_S:
                return None
            return deadline

        result = self._update(decode, encode, later)
        return deadline if result is None else result


def open_tenant_file(
    normalized_base_url: str,
    credential_identity: str,
    *,
    suffix: str,
    size: int,
    what: str,
    directory: str | None = None,
    create: bool = True,
) -> tuple[str, int, mmap.mmap] | None:
    """Open (creating if needed) and map ``size`` bytes of a tenant's file in the runtime
    directory: ``(path, fd, mapping)``, or None when ``what`` stays per process (module docs;
    the reason is logged once per ``what`` at debug level). The switch is read now.
    ``create=False`` opens an existing file only (None, and nothing logged, without one).
    """
    if not enabled():
        return None
    try:
        import fcntl  # POSIX only
    except ImportError:
        _fallback(what, "no fcntl on this platform")
        return None
    if directory is None:
        directory = runtime_dir()
    if directory is None:
        _fallback(what, "no per-user runtime directory")
        return None
    try:
        try:
            if create:
                os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode):
            raise OSError(f"{directory} is not a directory")
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise OSError(f"{directory} is not owned by this user or is writable by others")
        name = tenant_file_name(normalized_base_url, credential_identity, suffix)
        path = os.path.join(directory, name)
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        if not create and not os.path.exists(path):
            return None
        fd = os.open(path, flags | (os.O_CREAT if create else 0), 0o600)
    except OSError as exc:
        if not create:
            return None
        _fallback(what, f"cannot use the runtime directory ({exc.strerror or exc})")
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # zeros: a record that decodes as "absent"
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        mapped = mmap.mmap(fd, size)
    except (OSError, ValueError) as exc:
        os.close(fd)
        _fallback(what, f"cannot map {os.path.basename(path)} ({exc})")
        return None
    return path, fd, mapped


def open_shared_deadline(
    normalized_base_url: str, credential_identity: str, directory: str | None = None
) -> SharedDeadline | None:
    """Open (creating if needed) the tenant's record; None means "per process" (see module).

    ``directory`` defaults to :func:`runtime_dir` read now (the switch is read now too).
    """
    opened = open_tenant_file(
        normalized_base_url,
        credential_identity,
        suffix=".backoff",
        size=RECORD_SIZE,
        what="sampling backoff",
        directory=directory,
    )
    if opened is None:
        return None
    return SharedDeadline(*opened, RECORD_SIZE)
