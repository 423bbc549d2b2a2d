"""Wait for a state, never for a duration: the one polling helper the tests share.

Usage::

    from waiting import until  # tests/waiting.py

    until(lambda: server.app.counts["asample"] == 3)   # AssertionError after the hang guard
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

HANG = 60.0
"""The hang guard: a state not reached by then is a failure, never a slow machine."""


def until(predicate: Callable[[], bool], timeout: float = HANG) -> None:
    """Return once ``predicate()`` is true; raise AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached within the hang guard"
        pause.wait(0.002)
