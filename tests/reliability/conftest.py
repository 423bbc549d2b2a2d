"""Fixtures for the reliability suite (fault matrix, soak, fork storm, bad input, secrets).

Every test here talks only to a ``tinker_sync.local.LocalServer`` on 127.0.0.1 that the test
owns (own port, hence own limiter key); the limiter registry is reset after each test. Shared
helpers live in ``reliability_helpers.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tinker_sync._flow.limiter import reset_limiters


@pytest.fixture(autouse=True)
def _reset_limiters_after() -> Iterator[None]:
    yield
    reset_limiters()
