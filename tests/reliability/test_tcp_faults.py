"""A lossy network between the client and the local server (``tcp_faults.TcpFaultProxy``).

* each fault kind of the proxy does what it says, seen by a plain ``http.client`` and by the
  server's request log;
* a long poll whose reply never comes is given up after the hold it asked for plus a small
  margin, not after 45 s;
* under every fault kind at once (seeded), training ops are applied exactly once and in order
  and every sample gets the answer to its own prompt, exactly once.

The CI variant is small (seconds: short delays, a 1 s server hold, a 2 s read timeout); the
full-size one (8 threads x 15 steps, 5 % per kind, real delays) runs with TINKER_SYNC_FULL=1.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from reliability_helpers import HANG, datum, prompt
from tcp_faults import Exchange, Fault, FaultRates, TcpFaultProxy

import tinker_sync
from tinker_sync import types
from tinker_sync._polling.hold import ADVERT_HEADER
from tinker_sync.local import LocalServer

pytestmark = pytest.mark.usefixtures("transport_path")  # every test on both request paths
KEY = "tml-local"
BASE = "base"
PARAMS = types.SamplingParams(max_tokens=4, temperature=0.0)


def only_first(kind: Fault, path: str) -> Callable[[Exchange], Fault | None]:
    """A script applying ``kind`` to the first exchange on ``path`` and to nothing else."""
    done = threading.Event()

    def script(exchange: Exchange) -> Fault | None:
        if exchange.path == path and not done.is_set():
            done.set()
            return kind
        return None

    return script


def post(url: str, path: str, body: dict[str, Any], timeout: float = 5.0) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        payload = json.dumps(body).encode()
        headers = {"content-type": "application/json", "x-api-key": KEY}
        conn.request("POST", path, payload, headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


CONFIG = "/api/v1/client/config"


@pytest.mark.parametrize(
    ("kind", "error", "reached_server"),
    [
        (Fault.RESET_BEFORE, ConnectionError, False),
        (Fault.RESET_AFTER, ConnectionError, True),
        (Fault.CUT_BODY, (http.client.IncompleteRead, ConnectionError), True),
        (Fault.HOLD, TimeoutError, True),
        (Fault.DELAY, None, True),
    ],
)
def test_each_exchange_fault_does_what_it_says(
    kind: Fault, error: type[BaseException] | None, reached_server: bool
) -> None:
    with (
        LocalServer() as server,
        TcpFaultProxy(
            server.url, script=only_first(kind, CONFIG), delay_s=(0.01, 0.02), hold_max_s=HANG
        ) as proxy,
    ):
        if error is None:
            assert post(proxy.url, CONFIG, {"sdk_version": "x"})[0] == 200
        else:
            with pytest.raises(error):
                post(proxy.url, CONFIG, {"sdk_version": "x"}, timeout=0.5)
        if reached_server:
            server.requests.wait_for("client/config", 1, timeout=5.0)
        assert server.requests.count("client/config") == int(reached_server)
        status, body = post(proxy.url, CONFIG, {"sdk_version": "x"})  # the next one passes
        assert status == 200 and json.loads(body)
        assert [e.fault for e in proxy.exchanges()] == [kind, None]
        assert proxy.counts() == {kind.value: 1}


def test_accept_and_close_ends_a_new_connection_before_any_byte() -> None:
    with (
        LocalServer() as server,
        TcpFaultProxy(server.url, FaultRates(accept_close=1.0)) as proxy,
    ):
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            post(proxy.url, CONFIG, {"sdk_version": "x"})
        assert proxy.counts() == {"accept_close": 1} and proxy.exchanges() == []
        assert server.requests.count("*") == 0


def test_the_same_seed_draws_the_same_faults() -> None:
    def draws(seed: int) -> list[Fault | None]:
        with (
            LocalServer() as server,
            TcpFaultProxy(
                server.url, FaultRates(reset_before=0.3, delay=0.3), seed=seed, delay_s=(0, 0)
            ) as proxy,
        ):
            for _ in range(12):
                try:
                    post(proxy.url, CONFIG, {"sdk_version": "x"})
                except ConnectionError:
                    pass
            return [e.fault for e in proxy.exchanges()]

    first = draws(5)
    assert first == draws(5)
    assert {Fault.RESET_BEFORE, Fault.DELAY, None} <= set(first)


def test_a_held_poll_is_given_up_after_its_hold_plus_a_margin() -> None:
    """The first poll of an optim_step never gets its reply: the client asked the server to
    hold it at most 1 s (the server's own limit, under the client's 5 s), read with a 3 s
    timeout and polled again -- instead of waiting 45 s."""
    with (
        LocalServer(long_poll_s=1.0, api_key=KEY) as server,
        TcpFaultProxy(server.url, hold_max_s=HANG) as proxy,
    ):
        service = tinker_sync.ServiceClient(base_url=proxy.url, api_key=KEY)
        try:
            training = service.create_lora_training_client(BASE, rank=4)
            proxy.script = only_first(Fault.HOLD, "/api/v1/retrieve_future")
            result = training.optim_step(types.AdamParams()).result(HANG)
            assert isinstance(result, types.OptimStepResponse)
        finally:
            service.close()
        polls = [
            r
            for r in server.requests.filter("retrieve_future")
            if r.headers.get("x-tinker-request-type") == "OptimStep"
        ]
        assert len(polls) >= 2  # the held one (answered by the server, never delivered) + one
        assert all(r.headers["x-tinker-poll-hold"] == "1" for r in polls)
        assert all(r.headers["x-stainless-read-timeout"] == "3" for r in polls)
        assert proxy.counts() == {"hold": 1}


@pytest.mark.parametrize("kind", [Fault.HOLD, Fault.RESET_AFTER, Fault.CUT_BODY])
def test_one_lost_reply_does_not_fail_a_call_whose_read_timeout_is_the_retry_window(
    kind: Fault,
) -> None:
    """The server got ``create_model`` and answered; the reply was lost. With ``timeout=1``
    the retry window (1 s) is no longer than the lost attempt, yet the call is repeated (the
    window bounds a server that cannot be reached, not one whose reply got lost) and the
    server made one model."""
    with (
        LocalServer(api_key=KEY) as server,
        TcpFaultProxy(server.url, hold_max_s=HANG) as proxy,
    ):
        service = tinker_sync.ServiceClient(
            base_url=proxy.url, api_key=KEY, timeout=tinker_sync.Timeout(1.0, connect=1.0)
        )
        try:
            proxy.script = only_first(kind, "/api/v1/create_model")
            training = service.create_lora_training_client(BASE, rank=4)
            assert isinstance(
                training.optim_step(types.AdamParams()).result(HANG), types.OptimStepResponse
            )
        finally:
            service.close()
        assert proxy.counts() == {kind.value: 1}
        assert server.requests.count("create_model") == 2
        assert list(server.state()["models"]) == [training.model_id]


def test_a_hedged_training_send_is_applied_once_and_in_order() -> None:
    """Once the network has lost a reply, a training send that gets no answer is raced by a
    second copy after a delay derived from the recent send latencies; the second copy wins
    (the first is held until its 10 s read timeout), and the server, which answers a repeated
    seq_id with the original future, applies every step once and in order."""
    fwdbwd = "/api/v1/forward_backward"
    seen = 0

    def script(exchange: Exchange) -> Fault | None:
        nonlocal seen
        if exchange.path != fwdbwd:
            return None
        seen += 1
        return {13: Fault.RESET_AFTER, 15: Fault.HOLD}.get(seen)

    with (
        LocalServer(api_key=KEY) as server,
        TcpFaultProxy(server.url, hold_max_s=HANG, script=script) as proxy,
    ):
        service = tinker_sync.ServiceClient(
            base_url=proxy.url, api_key=KEY, timeout=tinker_sync.Timeout(10.0, connect=2.0)
        )
        try:
            training = service.create_lora_training_client(BASE, rank=4)
            for step in range(16):
                training.forward_backward([datum(step)], "cross_entropy").result(HANG)
            hedger = service._session.hedger
            # The held send is hedged and its copy wins; on a loaded machine another slow send
            # after the lost reply may be hedged too (a copy is meant for that).
            assert hedger.sent >= 1 and hedger.won >= 1
            hedges = hedger.sent
        finally:
            service.close()
        assert proxy.counts() == {"reset_after": 1, "hold": 1}
        assert server.app.applied(training.model_id) == [(0, "CreateModel")] + [
            (seq, "ForwardBackward") for seq in range(1, 17)
        ]
        sends = server.requests.filter("forward_backward")
        by_seq: dict[int, set[str]] = {}
        for r in sends:
            assert r.proto is not None
            by_seq.setdefault(r.proto["seq_id"], set()).add(r.headers["x-idempotency-key"])
        assert len(sends) == 17 + hedges  # 16 steps, one retry after the lost reply, the hedges
        assert all(len(keys) == 1 for keys in by_seq.values())  # copies share the key


def hedged_run(script: Callable[[Exchange], Fault | None], steps: int) -> tuple[Any, Any, Any]:
    """``steps`` forward/backward steps through a scripted proxy; (hedger, server, model)."""
    with (
        LocalServer(api_key=KEY) as server,
        TcpFaultProxy(server.url, hold_max_s=HANG, script=script) as proxy,
    ):
        service = tinker_sync.ServiceClient(
            base_url=proxy.url, api_key=KEY, timeout=tinker_sync.Timeout(10.0, connect=2.0)
        )
        try:
            training = service.create_lora_training_client(BASE, rank=4)
            for step in range(steps):
                training.forward_backward([datum(step)], "cross_entropy").result(HANG)
            hedger = service._session.hedger
        finally:
            service.close()
        assert server.app.applied(training.model_id) == [(0, "CreateModel")] + [
            (seq, "ForwardBackward") for seq in range(1, steps + 1)
        ]
        keys: dict[int, set[str]] = {}
        for r in server.requests.filter("forward_backward"):
            assert r.proto is not None
            keys.setdefault(r.proto["seq_id"], set()).add(r.headers["x-idempotency-key"])
        assert all(len(k) == 1 for k in keys.values())  # copies share the key
        return hedger, proxy, server


def test_a_copy_lost_to_a_reset_is_followed_by_another() -> None:
    """The first copy of a held training send is reset: a second copy (not the held send's
    10 s read timeout) answers, and every step is applied once, in order."""
    fwdbwd = "/api/v1/forward_backward"
    seen = 0

    def script(exchange: Exchange) -> Fault | None:
        nonlocal seen
        if exchange.path != fwdbwd:
            return None
        seen += 1
        return {13: Fault.RESET_AFTER, 15: Fault.HOLD, 16: Fault.RESET_BEFORE}.get(seen)

    hedger, proxy, server = hedged_run(script, 14)
    assert (hedger.sent, hedger.won) == (2, 1)
    assert proxy.counts() == {"reset_after": 1, "hold": 1, "reset_before": 1}
    # 14 steps, one retry after the lost reply, two copies (one reset before the server)
    assert len(server.requests.filter("forward_backward")) == 16


def test_a_copy_never_answered_gives_way_to_the_next_after_copy_read_s() -> None:
    """The held send's first copy is held too: it is cut after COPY_READ_S (2 s, not the
    send's 10 s read timeout), and the next copy answers."""
    fwdbwd = "/api/v1/forward_backward"
    seen = 0

    def script(exchange: Exchange) -> Fault | None:
        nonlocal seen
        if exchange.path != fwdbwd:
            return None
        seen += 1
        return {13: Fault.RESET_AFTER, 15: Fault.HOLD, 16: Fault.HOLD}.get(seen)

    hedger, proxy, _ = hedged_run(script, 14)
    assert (hedger.sent, hedger.won) == (2, 1)
    assert proxy.counts() == {"reset_after": 1, "hold": 2}


