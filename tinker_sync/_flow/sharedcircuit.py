"""The tenant circuit shared by every process of one user on one machine (docs/health.md).

Usage (inside :class:`~tinker_sync._flow.breaker.TenantHealth`; the CLI reads it)::

    shared = open_shared_circuit(normalized_base_url, credential_identity)   # or None
    record = shared.read()                    # lock-free; None when absent, torn or corrupt
    shared.update(lambda current: new_record_or_None)   # read-modify-write under flock

Why: eight data-loader processes with one API key are one tenant to the server. When one of
them opens the circuit, the seven others park their work too, one probe at a time goes out
across all of them, and the first answer in any process closes it for all.

The file sits next to the backoff deadline's (:mod:`tinker_sync._flow.sharedbackoff`: same
runtime directory, same naming by hashes, same switch ``TINKER_SYNC_SHARED_BACKOFF``), with the
suffix ``.circuit``: a 192-byte circuit record of magic, version, state (closed or open), failed
probes, the opening's epoch (one more at each opening), the opening's, the next probe's, the
probe lease's and the last change's wall-clock times (processes share no monotonic origin),
the lease holder's token (0: no probe out), the reason (UTF-8, truncated) and a checksum. A
half-open circuit is an open record whose probe time has passed. Writers serialise on
``flock``; readers take no lock and ignore a torn or corrupt record. A crashed prober's lease
expires (at once when its pid, the token's high bits, no longer exists). Times implausibly far ahead are the reader's to ignore (:func:`plausible`).

Failing soft as the deadline does: no ``fcntl``/``mmap``, an unusable directory or the switch
off give None and the circuit is per process (logged once at debug level). Thread safety:
``read``/``update`` are thread-safe. Fork safety: as the deadline's file.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tinker_sync._flow.sharedbackoff import MAX_SHARED_WAIT_S, MappedRecord, open_tenant_file

__all__ = [
    "RECORD_SIZE",
    "CircuitRecord",
    "SharedCircuit",
    "decode",
    "encode",
    "open_shared_circuit",
    "plausible",
]

MAGIC = b"TSCB"
VERSION = 1
REASON_BYTES = 120
# magic, version, state, failed probes, epoch, opened, next probe, lease end, changed (wall
# seconds), lease holder, reason, checksum
_BODY = struct.Struct(f"<4sIIIQddddQ{REASON_BYTES}s")
_RECORD = struct.Struct(f"<{_BODY.size}sQ")
RECORD_SIZE = _RECORD.size
_STATES = ("closed", "open")
SUFFIX = ".circuit"


@dataclass(frozen=True)
class CircuitRecord:
    """One tenant's shared circuit: ``state`` "closed" or "open"; wall-clock times."""

    state: str
    epoch: int
    failed_probes: int = 0
    opened_wall: float = 0.0
    probe_wall: float = 0.0  # when the next probe may go out (open only)
    lease_wall: float = 0.0  # when the probe out ends at the latest (0: none out)
    changed_wall: float = 0.0
    lease_owner: int = 0  # the prober's token (0: none)
    reason: str = ""

    def probe_out(self, wall: float) -> bool:
        """Whether a probe holds an unexpired lease at wall time ``wall``."""
        return self.state == "open" and self.lease_owner != 0 and self.lease_wall > wall

    def state_at(self, wall: float) -> Literal["closed", "open", "half_open"]:
        """The state at wall time ``wall``: closed, open, or half-open (a probe out or due)."""
        if self.state == "closed":
            return "closed"
        return "half_open" if self.probe_out(wall) or wall >= self.probe_wall else "open"


def _checksum(body: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "little")


def encode(record: CircuitRecord) -> bytes:
    """The encoded ``record`` (its reason truncated to whole UTF-8 characters)."""
    reason = record.reason.encode()[:REASON_BYTES].decode(errors="ignore").encode()
    body = _BODY.pack(
        MAGIC,
        VERSION,
        _STATES.index(record.state),
        record.failed_probes,
        record.epoch,
        record.opened_wall,
        record.probe_wall,
        record.lease_wall,
        record.changed_wall,
        record.lease_owner,
        reason,
    )
    return _RECORD.pack(body, _checksum(body))


def decode(raw: bytes) -> CircuitRecord | None:
    """The record in ``raw``, or None when it is empty, torn or corrupt."""
    if len(raw) != RECORD_SIZE:
        return None
    body, check = _RECORD.unpack(raw)
    if check != _checksum(body):
        return None
    magic, version, state, failed, epoch, opened, probe, lease, changed, owner, reason = (
        _BODY.unpack(body)
    )
    if magic != MAGIC or version != VERSION or state >= len(_STATES):
        return None
    return CircuitRecord(
        _STATES[state],
        epoch,
        failed,
        opened,
        probe,
        lease,
        changed,
        owner,
        reason.rstrip(b"\0").decode(errors="replace"),
    )


def plausible(record: CircuitRecord, wall: float, max_ahead: float) -> bool:
    """Whether ``record``'s times make sense at wall time ``wall``: past times no later than
    :data:`~tinker_sync._flow.sharedbackoff.MAX_SHARED_WAIT_S` ahead (clock skew), future
    ones (next probe, lease end) no more than ``max_ahead`` seconds ahead."""
    times = (record.opened_wall, record.probe_wall, record.lease_wall, record.changed_wall)
    if not all(math.isfinite(t) for t in times):
        return False
    past_ok = max(record.opened_wall, record.changed_wall) <= wall + MAX_SHARED_WAIT_S
    return past_ok and max(record.probe_wall, record.lease_wall) <= wall + max_ahead


class SharedCircuit(MappedRecord):
    """The mapped circuit record of one tenant. Create with :func:`open_shared_circuit`."""

    def read(self) -> CircuitRecord | None:
        """The record, or None (never written, torn, corrupt or closed)."""
        with self._lock:
            return self._read_raw(decode)

    def update(
        self, change: Callable[[CircuitRecord | None], CircuitRecord | None]
    ) -> CircuitRecord | None:
        """Under ``flock``: ``change(current)`` returns the record to write, or None to leave
        the file as it is. Returns the record the file holds afterwards (None: unreadable)."""
        return self._update(decode, encode, change)


def open_shared_circuit(
    normalized_base_url: str,
    credential_identity: str,
    directory: str | None = None,
    *,
    create: bool = True,
) -> SharedCircuit | None:
    """Open the tenant's circuit file; None means "per process" (see the module docs).

    ``create=False`` (the CLI) opens only an existing file and creates nothing.
    """
    opened = open_tenant_file(
        normalized_base_url,
        credential_identity,
        suffix=SUFFIX,
        size=RECORD_SIZE,
        what="tenant circuit",
        directory=directory,
        create=create,
    )
    if opened is None:
        return None
    return SharedCircuit(*opened, RECORD_SIZE)
