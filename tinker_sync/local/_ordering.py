"""Strict seq_id ordering for one model's requests (docs/design/protocol.md#seq-ids-and-turns,
docs/design/protocol.md#open-questions).

Usage::

    q = SeqQueue[str](next_seq=1, gap_grace_s=30.0, clock=time.monotonic)
    q.offer(2, "b")         # Offer.ACCEPTED, held: 1 is missing
    q.offer(1, "a")         # Offer.ACCEPTED
    q.offer(1, "again")     # Offer.DUPLICATE; q.original(1) == "a"
    q.pop_ready()           # [(1, "a"), (2, "b")]

Rules: items are released strictly in ascending seq_id order, whatever order they arrive in; a
repeated seq_id is reported as a duplicate (the caller answers with the original future and
applies nothing); a seq_id that was consumed without an item (a submission rejected with 4xx)
counts as processed; a missing seq_id is waited for ``gap_grace_s`` seconds from the moment a
later one is waiting for it, then skipped (recorded in :attr:`SeqQueue.skipped`); a seq_id that
arrives after it was skipped or released is :attr:`Offer.STALE`.

Thread safety: not thread-safe; the local server uses it from its event loop only.
Fork safety: plain data.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class Offer(enum.Enum):
    """Outcome of :meth:`SeqQueue.offer`. Immutable; thread- and fork-safe."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"


@dataclass
class _Slot(Generic[T]):
    item: T | None  # None: consumed without work (rejected submission)


class SeqQueue(Generic[T]):
    """Per-model ordered queue with duplicate detection and gap skipping. Not thread-safe."""

    def __init__(self, *, next_seq: int, gap_grace_s: float, clock: Callable[[], float]) -> None:
        """``next_seq``: the first seq_id to release; ``gap_grace_s``: how long a missing id is
        waited for once a later one is queued; ``clock``: monotonic seconds."""
        self._next = next_seq
        self._grace = gap_grace_s
        self._clock = clock
        self._pending: dict[int, _Slot[T]] = {}
        self._seen: dict[int, T | None] = {}
        self._gap_since: float | None = None
        #: Inclusive ranges of seq_ids given up on, in order: ``[(first, last), ...]``.
        self.skipped: list[tuple[int, int]] = []

    @property
    def next_seq(self) -> int:
        """The next seq_id that will be released."""
        return self._next

    @property
    def waiting(self) -> int:
        """Number of seq_ids received but not yet released."""
        return len(self._pending)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seen

    def original(self, seq_id: int) -> T | None:
        """The item first offered under ``seq_id`` (None if consumed without an item)."""
        return self._seen.get(seq_id)

    def offer(self, seq_id: int, item: T) -> Offer:
        """Queue ``item`` under ``seq_id``; see the module docstring for the outcomes."""
        if seq_id in self._seen:
            return Offer.DUPLICATE
        if seq_id < self._next:
            return Offer.STALE
        self._seen[seq_id] = item
        self._pending[seq_id] = _Slot(item)
        self._update_gap()
        return Offer.ACCEPTED

    def consume(self, seq_id: int) -> Offer:
        """Mark ``seq_id`` as processed without work (e.g. the submission was rejected)."""
        if seq_id in self._seen:
            return Offer.DUPLICATE
        if seq_id < self._next:
            return Offer.STALE
        self._seen[seq_id] = None
        self._pending[seq_id] = _Slot(None)
        self._update_gap()
        return Offer.ACCEPTED

    def _update_gap(self) -> None:
        if self._pending and self._next not in self._pending:
            if self._gap_since is None:
                self._gap_since = self._clock()
        else:
            self._gap_since = None

    def next_deadline(self) -> float | None:
        """Clock time at which the current gap will be skipped, or None when there is none."""
        self._update_gap()
        return None if self._gap_since is None else self._gap_since + self._grace

    def pop_ready(self) -> list[tuple[int, T]]:
        """Release every item that is now in order (skipping expired gaps and consumed ids)."""
        out: list[tuple[int, T]] = []
        while True:
            slot = self._pending.pop(self._next, None)
            if slot is not None:
                if slot.item is not None:
                    out.append((self._next, slot.item))
                self._next += 1
                self._gap_since = None
                continue
            if not self._pending:
                self._gap_since = None
                return out
            self._update_gap()
            assert self._gap_since is not None
            if self._clock() < self._gap_since + self._grace:
                return out
            first_present = min(self._pending)
            self.skipped.append((self._next, first_present - 1))
            self._next = first_present
            self._gap_since = None
