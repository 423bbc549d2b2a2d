"""The sampling threads' share of the CPU while the program's main thread is busy.

Usage::

    from tinker_sync._runtime.governor import governor

    gov = governor()                  # process-wide; None when switched off or unsupported
    gov.pace()                        # a sampling worker, before each job: may sleep
    job()
    gov.done()                        # charges the job's CPU

Why (docs/scale-out.md#background-share): CPython lets one thread run Python at a time, and a
thread waiting for the interpreter lock takes it from a busy thread only after the switch
interval (5 ms), and only if no other thread took it meanwhile. Hundreds of sampling threads
handing the lock to one another can keep it from a main thread that computes rewards or
tokenises for most of the time: with 500 samples in flight against a fast server the main
thread's loop ran at about 60 % of its speed, whatever the SDK's CPU per sample. The governor
bounds that: while the main thread is busy (it used at least :data:`BUSY` of the last
:data:`PERIOD_S`), the sampling pools' workers pause before their next job whenever their CPU
exceeds ``share / (1 - share)`` of the main thread's, for as long as the main thread needs to
get back to that ratio (at most :data:`MAX_PAUSE_S`). Jobs already running finish; nothing is
dropped or reordered, only started later. A main thread blocked in ``result()`` uses no CPU,
so a program that waits on its samples is never slowed.

The share comes from ``TINKER_SYNC_BACKGROUND_SHARE`` (default :data:`DEFAULT_SHARE`; ``1``
switches the governor off). The main thread's CPU is read with ``time.pthread_getcpuclockid``;
where that does not exist (macOS, Windows) there is no governor. Only the main thread is
watched: a busy thread of your own elsewhere is not seen.

:meth:`Governor.done` charges the calling worker's CPU since its previous call or
:meth:`Governor.pace`. Thread safety: both may be called from any thread; charges are added
without a lock (a rare lost update loses one job's CPU: the measurement is approximate by
design). Fork safety: a forked child builds its own governor (the parent's baselines are of
other threads).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.fork import make_lock, register_after_fork

__all__ = [
    "BUSY",
    "DEFAULT_SHARE",
    "MAX_PAUSE_S",
    "MIN_PAUSE_S",
    "PERIOD_S",
    "STALE_S",
    "Governor",
    "governor",
    "main_sdk_done",
    "main_sdk_start",
    "main_thread_cpu",
    "reset_governor",
    "share_from_env",
]

#: The sampling threads' CPU, as a share of theirs plus the busy main thread's.
DEFAULT_SHARE = 0.1
#: How often the shares are measured (the pause decided at one measurement lasts until the next
#: one at most, unless longer is needed, up to :data:`MAX_PAUSE_S`).
PERIOD_S = 0.01
#: The main thread counts as busy when it used at least this share of a period's wall time.
BUSY = 0.25
#: The longest pause decided at one measurement.
MAX_PAUSE_S = 0.05
#: A measurement longer after the previous one than this (the workers had nothing to do
#: meanwhile) only takes new baselines: what the main thread did then says nothing about now.
STALE_S = 0.1
#: Shorter pauses are not taken (a sleep that short costs more than it gives back).
MIN_PAUSE_S = 0.001

ENV = "TINKER_SYNC_BACKGROUND_SHARE"

log = logging.getLogger("tinker_sync.governor")


def share_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """The share ``TINKER_SYNC_BACKGROUND_SHARE`` asks for (:data:`DEFAULT_SHARE` when unset),
    or None when it says ``1`` (off). A value that is not a number in (0, 1] is reported once
    by a WARNING naming the variable, and the default applies."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return DEFAULT_SHARE
    try:
        share = float(raw)
    except ValueError:
        share = -1.0
    if not 0.0 < share <= 1.0:
        log.warning(
            "%s must be a number in (0, 1] (1: off), got %r; using %g", ENV, raw, DEFAULT_SHARE
        )
        return DEFAULT_SHARE
    return None if share >= 1.0 else share


def main_thread_cpu() -> float | None:
    """CPU seconds the main thread has used, or None where this cannot be read."""
    getclock = getattr(time, "pthread_getcpuclockid", None)
    ident = threading.main_thread().ident
    if getclock is None or ident is None or not threading.main_thread().is_alive():
        return None
    try:
        return time.clock_gettime(getclock(ident))
    except (OSError, OverflowError):
        return None


