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
and only when that is shorter than the read timeout). The first good answer (status < 400)
wins; if the hedge wins, the first copy's socket is shut down so its thread returns the
hedge's reply at once, and if the first copy answers while the hedge is still out, the hedge's
socket is shut down so its thread is free for the next hedge. At most one hedge per attempt;
with a healthy network nothing changes (no thread hop, no second request).

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

from tinker_sync._runtime.clock import SYSTEM_CLOCK
from tinker_sync._runtime.executor import call_later
from tinker_sync._runtime.fork import make_lock
from tinker_sync._transport import Reply

__all__ = ["FACTOR", "LOSSY_WINDOW_S", "MIN_DELAY_S", "MIN_SAMPLES", "Hedger"]

#: Hedging is on while a failed attempt (lost reply, timeout, 5xx gateway) is this recent.
LOSSY_WINDOW_S = 60.0
#: The hedge leaves after FACTOR x the recent 90th percentile latency of that request kind ...
FACTOR = 3.0
#: ... but never sooner than this.
MIN_DELAY_S = 0.2
#: No hedging for a kind of request until this many of its latencies were seen.
MIN_SAMPLES = 10
_WINDOW = 64


class _Race:
    """One hedged attempt: the first copy runs in the caller, the hedge on a pool thread."""

    def __init__(self) -> None:
        self.lock = make_lock()
        self.primary_done = False
        self.hedge_started = False
        self.hedge_thread = 0
        self.hedge_over = False  # the copy's send has returned (set under ``lock``)
        self.hedge_reply: Reply | None = None
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
    ) -> Reply:
        """``send()`` once, plus a hedge copy when the network is lossy and it is slow.

        ``abort(thread_ident)`` must shut down the socket that thread is using for this kind
        of request (the transport's :meth:`abort_threads`).
        """
        start = time.monotonic()
        delay = self.delay(kind) if self._recently_failed() else None
        if delay is None or (read_timeout is not None and delay >= read_timeout):
            reply = send()
            self.record(kind, time.monotonic() - start)
            return reply
        race = _Race()
        call_later(
            SYSTEM_CLOCK, delay, "hedge", self._hedge, race, send, abort, threading.get_ident()
        )
        try:
            reply = send()
        except Exception:
            with race.lock:
                race.primary_done = True
                started = race.hedge_started
            if started:
                race.hedge_finished.wait()  # bounded by the hedge's own timeouts
                if race.hedge_reply is not None:
                    return race.hedge_reply
            raise
        with race.lock:
            race.primary_done = True
            if not race.hedge_started:
                self.record(kind, time.monotonic() - start)
            elif not race.hedge_over:
                # The first copy answered: cut the copy so its hedge thread is free at once.
                # Under the lock, the copy's thread is still in that send.
                abort(race.hedge_thread)
        return reply

    def _hedge(
        self, race: _Race, send: Callable[[], Reply], abort: Callable[[int], object], caller: int
    ) -> None:
        with race.lock:
            if race.primary_done:
                return
            race.hedge_started = True
            race.hedge_thread = threading.get_ident()
        with self._lock:
            self.sent += 1
        reply: Reply | None = None
        try:
            reply = send()
        except Exception:
            pass
        finally:
            with race.lock:
                race.hedge_over = True
            if reply is not None and reply.status < 400:
                race.hedge_reply = reply
            race.hedge_finished.set()
        if race.hedge_reply is None:
            return
        with race.lock:
            if not race.primary_done:
                with self._lock:
                    self.won += 1
                abort(caller)  # the first copy fails at once and returns this reply
