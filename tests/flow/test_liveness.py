"""Liveness you can read (docs/health.md#liveness): each pending future's attempts, queue state
and the server's last answer with its time (``future.liveness()``, ``ServiceClient.pending()``),
and the tenant's health (``ServiceClient.health()``, ``PendingFuture.tenant``).

Against a real LocalServer with fault injection; waits are on states, never on durations.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from waiting import HANG, until  # tests/waiting.py

import tinker_sync
from tinker_sync import HealthPolicy, PendingFuture, TenantState, types
from tinker_sync._flow.breaker import TenantHealth
from tinker_sync._flow.health import tenant_state
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync._runtime.clock import FakeClock
from tinker_sync.local import Fault, LocalServer

BASE = "Qwen/Qwen3-8B"
PROMPT = types.ModelInput.from_ints([1, 2, 3, 4, 5])
PARAMS = types.SamplingParams(max_tokens=4)
FAST = HealthPolicy(probe_initial_s=0.05, probe_max_s=0.2, probe_jitter=0.5)
WALL = 1_700_000_000.0


def datum() -> types.Datum:
    tokens = np.arange(6, dtype=np.int64)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(5, np.float32)},
    )


@pytest.fixture
def server() -> Iterator[LocalServer]:
    srv = LocalServer(backend="instant", long_poll_s=0.2).start()
    yield srv
    srv.stop()
    reset_limiters()


def live(fut: tinker_sync.APIFuture[Any]) -> PendingFuture:
    info = fut.liveness()
    assert info is not None, "the future is done"
    return info


def test_a_paused_future_shows_its_queue_state_attempts_and_the_last_answer(
    server: LocalServer,
) -> None:
    """A training future on a paused server: its liveness (and its pending() entry) says the
    queue state, the polls so far and the server's last answer with its time; while polls get
    no answer (connections dropped), the last answer stays and its age grows."""
    clock = FakeClock(wall=WALL, rng=lambda: 0.0)
    service = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, stall_timeout=1e6, _clock=clock
    )
    try:
        training = service.create_lora_training_client("base", rank=4)
        server.pause("paused_rate_limit", "too many requests", kind="training")
        submitted = clock.time()
        fut = training.forward_backward([datum()], "cross_entropy")
        until(lambda: live(fut).queue_state == "paused_rate_limit")
        info = live(fut)
        assert info.kind == "ForwardBackward" and info.request_id == fut.request_id
        assert info.attempts >= 1 and info.last_status == "try_again"
        assert info.last_answer == "try_again"
        assert info.last_answer_at is not None and info.last_answer_age is not None
        assert submitted <= info.last_answer_at <= clock.time()
        assert info.last_answer_age >= 0.0
        assert info.tenant is not None and info.tenant.state == "closed"
        [entry] = service.pending()
        assert entry.request_id == fut.request_id and entry.queue_state == "paused_rate_limit"
        assert entry.last_answer == "try_again" and entry.last_answer_at is not None
        assert entry.tenant is not None and entry.tenant.state == "closed"
        assert entry.tenant.base_url == service.health().base_url == server.url.rstrip("/")

        server.faults.add("retrieve_future drop-before x*")  # polls get no answer at all
        until(lambda: live(fut).last_status not in (None, "try_again"))
        silent = live(fut)
        assert silent.last_answer == "try_again"  # a dropped connection is no answer
        answered_at = silent.last_answer_at
        assert answered_at is not None
        until(lambda: (live(fut).last_answer_age or 0.0) >= 5.0)  # the clock moves on
        later = live(fut)
        assert later.last_answer_at == answered_at and later.last_answer == "try_again"
        assert later.attempts > silent.attempts >= info.attempts
    finally:
        server.faults.clear()
        server.resume()
    try:
        fut.result(HANG)
        assert fut.liveness() is None  # done: nothing pending to describe
        assert service.pending() == []
    finally:
        service.close()


def test_a_5xx_answer_is_the_last_answer_with_the_servers_words(server: LocalServer) -> None:
    service = tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, health=FAST, stall_timeout=1e6
    )
    try:
        training = service.create_lora_training_client("base", rank=4)
        server.faults.add(
            "retrieve_future 500 x* match.request_type=OptimStep body='optimizer shard lost'"
        )
        fut = training.optim_step(types.AdamParams())
        until(lambda: live(fut).last_answer is not None)
        info = live(fut)
        assert info.last_answer == "HTTP 500: optimizer shard lost"
        assert info.last_status == "HTTP 500"
        server.faults.clear()
        fut.result(HANG)
    finally:
        server.faults.clear()
        service.close()


def test_a_sample_waiting_on_the_futures_poller_shows_the_pollers_last_answer() -> None:
    with LocalServer(
        backend="instant", long_poll_s=0.2, client_config={"sample_use_retrieve_futures": True}
    ) as srv:
        clock = FakeClock(wall=WALL, rng=lambda: 0.0)
        service = tinker_sync.ServiceClient(base_url=srv.url, api_key=srv.api_key, _clock=clock)
        try:
            sampler = service.create_sampling_client(base_model=BASE)
            srv.pause("paused_capacity", None, kind="sampling")
            submitted = clock.time()
            fut = sampler.sample(PROMPT, 1, PARAMS)
            until(lambda: live(fut).last_answer is not None)
            info = live(fut)
            assert info.kind == "Sample" and info.request_id == fut.request_id
            assert info.last_answer == "HTTP 200"
            assert info.last_answer_at is not None and submitted <= info.last_answer_at
            [entry] = service.pending()
            assert entry.request_id == fut.request_id and entry.last_answer == "HTTP 200"
            srv.resume()
            fut.result(HANG)
            assert fut.liveness() is None
        finally:
            srv.resume()
            service.close()
            reset_limiters()


def test_a_503_storm_shows_the_tenant_open_with_since_and_why_then_closed(
    server: LocalServer,
) -> None:
    """pending() and health() say the circuit is open, since when and why, while a 503 storm
    lasts; closed again once the server recovers. The API key is in no snapshot."""
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key, health=FAST)
    try:
        sampler = service.create_sampling_client(base_model=BASE)
        sampler.sample(PROMPT, 1, PARAMS).result(HANG)  # the session is up
        assert service.health().state == "closed" and service.health().since is None
        before = time.time()
        server.faults.add(Fault(endpoint="**", status=503, times=None))
        futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(6)]
        snapshot: list[PendingFuture] = []

        def opened() -> bool:
            snapshot[:] = service.pending()
            return (
                bool(snapshot)
                and snapshot[0].tenant is not None
                and snapshot[0].tenant.state != "closed"
            )

        until(opened)
        tenant = snapshot[0].tenant
        assert tenant is not None
        assert all(p.tenant is tenant for p in snapshot)  # one snapshot for every entry
        assert tenant.state in ("open", "half_open")
        assert tenant.since is not None and before <= tenant.since <= time.time()
        assert tenant.open_for is not None and tenant.open_for >= 0.0
        assert "HTTP 503" in tenant.reason and tenant.last_failure == "HTTP 503"
        assert tenant.base_url == service.health().base_url == server.url.rstrip("/")
    finally:
        server.faults.clear()
    try:
        for f in futures:
            f.result(HANG)
        health = service.health()
        assert health.state == "closed" and health.since is None and health.reason == ""
        assert health.open_for is None and health.opens >= 1
    finally:
        service.close()


def test_no_snapshot_holds_the_api_key(server: LocalServer) -> None:
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
    try:
        training = service.create_lora_training_client("base", rank=4)
        server.pause("paused_capacity", None, kind="training")
        fut = training.optim_step(types.AdamParams())
        until(lambda: live(fut).queue_state is not None)
        things = [service.health(), live(fut), *service.pending()]
        identity = service._session.config.credentials.identity  # the key's hash
        for thing in things:
            for secret in (server.api_key, identity):
                assert secret not in repr(thing)
                assert secret.encode() not in pickle.dumps(thing)
    finally:
        server.resume()
    fut.result(HANG)
    service.close()


def test_the_tenant_state_follows_the_breaker_on_the_injected_clock() -> None:
    clock = FakeClock(wall=WALL, rng=lambda: 0.5)
    tenant = TenantHealth(("http://127.0.0.1:1", "identity"), clock, schedule=lambda *a: None)
    tenant.configure(HealthPolicy(probe_initial_s=2.0))
    assert tenant_state(tenant, "ignored") == TenantState(
        base_url="http://127.0.0.1:1", state="closed", retry_tokens=500, retry_capacity=500
    )
    clock.advance(7.0)
    for i in range(5):
        tenant.failure(("asample", i), "HTTP 503")
    clock.advance(0.5)
    state = tenant_state(tenant, "ignored")
    assert state.state == "open" and state.since == WALL + 7.0 and state.open_for == 0.5
    assert state.reason == "5 failed attempts of 5 requests within 10 s, last: HTTP 503"
    assert state.last_failure == "HTTP 503"
    assert state.next_probe_in == pytest.approx(1.5 - 0.5)  # 2 s * (1 - 0.5 * 0.5), less 0.5
    clock.advance(1.0)
    assert tenant_state(tenant, "ignored").state == "half_open"
    tenant.success()
    state = tenant_state(tenant, "ignored")
    assert (state.state, state.since, state.open_for, state.reason) == ("closed", None, None, "")
    assert (state.opens, state.last_failure) == (1, "HTTP 503")


def test_before_its_first_request_a_client_shows_what_another_client_of_the_tenant_sees(
    server: LocalServer,
) -> None:
    """A new client of a tenant whose circuit another client of this process opened says so
    before it sends anything (it shares that client's tenant health); another key is another
    tenant and stays closed."""
    first = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key, health=FAST)
    try:
        sampler = first.create_sampling_client(base_model=BASE)
        sampler.sample(PROMPT, 1, PARAMS).result(HANG)
        server.faults.add(Fault(endpoint="**", status=503, times=None))
        futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(6)]
        until(lambda: first.health().state != "closed")
        second = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        other = tinker_sync.ServiceClient(base_url=server.url, api_key="tml-" + "9" * 40)
        try:
            seen = second.health()
            assert seen.state in ("open", "half_open") and "HTTP 503" in seen.reason
            assert seen.since == first.health().since
            assert other.health().state == "closed"
        finally:
            second.close()
            other.close()
    finally:
        server.faults.clear()
    try:
        for f in futures:
            f.result(HANG)
    finally:
        first.close()


def write_record(url: str, key: str, record: Any) -> None:
    from tinker_sync._config import normalize_base_url
    from tinker_sync._credentials import Secret
    from tinker_sync._flow.sharedcircuit import open_shared_circuit

    shared = open_shared_circuit(normalize_base_url(url), Secret(key).sha256())
    assert shared is not None
    shared.update(lambda _: record)
    shared.close()


def test_before_its_first_request_a_client_reads_the_circuit_other_processes_share() -> None:
    """With no client of the tenant in this process, health() shows the circuit record this
    user's other processes share (docs/health.md#across-processes), on the client's clock:
    open with since, why and the next probe; half-open while a probe is due; closed once an
    answer closed it, or when the record's times are implausible."""
    from tinker_sync._flow.sharedcircuit import CircuitRecord

    url, key = "http://127.0.0.1:9", "tml-" + "7" * 40  # never contacted: health() sends nothing
    clock = FakeClock(wall=WALL)
    service = tinker_sync.ServiceClient(base_url=url, api_key=key, _clock=clock)
    try:
        assert service.health() == TenantState(base_url=url, state="closed")  # nothing recorded
        opened = CircuitRecord("open", 4, 2, WALL - 30.0, WALL + 8.0, 0.0, WALL, 0, "HTTP 503")
        write_record(url, key, opened)
        assert service.health() == TenantState(
            base_url=url,
            state="open",
            since=WALL - 30.0,
            open_for=30.0,
            reason="HTTP 503",
            next_probe_in=8.0,
        )
        clock.advance(8.0)  # the probe is due: half-open
        assert service.health().state == "half_open" and service.health().next_probe_in is None
        write_record(url, key, CircuitRecord("closed", 4, 0, WALL - 30.0, changed_wall=WALL))
        assert service.health().state == "closed"
        far = CircuitRecord("open", 5, 0, WALL, WALL + 1e6, 0.0, WALL, 0, "HTTP 503")
        write_record(url, key, far)  # a next probe implausibly far ahead: not believed
        assert service.health().state == "closed"
    finally:
        service.close()
