"""Tenant health against a real LocalServer (docs/health.md): an outage parks the tenant and
one probe at a time goes out; recovery releases everything, nothing lost or duplicated;
fail-fast; one request failing alone ends fast with the server's words; quiet logs.

Waits are on states (the server's request log, the tenant's counters), never on durations.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from waiting import until  # tests/waiting.py

import tinker_sync
from tinker_sync import CircuitOpenError, HealthPolicy, PersistentServerError, types
from tinker_sync._flow.breaker import CLOSED, TenantHealth
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync.exceptions import RequestOutcome
from tinker_sync.local import Fault, LocalServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reliability"))
from tcp_faults import FaultRates, TcpFaultProxy  # noqa: E402  (tests/reliability/)

HANG = 60.0
BASE = "Qwen/Qwen3-8B"
PROMPT = types.ModelInput.from_ints([1, 2, 3, 4, 5])
PARAMS = types.SamplingParams(max_tokens=4)
FAST = HealthPolicy(probe_initial_s=0.05, probe_max_s=0.2, probe_jitter=0.5)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    srv = LocalServer(backend="instant", long_poll_s=1.0).start()
    yield srv
    srv.stop()
    reset_limiters()


@pytest.fixture
def make_client(server: LocalServer) -> Iterator[Callable[..., tinker_sync.ServiceClient]]:
    made: list[tinker_sync.ServiceClient] = []

    def make(**kwargs: Any) -> tinker_sync.ServiceClient:
        kwargs.setdefault("base_url", server.url)
        kwargs.setdefault("api_key", server.api_key)
        kwargs.setdefault("health", FAST)
        client = tinker_sync.ServiceClient(**kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def tenant_of(client: tinker_sync.ServiceClient) -> TenantHealth:
    return client._session.limiter.tenant


def failed_probes(tenant: TenantHealth) -> int:
    """Probes failed in a row since the circuit last opened."""
    count = tenant.snapshot()["failed_probes"]
    assert isinstance(count, int)
    return count


def requests_while_open(server: LocalServer, tenant: TenantHealth) -> tuple[int, int]:
    """(requests the server got, probes sent) over 6 failed probes in a row.

    Counted: the requests the outage answered (503). A long poll held by the server from
    before the outage is logged when it is answered, meanwhile, with its own status; that
    answer does not close the circuit (sent before it opened: docs/health.md). A window in
    which it reopened all the same is measured again.
    """
    for _ in range(50):
        until(lambda: failed_probes(tenant) >= 2)
        opens, first_probes = tenant.opens, tenant.probes
        first_count = server.requests.count(status=503)
        failed = failed_probes(tenant)
        until(lambda: failed_probes(tenant) >= failed + 6 or tenant.opens != opens)
        if tenant.opens == opens and failed_probes(tenant) >= failed + 6:
            return server.requests.count(status=503) - first_count, tenant.probes - first_probes
    raise AssertionError("the circuit never stayed open for 6 probes")


def outage(server: LocalServer) -> None:
    """Every request of every endpoint answered 503."""
    server.faults.add(Fault(endpoint="**", status=503, times=None))


def test_an_outage_parks_the_tenant_and_sends_one_probe_at_a_time(server, make_client):
    client = make_client()
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)  # the session is up
    tenant = tenant_of(client)
    outage(server)
    futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(100)]
    sent, probes = requests_while_open(server, tenant)
    assert sent <= probes + 1  # the probes only (one may straddle a snapshot)
    assert not any(f.done() for f in futures)
    server.faults.clear()
    results = [f.result(HANG) for f in futures]
    assert len(results) == 100
    assert tenant.state == CLOSED
    # Nothing lost; a seq_id answered twice is a hedged copy (the server answers it with the
    # same future), never a second sample.
    accepted = {r.json["seq_id"] for r in server.requests.filter("asample", status=200)}
    assert len(accepted) == 101


def datum(offset: int) -> types.Datum:
    tokens = np.arange(offset, offset + 5, dtype=np.int64) % 250
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(4, np.float32)},
    )


def test_an_outage_parks_polls_and_training_sends_which_resume_in_order(server, make_client):
    client = make_client()
    training = client.create_lora_training_client(base_model="base", rank=4)
    sampler = client.create_sampling_client(base_model=BASE)
    assert server.app is not None
    server.app.pause("active", None, "sampling")  # accepted samples wait: their polls go on
    samples = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(50)]
    until(lambda: server.requests.count("asample", status=200) == 50)
    tenant = tenant_of(client)
    outage(server)
    ops = []
    for i in range(10):
        ops.append(training.forward_backward([datum(i)], "cross_entropy"))
        ops.append(training.optim_step(types.AdamParams()))
    sent, probes = requests_while_open(server, tenant)
    assert sent <= probes + 1  # the probes only (one may straddle a snapshot)
    assert not any(f.done() for f in (*samples, *ops))
    server.faults.clear()
    server.resume(kind="sampling")
    for f in (*samples, *ops):
        f.result(HANG)
    log = server.app.applied(training.model_id)
    assert [seq for seq, _ in log] == list(range(21))  # create_model, then 20 ops in order
    assert [kind for _, kind in log[1:]] == ["ForwardBackward", "OptimStep"] * 10


def test_close_while_the_circuit_is_open_ends_the_parked_work(server, make_client):
    client = make_client(health=HealthPolicy(probe_initial_s=30.0, probe_max_s=30.0))
    training = client.create_lora_training_client(base_model="base", rank=4)
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    tenant = tenant_of(client)
    outage(server)
    op = training.forward_backward([datum(0)], "cross_entropy")
    samples = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(20)]
    until(lambda: tenant.opens >= 1 and tenant.waiting >= 1)  # the sender waits at the gate
    server.faults.clear()  # close()'s finish request is answered (the probe is 30 s away)
    client.close()
    for f in (op, *samples):
        with pytest.raises(tinker_sync.ClientClosedError):
            f.result(HANG)


def test_fail_fast_new_calls_raise_circuit_open_error(server, make_client):
    client = make_client(
        health=HealthPolicy(fail_fast=True, probe_initial_s=30.0, probe_max_s=30.0)
    )
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    tenant = tenant_of(client)
    outage(server)
    pending = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(10)]
    until(lambda: tenant.opens == 1)
    with pytest.raises(CircuitOpenError) as info:
        sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    assert info.value.outcome is RequestOutcome.NOT_SENT
    assert "circuit is open since" in str(info.value) and "HTTP 503" in str(info.value)
    with pytest.raises(CircuitOpenError):
        client.create_lora_training_client(base_model=BASE)
    seq_ids = [r.json["seq_id"] for r in server.requests.filter("asample")]
    assert len(seq_ids) == len(set(seq_ids)) <= 11  # no retry went out while open
    server.faults.clear()
    tenant.success()  # the probe is 30 s away: the next answer would close it
    for f in pending:  # made while it opened: each one was sent and completes, or failed fast
        try:
            f.result(HANG)
        except CircuitOpenError:
            pass


def test_one_request_failing_alone_ends_fast_with_the_servers_words(server, make_client):
    client = make_client()
    sampler = client.create_sampling_client(base_model=BASE)
    words = "token 151936 is out of vocabulary"
    server.faults.add(
        Fault(
            endpoint="asample",
            status=500,
            times=None,
            match={"num_samples": 3},
            body={"detail": words},
        )
    )
    bad = sampler.sample(PROMPT, 3, PARAMS)
    stop = threading.Event()

    def ordinary() -> None:  # the tenant stays healthy: other requests succeed
        while not stop.is_set():
            sampler.sample(PROMPT, 1, PARAMS).result(HANG)

    worker = threading.Thread(target=ordinary)
    worker.start()
    try:
        with pytest.raises(PersistentServerError) as info:
            bad.result(HANG)
    finally:
        stop.set()
        worker.join(HANG)
    assert words in str(info.value)
    assert info.value.status_code == 500
    assert server.requests.count("asample", status=500) == 4  # same_error_repeats
    assert tenant_of(client).opens == 0


def test_close_against_a_healthy_server_says_nothing_about_reaching_it(server, make_client, caplog):
    client = make_client()
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    assert server.app is not None
    server.app.pause("active", None, "sampling")  # results held: polls are waiting
    pending = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(20)]
    until(lambda: server.requests.count("retrieve_future") >= 20)
    with caplog.at_level(logging.INFO, logger="tinker_sync"):
        client.close()
    for f in pending:
        with pytest.raises(tinker_sync.ClientClosedError):
            f.result(HANG)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "cannot reach" in m or "circuit" in m], said


def test_300_samples_on_a_paused_server_log_a_few_info_lines(server, make_client, caplog):
    client = make_client()
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    assert server.app is not None
    server.app.pause("paused_rate_limit", "too many samplers", "sampling")
    with caplog.at_level(logging.INFO, logger="tinker_sync"):
        futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(300)]
        tenant = tenant_of(client)
        # once a poll is answered paused, the tenant's polls go one at a time: the others wait
        # at its gate (how many polled before the pause was known depends on the machine's load)
        until(lambda: tenant.pause_waiting >= 250)
        answered = server.requests.count("retrieve_future")
        until(lambda: server.requests.count("retrieve_future") >= answered + 3)
        server.resume(kind="sampling")
        for f in futures:
            f.result(HANG)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("tinker_sync") and not r.name.startswith("tinker_sync.local")
    ]
    assert 1 <= len(lines) <= 3, lines  # the pause and the backoff, once each


# A burst of 5xx that ends (by count, as the fault matrix injects it) on the injected virtual
# clock: enough failures of distinct requests to open the circuit, then every request answered.
BURST: dict[str, list[str]] = {
    "rest": [
        f"{ep} {code} x1"
        for code in (500, 502, 503, 504)
        for ep in ("training_runs", "training_runs/*", "training_runs/*/checkpoints", "sessions/*")
    ],
    # one sender sends training in seq order (its retries are one request, which alone never
    # opens the circuit): samples alongside open it, and training is parked with them
    "training": ["forward_backward 503 x3", "optim_step 502 x3", "asample 504 x12"],
    "sampling": ["asample 503 x12"],
    "polls": ["retrieve_future 503 x20"],
    # creation has no submission loop: a retry the open circuit refuses waits for the probe
    "creation": ["create_model 503 x3", "create_sampling_session 503 x3"],
}


@pytest.mark.parametrize("kind", sorted(BURST))
def test_a_5xx_burst_that_ends_is_ridden_out_on_the_virtual_clock(kind: str) -> None:
    """The circuit opens, one probe at a time goes out, and every request completes: no probe
    is failed by its lease while it is in flight (a lease timer on the virtual clock moved it
    90 s at once, and the REST calls of the fault matrix ended in StalledError)."""
    from tinker_sync._runtime.clock import FakeClock

    clock = FakeClock(wall=time.time(), seed=3)
    with LocalServer(long_poll_s=1.0, api_key=None, gap_grace_s=1.0) as srv:
        client = tinker_sync.ServiceClient(
            base_url=srv.url,
            api_key="tml-" + "0" * 40,
            timeout=tinker_sync.Timeout(2.0, connect=1.0),
            _clock=clock,
        )
        try:
            training = client.create_lora_training_client("base", rank=4)
            sampler = client.create_sampling_client(base_model="base")
            rest = client.create_rest_client()
            tenant = tenant_of(client)
            srv.faults.extend(BURST[kind])
            # The burst's first failures open the circuit (reported here, so that every run
            # starts open whatever the threads' timing); its other faults meet the probes.
            for i in range(tenant.policy.open_after):
                tenant.failure(("burst", i), "HTTP 503")
            if kind == "creation":
                client.create_lora_training_client("base", rank=4)
                client.create_sampling_client(base_model="base")
                futures = []
            elif kind == "rest":
                futures = [
                    rest.list_training_runs(),
                    rest.get_training_run(training.model_id),
                    rest.list_checkpoints(training.model_id),
                    rest.get_session(client._session.session_id),
                ]
            elif kind == "training":
                futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(12)]
                for i in range(6):
                    futures.append(training.forward_backward([datum(i)], "cross_entropy"))
                    futures.append(training.optim_step(types.AdamParams()))
            else:
                futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(12)]
            for f in futures:
                f.result(HANG)  # none ends in StalledError: the burst is ridden out
            srv.faults.assert_exhausted()
            assert tenant.opens >= 1 and tenant.probes >= 1
            assert tenant.expired_probes == 0
            assert tenant.state == CLOSED
            if kind == "training":
                log = srv.app.applied(training.model_id)
                assert [seq for seq, _ in log] == list(range(13))  # nothing lost, in order
            if kind in ("training", "sampling", "polls"):
                accepted = {r.json["seq_id"] for r in srv.requests.filter("asample", status=200)}
                assert len(accepted) == 12  # nothing lost or sampled twice
        finally:
            client.close()
            reset_limiters()


@pytest.mark.parametrize("status", [408, 503])
def test_the_408_and_5xx_backoff_comes_from_the_health_policy(status: int) -> None:
    """HTTP retries wait min(initial * 2^k, max) * (1 - jitter * r); the submission loop
    min(initial * 2^n, max): every number from the client's HealthPolicy (docs/health.md)."""
    from tinker_sync._runtime.clock import FakeClock

    clock = FakeClock(rng=lambda: 0.5)
    policy = HealthPolicy(
        http_backoff_initial_s=0.2,
        http_backoff_max_s=0.3,
        http_backoff_jitter=0.5,
        submit_backoff_initial_s=3.0,
        submit_backoff_max_s=5.0,
    )
    with LocalServer(api_key=None) as srv:
        client = tinker_sync.ServiceClient(
            base_url=srv.url, api_key="tml-" + "0" * 40, max_retries=2, health=policy, _clock=clock
        )
        try:
            rest = client.create_rest_client()
            rest.list_training_runs().result(HANG)
            clock.clear()
            srv.faults.add(f"training_runs {status} x7")
            rest.list_training_runs().result(HANG)
        finally:
            client.close()
            reset_limiters()
    # 3 attempts per round (max_retries=2), 3 rounds: the 7th answer fails, the 8th succeeds
    assert clock.sleeps_for("http-retry") == pytest.approx([0.15, 0.225, 0.15, 0.225, 0.15])
    assert clock.sleeps_for("submission-retry") == [3.0, 5.0]


