"""The connections the SDK's pools open: in-flight tracking and one write per small request.

Usage::

    tracker = _InflightTracker()
    use_sdk_connections(pool, tracker)     # before the pool opens its first connection
    ...
    tracker.abort(sticky=True)             # interpreter exit: unblock reads in other threads

Thread safety: see each class.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from tinker_sync._runtime.clock import REAL_CLOCK
from tinker_sync._runtime.fork import make_condition, make_lock, register_after_fork

if TYPE_CHECKING:  # urllib3 loads with the first urllib3 pool (docs/scale-out.md#start-up)
    import urllib3.exceptions
    from urllib3.connectionpool import HTTPConnectionPool


class _InflightTracker:
    """The connections of one :class:`Pool` that are carrying a request right now.

    A connection is in flight from the moment it starts sending a request until the exchange
    that sent it returns (:meth:`end`, called by the same thread). ``abort()`` shuts their sockets
    down so that reads blocked in other threads return at once; with ``sticky=True`` every
    connection that connects or sends later fails the same way. Used at interpreter exit, in
    the process that opened the connections.
    Thread safety: all methods are thread-safe; entries are keyed by the sending thread.
    ``begin`` and ``end`` (twice per request) take no lock: each changes only its own thread's
    entry with one dict operation, and ``begin`` stores its connection before it reads
    ``aborted`` while ``abort`` sets ``aborted`` before it reads the entries, so a connection
    is either seen by ``abort`` or shut down by ``begin`` itself.
    """

    def __init__(self) -> None:
        self._lock = make_lock()
        self._conns: dict[int, Any] = {}
        self.aborted = False

    def begin(self, conn: Any) -> None:
        """``conn`` starts sending a request on the calling thread."""
        self._conns[threading.get_ident()] = conn
        if self.aborted:
            _shutdown(conn)

    def end(self) -> None:
        """The calling thread's exchange is over (its connection is back in the pool)."""
        if self._conns:
            self._conns.pop(threading.get_ident(), None)

    def connected(self, conn: Any) -> None:
        with self._lock:
            aborted = self.aborted
        if aborted:
            _shutdown(conn)

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns)

    def abort_threads(self, threads: Collection[int]) -> int:
        """Shut down the sockets that ``threads`` (thread idents) are sending or reading on."""
        with self._lock:
            found = [self._conns.get(t) for t in threads]  # an entry may end meanwhile
        return sum(_shutdown(conn) for conn in found if conn is not None)

    def abort(self, *, sticky: bool = False) -> int:
        with self._lock:
            self.aborted = self.aborted or sticky  # before reading the entries (see begin)
            conns = list(self._conns.values())
        return sum(_shutdown(conn) for conn in conns)


def _shutdown(conn: Any) -> bool:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return False
    try:
        # The plain-socket shutdown also works under TLS without touching the SSL object.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        return False
    return True


def setup_timeout(
    conn: Any, where: str, stage: str, seconds: float | None
) -> urllib3.exceptions.ConnectTimeoutError:
    """A connection whose TCP connect succeeded but whose setup (``stage``: the TLS handshake,
    or a proxy's CONNECT tunnel) outlasted the connect timeout: a connect timeout, never sent.

    urllib3 reports it as a read timeout, which reads as "maybe sent"; both request paths
    report it as this instead (docs/transport.md).
    """
    import urllib3.exceptions

    return urllib3.exceptions.ConnectTimeoutError(
        conn, f"Connection to {where} timed out during its {stage}. (connect timeout={seconds})"
    )


COALESCE_LIMIT = 64 * 1024
"""Request bodies up to this size leave in the same write as their header block."""


