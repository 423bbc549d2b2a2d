"""Session state shared by a ServiceClient and the clients it creates.

Usage (inside the clients)::

    session = Session(config, clock=clock, hooks=hooks, user_metadata=..., with_session=True)
    session.ensure_started()                 # single-flight: config, JWT, dynamic config, session
    reply = session.request(spec)            # HTTP retries inside the submission loop
    n = session.next_counter("model")        # per-session counters
    session.close("success", None)

Start-up runs once however many threads race (docs/design/behavior.md#lazy-single-init):
``client/config`` with the raw credential, the JWT exchange when the server enables it,
``client/dynamic_config`` (404 = defaults), then ``create_session``; then the heartbeat thread
(every 10 s, docs/design/behavior.md#heartbeat) and the timer thread (dynamic config refresh,
telemetry flushes, and the background JWT refresh of docs/design/behavior.md#jwt-auth when the
server enables JWT auth). A failed start is not cached: the next call tries again.

``TINKER_LOG=debug|info`` is read when a Session is built, never at import
(:func:`tinker_sync._logging.configure_logging_from_env`).

Thread safety: every method may be called from any thread. Fork safety: a Session belongs to the
process that started it; in a forked child ``ensure_started`` raises ForkedProcessError for
session-owning work, while REST-only use rebuilds its transport
(docs/design/behavior.md#forked-child-clients).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from tinker_sync._config import PROTOCOL_VERSION, ClientConfig, DynamicConfig, ServerConfig, Timeout
from tinker_sync._credentials import StaticKeyAuth
from tinker_sync._flow.health import Health, describe_failure
from tinker_sync._flow.hedge import COLD_DELAY_S, COPY_READ_S, LOSSY_WINDOW_S, Hedger
from tinker_sync._flow.limiter import Limiter, limiter_for
from tinker_sync._flow.retry import (
    BillingPause,
    SubmissionRetry,
    classify,
    http_backoff,
    retry_delay,
    send_with_retries,
    should_retry,
    submission_loop,
)
from tinker_sync._logging import configure_logging_from_env
from tinker_sync._polling.hold import PollHold
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock, exiting
from tinker_sync._runtime.fork import make_lock, register_after_fork
from tinker_sync._session.jwt import make_auth
from tinker_sync._session.telemetry import Telemetry
from tinker_sync._transport import (
    Hook,
    Pool,
    Reply,
    RequestSpec,
    Transport,
    error_from_reply,
    new_idempotency_key,
)
from tinker_sync.exceptions import (
    ClientClosedError,
    ForkedProcessError,
    NotFoundError,
)

log = logging.getLogger("tinker_sync.session")
T = TypeVar("T")

_open_sessions = 0  # started and not closed, in this process
_open_lock = make_lock()


def _count_open(delta: int) -> int:
    """Adjust and return the number of started, unclosed sessions in this process."""
    global _open_sessions
    with _open_lock:
        _open_sessions = max(0, _open_sessions + delta)
        return _open_sessions


def _forget_open_sessions() -> None:
    global _open_sessions
    _open_sessions = 0  # a forked child starts its own sessions


register_after_fork(_forget_open_sessions)

HEARTBEAT_INTERVAL_S = 10.0
HEARTBEAT_WARN_AFTER_S = 120.0
#: How long close() waits for the background loops to exit (their calls time out in 10 s).
CLOSE_JOIN_TIMEOUT_S = 12.0
#: close()'s session-finish request: at most CLOSE_ATTEMPTS attempts, all within CLOSE_BUDGET_S
#: seconds; one attempt while the tenant's circuit is open or the interpreter exits
#: (docs/health.md#close-during-an-outage).
CLOSE_BUDGET_S = 5.0
CLOSE_ATTEMPTS = 3
SHORT_TIMEOUT = Timeout(10.0, connect=5.0)


class Session:
    """Lazy, single-flight session start plus the background loops of one ServiceClient.

    Thread-safe; belongs to one process (a forked child must not reuse its session).
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        hooks: Sequence[Hook] = (),
        user_metadata: Mapping[str, str] | None = None,
        display_name: str | None = None,
        with_session: bool = True,
        timer_clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.clock = clock
        #: Schedules the background loops (heartbeat, refresh, telemetry). Kept apart from
        #: ``clock`` so a test's virtual backoff clock never turns those loops into busy loops.
        self.timer_clock = timer_clock
        self.hooks = tuple(hooks)
        self.user_metadata = dict(user_metadata) if user_metadata else None
        self.display_name = display_name
        self.with_session = with_session
        self.server = ServerConfig()
        self.dynamic = DynamicConfig()
        self.session_id: str | None = None
        self.billing = BillingPause()
        #: Reachability, the "cannot reach" warning and the progress of pending requests.
        self.health = Health(config.normalized_base_url, clock)
        #: How long the server holds long polls (learned from its replies).
        self.poll_hold = PollHold(config.timeout.connect)
        #: Second copies of slow repeatable requests while the network is lossy.
        self.hedger = Hedger(lambda: self.health.recently_failed(LOSSY_WINDOW_S))
        self.telemetry: Telemetry | None = None
        self._transport: Transport | None = None
        self._limiter: Limiter | None = None
        self._lock = make_lock()
        self._starting: concurrent.futures.Future[None] | None = None
        self._started = False
        self._counters = {"model": 0, "sampling": 0, "custom_loss": 0}
        self._closed = False
        self._stop = threading.Event()
        self._wake = threading.Event()  # wakes the timer loop (telemetry batch full, close)
        self._threads: list[threading.Thread] = []
        self._pid = os.getpid()
        self._close_listeners: list[Callable[[], None]] = []
        self._joiners: list[Callable[[float], None]] = []
        self._shadow = False
        configure_logging_from_env()

    @classmethod
    def shadow(
        cls,
        config: ClientConfig,
        *,
        session_id: str | None,
        server: ServerConfig,
        dynamic: DynamicConfig,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Session:
        """A session view rebuilt from a pickle or sampler handle
        (docs/design/behavior.md#credential-free-pickles).

        It sends nothing until first use, then skips ``client/config`` and
        ``create_session`` (it reuses the snapshot and the original session id) and
        heartbeats the original session.
        """
        self = cls(config, clock=clock, with_session=False)
        self.server = server
        self.dynamic = dynamic
        self.session_id = session_id
        self._shadow = True
        return self

    # ---------------------------------------------------------------- state

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def started(self) -> bool:
        return self._started

    @property
    def transport(self) -> Transport:
        self.ensure_started()
        assert self._transport is not None
        return self._transport

    @property
    def limiter(self) -> Limiter:
        self.ensure_started()
        assert self._limiter is not None
        return self._limiter

    def check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this client was closed; create a new ServiceClient")

    def in_forked_child(self) -> bool:
        return os.getpid() != self._pid

    def add_close_listener(
        self, fn: Callable[[], None], *, join: Callable[[float], None] | None = None
    ) -> None:
        """Run ``fn`` when the session closes (clients fail their pending work there).

        ``join(timeout)``, if given, waits for the client's own threads to exit; close() calls
        it after the transport is closed, within the same bound as the session's threads.
        """
        with self._lock:
            self._close_listeners.append(fn)
            if join is not None:
                self._joiners.append(join)

    # ---------------------------------------------------------------- start-up

    def ensure_started(self) -> None:
        """Run the start-up once; concurrent callers wait for the same attempt."""
        if self._started and not self.in_forked_child():
            return
        self.check_open()
        if self.in_forked_child():
            self._adopt_child()
            if self._started:
                return
        with self._lock:
            if self._started:
                return
            starting = self._starting
            owner = starting is None
            if owner:
                starting = self._starting = concurrent.futures.Future()
        assert starting is not None
        if not owner:
            starting.result()
            return
        try:
            self._start()
        except BaseException as exc:
            with self._lock:
                self._starting = None  # a failed start is not cached
            starting.set_exception(exc)
            raise
        with self._lock:
            self._started = True
        if _count_open(+1) == 1:
            from tinker_sync._runtime.executor import retire_idle_threads

            retire_idle_threads(False)  # workers may idle again: a client is open
        starting.set_result(None)

    def _adopt_child(self) -> None:
        """In a forked child: forget the parent's session and threads
        (docs/design/behavior.md#fork-detection, docs/design/behavior.md#forked-child-clients)."""
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._lock = make_lock()
            self._starting = None
            self._started = False
            self._threads = []
            self._stop = threading.Event()
            self._wake = threading.Event()
            self.session_id = None
            self._transport = None
            self.telemetry = None

    def _start(self) -> None:
        raw = Transport(
            self.config,
            auth=StaticKeyAuth(self.config.credentials),
            hooks=(*self.hooks, self.health.observe),
            clock=self.clock,
        )
        if self._shadow:
            self._start_shadow(raw)
            return
        reply = self._loop(
            raw,
            RequestSpec(
                method="POST",
                path="/api/v1/client/config",
                pool=Pool.SESSION,
                json={"sdk_version": PROTOCOL_VERSION},
                sdk_method=None,
            ),
        )
        self.server = ServerConfig.from_dict(_json_object(reply))
        self.poll_hold.learn(reply.headers)
        self.billing = BillingPause(float(self.server.billing_exception_max_pause_duration_sec))
        auth = make_auth(self.config.credentials, self.server, raw, clock=self.clock)
        transport = raw.with_auth(auth)
        raw.close()
        self._transport = transport
        self._configure_limiter()
        self.dynamic = self._fetch_dynamic_config(initial=True) or DynamicConfig()
        if self.with_session:
            self._create_session()
        self.telemetry = Telemetry(self, enabled=self.config.telemetry)
        self._spawn("timer", self._timer_loop)
        if self.with_session:
            self._spawn("heartbeat", self._heartbeat_loop)

    def _start_shadow(self, raw: Transport) -> None:
        self.billing = BillingPause(float(self.server.billing_exception_max_pause_duration_sec))
        self._transport = raw.with_auth(
            make_auth(self.config.credentials, self.server, raw, clock=self.clock)
        )
        raw.close()
        self._configure_limiter()
        self.telemetry = Telemetry(self, enabled=self.config.telemetry)
        self._spawn("timer", self._timer_loop)
        if self.session_id is not None:
            self._spawn("heartbeat", self._heartbeat_loop)

    def _configure_limiter(self) -> None:
        limiter = limiter_for(
            self.config.normalized_base_url, self.config.credentials.identity, self.clock
        )
        limiter.configure(
            sample_dispatch_bytes=self.server.sample_dispatch_bytes_semaphore_size,
            fwdbwd_dispatch_bytes=self.server.fwdbwd_dispatch_bytes_semaphore_size,
            inflight_response_bytes=self.server.inflight_response_bytes_semaphore_size,
        )
        limiter.tenant.configure(self.config.health)
        limiter.add_user()
        self._limiter = limiter
        self.health.tenant = limiter.tenant

    def _create_session(self) -> None:
        body: dict[str, Any] = {
            "tags": list(self.config.tags),
            "user_metadata": self.user_metadata or {},
            "sdk_version": PROTOCOL_VERSION,
            "type": "create_session",
        }
        if self.config.project_id:
            body["project_id"] = self.config.project_id
        if self.display_name:
            body["display_name"] = self.display_name
        assert self._transport is not None
        reply = send_with_retries(
            self._transport,
            RequestSpec(
                method="POST",
                path="/api/v1/create_session",
                pool=Pool.SESSION,
                json=body,
                sdk_method=None,
            ),
        )
        data = _json_object(reply)
        session_id = data.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            from tinker_sync.exceptions import APIResponseValidationError

            raise APIResponseValidationError(
                "create_session answered without a session_id", response=reply.snapshot()
            )
        self.session_id = session_id
        for key, level in (
            ("info_message", logging.INFO),
            ("warning_message", logging.WARNING),
            ("error_message", logging.ERROR),
        ):
            message = data.get(key)
            if isinstance(message, str) and message:
                log.log(level, "%s", message)
        log.info("session %s created", session_id, extra={"session_id": session_id})

    def _fetch_dynamic_config(self, *, initial: bool) -> DynamicConfig | None:
        assert self._transport is not None
        spec = RequestSpec(
            method="POST",
            path="/api/v1/client/dynamic_config",
            pool=Pool.SESSION,
            json={"sdk_version": PROTOCOL_VERSION},
            timeout=SHORT_TIMEOUT,
            max_retries=0,
            sdk_method=None,
        )
        try:
            reply = (
                self._loop(self._transport, spec)
                if initial
                else (send_with_retries(self._transport, spec, max_retries=0))
            )
        except NotFoundError:
            return DynamicConfig()
        except Exception:
            if initial:
                raise
            log.debug("dynamic config refresh failed; keeping the last good value", exc_info=True)
            return None
        return DynamicConfig.from_dict(_json_object(reply))

    # ---------------------------------------------------------------- requests

    def _loop(self, transport: Transport, spec: RequestSpec) -> Reply:
        return self.retry_loop(
            lambda: send_with_retries(transport, spec), f"{spec.method} {spec.path}"
        )

    def retry_loop(
        self,
        fn: Callable[[], T],
        what: str,
        stop: Callable[[], BaseException | None] | None = None,
    ) -> T:
        """``fn()`` inside the submission loop, bounded by this client's knobs.

        ``max_retries=0`` retries nothing here; a server that never answered gets only the
        HTTP layer's retries; otherwise retries last until ``stall_timeout`` passes without a
        useful answer (then StalledError naming ``what``); ``stop()`` may end it sooner.
        """
        return submission_loop(fn, retry=self.submission_retry(what, stop))

    def submission_retry(
        self, what: str, stop: Callable[[], BaseException | None] | None = None
    ) -> SubmissionRetry:
        """The submission loop's decisions with this client's knobs (see :meth:`retry_loop`)."""
        return SubmissionRetry(
            clock=self.clock,
            billing=self.billing,
            hooks=self.hooks,
            max_retries=self.config.max_retries,
            stall_timeout=self.config.stall_timeout,
            reached=lambda: self.health.reached,
            what=what,
            stop=stop,
            # close() never waits for the circuit: its one finish request goes out at once.
            tenant=self._limiter.tenant
            if self._limiter is not None and not self.health.closing
            else None,
            fail_fast=self.config.health.fail_fast,
            closed=self._closed_error,
            policy=self.config.health,
        )

    def _closed_error(self) -> BaseException | None:
        if not self._closed:
            return None
        return ClientClosedError("the client was closed while this request was pending")

    def request(self, spec: RequestSpec, *, loop: bool = True, hedge: bool = False) -> Reply:
        """Send ``spec``: HTTP retries, inside the submission loop unless ``loop=False``.

        ``hedge=True`` (only for requests the server deduplicates, see ``_flow.hedge``) races a
        second copy against a slow attempt while the network is lossy.
        """
        self.ensure_started()
        self.check_open()
        transport = self._transport
        assert transport is not None
        send = self.hedged_send(transport) if hedge else None
        tenant = self._limiter.tenant if self._limiter is not None else None
        if not loop:
            # No submission loop, but the tenant's circuit still parks (or fails fast) it; and
            # a failure whose HTTP retry the open circuit refused waits for the probe here and
            # is sent again, as in the loop (bounded by stall_timeout: docs/health.md).
            gate = self.submission_retry(f"{spec.method} {spec.path}")
            while True:
                gate.gate()
                try:
                    return send_with_retries(transport, spec, send=send, tenant=tenant)
                except Exception as exc:
                    if tenant is None or not classify(exc).retryable or not tenant.is_open():
                        raise
        return self.retry_loop(
            lambda: send_with_retries(transport, spec, send=send, tenant=tenant),
            f"{spec.method} {spec.path}",
        )

    def hedged_send(self, transport: Transport) -> Callable[[RequestSpec, int], Reply]:
        """A ``send_once`` replacement that hedges slow attempts (see :mod:`tinker_sync._flow.hedge`).

        For submissions (training sends, ``asample``), whose acceptance replies are quick: a
        kind of request with too few latencies known yet is hedged after ``COLD_DELAY_S``, and
        a copy reads for at most ``COPY_READ_S`` (one never answered gives way to the next)."""
        hedger = self.hedger
        default_timeout = self.config.timeout

        def send(spec: RequestSpec, attempt: int) -> Reply:
            timeout = spec.timeout if spec.timeout is not None else default_timeout
            read = timeout.read

            def copy() -> Reply:
                short = read if read is not None and read <= COPY_READ_S else COPY_READ_S
                # The same request (content, idempotency key), read for at most COPY_READ_S.
                spec_copy = attrs.evolve(
                    spec,
                    json=None,
                    content=spec.content,
                    timeout=Timeout(short, connect=timeout.connect),
                )
                return transport.send_once(spec_copy, attempt)

            return hedger.run(
                spec.path,
                lambda: transport.send_once(spec, attempt),
                abort=lambda ident: transport.abort_threads([ident], (spec.pool,)),
                read_timeout=read,
                cold_delay=COLD_DELAY_S,
                copy=copy,
            )

        return send

    def next_counter(self, name: str) -> int:
        """Take the next value of a per-session counter (``model``, ``sampling``, ...)."""
        if self.in_forked_child():
            raise ForkedProcessError(
                f"this ServiceClient's session was started in process {self._pid}, before this "
                f"process ({os.getpid()}) was forked from it, so it cannot create training or "
                "sampling clients here. Create a new ServiceClient in the child, after the "
                "fork: e.g. service = tinker_sync.ServiceClient() in gunicorn's "
                "post_fork(server, worker) hook, a multiprocessing Pool initializer or the "
                "worker's first request (with gunicorn --preload, not at import time)"
            )
        with self._lock:
            value = self._counters[name]
            self._counters[name] = value + 1
            return value

    # ---------------------------------------------------------------- background loops

    def _spawn(self, role: str, target: Callable[[], None]) -> None:
        t = threading.Thread(
            target=target, name=f"tinker_sync-{role}-{self.session_id or 'rest'}", daemon=True
        )
        self._threads.append(t)
        t.start()

    def _heartbeat_loop(self) -> None:
        """Beat every 10 s on a monotonic schedule; warn after 120 s of failures (then at most
        once a minute); stop on 410."""
        assert self._transport is not None and self.session_id is not None
        spec = RequestSpec(
            method="POST",
            path="/api/v1/session_heartbeat",
            pool=Pool.SESSION,
            json={"session_id": self.session_id, "type": "session_heartbeat"},
            timeout=SHORT_TIMEOUT,
            max_retries=0,
            sdk_method=None,
        )
        last_ok = self.timer_clock.monotonic()
        last_warned = -math.inf  # the warning repeats at most once a minute
        next_beat = last_ok + HEARTBEAT_INTERVAL_S
        while True:
            remaining = next_beat - self.timer_clock.monotonic()
            if remaining > 0 and self.timer_clock.wait(self._stop, remaining):
                return
            if self._stop.is_set() or exiting():
                return
            next_beat += HEARTBEAT_INTERVAL_S
            try:
                reply = self._transport.send_once(spec)
            except Exception as exc:
                failure: str | None = type(exc).__name__
            else:
                if reply.status == 410:
                    log.info("session %s has finished (heartbeat answered 410)", self.session_id)
                    return
                failure = None if reply.status < 400 else f"HTTP {reply.status}"
            now = self.timer_clock.monotonic()
            if failure is None:
                last_ok = now
                last_warned = -math.inf
            elif now - last_ok > HEARTBEAT_WARN_AFTER_S and now - last_warned >= 60.0:
                last_warned = now
                log.warning(
                    "session %s: heartbeats have failed for %.0f s (%s); the server will end "
                    "the session if this persists",
                    self.session_id,
                    now - last_ok,
                    failure,
                )

    def wake_timer(self) -> None:
        """Make the timer loop run now (e.g. 100 telemetry events are queued)."""
        self._wake.set()

    def _tick_auth(self) -> float:
        """Drive the JWT background refresh (docs/design/behavior.md#jwt-auth); seconds until it
        wants the next tick."""
        transport = self._transport
        tick = getattr(transport.auth, "tick", None) if transport is not None else None
        if tick is None:
            return math.inf
        try:
            return float(tick())
        except Exception:  # tick() handles its own failures; never kill the timer loop
            log.debug("JWT refresh tick failed", exc_info=True)
            return 60.0

    def _timer_loop(self) -> None:
        """Dynamic config refresh, telemetry flushes and JWT refreshes."""
        next_refresh = self.timer_clock.monotonic() + self.dynamic.refresh_every
        while True:
            auth_in = self._tick_auth()
            now = self.timer_clock.monotonic()
            telemetry = self.telemetry
            flush_in = telemetry.next_flush_in() if telemetry is not None else 10.0
            timeout = max(0.0, min(next_refresh - now, flush_in, auth_in))
            self.timer_clock.wait(self._wake, timeout)
            self._wake.clear()
            if self._stop.is_set() or exiting():
                return
            now = self.timer_clock.monotonic()
            if now >= next_refresh:
                fresh = self._fetch_dynamic_config(initial=False)
                if fresh is not None:
                    self.dynamic = fresh
                next_refresh = self.timer_clock.monotonic() + self.dynamic.refresh_every
            if telemetry is not None and telemetry.next_flush_in() <= 0:
                telemetry.flush()

    # ---------------------------------------------------------------- close

    def close(self, status: str = "success", detail: str | None = None) -> BaseException | None:
        """Finish the session (if one was started), stop the loops, fail pending work.

        Returns why the server could not be told the session ended (logged once as a
        WARNING naming the server's URL), else None (docs/health.md#close-during-an-outage).
        """
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            listeners = list(self._close_listeners)
        # The tenant's state before close() stops reporting outcomes to it.
        circuit_open = self._limiter is not None and self._limiter.tenant.is_open()
        self.health.closing = True
        if self._transport is not None and not self.in_forked_child():
            # Polls held by the server would keep their sockets and threads until the hold
            # ends; they see the client closed as soon as their request fails.
            self._transport.abort_polls(self.poll_hold.threads())
        failure: BaseException | None = None
        try:
            if (
                self._started
                and self.session_id is not None
                and self._transport is not None
                and not self.in_forked_child()
            ):
                try:
                    self._finish(self._transport, status, detail, circuit_open)
                except NotFoundError:  # a server without the route (TuFT, older protocols)
                    log.info(
                        "server has no session finish endpoint; %s ends on its own", self.session_id
                    )
                except Exception as exc:
                    failure = exc
                    log.warning(
                        "could not tell the Tinker server at %s that session %s ended (%s); "
                        "it ends on its own when its heartbeats stop",
                        self.health.url,
                        self.session_id,
                        describe_failure(exc),
                    )
        finally:
            self._stop.set()
            self._wake.set()
            for fn in listeners:
                try:
                    fn()
                except Exception:
                    log.exception("error while closing")
            if self.telemetry is not None:
                self.telemetry.close()
            if self._limiter is not None:
                self._limiter.wake()
            if self._transport is not None and not self.in_forked_child():
                self._transport.close()
            self._join_background(CLOSE_JOIN_TIMEOUT_S)
            if self._started and not self.in_forked_child() and _count_open(-1) == 0:
                # The last client of this process is closed: idle pool workers and timers
                # exit now instead of lingering 30 s.
                from tinker_sync._runtime.executor import retire_idle_threads

                retire_idle_threads()
            if self._started and self._limiter is not None and not self.in_forked_child():
                self._limiter.remove_user()  # the last session of a tenant closes its file
        return failure

    def _finish(
        self, transport: Transport, status: str, detail: str | None, circuit_open: bool
    ) -> None:
        """close()'s ``sessions/{id}/finish``, bounded (docs/health.md#close-during-an-outage).

        At most :data:`CLOSE_ATTEMPTS` attempts (``max_retries + 1`` if fewer), each one's
        timeout and the waits between them inside :data:`CLOSE_BUDGET_S` seconds of the
        session clock; one attempt while the tenant's circuit is open or the interpreter
        exits. Never parked behind the circuit, never the submission loop. Raises the last
        failure.
        """
        clock = self.clock
        deadline = clock.monotonic() + CLOSE_BUDGET_S
        policy = self.config.health
        attempts = min(CLOSE_ATTEMPTS, self.config.max_retries + 1)
        if circuit_open or exiting():
            attempts = 1
        key = new_idempotency_key()
        configured = transport.config.timeout
        attempt = 0
        while True:
            left = max(deadline - clock.monotonic(), 0.001)
            spec = RequestSpec(
                method="POST",
                path=f"/api/v1/sessions/{self.session_id}/finish",
                pool=Pool.TRAIN,
                json={"reason": {"type": status}, "detail": detail},
                timeout=Timeout(
                    _cap(configured.read, left), connect=_cap(configured.connect, left)
                ),
                idempotency_key=key,
                max_retries=0,
                sdk_method=None,
            )
            try:
                reply = transport.send_once(spec, attempt)
            except Exception as exc:
                failure: Exception = exc
                retryable = classify(exc).retryable
                delay = http_backoff(attempt, clock.random, policy)
            else:
                if reply.status < 400:
                    return
                failure = error_from_reply(reply)
                retryable = should_retry(reply)
                delay = retry_delay(reply.headers, attempt, clock, policy)
            attempt += 1
            if (
                not retryable
                or attempt >= attempts
                or exiting()
                or clock.monotonic() + delay >= deadline
            ):
                raise failure
            clock.sleep(delay, "close-retry")

    def _join_background(self, timeout: float) -> None:
        """Wait (bounded) for the heartbeat, timer and clients' threads to notice the stop and exit.

        A loop may be inside one last short HTTP call (10 s timeout at most); close() returns
        once it is done, so a closed client leaves no thread behind.
        """
        if self.in_forked_child():
            return
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        for thread in list(self._threads):
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
        for join in list(self._joiners):
            join(max(0.0, deadline - time.monotonic()))


def _cap(part: float | None, left: float) -> float:
    """A timeout part (None: no limit) cut to the ``left`` seconds of a budget."""
    return left if part is None else min(part, left)


def _json_object(reply: Reply) -> dict[str, Any]:
    data = reply.json()
    if not isinstance(data, dict):
        from tinker_sync.exceptions import APIResponseValidationError

        raise APIResponseValidationError(
            f"{reply.method} {reply.url}: expected a JSON object", response=reply.snapshot()
        )
    return data