def test_the_first_training_send_on_a_lossy_network_is_hedged_after_the_cold_delay() -> None:
    """Before any send latency is known, a held training send on a network that just lost a
    reply gets a copy after COLD_DELAY_S (it used to wait for its whole read timeout)."""
    create, fwdbwd = (
        only_first(Fault.RESET_AFTER, "/api/v1/create_model"),
        only_first(Fault.HOLD, "/api/v1/forward_backward"),
    )

    def script(exchange: Exchange) -> Fault | None:
        return create(exchange) or fwdbwd(exchange)

    hedger, proxy, _ = hedged_run(script, 2)
    assert (hedger.sent, hedger.won) == (1, 1)
    assert proxy.counts() == {"reset_after": 1, "hold": 1}


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    stop = threading.Event()
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        stop.wait(0.02)
    return True


@pytest.mark.parametrize("path", ["/api/v1/retrieve_future", "/api/v1/retrieve_futures"])
def test_close_cuts_a_poll_whose_reply_never_comes(path: str) -> None:
    """The proxy holds a poll's reply forever and the server does not advertise holds, so the
    client would read for 45 s. ``close()`` cuts the poll: the future fails with
    ClientClosedError, the session poller's thread ends and the held connection is closed by
    the client long before its read timeout could have ended it."""
    with (
        LocalServer(api_key=KEY, client_config={"sample_use_retrieve_futures": True}) as server,
        TcpFaultProxy(server.url, hold_max_s=HANG, strip_reply_headers=[ADVERT_HEADER]) as proxy,
    ):
        service = tinker_sync.ServiceClient(base_url=proxy.url, api_key=KEY)
        closed = False
        try:
            training = service.create_lora_training_client(BASE, rank=4)
            sampler = service.create_sampling_client(base_model=BASE)
            proxy.script = only_first(Fault.HOLD, path)
            if path.endswith("futures"):
                future: Any = sampler.sample(prompt(1), 1, PARAMS)
            else:
                future = training.optim_step(types.AdamParams())
            assert wait_until(lambda: proxy.counts() == {"hold": 1}, HANG)
            service.close()
            closed = True
            assert isinstance(future.exception(HANG), tinker_sync.ClientClosedError)
            # The held connection (and every idle one) is gone well within the 45 s it would
            # otherwise have been read from.
            assert wait_until(lambda: proxy.open_connections == 0, 20.0), proxy.open_connections
            assert wait_until(
                lambda: (
                    not any(
                        t.name.startswith("tinker_sync-futures-poller")
                        for t in threading.enumerate()
                    )
                ),
                20.0,
            )
        finally:
            if not closed:
                service.close()
        held = [e for e in proxy.exchanges() if e.fault is Fault.HOLD]
        assert [e.path for e in held] == [path]
        polls = server.requests.filter(path.rsplit("/", 1)[1])
        long_polls = [r for r in polls if (r.json or {}).get("timeout") != 0.0]  # not acks
        assert long_polls
        assert all(r.headers["x-stainless-read-timeout"] == "45" for r in long_polls)