class _SdkConnection:
    """Mixin for a urllib3 connection class: in-flight tracking and one write per request.

    Installed through the pool's ``ConnectionCls`` (urllib3's extension point for the class of
    the connections a pool opens) on top of whatever class the pool would use (plain, TLS or
    SOCKS), overriding only the public ``connect()``, ``request()`` and ``send()``:

    * every connect and request is reported to ``tracker`` (see :class:`_InflightTracker`);
    * a request with a small body sends its header block and body in one write. urllib3 writes
      them separately, which costs a system call per request here and a second read on the
      server before the request is complete. Whatever order urllib3 writes in, nothing is held
      back once ``request()`` returns.

    Thread safety: like any connection, used by one thread at a time (the pool hands it out).
    """

    tracker: _InflightTracker
    host: str  # these three are the urllib3 connection's own attributes
    port: int
    timeout: float | None
    _holding = False
    _held: bytes | None = None

    def connect(self) -> None:
        try:
            super().connect()  # type: ignore[misc]
        except TimeoutError as exc:  # the TCP connect's own timeout is a ConnectTimeoutError
            where, stage = f"{self.host}:{self.port}", "TLS handshake or proxy tunnel"
            raise setup_timeout(self, where, stage, self.timeout) from exc
        self.tracker.connected(self)

    def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        headers: Any = None,
        **kwargs: Any,
    ) -> None:
        self.tracker.begin(self)
        self._holding = isinstance(body, bytes) and 0 < len(body) <= COALESCE_LIMIT
        try:
            super().request(method, url, body, headers, **kwargs)  # type: ignore[misc]
        except BaseException:
            self._holding, self._held = False, None
            raise
        held = self._held
        self._holding, self._held = False, None
        if held is not None:  # only the header block was written: send it now
            super().send(held)  # type: ignore[misc]

    def send(self, data: Any) -> None:
        if self._holding and isinstance(data, (bytes, bytearray, memoryview)):
            if self._held is None:
                self._held = bytes(data)  # the header block: the body comes next
                return
            data, self._held, self._holding = self._held + bytes(data), None, False
        elif self._held is not None:  # an unexpected kind of write: keep the order
            held, self._held, self._holding = self._held, None, False
            super().send(held)  # type: ignore[misc]
        super().send(data)  # type: ignore[misc]


def use_sdk_connections(pool: HTTPConnectionPool, tracker: _InflightTracker) -> None:
    """Make the connections ``pool`` opens from now on :class:`_SdkConnection` objects."""
    base = pool.ConnectionCls
    pool.ConnectionCls = type(f"Sdk{base.__name__}", (_SdkConnection, base), {"tracker": tracker})


class _Watch:
    """One attempt on the urllib3 path, cut at ``deadline`` if still in flight (``fired``)."""

    __slots__ = ("active", "deadline", "fired", "ident", "tracker")

    def __init__(self, deadline: float, tracker: _InflightTracker) -> None:
        self.deadline = deadline
        self.tracker = tracker
        self.ident = threading.get_ident()
        self.active = True
        self.fired = False

    def __lt__(self, other: _Watch) -> bool:
        return self.deadline < other.deadline


class DeadlineWatch:
    """Cuts urllib3-path attempts at their deadline: shuts down the socket the attempt's
    thread has in flight, so a peer dripping bytes cannot hold a call past it (urllib3 reads
    the header block inside ``urlopen``, where the SDK cannot look at the time itself).

    Usage::

        watch = DEADLINES.start(deadline, tracker)   # deadline: a time.monotonic() value
        try:
            ...                                      # the exchange
        finally:
            DEADLINES.stop(watch)
        watch.fired                                  # True: it was cut at the deadline

    One daemon thread (``tinker_sync-deadline-<n>``) while attempts are watched; it exits after
    a second with none. Thread safety: thread-safe. Fork safety: a child starts afresh.
    """

    IDLE_EXIT_S = 1.0

    def __init__(self) -> None:
        self._cond = make_condition()
        self._heap: list[_Watch] = []
        self._active = 0
        self._running = False
        self._names = itertools.count(1)

    def start(self, deadline: float, tracker: _InflightTracker) -> _Watch:
        watch = _Watch(deadline, tracker)
        with self._cond:
            heapq.heappush(self._heap, watch)
            self._active += 1
            if self._heap[0] is watch:
                self._cond.notify()
            if not self._running:
                self._running = True
                name = f"tinker_sync-deadline-{next(self._names)}"
                threading.Thread(target=self._run, name=name, daemon=True).start()
        return watch

    def stop(self, watch: _Watch) -> None:
        with self._cond:
            if not watch.active:
                return
            watch.active = False
            self._active -= 1
            if len(self._heap) > 64 and len(self._heap) > 4 * self._active:
                self._heap = [w for w in self._heap if w.active]  # drop finished attempts
                heapq.heapify(self._heap)

    def _run(self) -> None:
        # Real waits (REAL_CLOCK): the deadlines are time.monotonic() values, ended by real time.
        with self._cond:
            while True:
                while self._heap and not self._heap[0].active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    if not REAL_CLOCK.wait(self._cond, self.IDLE_EXIT_S) and not self._heap:
                        self._running = False
                        return
                    continue
                first = self._heap[0]
                delay = first.deadline - time.monotonic()
                if delay > 0:
                    REAL_CLOCK.wait(self._cond, delay)
                    continue
                heapq.heappop(self._heap)
                first.active = False
                first.fired = True
                self._active -= 1
                first.tracker.abort_threads([first.ident])  # under the lock: see stop()

    def reset_in_child(self) -> None:
        self._cond = make_condition()
        self._heap = []
        self._active = 0
        self._running = False


DEADLINES = DeadlineWatch()
"""The process's deadline watch for urllib3-path attempts."""
register_after_fork(DEADLINES.reset_in_child)
