"""RestClient against a real LocalServer over loopback: every method, validation, retries,
idempotency of copy_weights, secrets, close, async aliases."""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import tinker_sync
from tinker_sync.exceptions import (
    APIResponseValidationError,
    ClientClosedError,
    MissingCredentialsError,
    NotFoundError,
    StalledError,
)
from tinker_sync.local import LocalServer
from tinker_sync.rest_client import RestClient
from tinker_sync.testing import VirtualSleepClock, reset_process_state
from tinker_sync.types import (
    CheckpointsListResponse,
    GetServerCapabilitiesResponse,
    TrainingRun,
    WhoamiResponse,
)

TIMEOUT = 30.0


class Seed:
    """Two training runs with checkpoints, created once for the module."""

    def __init__(self, server: LocalServer) -> None:
        self.server = server
        self.service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        first = self.service.create_lora_training_client("tinker-sync/tiny", rank=4)
        second = self.service.create_lora_training_client("tinker-sync/tiny", rank=2)
        self.run_id = first.model_id
        self.other_run_id = second.model_id
        self.weights = first.save_state("s1").result(TIMEOUT).path
        self.sampler = first.save_weights_for_sampler("w1").result(TIMEOUT).path
        self.external = first.save_weights_external("e1").result(TIMEOUT).path
        second.save_state("t1").result(TIMEOUT)
        self.training = first
        session_id = self.service._session.session_id
        assert session_id is not None
        self.session_id = session_id
        self.sampler_id = first.save_weights_and_get_sampling_client().sampler_id


@pytest.fixture(scope="module")
def seed() -> Iterator[Seed]:
    with LocalServer(backend="instant") as server:
        seeded = Seed(server)
        yield seeded
        seeded.service.close()
    reset_process_state()


@pytest.fixture
def server(seed: Seed) -> LocalServer:
    seed.server.faults.clear()
    return seed.server


@pytest.fixture
def clock() -> VirtualSleepClock:
    return VirtualSleepClock()


@pytest.fixture
def rest(server: LocalServer, clock: VirtualSleepClock) -> Iterator[RestClient]:
    client = RestClient(base_url=server.url, api_key=server.api_key, _clock=clock)
    yield client
    client.close()


def requests_since(server: LocalServer, before: int, endpoint: str | None = None) -> list[Any]:
    entries = server.requests.all()[before:]
    return [e for e in entries if endpoint is None or e.endpoint == endpoint]


def new_checkpoint(seed: Seed, name: str) -> str:
    return seed.training.save_state(name).result(TIMEOUT).path


# -- construction ---------------------------------------------------------------------------