def test_polling_a_paused_queue_does_not_scale_with_the_pending_futures() -> None:
    """300 samples pending on a paused server: once it declared the pause, the tenant's polls
    go out one at a time, at most paused_polls_per_s (5) per second of the injected clock,
    and all complete when it resumes (before: every future polled on its own)."""
    from tinker_sync._runtime.clock import FakeClock

    clock = FakeClock(wall=time.time(), seed=5)
    with LocalServer(backend="instant", long_poll_s=0.05, api_key=None) as srv:
        client = tinker_sync.ServiceClient(
            base_url=srv.url, api_key="tml-" + "0" * 40, _clock=clock
        )
        try:
            sampler = client.create_sampling_client(base_model=BASE)
            sampler.sample(PROMPT, 1, PARAMS).result(HANG)
            tenant = tenant_of(client)
            assert srv.app is not None
            srv.app.pause("paused_rate_limit", "too many samplers", "sampling")
            futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(300)]
            until(lambda: srv.requests.count("asample", status=200) == 301)
            # every poll but the one out waits for its turn: nothing else is in flight
            until(lambda: tenant.pause_waiting == 299)
            start, polls = clock.monotonic(), srv.requests.count("retrieve_future")
            until(
                lambda: (
                    clock.monotonic() >= start + 4.0
                    or srv.requests.count("retrieve_future") >= polls + 100
                )
            )
            sent = srv.requests.count("retrieve_future") - polls
            window = clock.monotonic() - start
            assert 2 <= sent <= 5 * window + 2, (sent, window)
            srv.resume(kind="sampling")
            assert len([f.result(HANG) for f in futures]) == 300
            assert tenant.paused("sampling") is None
        finally:
            client.close()
            reset_limiters()