def run_lossy(
    rates: FaultRates,
    *,
    seed: int,
    threads: int,
    steps: int,
    samples: int,
    delay_s: tuple[float, float],
    timeout: tinker_sync.Timeout,
    long_poll_s: float,
) -> dict[str, int]:
    """Train and sample through the proxy; assert exactly-once, order and right answers."""
    with LocalServer(long_poll_s=long_poll_s, api_key=KEY, gap_grace_s=HANG) as server:
        direct = tinker_sync.ServiceClient(base_url=server.url, api_key=KEY)
        try:
            reference_sampler = direct.create_sampling_client(base_model=BASE)
            reference = [reference_sampler.sample(prompt(i), 1, PARAMS) for i in range(samples)]
            expected = [tuple(f.result(HANG).sequences[0].tokens) for f in reference]
        finally:
            direct.close()
        with TcpFaultProxy(server.url, rates, seed=seed, delay_s=delay_s, hold_max_s=HANG) as proxy:
            service = tinker_sync.ServiceClient(base_url=proxy.url, api_key=KEY, timeout=timeout)
            try:
                with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                    clients = list(
                        pool.map(
                            lambda _: service.create_lora_training_client(BASE, rank=4),
                            range(threads),
                        )
                    )

                    def train(client: Any) -> None:
                        for step in range(steps):
                            fb = client.forward_backward([datum(step)], "cross_entropy")
                            opt = client.optim_step(types.AdamParams())
                            fb.result(HANG)
                            opt.result(HANG)

                    trained = [pool.submit(train, c) for c in clients]
                    sampler = service.create_sampling_client(base_model=BASE)
                    futures = [sampler.sample(prompt(i), 1, PARAMS) for i in range(samples)]
                    for f in trained:
                        f.result(HANG * 4)
                    answers = [f.result(HANG) for f in futures]
                hedges = service._session.hedger.sent
            finally:
                service.close()
            counts = {**proxy.counts(), "hedges": hedges}
        ops = [(0, "CreateModel")] + [
            (seq, kind)
            for step in range(steps)
            for seq, kind in ((2 * step + 1, "ForwardBackward"), (2 * step + 2, "OptimStep"))
        ]
        for client in clients:  # every op applied once, in order, none skipped
            assert server.app.applied(client.model_id) == ops, client.model_id
        assert [tuple(a.sequences[0].tokens) for a in answers] == expected
        # each sample call used one seq_id, however often its submission was repeated
        asamples = [r for r in server.requests.filter("asample") if r.json]
        by_seq: dict[int, set[tuple[int, ...]]] = {}
        for r in asamples:
            tokens = tuple(t for c in r.json["prompt"]["chunks"] for t in c["tokens"])
            by_seq.setdefault(r.json["seq_id"], set()).add(tokens)
        assert len(by_seq) == samples and all(len(p) == 1 for p in by_seq.values())
        table = server.app._futures
        for i, answer in enumerate(answers):  # ... and its answer came from its own seq_id
            rid = answer.sequences[0].sequence_id.rsplit(":", 1)[0]
            rec = table.get(rid)
            assert rec is not None and rec.seq_id is not None
            assert by_seq[rec.seq_id] == {tuple(prompt(i).to_ints())}
        return counts


def test_lossy_network_small() -> None:
    """Every fault kind at 6 %, seeded; short delays and holds keep it to seconds."""
    counts = run_lossy(
        FaultRates.each(0.06),
        seed=3,
        threads=3,
        steps=4,
        samples=24,
        delay_s=(0.05, 0.3),
        timeout=tinker_sync.Timeout(2.0, connect=1.0),
        long_poll_s=1.0,
    )
    assert sum(counts.values()) >= 3, counts  # the run did meet faults


@pytest.mark.full
def test_lossy_network_full() -> None:
    """The issue's run: 8 threads x 15 steps and 200 samples at 5 % per kind, real delays."""
    run_lossy(
        FaultRates.each(0.05),
        seed=11,
        threads=8,
        steps=15,
        samples=200,
        delay_s=(0.5, 3.0),
        timeout=tinker_sync.Timeout(10.0, connect=2.0),
        long_poll_s=20.0,
    )
