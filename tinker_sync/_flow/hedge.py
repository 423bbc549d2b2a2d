"""Hedged requests: race a second copy of a repeatable request against a slow first one.

Usage::

    hedger = Hedger(recently_failed=lambda: health.recently_failed(60.0))   # one per session
    reply = hedger.run("/api/v1/asample", lambda: transport.send_once(spec, k),
                       abort=lambda ident: transport.abort_threads([ident], {spec.pool}),
                       read_timeout=10.0)

On a lossy network one reply in a few dozen never comes, and the caller waits for its whole
read timeout before retrying. While the session has seen a failed attempt in the last
:data:`LOSSY_WINDOW_S` seconds, :meth:`Hedger.run` sends a second copy of the request (the
*hedge*, on ``pool("hedge")``) once the first has been out for :data:`FACTOR` times the 90th
percentile of the recent latencies of that kind of request (at least :data:`MIN_DELAY_S`,
and only when that is shorter than the read timeout; before :data:`MIN_SAMPLES` latencies of
the kind are known, after the caller's ``cold_delay`` if it gave one). The first good answer
(status < 400) wins; if the hedge wins, the first copy's socket is shut down so its thread
returns the hedge's reply at once, and if the first copy answers while the hedge is still
out, the hedge's socket is shut down so its thread is free for the next hedge. A hedge that
fails (reset, cut reply, status >= 400; for submissions also silent for :data:`COPY_READ_S`)
while the first copy is still out is followed by another, after twice the previous wait, up
to :data:`MAX_HEDGES` per attempt: a copy lost to a reset or a half-open peer no longer
leaves the attempt to its whole read timeout. With a healthy network nothing changes (no
thread hop, no second request). docs/polling.md#hedging-a-slow-poll-or-submission.

Only for requests that are safe to send twice: long polls (``retrieve_future`` answers the
same result again) and submissions the server deduplicates by seq_id and idempotency key
(``asample``, training requests: a repeated seq_id gets the original future back). The
exactly-once and order checks of ``tests/reliability/test_tcp_faults.py`` hold with hedging on.

Thread safety: share freely. Fork safety: plain state; a forked child's session makes its own.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from tinker_sync._runtime.causes import signal_exception
from tinker_sync._runtime.clock import REAL_CLOCK
from tinker_sync._runtime.executor import call_later
from tinker_sync._runtime.fork import make_lock
from tinker_sync._transport import Reply

__all__ = [
    "COLD_DELAY_S",
    "COPY_READ_S",
    "FACTOR",
    "LOSSY_WINDOW_S",
    "MAX_HEDGES",
    "MIN_DELAY_S",
    "MIN_SAMPLES",
    "Hedger",
]

#: Hedging is on while a failed attempt (lost reply, timeout, 5xx gateway) is this recent.
LOSSY_WINDOW_S = 60.0
#: The hedge leaves after FACTOR x the recent 90th percentile latency of that request kind ...
FACTOR = 3.0
#: ... but never sooner than this.
MIN_DELAY_S = 0.2
#: No hedging for a kind of request until this many of its latencies were seen ...
MIN_SAMPLES = 10
#: ... except for submissions (training sends, ``asample``), whose acceptance replies are
#: quick: those are hedged after this many seconds meanwhile (docs/polling.md#hedging).
COLD_DELAY_S = 1.0
#: A submission's copy reads for at most this long (the first copy keeps its read timeout):
#: its acceptance reply is quick, so a silent copy is cut and followed by the next one.
COPY_READ_S = 2.0
#: Copies per attempt at most: a failed copy is followed by another while the first is out,
#: each after twice the previous copy's wait (0.2, 0.4, 0.8, 1.6 s at the floor).
MAX_HEDGES = 4
_WINDOW = 64


class _Race:
    """One hedged attempt: the first copy runs in the caller, the hedge on a pool thread."""

    def __init__(self, delay: float) -> None:
        self.lock = make_lock()
        self.delay = delay
        self.primary_done = False
        self.hedge_started = False  # a copy was sent
        self.hedge_thread = 0  # the thread of the copy sent last
        self.hedge_over = True  # no copy's send is running now (set under ``lock``)
        self.hedge_reply: Reply | None = None
        #: Set once no copy is out or due: the last one failed, won, or found the race over.
        self.hedge_finished = threading.Event()


class Hedger:
    """Latency windows per request kind and the hedged send (see the module docs)."""

    def __init__(self, recently_failed: Callable[[], bool]) -> None:
        self._recently_failed = recently_failed
        self._lock = make_lock()
        self._latency: dict[str, collections.deque[float]] = {}
        #: Hedges sent and hedges that answered first (tests and debugging).
        self.sent = 0
        self.won = 0

    def delay(self, kind: str) -> float | None:
        """When a hedge of ``kind`` would leave, or None while too few latencies are known."""
        with self._lock:
            window = self._latency.get(kind)
            samples = sorted(window) if window is not None else []
        if len(samples) < MIN_SAMPLES:
            return None
        p90 = samples[int(0.9 * (len(samples) - 1))]
        return max(MIN_DELAY_S, FACTOR * p90)

    def record(self, kind: str, seconds: float) -> None:
        with self._lock:
            window = self._latency.get(kind)
            if window is None:
                window = self._latency[kind] = collections.deque(maxlen=_WINDOW)
            window.append(seconds)

    def run(
        self,
        kind: str,
        send: Callable[[], Reply],
        *,
        abort: Callable[[int], object],
        read_timeout: float | None,
        cold_delay: float | None = None,
        copy: Callable[[], Reply] | None = None,
    ) -> Reply:
        """``send()`` once, plus hedge copies when the network is lossy and it is slow.

        ``abort(thread_ident)`` must shut down the socket that thread is using for this kind
        of request (the transport's :meth:`abort_threads`). ``cold_delay``: the hedge delay
        while fewer than :data:`MIN_SAMPLES` latencies of ``kind`` are known (default: no
        hedge then). ``copy()`` sends a hedge copy (default: ``send``), e.g. with the shorter
        read timeout :data:`COPY_READ_S`, so that a copy that is itself never answered gives
        way to the next one.
        """
        start = time.monotonic()
        delay = None
        if self._recently_failed():
            delay = self.delay(kind)
            if delay is None:
                delay = cold_delay
        if delay is None or (read_timeout is not None and delay >= read_timeout):
            reply = send()
            self.record(kind, time.monotonic() - start)
            return reply
        race = _Race(delay)
        try:
            # Inside the try: an exception raised right after scheduling (a signal handler's,
            # on the main thread) still marks the first copy done, so no copy leaves after it.
            self._schedule(race, send if copy is None else copy, abort, threading.get_ident(), 0)
            reply = send()
        except BaseException as exc:
            with race.lock:
                race.primary_done = True
                running = not race.hedge_over  # a copy is out now (none is due any more)
                answered = race.hedge_reply
            # A signal handler's exception (an alarm timeout) reaches the caller as itself.
            if not isinstance(exc, Exception) or signal_exception(exc) is not None:
                raise
            if running:
                race.hedge_finished.wait()  # bounded by the copy's own timeouts
                answered = race.hedge_reply
            if answered is not None:
                return answered
            raise
        with race.lock:
            race.primary_done = True
            if not race.hedge_over:
                # The first copy answered: cut the copy so its hedge thread is free at once.
                # Under the lock, the copy's thread is still in that send.
                abort(race.hedge_thread)
        # The first copy answered first: its latency is a true one, even with a copy out.
        self.record(kind, time.monotonic() - start)
        return reply

    def _schedule(
        self,
        race: _Race,
        send: Callable[[], Reply],
        abort: Callable[[int], object],
        caller: int,
        number: int,
    ) -> None:
        wait = race.delay * 2.0**number
        # Real time: the wait comes from real latencies and races a real send.
        call_later(REAL_CLOCK, wait, "hedge", self._hedge, race, send, abort, caller, number)

    def _hedge(
        self,
        race: _Race,
        send: Callable[[], Reply],
        abort: Callable[[int], object],
        caller: int,
        number: int,
    ) -> None:
        with race.lock:
            if race.primary_done:
                race.hedge_finished.set()
                return
            race.hedge_started = True
            race.hedge_over = False
            race.hedge_thread = threading.get_ident()
        with self._lock:
            self.sent += 1
        reply: Reply | None = None
        try:
            reply = send()
        except Exception:
            pass
        finally:
            won = reply is not None and reply.status < 400
            with race.lock:
                race.hedge_over = True
                if won:
                    race.hedge_reply = reply
                again = not won and not race.primary_done and number + 1 < MAX_HEDGES
                if not again:
                    race.hedge_finished.set()
            if again:  # this copy failed and the first is still out: another, later
                self._schedule(race, send, abort, caller, number + 1)
        if not won:
            return
        with race.lock:
            if not race.primary_done:
                with self._lock:
                    self.won += 1
                abort(caller)  # the first copy fails at once and returns this reply
