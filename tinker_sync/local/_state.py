"""In-memory runtime state of the local server: futures, models, samplers, sessions, channels.

Usage (from the app's event loop)::

    futures = FutureTable(clock=time.monotonic, ttl_s=600.0)
    rec = futures.create("ForwardBackward", owner="s:train:0", seq_id=1)
    rec.complete(result)            # wakes every long-poll awaiting rec.wait(...)
    futures.get(rec.request_id)     # None once expired or dropped

Everything durable (sessions, runs, samplers, checkpoints) is also in ``_store``; these records
hold what only a running server needs: pending work, results, events for long polls.

Thread safety: not thread-safe; every object here is owned by the app's single event loop
(worker threads hand results back with ``loop.call_soon_threadsafe``).
Fork safety: not fork-safe (holds asyncio events).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tinker_sync.local._ordering import SeqQueue
from tinker_sync.local.backends.base import LoraSpec, Sampler, TrainableModel

FutureState = Literal["pending", "done", "failed"]

#: Request kinds as the SDK names them in ``X-Tinker-Request-Type``
#: (docs/design/protocol.md#retrieve-future).
KINDS = (
    "CreateModel",
    "ForwardBackward",
    "Forward",
    "OptimStep",
    "SaveWeights",
    "SaveWeightsForSampler",
    "SaveWeightsExternal",
    "LoadWeights",
    "Sample",
    "CreateCustomLoss",
    "UnloadModel",
)


@dataclass(eq=False)
class FutureRecord:
    """One server-side future (a submission's result slot). Loop-owned; not fork-safe."""

    request_id: str
    kind: str
    owner: str  # model id, sampling session id or session id
    seq_id: int | None
    created_at: float
    state: FutureState = "pending"
    #: A JSON-able dict, or a backend ForwardResult / SampleResult for proto-typed kinds.
    result: Any = None
    #: Cached encodings: "proto" / "json" -> bytes.
    encoded: dict[str, bytes] = field(default_factory=dict)
    #: Size in bytes of the primary encoding of the result.
    size: int = 0
    error: str | None = None
    category: str | None = None
    completed_at: float | None = None
    metadata_sent: bool = False
    sample_sequence_ids: list[str] | None = None
    cloned_sampler_id: int = 0
    cancelled: bool = False
    #: Lost by a ``lose`` fault: never run, never completed, unknown to polls (404).
    lost: bool = False
    _event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _listeners: list[Callable[[FutureRecord], None]] = field(default_factory=list, repr=False)

    @property
    def done(self) -> bool:
        return self.state != "pending"

    def add_listener(self, fn: Callable[[FutureRecord], None]) -> None:
        """Call ``fn(self)`` once when the future completes (at once if it already has)."""
        if self.done:
            fn(self)
        else:
            self._listeners.append(fn)

    def _finish(self, now: float) -> None:
        self.completed_at = now
        self._event.set()
        listeners, self._listeners = self._listeners, []
        for fn in listeners:
            fn(self)

    def complete(self, result: Any, *, now: float, encoded: dict[str, bytes] | None = None) -> None:
        """Record a success (ignored if the future already finished)."""
        if self.done:
            return
        self.state = "done"
        self.result = result
        if encoded:
            self.encoded.update(encoded)
            self.size = len(next(iter(encoded.values())))
        self._finish(now)

    def fail(self, message: str, category: str, *, now: float) -> None:
        """Record a failure (ignored if the future already finished)."""
        if self.done:
            return
        self.state = "failed"
        self.error = message
        self.category = category
        self._finish(now)

    def force_fail(self, message: str, category: str, *, now: float) -> None:
        """Fail the future even if it already finished (fault injection); drops any result."""
        if self.state == "pending":
            self.fail(message, category, now=now)
            return
        self.state = "failed"
        self.error = message
        self.category = category
        self.drop_payload()

    def drop_payload(self) -> None:
        self.result = None
        self.encoded.clear()

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for completion; True when done."""
        if self.done:
            return True
        if timeout <= 0:
            return False
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return self.done
        return True


class FutureTable:
    """All live futures by request id, with expiry of finished ones. Loop-owned; not fork-safe."""

    def __init__(self, *, clock: Callable[[], float], ttl_s: float) -> None:
        self._clock = clock
        self._ttl = ttl_s
        self._by_id: dict[str, FutureRecord] = {}
        self._finished: deque[FutureRecord] = deque()
        self._counter = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        #: Request ids lost by a ``lose`` fault (answered 404 when polled).
        self._lost: set[str] = set()

    def __len__(self) -> int:
        return len(self._by_id)

    def new_id(self) -> str:
        return f"req-{self._prefix}-{next(self._counter)}"

    def create(self, kind: str, *, owner: str, seq_id: int | None) -> FutureRecord:
        rec = FutureRecord(
            request_id=self.new_id(),
            kind=kind,
            owner=owner,
            seq_id=seq_id,
            created_at=self._clock(),
        )
        self._by_id[rec.request_id] = rec
        rec.add_listener(self._finished.append)
        return rec

    def get(self, request_id: str) -> FutureRecord | None:
        self.expire()
        return self._by_id.get(request_id)

    def lose(self, request_id: str) -> bool:
        """Lose a pending future (a ``lose`` fault): it never runs or completes, and polls of
        its id answer 404. False when there is no such pending future."""
        rec = self._by_id.get(request_id)
        if rec is None or rec.done:
            return False
        rec.lost = True
        del self._by_id[request_id]
        self._lost.add(request_id)
        return True

    def is_lost(self, request_id: str) -> bool:
        return request_id in self._lost

    def forget(self, request_id: str) -> None:
        """Drop a finished future's payload and make its id unknown (client acked it)."""
        rec = self._by_id.get(request_id)
        if rec is not None and rec.done:
            rec.drop_payload()
            del self._by_id[request_id]

    def expire(self) -> None:
        """Forget futures finished more than ``ttl_s`` ago."""
        cutoff = self._clock() - self._ttl
        while self._finished:
            rec = self._finished[0]
            if rec.completed_at is not None and rec.completed_at > cutoff:
                break
            self._finished.popleft()
            rec.drop_payload()
            self._by_id.pop(rec.request_id, None)

    def pending(self) -> list[FutureRecord]:
        return [r for r in self._by_id.values() if not r.done]


@dataclass(eq=False)
class WorkItem:
    """One queued operation of a model: ``run`` executes in a worker thread.

    Built and consumed on the loop (``run`` itself runs in one worker thread). Not fork-safe.
    """

    kind: str
    future: FutureRecord
    #: Returns the result; raises ``UserError`` / ``LookupError`` (user) or anything (server).
    run: Callable[[], Any]
    #: Optional post-processing of the result on the event loop (registers samplers etc.).
    on_loop: Callable[[Any], Any] | None = None

    def release(self) -> None:
        """Drop the closures (and the request data they hold) once the item has run."""
        self.run = _released
        self.on_loop = None


def _released() -> Any:
    raise RuntimeError("work item already ran")


@dataclass(eq=False)
class ModelRuntime:
    """A training run (model) held by this server process. Loop-owned; not fork-safe."""

    model_id: str
    session_id: str
    model_seq_id: int
    base_model: str
    lora: LoraSpec
    optimizer_config: dict[str, Any]
    user_metadata: dict[str, Any] | None
    queue: SeqQueue[WorkItem]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    model: TrainableModel | None = None
    #: Set when seq 0 (create / create-via-load) failed; later work fails with this message.
    broken: str | None = None
    unloaded: bool = False
    #: (seq_id, kind) of every applied operation, in application order.
    applied: list[tuple[int, str]] = field(default_factory=list)
    last_seq: int = -1
    task: asyncio.Task[None] | None = None
    #: seq_id -> canned 4xx reply of a rejected submission (repeated on duplicates).
    rejected: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    #: unload_model futures completed once the queue has drained.
    unload_futures: list[FutureRecord] = field(default_factory=list)


@dataclass(eq=False)
class Channel:
    """Completion events of one (sampling session, cloned sampler) for ``retrieve_futures``.

    Loop-owned; not fork-safe.
    """

    events: deque[tuple[int, dict[str, Any], float]] = field(default_factory=deque)
    last_cursor: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, completion: dict[str, Any], now: float, cap: int = 100_000) -> None:
        self.last_cursor += 1
        self.events.append((self.last_cursor, completion, now))
        while len(self.events) > cap:
            self.events.popleft()
        self.changed.set()
        self.changed = asyncio.Event()

    def ack(self, cursor: int) -> None:
        while self.events and self.events[0][0] <= cursor:
            self.events.popleft()

    def after(self, cursor: int) -> list[dict[str, Any]]:
        return [c for n, c, _ in self.events if n > cursor]

    def prune(self, cutoff: float) -> None:
        while self.events and self.events[0][2] < cutoff:
            self.events.popleft()


