"""The per-TrainingClient ordered sender.

Usage (inside TrainingClient)::

    seq_ids = sequencer.reserve(n_chunks, job)   # caller's thread, under the client's lock

``reserve`` takes the next ``n`` seq_ids and puts ``job`` on a FIFO in one critical section, so
the order in which threads call a TrainingClient is the order its requests leave. One sender thread
per client drains the FIFO and runs each job *inside its turn*: the job sends its chunks (with all
their retries) and returns once every chunk is accepted or has failed for good; polling then runs
concurrently elsewhere (docs/design/behavior.md#send-order-and-chunk-fanout,
docs/design/behavior.md#turn-covers-send-and-retries). A job never raises into the sender: it fails
its own future and the next job takes the next ids
(docs/design/behavior.md#failed-send-fails-one-op).

Invariants the tests check (docs/sequencer.md): seq_ids start at 1, are contiguous across
ops, are never reused; op n+1's first send starts after op n's last acceptance or failure; no
pool worker ever waits for a turn (the sender is a dedicated thread).

Signals: a ``reserve`` on the main thread cut short by a signal handler's exception either took
nothing or has queued its job and woken the sender (docs/sequencer.md#signals).

Thread safety: ``reserve`` may be called from any thread. Fork safety: a sequencer belongs to
the process that created it; in a forked child ``reserve`` raises ForkedProcessError.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from tinker_sync._runtime.causes import signal_exception
from tinker_sync.exceptions import ClientClosedError, ForkedProcessError

log = logging.getLogger("tinker_sync.sequencer")

#: A job receives its reserved seq_ids and runs inside its turn on the sender thread.
Job = Callable[[list[int]], None]
#: Called for each job still queued at close (so its future can fail).
Abandon = Callable[[BaseException], object]


class Sequencer:
    """Reserve seq_ids in call order and run send jobs one at a time in that order.

    Thread-safe. Not usable in a forked child (raises ForkedProcessError).
    """

    def __init__(self, name: str, *, first_seq_id: int = 1) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._next_seq_id = first_seq_id
        # None tells the sender to exit (close). A SimpleQueue's put queues and wakes the
        # waiting sender in one C call: there is no separate notify() to be cut short.
        self._jobs: queue.SimpleQueue[tuple[list[int], Job, Abandon | None] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._live = False  # self._thread runs or will run _run (see _start_sender)
        self._closed = False
        self._pid = os.getpid()

    @property
    def next_seq_id(self) -> int:
        """The seq_id the next reservation will start at."""
        return self._next_seq_id

    def reserve(self, n: int, job: Job, on_abandon: Abandon | None = None) -> list[int]:
        """Take the next ``n`` seq_ids and queue ``job`` to run with them, in call order."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if os.getpid() != self._pid:
            raise ForkedProcessError(
                f"training client {self.name} was created in process {self._pid}, before "
                f"this process ({os.getpid()}) was forked from it: training cannot continue "
                "in a forked child (the model's seq_ids belong to the parent). Create the "
                "TrainingClient in the child, after the fork: e.g. in gunicorn's "
                "post_fork(server, worker) hook or a multiprocessing Pool initializer, call "
                "tinker_sync.ServiceClient().create_lora_training_client(base_model, rank=...) "
                "(or .create_training_client_from_state(path) to go on from the parent's "
                "save_state()); with gunicorn --preload, do not create it at import time. "
                "To sample in the child, pass a SamplingClient: it works after a fork"
            )
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"training client {self.name} is closed")
            if not self._live:
                self._start_sender()  # before the ids: cut short, it has taken nothing
            first = self._next_seq_id
            ids = list(range(first, first + n))
            # One step (docs/sequencer.md#signals): no call between taking the ids and the
            # put, and the put (C code) queues the job and wakes the sender at once. An
            # exception a signal handler raises on this thread (checked only after calls)
            # finds both done or neither: never a seq_id taken and left for the next call.
            self._next_seq_id = first + n
            self._jobs.put((ids, job, on_abandon))
        return ids

    def close(self, exc: BaseException | None = None) -> None:
        """Stop accepting jobs; jobs not yet started are abandoned with ``exc``."""
        abandoned: list[tuple[list[int], Job, Abandon | None]] = []
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    abandoned.append(item)
            self._jobs.put(None)  # the sender exits after the job it runs
        error = exc or ClientClosedError(f"training client {self.name} was closed")
        for _ids, _job, on_abandon in abandoned:
            if on_abandon is not None:
                self._abandon(on_abandon, error)

    def _abandon(self, on_abandon: Abandon, error: BaseException) -> None:
        try:
            on_abandon(error)
        except Exception:
            log.exception("error abandoning a queued job of %s", self.name)

    def join(self, timeout: float) -> None:
        """After close(): wait up to ``timeout`` s for the sender to finish its job and exit."""
        thread = self._thread
        mine = os.getpid() == self._pid
        if thread is None or not mine or thread is threading.current_thread():
            return
        if thread.is_alive():  # not a sender whose start() a signal handler cut short
            thread.join(timeout)

    def _start_sender(self) -> None:
        # Called with self._lock held, before any id is taken. A signal handler's exception
        # inside start() can leave a thread that never runs _run (one landing right after the
        # OS thread started makes threading forget it, and it dies in its bootstrap), so a
        # sender counts as live only once start() returned or it entered _run; until then each
        # reserve starts a new one, and a replaced one returns at its first check.
        sender = threading.Thread(
            target=self._run, name=f"tinker_sync-sender-{self.name}", daemon=True
        )
        self._thread = sender
        try:
            sender.start()
        except BaseException as exc:
            raised = signal_exception(exc)  # as in DaemonPool.submit
            if raised is not None and raised is not exc:
                raise raised  # noqa: B904 (the caller's own, unchanged)
            raise
        self._live = True

    def _run(self) -> None:
        with self._lock:
            if self._thread is not threading.current_thread():
                return  # its start() was cut by a signal handler and another took over
            self._live = True
        while True:
            item = self._jobs.get()
            if item is None:
                return
            ids, job, on_abandon = item
            if self._closed:
                # Left behind by a close() cut short on its thread: abandoned, never sent.
                if on_abandon is not None:
                    self._abandon(
                        on_abandon, ClientClosedError(f"training client {self.name} was closed")
                    )
                continue
            try:
                job(ids)
            except BaseException:
                # Jobs fail their own futures; reaching here is a bug, never a stopped sender.
                log.exception("training job for seq_ids %s of %s raised", ids, self.name)
