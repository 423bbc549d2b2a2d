"""Settle one training operation's future from the outcomes of its chunks.

Usage (inside TrainingClient and the client-side custom loss)::

    group = ChunkGroup(future, n_chunks, combine_forward_backward_outputs, "forward_backward")
    group.expect(n_chunks)
    group.chunk_done(index, value, error)        # from each chunk's poll, in any order
    group.send_failed(index, exc, accepted, seq_ids)   # a chunk could not be sent

The last chunk to finish combines the results (``docs/design/behavior.md#combine-chunk-results``);
any chunk error fails the operation with the first chunk's error; a chunk that could not be sent
fails it at once, noting which chunks the server had accepted
(``docs/design/behavior.md#failed-send-fails-one-op``).

Thread safety: every method may be called from any thread (one small lock). Fork safety: plain
data owned by one operation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tinker_sync._futures import APIFuture

__all__ = ["ChunkGroup"]


class ChunkGroup:
    """Settles one operation's future from its chunks' outcomes
    (docs/design/behavior.md#failed-send-fails-one-op,
    docs/design/behavior.md#combine-chunk-results).

    Completion happens in done-callbacks plus a countdown; no worker ever blocks on a sibling.
    """

    def __init__(
        self, future: APIFuture[Any], n: int, combine: Callable[[list[Any]], Any], what: str
    ) -> None:
        self.future = future
        self.n = n
        self.combine = combine
        self.what = what
        self.values: list[Any] = [None] * n
        self.errors: list[BaseException | None] = [None] * n
        self._pending = 0
        self._lock = threading.Lock()
        self._send_failed = False

    def expect(self, count: int) -> None:
        with self._lock:
            self._pending = count

    def send_failed(
        self, index: int, exc: BaseException, accepted: list[int], seq_ids: list[int]
    ) -> None:
        note = (
            f"{self.what}: chunk {index + 1}/{self.n} (seq_id {seq_ids[index]}) failed to send; "
            f"chunks accepted by the server: {[i + 1 for i in accepted] or 'none'}"
            + (" (their work may have been applied)" if accepted else "")
        )
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        exc.accepted_chunks = [i + 1 for i in accepted]  # type: ignore[attr-defined]
        with self._lock:
            self._send_failed = True
        self.future._fail(exc)

    def chunk_done(self, index: int, value: Any, error: BaseException | None) -> None:
        with self._lock:
            self.values[index] = value
            self.errors[index] = error
            self._pending -= 1
            finished = self._pending == 0 and not self._send_failed
        if not finished:
            return
        first_error = next((e for e in self.errors if e is not None), None)
        if first_error is not None:
            self.future._fail(first_error)
            return
        try:
            result = self.combine(self.values)
        except Exception as exc:
            self.future._fail(exc)
            return
        self.future._resolve(result)