@dataclass(eq=False)
class SamplerRuntime:
    """A sampling session held by this server process. Loop-owned; not fork-safe."""

    sampler_id: str
    session_id: str
    base_model: str
    model_path: str | None
    #: Raw sampler weights for ephemeral samplers (None: base model or loaded from model_path).
    weights: bytes | None = None
    sampler: Sampler | None = None
    load_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    by_seq: dict[int, FutureRecord] = field(default_factory=dict)
    client_counter: int = 0
    channels: dict[int, Channel] = field(default_factory=dict)

    def channel(self, cloned_id: int) -> Channel:
        ch = self.channels.get(cloned_id)
        if ch is None:
            ch = self.channels[cloned_id] = Channel()
        return ch


@dataclass(eq=False)
class SessionRuntime:
    """Live bookkeeping of a session (its durable record is in the store). Loop-owned."""

    session_id: str
    last_heartbeat: float
    #: model_seq_id -> model id (dedupes create_model / create-via-load).
    models_by_seq: dict[int, str] = field(default_factory=dict)
    #: model_seq_id -> the original seq-0 future.
    create_futures: dict[int, FutureRecord] = field(default_factory=dict)
    #: sampling_session_seq_id -> sampler id (create_sampling_session and ephemeral saves).
    samplers_by_seq: dict[int, str] = field(default_factory=dict)
    #: custom_loss_seq_id -> future.
    custom_losses: dict[int, FutureRecord] = field(default_factory=dict)
    expired: bool = False


PROTO_KINDS = frozenset({"Sample", "ForwardBackward", "Forward"})