class Governor:
    """Paces the sampling workers while the main thread is busy (see the module docstring).

    Parameters: ``share`` in (0, 1): the sampling threads' share of their CPU plus the main
    thread's while the latter is busy; ``clock``: monotonic time and the pause's sleep;
    ``main_cpu``: the main thread's CPU seconds (None: unreadable, the governor stays idle);
    ``thread_cpu``: the calling thread's CPU seconds.
    """

    def __init__(
        self,
        share: float,
        *,
        clock: Clock = SYSTEM_CLOCK,
        main_cpu: Callable[[], float | None] = main_thread_cpu,
        thread_cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"share must be in (0, 1), got {share}")
        self.share = share
        self.clock = clock
        self._main_cpu = main_cpu
        self._thread_cpu = thread_cpu
        self._workers = threading.local()  # .cpu: the worker's CPU clock at its last pace()
        self._ratio = share / (1.0 - share)
        self._lock = make_lock()
        self._charged = 0.0
        self._main_in_sdk = 0.0  # the main thread's CPU inside SDK calls (not the user's work)
        self._entered: float | None = None  # its CPU clock when it entered the SDK call it is in
        self._depth = 0  # SDK calls the main thread is in (nested)
        self._start: tuple[float, float, float] | None = None  # (monotonic, main CPU, charged)
        self._until = 0.0
        self._debt = 0.0  # the workers' CPU beyond their share while the main thread is busy
        #: Pauses decided, and their total length in seconds (for tests and benchmarks).
        self.pauses = 0
        self.paused_s = 0.0

    def charge(self, cpu_seconds: float) -> None:
        """Count CPU a sampling worker used for one job."""
        self._charged += cpu_seconds

    def main_enter(self, cpu: float) -> None:
        """The main thread enters a public SDK call (``sample()``, ``forward_backward()``...) at
        its CPU clock ``cpu``: its CPU from here to :meth:`main_leave` is the SDK's, not its own
        work. Calls nest; only the main thread calls these."""
        if self._depth == 0:
            self._entered = cpu
        self._depth += 1

    def main_leave(self, cpu: float) -> None:
        """The main thread leaves the SDK call it entered (see :meth:`main_enter`)."""
        self._depth = max(self._depth - 1, 0)
        entered = self._entered
        if self._depth == 0 and entered is not None:
            self._main_in_sdk += cpu - entered
            self._entered = None

    def pace(self) -> None:
        """Before a sampling job: sleep while a pause is decided, and measure once a period."""
        self.done()  # what the worker used since its last job (little: it was waiting)
        now = self.clock.monotonic()
        start = self._start
        if now >= self._until and (start is None or now - start[0] >= PERIOD_S):
            if not self._lock.acquire(blocking=False):
                return  # another worker is measuring
            try:
                self._measure(now)
            finally:
                self._lock.release()
        if now < self._until:
            self.clock.sleep(self._until - now, reason="background-share")

    def done(self) -> None:
        """After a sampling job: charge the CPU the calling worker used since its last
        :meth:`pace` or :meth:`done` (its first call only takes the baseline)."""
        cpu = self._thread_cpu()
        last = getattr(self._workers, "cpu", None)
        self._workers.cpu = cpu
        if last is not None:
            self.charge(cpu - last)

    def _measure(self, now: float) -> None:
        main = self._main_cpu()
        if main is None:
            self._start = None
            return
        entered = self._entered  # inside an SDK call now: what it used in there so far too
        main -= self._main_in_sdk + (main - entered if entered is not None else 0.0)
        charged = self._charged
        start, self._start = self._start, (now, main, charged)
        if start is None:
            return
        elapsed, main_used, ours = now - start[0], main - start[1], charged - start[2]
        if elapsed <= 0 or elapsed > STALE_S or main_used < BUSY * elapsed:
            # Not busy, or a window too old to say (nothing was sampled meanwhile):
            self._debt = 0.0  # nothing is owed
            return
        # What the workers used beyond their share since the main thread became busy; a
        # period under the share pays back, but no more than one period's worth is banked.
        self._debt = max(self._debt + ours - self._ratio * main_used, -self._ratio * PERIOD_S)
        # While the workers pause the main thread runs alone: this much of its time pays.
        pause = min(self._debt / self._ratio, MAX_PAUSE_S)
        if pause < MIN_PAUSE_S:
            return
        self._until = now + pause
        self.pauses += 1
        self.paused_s += pause


_MAIN_IDENT = threading.main_thread().ident
_lock = make_lock()
_governor: Governor | None = None
_resolved = False


def governor() -> Governor | None:
    """The process's governor (created on first use), or None when it is switched off
    (``TINKER_SYNC_BACKGROUND_SHARE=1``) or the main thread's CPU cannot be read here."""
    global _governor, _resolved
    if _resolved:
        return _governor
    with _lock:
        if not _resolved:
            share = share_from_env()
            if share is not None and main_thread_cpu() is not None:
                _governor = Governor(share)
            _resolved = True
    return _governor


def main_sdk_start() -> bool:
    """On the main thread while there is a governor: it enters an SDK call (True), else False.

    Usage: ``entered = main_sdk_start(); ...an SDK call...; main_sdk_done(entered)``."""
    gov = _governor if _resolved else governor()
    if gov is None or threading.get_ident() != _MAIN_IDENT:
        return False
    gov.main_enter(time.thread_time())
    return True


def main_sdk_done(entered: bool) -> None:
    """Count the main thread's CPU since :func:`main_sdk_start` as spent inside the SDK."""
    if entered and _governor is not None:
        _governor.main_leave(time.thread_time())


def reset_governor() -> None:
    """Forget the process's governor; the next :func:`governor` reads the environment again
    (tests, and a forked child)."""
    global _governor, _resolved, _lock, _MAIN_IDENT
    _governor, _resolved, _lock = None, False, make_lock()
    _MAIN_IDENT = threading.main_thread().ident


register_after_fork(reset_governor)
