"""The one clock of the SDK: monotonic and wall time, sleeps, timed waits and jitter.

Usage::

    from tinker_sync._runtime.clock import REAL_CLOCK, SYSTEM_CLOCK, FakeClock, exiting

    clock = SYSTEM_CLOCK                             # REAL_CLOCK: a deadline in real time
    clock.sleep(0.5, reason="http-retry")          # returns early at interpreter exit
    with cond:
        while not ready and not exiting():
            clock.wait(cond, timeout=remaining)      # timed Condition/Event wait

    fake = FakeClock()                               # tests: returns at once, time is virtual
    fake.sleep(2.0, reason="backoff")
    assert fake.sleeps == [(2.0, "backoff")] and fake.monotonic() == 2.0

Every wait in the SDK goes through a :class:`Clock` so that tests can assert the exact delays
requested (``FakeClock.sleeps``) without wall-clock races.

Exit (docs/design/behavior.md#fast-interpreter-exit): :data:`EXIT_EVENT` is set when the interpreter
starts shutting down, *before* ``concurrent.futures`` joins its worker threads, so that backoff
sleeps and timed waits on :data:`SYSTEM_CLOCK` return within about half a second and a finished
script exits promptly. :func:`register_exit_callback` adds work to that moment (e.g. closing pools).

Thread safety: both clocks may be used from any thread. Fork safety: plain state; the exit event
is recreated unset in a forked child.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (import first: its exit hook must run after ours)
import logging
import random as _random
import threading
import time as _time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from tinker_sync._runtime.fork import make_lock, register_after_fork

__all__ = [
    "EXIT_EVENT",
    "REAL_CLOCK",
    "SYSTEM_CLOCK",
    "Clock",
    "FakeClock",
    "SystemClock",
    "Waitable",
    "exiting",
    "register_exit_callback",
]

logger = logging.getLogger("tinker_sync.clock")

# Longest uninterrupted real wait; bounds how late a waiter notices EXIT_EVENT.
_EXIT_SLICE = 0.5

EXIT_EVENT = threading.Event()
"""Set once the interpreter begins to exit; long waits and daemon loops watch it."""

_exit_callbacks: list[Callable[[], object]] = []


def exiting() -> bool:
    """True once the interpreter has started shutting down."""
    return EXIT_EVENT.is_set()


def register_exit_callback(callback: Callable[[], object]) -> None:
    """Call ``callback()`` at interpreter exit, right after :data:`EXIT_EVENT` is set.

    Runs before ``ThreadPoolExecutor`` workers are joined. Exceptions are logged, never raised.
    """
    _exit_callbacks.append(callback)


def _on_exit() -> None:
    if EXIT_EVENT.is_set():
        return
    EXIT_EVENT.set()
    for callback in list(_exit_callbacks):
        try:
            callback()
        except Exception:
            logger.debug("exit callback %r failed", callback, exc_info=True)


def _install_exit_hook() -> None:
    # threading._register_atexit callbacks run in reverse order of registration, before the
    # interpreter joins non-daemon threads (concurrent.futures registers its join the same way).
    # It is the one private name the SDK touches: Python has no public hook that runs before
    # that join. Feature-detected; without it the atexit fallback below still runs, later.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_on_exit)
        except RuntimeError:  # already shutting down
            pass
    import atexit

    atexit.register(_on_exit)


_install_exit_hook()


def _reset_exit_in_child() -> None:
    # A fresh event: the parent's may have been locked by one of its threads at fork time.
    # Code reads it through this module (``exiting()``, the clocks), never by an imported name.
    global EXIT_EVENT
    EXIT_EVENT = threading.Event()


register_after_fork(_reset_exit_in_child)


@runtime_checkable
class Waitable(Protocol):
    """Anything with ``wait(timeout) -> bool``: ``threading.Condition`` or ``threading.Event``."""

    def wait(self, timeout: float | None = None) -> bool: ...


class Clock(Protocol):
    """Time source and waiting primitive injected into every SDK component.

    * ``monotonic()``: seconds for deadlines and durations.
    * ``time()``: wall-clock epoch seconds (HTTP dates, JWT expiry).
    * ``sleep(seconds, reason)``: block; ``reason`` is recorded by fakes.
    * ``wait(cond, timeout)``: ``cond.wait(timeout)`` for a held Condition or an Event; True
      when notified/set, False on timeout.
    * ``random()``: a float in [0, 1) for jitter.
    """

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def sleep(self, seconds: float, reason: str = "") -> None: ...

    def wait(self, cond: Waitable, timeout: float | None) -> bool: ...

    def random(self) -> float: ...


class SystemClock:
    """The real clock. Sleeps and waits return early (False) once :data:`EXIT_EVENT` is set.

    Thread safety: stateless apart from its RNG (thread-safe in CPython). Fork safety: yes.
    """

    def __init__(self, rng: _random.Random | None = None) -> None:
        self._rng = rng if rng is not None else _random.Random()

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()

    def sleep(self, seconds: float, reason: str = "") -> None:
        if seconds > 0:
            EXIT_EVENT.wait(seconds)

    def wait(self, cond: Waitable, timeout: float | None) -> bool:
        """Wait on ``cond`` (held Condition, or Event).

        Daemon threads (every SDK worker) wait the whole timeout: the interpreter never waits for
        them, and slicing would wake each parked waiter twice a second. Other threads wait in slices
        so that interpreter exit is noticed (docs/design/behavior.md#fast-interpreter-exit).
        """
        if EXIT_EVENT.is_set():
            return bool(cond.wait(0))
        if threading.current_thread().daemon:
            return bool(cond.wait(None if timeout is None else max(timeout, 0.0)))
        if timeout is not None and timeout <= _EXIT_SLICE:
            return bool(cond.wait(max(timeout, 0.0)))
        deadline = None if timeout is None else _time.monotonic() + timeout
        while True:
            if EXIT_EVENT.is_set():
                return bool(cond.wait(0))
            if deadline is None:
                slice_ = _EXIT_SLICE
            else:
                remaining = deadline - _time.monotonic()
                if remaining <= 0:
                    return False
                slice_ = min(remaining, _EXIT_SLICE)
            if cond.wait(slice_):
                return True

    def random(self) -> float:
        return self._rng.random()

    def __repr__(self) -> str:
        return "<SystemClock>"


SYSTEM_CLOCK: Clock = SystemClock()
"""The default clock of every SDK component."""

REAL_CLOCK: Clock = SystemClock()
"""Real time, for waits that real time or real work ends (an attempt's socket deadline, a
hedge's delay measured from real latencies). A test's virtual clock stands in for
:data:`SYSTEM_CLOCK`, never for this one: such a wait made virtual would return at once while
its deadline, still real, has not passed, and its loop would spin the virtual clock forward
(docs/design/local-server.md#pytest-plugin)."""


class FakeClock:
    """A virtual clock for tests: sleeps and timed waits return at once and advance time.

    Usage::

        clock = FakeClock(rng=lambda: 0.0)     # jitter source fixed at its low extreme
        run_code_under_test(clock=clock)
        assert clock.sleeps == [(0.5, "http-retry"), (1.0, "http-retry")]

    * ``sleep(s, reason)`` records ``(s, reason)`` in :attr:`sleeps` and advances time by ``s``.
    * ``wait(event, t)``: True at once if the event is set; else time advances by ``t`` and the
      result is ``event.is_set()``.
    * ``wait(cond, t)`` (caller holds the Condition): the lock is released and re-acquired once
      so other threads can run; unless that brief wait was notified, time advances by ``t`` and
      False is returned. ``t=None`` waits for a real notify (no virtual time passes).
    * Every timed wait is recorded in :attr:`waits` as ``(timeout, thread_name)``.
    * ``on_sleep(seconds, reason)``, if given, is called after each recorded sleep (outside
      the clock's lock), e.g. to stop a loop after N iterations.

    Concurrent sleepers each advance the shared time (virtual time is a sum, not a max).
    Thread safety: all methods are thread-safe. Fork safety: plain data.
    """

    def __init__(
        self,
        *,
        monotonic: float = 0.0,
        wall: float = 1_700_000_000.0,
        rng: Callable[[], float] | None = None,
        seed: int = 0,
        on_sleep: Callable[[float, str], object] | None = None,
    ) -> None:
        self._lock = make_lock()
        self._mono = float(monotonic)
        self._wall_offset = float(wall) - float(monotonic)
        self._rng: Callable[[], float] = rng if rng is not None else _random.Random(seed).random
        self._sleeps: list[tuple[float, str]] = []
        self._waits: list[tuple[float | None, str]] = []
        self.on_sleep = on_sleep

    # -- time ------------------------------------------------------------------------------
    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def time(self) -> float:
        with self._lock:
            return self._mono + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` (>= 0) without recording a sleep."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go backwards")
        with self._lock:
            self._mono += seconds

    def set_wall(self, wall: float) -> None:
        """Set the wall-clock reading (monotonic time is unchanged)."""
        with self._lock:
            self._wall_offset = float(wall) - self._mono

    # -- waiting ---------------------------------------------------------------------------
    def sleep(self, seconds: float, reason: str = "") -> None:
        seconds = float(seconds)
        with self._lock:
            self._sleeps.append((seconds, reason))
            if seconds > 0:
                self._mono += seconds
        hook = self.on_sleep
        if hook is not None:
            hook(seconds, reason)

    def wait(self, cond: Waitable, timeout: float | None) -> bool:
        with self._lock:
            self._waits.append((timeout, threading.current_thread().name))
        if isinstance(cond, threading.Event):
            if cond.is_set():
                return True
            if timeout is None:
                return cond.wait()
            self.advance(max(timeout, 0.0))
            return cond.is_set()
        if timeout is None:
            return bool(cond.wait())
        if cond.wait(0):
            return True
        self.advance(max(timeout, 0.0))
        return False

    def random(self) -> float:
        with self._lock:
            return float(self._rng())

    # -- records ---------------------------------------------------------------------------
    @property
    def sleeps(self) -> list[tuple[float, str]]:
        """A copy of the recorded ``(seconds, reason)`` sleeps, in order."""
        with self._lock:
            return list(self._sleeps)

    @property
    def waits(self) -> list[tuple[float | None, str]]:
        """A copy of the recorded ``(timeout, thread_name)`` timed waits, in order."""
        with self._lock:
            return list(self._waits)

    def sleeps_for(self, reason: str) -> list[float]:
        """The recorded sleep durations with this ``reason``."""
        with self._lock:
            return [s for s, r in self._sleeps if r == reason]

    def clear(self) -> None:
        """Forget recorded sleeps and waits (time is unchanged)."""
        with self._lock:
            self._sleeps.clear()
            self._waits.clear()

    def __repr__(self) -> str:
        return f"<FakeClock t={self._mono:.3f} sleeps={len(self._sleeps)}>"