# Each layer's waits before the four resends of a request whose connection dropped four times,
# with FakeClock(rng=lambda: 0.5): training sends retry in the HTTP layer (0.5 s * 2^k *
# (1 - 0.25 * 0.5)), a sample in the submission loop (1 s * 2^n).
DROPPED = {
    "training": ("forward_backward", "http", [0.4375] * 4),  # 0.4375, 0.875, 1.75, 3.5 before
    "sampling": ("asample", "submission", [1.0] * 4),  # 1, 2, 4, 8 before
}


@pytest.mark.parametrize("kind", sorted(DROPPED))
def test_a_request_whose_connection_drops_while_others_are_answered_waits_no_longer(
    kind: str,
) -> None:
    """On a lossy network one request's connection can drop several times in a row while the
    tenant's other requests are answered: that is not server trouble, so each resend waits the
    first step of the backoff instead of climbing it (the lossy bench's slowest sample waited
    1 + 2 + 4 + 8 + 16 = 31 s). The outage ladders (no answer in between, or 5xx) are
    test_the_408_and_5xx_backoff_comes_from_the_health_policy's and test_retry.py's."""
    from tinker_sync._runtime.clock import FakeClock

    endpoint, layer, expected = DROPPED[kind]
    clock = FakeClock(wall=time.time(), rng=lambda: 0.5)
    delays: list[float] = []
    rest: list[tinker_sync.RestClient] = []

    def hook(event: Any) -> None:
        if event.kind == "retry_scheduled" and event.data.get("layer") == layer:
            delays.append(event.data["delay"])
            rest[0].list_training_runs().result(HANG)  # another request answered meanwhile

    with LocalServer(long_poll_s=1.0, api_key=None) as srv:
        client = tinker_sync.ServiceClient(
            base_url=srv.url, api_key="tml-" + "0" * 40, hooks=[hook], _clock=clock
        )
        try:
            training = client.create_lora_training_client("base", rank=4)
            sampler = client.create_sampling_client(base_model="base")
            rest.append(client.create_rest_client())
            srv.faults.add(Fault(endpoint=endpoint, drop="before", times=4))
            if kind == "training":
                training.forward_backward([datum(0)], "cross_entropy").result(HANG)
            else:
                sampler.sample(PROMPT, 1, PARAMS).result(HANG)
            srv.faults.assert_exhausted()
            tenant = tenant_of(client)
        finally:
            client.close()
            reset_limiters()
    assert delays == pytest.approx(expected)
    assert tenant.opens == 0


