"""How long the server holds each long poll, and the read timeout that follows from it.

Usage::

    hold = session.poll_hold                 # one per session
    hold.learn(reply.headers)                # any reply that may carry the server's advert
    with hold.polling() as plan:             # plan.timeout, plan.headers, plan.hold_s
        transport.send_once(spec_with(plan))

A long poll that loses its reply (a half-open connection, a reply that never comes) is only
noticed when the read timeout fires, so the read timeout should end shortly after the moment
the answer was due. A server that sends ``X-Tinker-Poll-Hold-Max: <s>`` (on
``client/config`` and on poll replies) says it honours the hold a client asks for with the
``X-Tinker-Poll-Hold`` request header (``retrieve_future``) or the body field ``timeout``
(``retrieve_futures``), up to ``<s>`` seconds. Then, while at most :data:`FEW_POLLS` polls
of the session are in flight, each poll asks for a hold of ``min(MIN_HOLD_S, <s>)`` and
reads with ``hold + MARGIN_S`` (and the client's own connect timeout): a lost reply costs
seconds, and a few pending futures polling every few seconds cost next to nothing.

With more polls in flight, or without the advert (a server that does not know the header),
polls are sent as before: no header, the server's own hold and a read timeout of
:data:`LEGACY_TIMEOUT` (45 s), so a thousand waiting futures stay as cheap as they were.

It also knows which threads have a poll in flight, so that ``close()`` can cut those polls
(:meth:`PollHold.threads`) instead of leaving them to the end of their hold.

Thread safety: lock-guarded; shared by every poll of one session. Fork safety: plain state.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import attrs

from tinker_sync._config import Timeout
from tinker_sync._runtime.fork import make_lock
from tinker_sync._wire._headers import ADVERT_HEADER, HOLD_HEADER

__all__ = [
    "ADVERT_HEADER",
    "FEW_POLLS",
    "HOLD_HEADER",
    "LEGACY_TIMEOUT",
    "MARGIN_S",
    "MIN_HOLD_S",
    "PollHold",
    "PollPlan",
]

LEGACY_TIMEOUT = Timeout(45.0, connect=5.0)
#: How much later than the hold an answer may come before the poll counts as lost.
MARGIN_S = 2.0
MIN_HOLD_S = 5.0
#: Above this many polls in flight in one session, polls keep the server's long hold.
FEW_POLLS = 32


@attrs.frozen
class PollPlan:
    """One poll's hold (None: the server decides), read timeout and extra headers (shared by
    every poll with the same plan: read-only)."""

    hold_s: float | None
    timeout: Timeout
    headers: Mapping[str, str]


#: The plan without the server's advert, or with many polls in flight.
_LEGACY_PLAN = PollPlan(None, LEGACY_TIMEOUT, MappingProxyType({}))


def _fmt(seconds: float) -> str:
    return f"{seconds:g}"


class PollHold:
    """The session's view of the server's poll holds (see the module docs). Thread-safe."""

    def __init__(self, connect_timeout: float | None = LEGACY_TIMEOUT.connect) -> None:
        self.connect_timeout = connect_timeout
        self._lock = make_lock()
        self._max: float | None = None
        self._active = 0
        self._threads: dict[int, int] = {}  # thread ident -> polls it has in flight
        # The short-hold plan of the last advert (limit, connect timeout, plan): built once,
        # not per poll (each poll asks for its plan twice).
        self._short: tuple[float, float | None, PollPlan] | None = None

    @property
    def server_max(self) -> float | None:
        """The longest hold the server honours, or None when it never said."""
        return self._max

    def learn(self, headers: Mapping[str, str]) -> None:
        """Record the server's advert from a reply's (lower-case) headers, if present."""
        raw = headers.get(ADVERT_HEADER)
        if raw is None:
            return
        try:
            value = float(raw)
        except ValueError:
            return
        if 0.0 < value < 3600.0:  # NaN and nonsense are ignored
            self._max = value

    def plan(self, active: int | None = None) -> PollPlan:
        """The hold, read timeout and headers for a poll with ``active`` polls in flight."""
        limit = self._max
        if active is None:
            active = self._active
        if limit is None or active > FEW_POLLS:
            return _LEGACY_PLAN
        short, connect = self._short, self.connect_timeout
        if short is not None and short[0] == limit and short[1] == connect:
            return short[2]
        hold = min(limit, MIN_HOLD_S)
        timeout = Timeout(hold + MARGIN_S, connect=connect)
        plan = PollPlan(hold, timeout, MappingProxyType({HOLD_HEADER: _fmt(hold)}))
        self._short = (limit, connect, plan)  # one tuple: a racing reader sees old or new
        return plan

    @contextlib.contextmanager
    def polling(self) -> Iterator[PollPlan]:
        """Count one poll in flight (on this thread) while the block runs; yields its plan."""
        plan = self.begin()
        try:
            yield plan
        finally:
            self.end()

    def begin(self) -> PollPlan:
        """Count one poll in flight on this thread and return its plan; :meth:`end` must
        follow (``try``/``finally``). :meth:`polling` without a generator per poll."""
        ident = threading.get_ident()
        with self._lock:
            self._active += 1
            self._threads[ident] = self._threads.get(ident, 0) + 1
            active = self._active
        return self.plan(active)

    def end(self) -> None:
        """The poll :meth:`begin` counted on this thread is over."""
        ident = threading.get_ident()
        with self._lock:
            self._active -= 1
            left = self._threads.pop(ident) - 1
            if left:
                self._threads[ident] = left

    def threads(self) -> list[int]:
        """Idents of the threads with a poll in flight now (``close()`` cuts those polls)."""
        with self._lock:
            return list(self._threads)
