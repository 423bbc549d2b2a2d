"""The telemetry reporter never makes the session timer loop spin (regression: P5 CPU burn)."""

from __future__ import annotations

import threading

import pytest

from tinker_sync._runtime.clock import FakeClock
from tinker_sync.local import LocalServer


class CountingClock(FakeClock):
    """Virtual time for the timer thread only; counts its wake-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.timer_waits = 0
        self.enough = threading.Event()

    def wait(self, cond, timeout):  # type: ignore[no-untyped-def]
        if "timer" not in threading.current_thread().name:
            return cond.wait(timeout)  # other loops wait for real
        self.timer_waits += 1
        if self.timer_waits >= 50:
            self.enough.set()
            return cond.wait(timeout)  # stop advancing: real wait from here on
        return super().wait(cond, timeout)


@pytest.mark.parametrize("telemetry_on", [False, True])
def test_timer_loop_sleeps_between_wakeups(monkeypatch, telemetry_on):
    monkeypatch.setenv("TINKER_TELEMETRY", "1" if telemetry_on else "0")
    from tinker_sync._config import ClientConfig
    from tinker_sync._session.state import Session

    with LocalServer() as server:
        clock = CountingClock()
        config = ClientConfig.from_env(base_url=server.url, api_key=server.api_key)
        session = Session(config, timer_clock=clock)
        session.ensure_started()
        assert clock.enough.wait(60)
        # 50 wake-ups must cover many minutes of virtual time: each wait was for a real
        # interval (flush every 10 s, refresh every 300 s), never a zero-length spin.
        positive = [t for t, name in clock.waits if "timer" in name and t is not None]
        assert len(positive) >= 40
        assert min(positive) > 0, "the timer loop asked for a zero-length wait"
        assert clock.monotonic() >= 40 * 9.0
        session.close()