def test_answers_to_polls_sent_before_the_server_went_down_release_nothing() -> None:
    """The server is down (a proxy accepts each new connection and closes it at once) while
    long polls it held from before are answered: those answers say nothing of new connections,
    so the circuit stays open and the peer sees only the probes, one connect or request each.
    Before, the first such answer closed it and every parked sample went out at once
    (bench_outage's refused row: 22 connects/s after the first 10 s)."""
    from tinker_sync._runtime.clock import FakeClock

    clock = FakeClock(wall=time.time(), seed=11)
    with (
        LocalServer(backend="instant", long_poll_s=30.0, api_key=None) as srv,
        # no hold advert: every poll keeps the server's 30 s hold (docs/polling.md)
        TcpFaultProxy(srv.url, strip_reply_headers=["x-tinker-poll-hold-max"]) as proxy,
    ):
        client = tinker_sync.ServiceClient(
            base_url=proxy.url,
            api_key="tml-" + "0" * 40,
            # the probes' waits pass at once on the virtual clock, as fast as the proxy closes
            # their connections: no stall bound while the test waits for real events
            stall_timeout=1e9,
            _clock=clock,
        )
        try:
            sampler = client.create_sampling_client(base_model=BASE)
            sampler.sample(PROMPT, 1, PARAMS).result(HANG)
            tenant = tenant_of(client)

            def polls() -> int:
                return sum(e.path.endswith("/retrieve_future") for e in proxy.exchanges())

            srv.pause("active", kind="sampling")  # accepted samples wait: their polls are held
            before = polls()
            held = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(10)]
            until(lambda: polls() >= before + 10)
            # down: new connections closed at once, requests on idle ones reset
            proxy.rates = FaultRates(accept_close=1.0, reset_before=1.0)
            parked = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(30)]
            until(lambda: tenant.opens == 1 and failed_probes(tenant) >= 1)
            seen, probes = proxy.accepted + len(proxy.exchanges()), tenant.probes
            srv.resume(kind="sampling")  # the held polls are answered
            for f in held:
                f.result(HANG)
            until(lambda: tenant.probes >= probes + 3 and failed_probes(tenant) >= 1)
            seen = proxy.accepted + len(proxy.exchanges()) - seen
            assert seen <= tenant.probes - probes + 2, (seen, tenant.probes - probes)
            assert tenant.opens == 1 and tenant.stale_successes >= 10
            assert not any(f.done() for f in parked)
            proxy.rates = FaultRates()  # the server is back: the next probe closes it
            assert len([f.result(HANG) for f in parked]) == 30
            # one logical sample per seq_id: a hedged copy (the network failed within the last
            # minute) repeats both its seq_id and its idempotency key, and the server answers
            # it with the original future
            keys: dict[int, set[str]] = {}
            for r in srv.requests.filter("asample", status=200):
                keys.setdefault(r.json["seq_id"], set()).add(r.headers["x-idempotency-key"])
            assert len(keys) == 41 and all(len(k) == 1 for k in keys.values()), keys
        finally:
            client.close()
            reset_limiters()
