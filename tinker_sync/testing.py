"""pytest plugin: a local Tinker server, clients and a virtual backoff clock for your tests.

Usage (opt-in; nothing loads automatically; tests/test_testing_plugin.py runs these examples)::

    # conftest.py
    pytest_plugins = ["tinker_sync.testing"]

    # test_training.py
    import pytest

    from tinker_sync import types

    PROMPT = types.ModelInput.from_ints([1, 2, 3])


    def test_train(tinker_service_client):             # bound to a fresh LocalServer
        tc = tinker_service_client.create_lora_training_client("tinker-sync/tiny", rank=4)
        datum = types.Datum(model_input=PROMPT, loss_fn_inputs={"target_tokens": [2, 3, 4]})
        tc.forward_backward([datum], "cross_entropy").result(timeout=60)
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)


    @pytest.mark.tinker_server(faults=["get_server_capabilities 503 x2"])
    def test_http_retries(tinker_server, tinker_service_client, tinker_sleeps):
        tinker_service_client.get_server_capabilities()   # TINKER_BASE_URL/_API_KEY point at it
        assert tinker_sleeps.delays("http-retry") == [0.5, 1.0]


    @pytest.mark.tinker_server(backend="tiny", faults=["asample 429 x2"])
    def test_sampling_backoff(tinker_service_client, tinker_sleeps, tinker_faults):
        sampler = tinker_service_client.create_sampling_client(base_model="tinker-sync/tiny")
        sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=4)).result(timeout=60)
        # each 429 sets the shared sampling backoff (1 s without Retry-After); the wait is
        # what remains of it when the SDK's timer runs, so a little under 1 s
        assert tinker_sleeps.delays("backoff-wait") == pytest.approx([1.0, 1.0], abs=0.5)
        tinker_faults.assert_exhausted()

What each wait is recorded as: HTTP retries of a request (``"http-retry"``); a sample's
backoff after a 429 or a retried failure, which waits on the SDK's timer (``"backoff-wait"``,
the remaining time to the deadline); the pauses between polls of a pending result
(``"poll:<why>"``, e.g. ``"poll:try_again"``). Backoff deadlines and the sampling stall
deadline (``RetryConfig.progress_timeout``) both run on the virtual clock, so every fault kind
of the local server works under ``tinker_sleeps``.

Which waits are virtual: only those the clock alone ends (backoff and retry sleeps, poll
pauses, the SDK's timer waiting for a backoff deadline). Waits that real time or real work
ends stay real: an HTTP exchange and its attempt deadline, a hedge's delay (measured from real
latencies), the background loops. A backoff published by another of your processes (a
wall-clock record) is honoured once, as one virtual wait. So virtual time is the sum of the
delays the SDK asked for and never runs on while a request waits for something real.

Fixtures (function scope): ``tinker_server`` (a started ``LocalServer``, ``instant`` backend
unless the ``tinker_server`` marker says otherwise; its URL and key are patched into the
environment), ``tinker_server_factory`` (``(**LocalServer kwargs) -> LocalServer``, all stopped
at teardown), ``tinker_service_client`` (a ``ServiceClient`` bound to ``tinker_server``, closed
at teardown), ``tinker_faults`` (``tinker_server.faults``), ``tinker_sleeps`` (a
:class:`VirtualSleepClock` standing in for the SDK clock). Teardown of each calls
:func:`reset_process_state`.

Thread safety: fixtures are per test; :class:`VirtualSleepClock` is thread-safe.
Fork safety: not designed for use across fork.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from tinker_sync._runtime.clock import REAL_CLOCK, SYSTEM_CLOCK, FakeClock, Waitable

if TYPE_CHECKING:
    from tinker_sync.local import FaultPlan, LocalServer
    from tinker_sync.service_client import ServiceClient

__all__ = [
    "Sleep",
    "VirtualSleepClock",
    "reset_process_state",
    "tinker_faults",
    "tinker_server",
    "tinker_server_factory",
    "tinker_service_client",
    "tinker_sleeps",
]

_MARKER_HELP = (
    "tinker_server(backend='instant', faults=None, client_config=None, **LocalServer kwargs): "
    "configure the tinker_server fixture (tinker_sync.testing)"
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``tinker_server`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line("markers", _MARKER_HELP)


def reset_process_state() -> None:
    """Close the shared HTTP pools, forget rate limiters and cached tokenizers.

    Call it between tests that must not share process-wide SDK state.
    """
    from tinker_sync._flow.limiter import reset_limiters
    from tinker_sync._transport import close_all_pools

    close_all_pools()
    reset_limiters()
    tokenizer = sys.modules.get("tinker_sync.tokenizer")
    reset = getattr(tokenizer, "_reset_tokenizer_cache", None)
    if callable(reset):
        reset()


class Sleep(NamedTuple):
    """One requested delay: ``seconds`` and the SDK's ``reason`` (``"http-retry"``, ...).

    Thread safety: immutable. Fork safety: plain data.
    """

    seconds: float
    reason: str


class VirtualSleepClock:
    """A clock whose backoff sleeps are recorded and return at once.

    Usage (without the ``tinker_sleeps`` fixture)::

        # test_clock.py
        import tinker_sync
        from tinker_sync.testing import VirtualSleepClock


        def test_virtual_clock(tinker_server, tinker_faults):
            clock = VirtualSleepClock()
            tinker_faults.add("get_server_capabilities 503 x2")
            with tinker_sync.ServiceClient(_clock=clock) as client:
                client.get_server_capabilities()
            assert clock.delays("http-retry") == [0.5, 1.0]

    * ``sleep(seconds, reason)`` records a :class:`Sleep` and advances virtual time.
    * Timed waits on a ``threading.Condition`` (the shared sampling backoff) are virtual too:
      recorded with reason ``"backoff-wait"``; waits on an ``Event`` (heartbeat and timer
      loops) and untimed waits stay real, so background loops do not spin. Waits for a
      real-time deadline never reach this clock (the SDK makes them on real time).
    * ``monotonic()`` is real monotonic time plus the virtual time slept; ``time()`` is the
      real wall clock (HTTP-date ``Retry-After`` values stay exact).
    * ``random()`` is the jitter source: ``0.0`` by default, which makes every HTTP backoff
      its nominal value (0.5, 1, 2, ... s); change it with :meth:`set_jitter`.

    Thread safety: thread-safe. Fork safety: plain data.
    """

    def __init__(self, *, jitter: float | Callable[[], float] = 0.0) -> None:
        self._jitter: Callable[[], float] = _as_source(jitter)
        self._fake = FakeClock(monotonic=0.0, rng=self._draw)

    def _draw(self) -> float:
        return self._jitter()

    # -- Clock protocol ----------------------------------------------------------------------
    def monotonic(self) -> float:
        return time.monotonic() + self._fake.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float, reason: str = "") -> None:
        self._fake.sleep(max(float(seconds), 0.0), reason)

    def wait(self, cond: Waitable, timeout: float | None) -> bool:
        if timeout is None or isinstance(cond, threading.Event):
            return REAL_CLOCK.wait(cond, timeout)
        if cond.wait(0):
            return True
        self._fake.sleep(max(float(timeout), 0.0), "backoff-wait")
        return False

    def random(self) -> float:
        return self._fake.random()

    # -- records -----------------------------------------------------------------------------
    @property
    def clock(self) -> VirtualSleepClock:
        """This object (it is the clock to inject, e.g. ``ServiceClient(_clock=...)``)."""
        return self

    @property
    def sleeps(self) -> list[Sleep]:
        """Every recorded delay, in order."""
        return [Sleep(s, r) for s, r in self._fake.sleeps]

    def delays(self, reason: str | None = None) -> list[float]:
        """The recorded seconds, optionally only those with ``reason``."""
        return [s.seconds for s in self.sleeps if reason is None or s.reason == reason]

    @property
    def total(self) -> float:
        """Virtual seconds slept so far."""
        return sum(self.delays())

    def set_jitter(self, jitter: float | Callable[[], float]) -> None:
        """Set the jitter source: a constant in [0, 1) or a callable returning one."""
        self._jitter = _as_source(jitter)

    def clear(self) -> None:
        """Forget the recorded delays (virtual time keeps its value)."""
        self._fake.clear()

    def __len__(self) -> int:
        return len(self._fake.sleeps)

    def __iter__(self) -> Iterator[Sleep]:
        return iter(self.sleeps)

    def __getitem__(self, index: int) -> Sleep:
        return self.sleeps[index]

    def __repr__(self) -> str:
        return f"<VirtualSleepClock sleeps={len(self)} total={self.total:.3f}s>"


def _as_source(jitter: float | Callable[[], float]) -> Callable[[], float]:
    if callable(jitter):
        return jitter
    value = float(jitter)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {value}")
    return lambda: value


# --------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tinker_server_factory() -> Iterator[Callable[..., LocalServer]]:
    """``make(**LocalServer kwargs) -> LocalServer`` (started); every server stops at teardown."""
    from tinker_sync.local import LocalServer

    servers: list[LocalServer] = []

    def make(**kwargs: Any) -> LocalServer:
        server = LocalServer(**kwargs)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in reversed(servers):
            server.stop()
        reset_process_state()


@pytest.fixture
def tinker_server(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tinker_server_factory: Callable[..., LocalServer],
) -> LocalServer:
    """A started ``LocalServer`` with ``TINKER_BASE_URL`` / ``TINKER_API_KEY`` patched in.

    Configure it with ``@pytest.mark.tinker_server(backend=..., faults=[...], ...)``.
    """
    kwargs: dict[str, Any] = {}
    marker = request.node.get_closest_marker("tinker_server")
    if marker is not None:
        if len(marker.args) > 1:
            raise pytest.UsageError("@pytest.mark.tinker_server takes only keyword arguments")
        if marker.args:
            kwargs["backend"] = marker.args[0]
        kwargs.update(marker.kwargs)
    kwargs.setdefault("backend", "instant")
    server = tinker_server_factory(**kwargs)
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return server


@pytest.fixture
def tinker_faults(tinker_server: LocalServer) -> FaultPlan:
    """The live fault plan of ``tinker_server`` (``add``, ``clear``, ``assert_exhausted``)."""
    return tinker_server.faults


@pytest.fixture
def tinker_sleeps() -> Iterator[VirtualSleepClock]:
    """A :class:`VirtualSleepClock` that also stands in for the SDK's default clock.

    Clients built in the test without an explicit clock use it too (``tinker_service_client``
    gets it explicitly), so their retry and backoff delays are recorded and take no time.
    """
    clock = VirtualSleepClock()
    names = ("monotonic", "time", "sleep", "wait", "random")
    shadowed = {name: vars(SYSTEM_CLOCK)[name] for name in names if name in vars(SYSTEM_CLOCK)}
    for name in names:
        setattr(SYSTEM_CLOCK, name, getattr(clock, name))
    try:
        yield clock
    finally:
        for name in names:
            if name in shadowed:
                setattr(SYSTEM_CLOCK, name, shadowed[name])
            else:
                delattr(SYSTEM_CLOCK, name)
        reset_process_state()


@pytest.fixture
def tinker_service_client(
    request: pytest.FixtureRequest, tinker_server: LocalServer
) -> Iterator[ServiceClient]:
    """A ``ServiceClient`` bound to ``tinker_server`` (virtual clock with ``tinker_sleeps``)."""
    from tinker_sync.service_client import ServiceClient

    if "tinker_sleeps" in request.fixturenames:
        clock: Any = request.getfixturevalue("tinker_sleeps")
    else:
        clock = SYSTEM_CLOCK
    client = ServiceClient(
        base_url=tinker_server.url, api_key=tinker_server.env["TINKER_API_KEY"], _clock=clock
    )
    try:
        yield client
    finally:
        client.close()
        reset_process_state()
