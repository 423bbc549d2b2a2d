"""Shared fixtures: a fresh LocalServer per test (own port, so own limiter key)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tinker_sync._flow.limiter import reset_limiters

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass
else:
    # CI replays the same examples every run (never flaky); locally each run explores new
    # ones. Registered here, before test modules build their own settings from the profile.
    _hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        _hypothesis_settings.load_profile("ci")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Full-size variants (minutes each) run only on request; their reduced twins always run."""
    if os.environ.get("TINKER_SYNC_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="full-size variant: set TINKER_SYNC_FULL=1 to run it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """No test sees the developer's Tinker credentials or telemetry settings.

    Shared backoff files go to a fresh directory per test (never the user's runtime dir, and
    no deadline leaks from one test into the next); subprocesses inherit it.
    """
    for name in list(os.environ):
        if name.startswith(("TINKER_", "CLOUDFLARE_ACCESS_")):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("TINKER_SYNC_RUNTIME_DIR", str(tmp_path_factory.mktemp("run")))
    monkeypatch.setenv("HOME", os.environ.get("TINKER_SYNC_TEST_HOME", "/nonexistent-home"))
    yield


@pytest.fixture(params=["direct", "urllib3"])
def transport_path(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Run a test on both request paths: the direct socket path (the default where eligible,
    ``_transport/_direct.py``) and urllib3's documented API (``TINKER_SYNC_TRANSPORT=urllib3``).
    Pools are rebuilt around the test, since they read the switch when created."""
    from tinker_sync._transport import close_all_pools

    if request.param == "urllib3":
        monkeypatch.setenv("TINKER_SYNC_TRANSPORT", "urllib3")
    close_all_pools()
    yield str(request.param)
    close_all_pools()


@pytest.fixture
def server() -> Iterator[object]:
    from tinker_sync.local import LocalServer

    with LocalServer(backend="instant", long_poll_s=2.0) as srv:
        yield srv
    reset_limiters()


@pytest.fixture
def service(server):  # type: ignore[no-untyped-def]
    import tinker_sync

    client = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
    yield client
    client.close()