def test_construction_sends_nothing_and_credentials_resolve_late(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("TINKER_CREDENTIAL_CMD", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    before = len(server.requests)
    client = RestClient(base_url=server.url)
    assert len(server.requests) == before
    fut = client.get_server_capabilities()
    assert isinstance(fut.exception(TIMEOUT), MissingCredentialsError)
    assert len(server.requests) == before
    client.close()


def test_repr_is_secret_free_and_pickling_refused(rest: RestClient, server: LocalServer) -> None:
    assert server.url in repr(rest)
    assert str(server.api_key) not in repr(rest)
    with pytest.raises(TypeError):
        pickle.dumps(rest)


# -- reads ----------------------------------------------------------------------------------


def test_get_server_capabilities_and_sdk_method_header(
    rest: RestClient, server: LocalServer
) -> None:
    before = len(server.requests)
    caps = rest.get_server_capabilities().result(TIMEOUT)
    assert isinstance(caps, GetServerCapabilitiesResponse)
    assert "tinker-sync/tiny" in [m.model_name for m in caps.supported_models]
    (entry,) = requests_since(server, before, "get_server_capabilities")
    assert entry.method == "GET"
    assert entry.headers["x-sdk-method"] == "RestClient.get_server_capabilities"


def test_training_run_lookups(rest: RestClient, seed: Seed, server: LocalServer) -> None:
    before = len(server.requests)
    run = rest.get_training_run(seed.run_id).result(TIMEOUT)
    assert isinstance(run, TrainingRun)
    assert run.training_run_id == seed.run_id and run.lora_rank == 4
    assert run.last_checkpoint is not None
    by_path = rest.get_training_run_by_tinker_path(seed.weights, "accessible").result(TIMEOUT)
    assert by_path.training_run_id == seed.run_id
    scopes = [
        e.query.get("access_scope")
        for e in requests_since(server, before)
        if e.path.startswith("/api/v1/training_runs/")
    ]
    assert scopes == ["owned", "accessible"]


def test_argument_errors_are_synchronous_and_send_nothing(
    rest: RestClient, server: LocalServer
) -> None:
    before = len(server.requests)
    with pytest.raises(ValueError, match="tinker://"):
        rest.get_training_run_by_tinker_path("run-1/weights/x")
    with pytest.raises(ValueError, match="access_scope"):
        rest.get_training_run("run", "everyone")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="training_run_id"):
        rest.get_training_run(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        rest.list_training_runs(limit=-1)
    with pytest.raises(TypeError, match="offset"):
        rest.list_user_checkpoints(offset=True)
    with pytest.raises(ValueError, match="external"):
        rest.get_external_weights_urls("tinker://run/weights/x")
    with pytest.raises(ValueError, match="checkpoint_id"):
        rest.delete_checkpoint("run", "step1")
    with pytest.raises(ValueError, match="ttl_seconds"):
        rest.set_checkpoint_ttl_from_tinker_path("tinker://run/weights/x", 0)
    with pytest.raises(ValueError, match="page_size"):
        rest.iter_training_runs(page_size=0)
    assert len(server.requests) == before


def test_weights_info(rest: RestClient, seed: Seed, server: LocalServer) -> None:
    before = len(server.requests)
    info = rest.get_weights_info_by_tinker_path(seed.weights).result(TIMEOUT)
    assert info.base_model == "tinker-sync/tiny" and info.lora_rank == 4 and info.is_lora
    (entry,) = requests_since(server, before, "weights_info")
    assert entry.json == {"tinker_path": seed.weights}


def test_list_training_runs_sends_project_only_when_given(
    rest: RestClient, seed: Seed, server: LocalServer
) -> None:
    before = len(server.requests)
    page = rest.list_training_runs(limit=1, offset=0).result(TIMEOUT)
    assert len(page.training_runs) == 1 and page.cursor.total_count >= 2
    rest.list_training_runs(limit=5, offset=1, project_id="proj-x").result(TIMEOUT)
    first, second = requests_since(server, before, "training_runs")
    assert first.query == {"limit": "1", "offset": "0", "access_scope": "owned"}
    assert second.query["project_id"] == "proj-x" and second.query["offset"] == "1"


def test_iter_training_runs_follows_total_count(
    rest: RestClient, seed: Seed, server: LocalServer
) -> None:
    total = rest.list_training_runs(limit=1).result(TIMEOUT).cursor.total_count
    before = len(server.requests)
    ids = [r.training_run_id for r in rest.iter_training_runs(page_size=1)]
    assert len(ids) == total == len(set(ids))
    assert {seed.run_id, seed.other_run_id} <= set(ids)
    # exactly one request per page: the last full page stops on total_count
    assert len(requests_since(server, before, "training_runs")) == total


def test_checkpoint_listings(rest: RestClient, seed: Seed) -> None:
    listing = rest.list_checkpoints(seed.run_id).result(TIMEOUT)
    assert isinstance(listing, CheckpointsListResponse)
    kinds = {c.checkpoint_type for c in listing.checkpoints}
    assert {"training", "sampler", "external"} <= kinds
    page = rest.list_user_checkpoints(limit=2).result(TIMEOUT)
    assert len(page.checkpoints) == 2 and page.cursor is not None
    everything = list(rest.iter_user_checkpoints(page_size=2))
    assert len(everything) == page.cursor.total_count
    assert {seed.weights, seed.sampler, seed.external} <= {c.tinker_path for c in everything}


def test_external_weights_urls_are_fetchable(rest: RestClient, seed: Seed) -> None:
    import requests

    urls = rest.get_external_weights_urls(seed.external).result(TIMEOUT)
    assert urls.urls and urls.expires.tzinfo is not None
    for url in urls.urls.values():
        reply = requests.get(url, timeout=10)
        assert reply.status_code == 200 and reply.content


def test_not_found_is_not_retried(rest: RestClient, server: LocalServer, clock: Any) -> None:
    before = len(server.requests)
    fut = rest.get_training_run("no-such-run")
    with pytest.raises(NotFoundError):
        fut.result(TIMEOUT)
    assert len(requests_since(server, before, "training_runs/no-such-run")) == 1
    assert clock.sleeps == []


def test_bad_reply_is_a_validation_error(rest: RestClient, server: LocalServer) -> None:
    server.faults.add({"endpoint": "get_server_capabilities", "status": 200, "body": {"models": 3}})
    with pytest.raises(APIResponseValidationError):
        rest.get_server_capabilities().result(TIMEOUT)


def test_http_retries_use_the_client_clock(
    rest: RestClient, server: LocalServer, clock: VirtualSleepClock
) -> None:
    server.faults.add("get_server_capabilities 503 x2")
    rest.get_server_capabilities().result(TIMEOUT)
    assert clock.delays("http-retry") == [0.5, 1.0]


def test_stall_timeout_bounds_a_call_answered_503_forever(
    server: LocalServer, clock: VirtualSleepClock
) -> None:
    """A RestClient built on its own takes ``stall_timeout`` as a ServiceClient does: a call
    that gets no useful answer fails with StalledError after that long (not the default 600 s),
    keeping the last status."""
    server.faults.add("get_server_capabilities 503 x* body='restarting'")
    start = clock.monotonic()
    with RestClient(
        base_url=server.url, api_key=server.api_key, stall_timeout=100.0, _clock=clock
    ) as rest:
        with pytest.raises(StalledError) as info:
            rest.get_server_capabilities().result(TIMEOUT)
    # checked between rounds of HTTP retries (about 65 s each), so well before 600 s
    assert 100.0 <= clock.monotonic() - start < 200.0
    assert "HTTP 503" in str(info.value) and "restarting" in str(info.value)


# -- writes ---------------------------------------------------------------------------------


def test_delete_checkpoint_quotes_multi_segment_ids(
    rest: RestClient, seed: Seed, server: LocalServer
) -> None:
    spaced = new_checkpoint(seed, "ck 1")
    plain = new_checkpoint(seed, "ck2")
    before = len(server.requests)
    rest.delete_checkpoint(seed.run_id, "weights/ck 1").result(TIMEOUT)
    rest.delete_checkpoint_from_tinker_path(plain).result(TIMEOUT)
    deletes = [e for e in requests_since(server, before) if e.method == "DELETE"]
    assert [e.path for e in deletes] == [
        f"/api/v1/training_runs/{seed.run_id}/checkpoints/weights/ck 1",
        f"/api/v1/training_runs/{seed.run_id}/checkpoints/weights/ck2",
    ]
    remaining = {c.tinker_path for c in rest.list_checkpoints(seed.run_id).result().checkpoints}
    assert spaced not in remaining and plain not in remaining


def test_publish_unpublish_and_ttl(rest: RestClient, seed: Seed, server: LocalServer) -> None:
    path = new_checkpoint(seed, "pub")

    def current() -> Any:
        listing = rest.list_checkpoints(seed.run_id).result(TIMEOUT).checkpoints
        return next(c for c in listing if c.tinker_path == path)

    rest.publish_checkpoint_from_tinker_path(path).result(TIMEOUT)
    assert current().public is True
    rest.unpublish_checkpoint_from_tinker_path(path).result(TIMEOUT)
    assert current().public is False
    before = len(server.requests)
    rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result(TIMEOUT)
    assert current().expires_at is not None
    rest.set_checkpoint_ttl_from_tinker_path(path, None).result(TIMEOUT)
    assert current().expires_at is None
    bodies = [e.json for e in requests_since(server, before) if e.method == "PUT"]
    assert bodies == [{"ttl_seconds": 7200}, {"ttl_seconds": None}]
    rest.delete_checkpoint_from_tinker_path(path).result(TIMEOUT)


def test_copy_weights_destination_is_read_at_call_time(
    rest: RestClient, seed: Seed, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TINKER_PROJECT_ID", raising=False)
    before = len(server.requests)
    with pytest.raises(ValueError, match="TINKER_PROJECT_ID"):
        rest.copy_weights(seed.weights)
    assert len(server.requests) == before
    monkeypatch.setenv("TINKER_PROJECT_ID", "proj-env")
    new_path = rest.copy_weights(seed.weights, ttl_seconds=3600).result(TIMEOUT)
    assert new_path.startswith("tinker://") and new_path != seed.weights
    (entry,) = requests_since(server, before, "copy_weights")
    assert entry.json == {
        "destination_project_id": "proj-env",
        "source_path": seed.weights,
        "ttl_seconds": 3600,
    }


def test_copy_weights_reuses_one_idempotency_key_across_retries(
    rest: RestClient,
    seed: Seed,
    server: LocalServer,
    clock: VirtualSleepClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = uuid.UUID("12345678-1234-4234-8234-1234567890ab")
    import tinker_sync.rest_client as rest_module

    class FixedUuid:
        @staticmethod
        def uuid4() -> uuid.UUID:
            return key

    monkeypatch.setattr(rest_module, "uuid", FixedUuid)
    token = "weights-token-" + uuid.uuid4().hex
    # Only requests carrying exactly this key fail: a retry with a new key would get through.
    server.faults.add(
        {
            "endpoint": "copy_weights",
            "status": 500,
            "times": 2,
            "match": {"header:x-idempotency-key": str(key)},
            "name": "keyed-500",
        }
    )
    before = len(server.requests)
    with caplog.at_level(logging.DEBUG, logger="tinker_sync"):
        new_path = rest.copy_weights(seed.weights, "proj-a", weights_access_token=token).result(
            TIMEOUT
        )
    entries = requests_since(server, before, "copy_weights")
    assert [e.status for e in entries] == [500, 500, 200]
    assert [e.fault for e in entries] == ["keyed-500", "keyed-500", None]
    for entry in entries:
        assert entry.headers["x-tinker-weights-access-token"] == "<redacted>"
        assert "weights_access_token" not in entry.json
        assert token not in str(entry.json)
        assert entry.headers["x-sdk-method"] == "RestClient.copy_weights"
    assert clock.delays("http-retry") == [0.5, 1.0]
    assert token not in caplog.text
    assert new_path.startswith("tinker://")


def test_copy_weights_lost_reply_makes_a_single_copy(
    rest: RestClient, seed: Seed, server: LocalServer
) -> None:
    before_runs = rest.list_training_runs(limit=1).result(TIMEOUT).cursor.total_count
    server.faults.add("copy_weights drop-after x1")
    before = len(server.requests)
    new_path = rest.copy_weights(seed.weights, "proj-drop").result(TIMEOUT)
    entries = requests_since(server, before, "copy_weights")
    assert len(entries) == 2 and entries[0].dropped == "after"
    after_runs = rest.list_training_runs(limit=1).result(TIMEOUT).cursor.total_count
    assert after_runs == before_runs + 1  # the retry was deduplicated by its key
    assert new_path.startswith("tinker://copy-")


def test_outermost_sdk_method_wins(seed: Seed, server: LocalServer) -> None:
    before = len(server.requests)
    service = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, project_id="proj-svc"
    )
    try:
        service.copy_weights(seed.weights).result(TIMEOUT)
    finally:
        service.close()
    (entry,) = requests_since(server, before, "copy_weights")
    assert entry.headers["x-sdk-method"] == "ServiceClient.copy_weights"
    assert entry.json["destination_project_id"] == "proj-svc"


# -- sessions, samplers, traces --------------------------------------------------------------


def test_sessions_and_samplers(rest: RestClient, seed: Seed, server: LocalServer) -> None:
    session = rest.get_session(seed.session_id).result(TIMEOUT)
    assert seed.run_id in session.training_run_ids
    assert seed.sampler_id in session.sampler_ids
    listed = rest.list_sessions(limit=100).result(TIMEOUT)
    assert seed.session_id in listed.sessions
    sampler = rest.get_sampler(seed.sampler_id).result(TIMEOUT)
    assert sampler.base_model == "tinker-sync/tiny"
    before = len(server.requests)
    rest.assign_session_project(seed.session_id, "proj-9").result(TIMEOUT)
    (entry,) = requests_since(server, before)
    assert entry.method == "PUT" and entry.json == {"project_id": "proj-9"}
    assert entry.path == f"/api/v1/sessions/{seed.session_id}/project"


def test_export_session_trace_polls_every_five_seconds(
    rest: RestClient, seed: Seed, server: LocalServer, clock: VirtualSleepClock
) -> None:
    server.faults.add(
        {
            "endpoint": "sessions/*/trace_export",
            "status": 200,
            "body": {"status": "pending"},
            "times": 2,
        }
    )
    url = rest.export_session_trace(seed.session_id).result(TIMEOUT)
    assert url.startswith(server.url)
    assert clock.delays("trace-export-poll") == [5.0, 5.0]


def test_export_session_trace_failure_is_a_runtime_error(
    rest: RestClient, seed: Seed, server: LocalServer
) -> None:
    server.faults.add(
        {
            "endpoint": "sessions/*/trace_export",
            "status": 200,
            "body": {"status": "failed", "error": "disk full"},
        }
    )
    with pytest.raises(RuntimeError, match="disk full"):
        rest.export_session_trace(seed.session_id).result(TIMEOUT)


def test_whoami_with_plain_key_fails(rest: RestClient) -> None:
    with pytest.raises(RuntimeError, match="JWT"):
        rest.whoami().result(TIMEOUT)


def test_whoami_reads_jwt_claims() -> None:
    with LocalServer(backend="instant", client_config={"pjwt_auth_enabled": True}) as server:
        with RestClient(base_url=server.url, api_key=server.api_key) as rest:
            who = rest.whoami().result(TIMEOUT)
            assert isinstance(who, WhoamiResponse)
            assert who.user_urn == "tml:user:local"
            assert who.org_urn == "tml:organization:local"
            assert who.email == "local@tinker-sync.invalid"
            assert server.requests.count("auth/token") == 1
            jwt = rest._session.transport.auth.token()  # type: ignore[union-attr]
        # A Tinker-issued JWT given as the key works without JWT auth on the server too.
        server.set_client_config(pjwt_auth_enabled=False)
        with RestClient(base_url=server.url, api_key=jwt) as rest:
            assert rest.whoami().result(TIMEOUT).user_urn == "tml:user:local"
    reset_process_state()


# -- lifecycle, async -------------------------------------------------------------------------


def test_close_fails_pending_and_later_calls(server: LocalServer) -> None:
    client = RestClient(base_url=server.url, api_key=server.api_key)
    server.faults.add("get_server_capabilities delay=0.3")
    fut = client.get_server_capabilities()
    client.close()
    assert isinstance(fut.exception(TIMEOUT), ClientClosedError)
    with pytest.raises(ClientClosedError):
        client.list_sessions()
    client.close()  # idempotent


def test_context_manager_closes(server: LocalServer) -> None:
    with RestClient(base_url=server.url, api_key=server.api_key) as client:
        assert client.list_sessions().result(TIMEOUT).sessions
    assert client.closed
    with pytest.raises(ClientClosedError):
        client.get_server_capabilities()


def test_async_aliases_resolve_to_values(rest: RestClient, seed: Seed) -> None:
    async def go() -> tuple[Any, Any, Any]:
        caps = await rest.get_server_capabilities_async()
        run = await rest.get_training_run_async(seed.run_id)
        listing = await rest.list_checkpoints_async(seed.run_id)
        return caps, run, listing

    caps, run, listing = asyncio.run(go())
    assert caps.supported_models and run.training_run_id == seed.run_id
    assert listing.checkpoints


def test_cancel_before_send_sends_nothing(rest: RestClient, server: LocalServer) -> None:
    from tinker_sync._runtime.executor import pool

    gate = threading.Event()
    started = threading.Event()
    rest_pool = pool("rest")

    def blocker() -> None:
        started.set()
        gate.wait(TIMEOUT)

    blockers = rest_pool.max_workers
    for _ in range(blockers):
        rest_pool.submit(blocker)
    try:
        assert started.wait(TIMEOUT)
        before = len(server.requests)
        fut = rest.get_server_capabilities()
        assert fut.cancel()
    finally:
        gate.set()
    assert fut.cancelled()
    # the pool drains; the cancelled job never sends
    rest.list_sessions().result(TIMEOUT)
    assert requests_since(server, before, "get_server_capabilities") == []


def test_constructor_knobs_reach_the_wire(server: LocalServer) -> None:
    before = len(server.requests)
    with RestClient(
        base_url=server.url + "/",
        api_key=server.api_key,
        timeout=7.5,
        default_headers_overrides={"X-Custom-Header": "hello"},
    ) as client:
        client.list_sessions().result(TIMEOUT)
    (entry,) = requests_since(server, before, "sessions")
    assert entry.headers["x-custom-header"] == "hello"
    assert entry.headers["x-stainless-read-timeout"] == "7.5"
