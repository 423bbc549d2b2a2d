"""SamplingClient against a real LocalServer: gates, backoff, retries, cancels
(docs/design/behavior.md#sampling-lock-free-seq-ids, docs/design/behavior.md#limiter-registry,
docs/design/behavior.md#dispatch-gates, docs/design/behavior.md#shared-backoff,
docs/design/behavior.md#paused-queue-extends-backoff, docs/design/behavior.md#sampling-retry-layer,
docs/design/behavior.md#sampling-wire-rules, docs/design/behavior.md#sample-cancellation), and
the sampling half of docs/design/behavior.md#older-servers. The limiter's own unit tests are in
tests/flow/test_limiter.py.

Threads are released on barriers; delays are asserted on a FakeClock or from the server's
request log (arrival times), never from wall-clock order in the client.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pickle
import subprocess
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
from tinker_sync import types
from tinker_sync._flow.limiter import LOOPBACK_WIDENS_ENV, MAX_SEND_WIDTH, reset_limiters
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._runtime.executor import pool
from tinker_sync._sampling.retry import RetryConfig
from tinker_sync.exceptions import (
    ClientClosedError,
    InternalServerError,
    RequestFailedError,
    SamplingStuckError,
)
from tinker_sync.local import LocalServer
from tinker_sync.sampling_client import SEQ_STRIDE, SamplingClient

HANG = 60.0
BASE = "Qwen/Qwen3-8B"
PROMPT = types.ModelInput.from_ints([1, 2, 3, 4, 5])
PARAMS = types.SamplingParams(max_tokens=4)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def make_server() -> Iterator[Callable[..., LocalServer]]:
    servers: list[LocalServer] = []

    def make(**kwargs: Any) -> LocalServer:
        kwargs.setdefault("long_poll_s", 2.0)
        srv = LocalServer(backend="instant", **kwargs).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()
    reset_limiters()


@pytest.fixture
def make_client() -> Iterator[Callable[..., tinker_sync.ServiceClient]]:
    made: list[tinker_sync.ServiceClient] = []

    def make(srv: LocalServer, **kwargs: Any) -> tinker_sync.ServiceClient:
        kwargs.setdefault("base_url", srv.url)
        kwargs.setdefault("api_key", srv.api_key)
        client = tinker_sync.ServiceClient(**kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def hold(srv: LocalServer) -> None:
    """Hold sample results (polls answer try_again, queue state active: no backoff,
    docs/design/behavior.md#paused-queue-extends-backoff)."""
    assert srv.app is not None
    srv.app.pause("active", None, "sampling")


def release(srv: LocalServer) -> None:
    srv.resume(kind="sampling")


def asample_seq_ids(srv: LocalServer, status: int | None = None) -> list[int]:
    return [r.json["seq_id"] for r in srv.requests.filter("asample", status=status)]


def sampler_of(service: tinker_sync.ServiceClient, **kwargs: Any) -> SamplingClient:
    return service.create_sampling_client(base_model=BASE, **kwargs)


class Events:
    """A per-client hook recording events by kind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: Any) -> None:
        with self.lock:
            self.events.append((event.kind, dict(event.data)))

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [d for k, d in self.events if k == kind]


# ------------------------------------------------------------------------------ basics


def test_one_sdk_thread_sends_and_polls_a_sample_waited_on_from_the_main_thread(
    make_server, make_client
):
    """A main-thread ``sample().result()`` makes two thread hand-offs, not three: the SDK
    thread that sends the sample also polls it, once its send step has returned; the main
    thread itself sends nothing (docs/polling.md#which-thread-polls,
    docs/guarantees.md#signals-and-exit)."""
    assert threading.current_thread() is threading.main_thread()
    seen: list[tuple[str, int]] = []

    def on_event(event: Any) -> None:
        if event.kind == "request" and event["path"].endswith(("/asample", "/retrieve_future")):
            seen.append((event["path"].rsplit("/", 1)[1], threading.get_ident()))

    sampler = sampler_of(make_client(make_server(), hooks=[on_event]))
    for _ in range(3):
        seen.clear()
        assert sampler.sample(PROMPT, 1, PARAMS).result(HANG).sequences
        assert [path for path, _ in seen] == ["asample", "retrieve_future"]
        assert seen[0][1] == seen[1][1] != threading.get_ident()


def test_a_sample_sent_while_another_is_in_flight_is_polled_by_the_poll_pool(
    make_server, make_client, monkeypatch
):
    """Only a lone sample is polled by the thread that sent it: one sent while another of the
    client's samples is in flight is polled on ``sample-poll`` (lending senders to polls cost
    more CPU per sample at 16 to 64 in flight; docs/polling.md#which-thread-polls)."""
    from tinker_sync._polling.loop import Poll
    from tinker_sync._sampling.job import SampleJob

    senders: dict[str, str] = {}
    pollers: dict[str, str] = {}
    real_accepted, real_run = SampleJob._accepted, Poll.run

    def accepted(self: SampleJob, future: Any) -> None:
        senders.setdefault(future.request_id, threading.current_thread().name)
        real_accepted(self, future)

    def run(self: Poll) -> None:
        pollers.setdefault(self.request_id, threading.current_thread().name)
        real_run(self)

    monkeypatch.setattr(SampleJob, "_accepted", accepted)
    monkeypatch.setattr(Poll, "run", run)
    srv = make_server(long_poll_s=0.2)
    sampler = sampler_of(make_client(srv))
    hold(srv)  # the first sample stays in flight until release
    first = sampler.sample(PROMPT, 1, PARAMS)
    until(lambda: first.request_id in pollers)
    second = sampler.sample(PROMPT, 1, PARAMS)
    until(lambda: second.request_id in pollers)
    release(srv)
    assert first.result(HANG).sequences and second.result(HANG).sequences
    assert pollers[first.request_id] == senders[first.request_id]  # alone: its sender polled
    assert pollers[second.request_id].startswith("tinker_sync-sample-poll-")
    assert senders[second.request_id].startswith("tinker_sync-sample-submit-")


def test_sample_stamps_sequence_ids_and_compute_logprobs(server, service):
    """Ids from the asample reply are stamped; compute_logprobs entry 0 is None
    (docs/design/behavior.md#sampling-wire-rules)."""
    sampler = sampler_of(service)
    fut = sampler.sample(PROMPT, 3, PARAMS)
    response = fut.result(HANG)
    assert fut.request_id is not None
    assert [s.sequence_id for s in response.sequences] == [
        f"{fut.request_id}:{i}" for i in range(3)
    ]
    (req,) = server.requests.filter("asample")
    assert req.headers["x-tinker-sampling-backpressure"] == "1"
    assert req.headers["x-stainless-retry-count"] == "0"
    assert req.json["seq_id"] == 0 and req.json["num_samples"] == 3
    logprobs = sampler.compute_logprobs(PROMPT).result(HANG)
    assert len(logprobs) == PROMPT.length and logprobs[0] is None
    assert all(isinstance(v, float) for v in logprobs[1:])
    last = sampler.compute_logprobs(PROMPT, prompt_logprobs_last_n=2).result(HANG)
    assert last[:3] == [None, None, None] and all(isinstance(v, float) for v in last[3:])
    body = server.requests.filter("asample")[-1].json
    assert body["num_samples"] == 1 and body["prompt_logprobs"] is True
    assert body["sampling_params"]["max_tokens"] == 1 and body["prompt_logprobs_last_n"] == 2
    assert asample_seq_ids(server) == [0, 1, 2]


def test_kept_sample_futures_keep_no_job_and_a_finished_sample_leaves_no_cycle(server, service):
    """Programs keep their futures (a list of results to score): each done future keeps its
    response, not the job that fetched it with its ticket, retry state and locks. And a finished
    sample is freed by reference counting alone, leaving no cycle for the garbage collector
    (which would walk every live object again in each full collection)."""
    import gc
    import weakref

    from tinker_sync._flow.limiter import Ticket
    from tinker_sync._sampling.job import SampleJob

    sampler = sampler_of(service)
    hold(server)
    futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(20)]
    jobs = [weakref.ref(f._on_cancel.__self__) for f in futures]  # pending: the job's hook
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # from now on, unreachable objects stay in gc.garbage
    try:
        release(server)
        for fut in futures:
            fut.result(HANG)
        until(lambda: all(job() is None for job in jobs))  # while the futures are kept
        gc.collect()
        cyclic = [
            o
            for o in gc.garbage
            if (isinstance(o, SampleJob) and o.client is sampler)
            or (isinstance(o, Ticket) and o.owner == id(sampler))
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == []
    assert all(len(f.result().sequences) == 1 for f in futures)


def test_validation_errors_are_synchronous_and_send_nothing(server, service):
    """Checked in the caller's thread before a seq_id is taken
    (docs/design/behavior.md#sampling-wire-rules)."""
    sampler = sampler_of(service)
    bad_target = types.TensorData(data=[0.0] * 4, dtype="float32", shape=[4, 1])
    cases: list[tuple[type[Exception], dict[str, Any]]] = [
        (ValueError, {"num_samples": 0}),
        (TypeError, {"num_samples": True}),
        (ValueError, {"prompt_alt_tokens_k": -1}),
        (ValueError, {"prompt_logprobs_last_n": 2}),
        (ValueError, {"prompt_logprobs_last_n": 0, "include_prompt_logprobs": True}),
        (ValueError, {"target_prompt_logprobs": bad_target}),
        (
            ValueError,
            {"target_prompt_logprobs": types.TensorData(data=[1] * 8, dtype="int64", shape=[2, 4])},
        ),
    ]
    for exc_type, kwargs in cases:
        args = {"num_samples": 1, **kwargs}
        with pytest.raises(exc_type):
            sampler.sample(PROMPT, sampling_params=PARAMS, **args)
    with pytest.raises(TypeError):
        sampler.sample([1, 2], 1, PARAMS)  # type: ignore[arg-type]
    ok = sampler.sample(
        PROMPT,
        1,
        PARAMS,
        include_prompt_logprobs=True,
        target_prompt_logprobs=types.TensorData(data=[1, -1] * 4, dtype="int64", shape=[4, 2]),
    ).result(HANG)
    assert ok.sequences
    assert asample_seq_ids(server) == [0]


def _reference_body(sampler: SamplingClient, prompt: Any, n: int, params: Any, **kw: Any) -> str:
    """The asample body as sample() built it field by field (to_json, then the 0.25 rule)."""
    from tinker_sync._wire._converter import omit_new_defaults, to_json

    target = kw.get("target_prompt_logprobs")
    body: dict[str, Any] = {
        "num_samples": n,
        "prompt": to_json(prompt),
        "sampling_params": to_json(params),
        "sampling_session_id": sampler.sampler_id,
        "prompt_logprobs": kw.get("include_prompt_logprobs", False),
        "topk_prompt_logprobs": kw.get("topk_prompt_logprobs", 0),
        "topk_sample_logprobs": kw.get("topk_sample_logprobs", 0),
        "prompt_alt_tokens_k": kw.get("prompt_alt_tokens_k", 0),
        "record_stability_info": sampler._record_stability_info,
        "type": "sample",
    }
    if target is not None:
        body["target_prompt_logprobs"] = to_json(target)
    if kw.get("prompt_logprobs_last_n") is not None:
        body["prompt_logprobs_last_n"] = kw["prompt_logprobs_last_n"]
    return json.dumps(omit_new_defaults(body))


def test_asample_bodies_on_the_wire_are_the_generic_dump_of_the_arguments(server, service):
    """The one-pass prompt dump and the reused SamplingParams JSON send exactly the bodies of
    the generic dump (keys, order, values), also after a SamplingParams' stop list changed."""
    stop_list = types.SamplingParams(max_tokens=3, stop=["a"])
    image = types.ModelInput(
        chunks=[
            types.EncodedTextChunk(tokens=[1, 2]),
            types.ImageChunk(data=b"abcd", format="png", expected_tokens=2),
        ]
    )
    target = types.TensorData(data=[1, -1] * 4, dtype="int64", shape=[4, 2])
    calls: list[tuple[SamplingClient, Any, int, Any, dict[str, Any]]] = []
    plain, stable = sampler_of(service), sampler_of(service, record_stability_info=True)
    for sampler in (plain, stable):
        calls += [
            (sampler, PROMPT, 1, PARAMS, {}),
            (sampler, PROMPT, 2, PARAMS, {}),  # the same SamplingParams again
            (sampler, types.ModelInput.from_ints(np.arange(7)), 1, PARAMS, {}),
            (sampler, image, 1, types.SamplingParams(seed=3, stop="x", temperature=0.5), {}),
            (sampler, PROMPT, 1, stop_list, {"topk_sample_logprobs": 2}),
            (sampler, PROMPT, 1, stop_list, {"prompt_alt_tokens_k": 1}),
            (
                sampler,
                PROMPT,
                1,
                PARAMS,
                {
                    "include_prompt_logprobs": True,
                    "topk_prompt_logprobs": 1,
                    "target_prompt_logprobs": target,
                    "prompt_logprobs_last_n": 2,
                },
            ),
        ]
    expected = []
    for i, (sampler, prompt, n, params, kw) in enumerate(calls):
        if i == 6:
            stop_list.stop.append("b")  # type: ignore[union-attr]  # changed after use
        sampler.sample(prompt, n, params, **kw).exception(HANG)
        expected.append(_reference_body(sampler, prompt, n, params, **kw))
    got = []
    for req in server.requests.filter("asample"):
        body = dict(req.json)
        del body["seq_id"]  # appended last, by the job
        assert list(req.json)[-1] == "seq_id"
        got.append(json.dumps(body))
    assert got == expected
    assert '"stop": ["a", "b"]' in got[-2]  # the changed list went out as changed


def test_ignored_features_fail_with_runtime_error(server, service, monkeypatch):
    """A server that silently drops prompt_alt_tokens_k / last_n fails loudly
    (docs/design/behavior.md#sampling-wire-rules)."""
    from tinker_sync.local.backends import instant

    original = instant.InstantSampler.sample

    def forgetful(self: Any, prompt: Any, opts: Any) -> Any:
        result = original(self, prompt, opts)
        result.prompt_alt_tokens = None
        result.prompt_alt_logprobs = None
        if result.prompt_logprobs is not None:
            result.prompt_logprobs = np.where(
                np.arange(len(result.prompt_logprobs)) == 0, np.nan, -1.0
            ).astype(np.float32)
        return result

    sampler = sampler_of(service)
    assert sampler.sample(PROMPT, 1, PARAMS, prompt_alt_tokens_k=2).result(HANG).prompt_alt_tokens
    monkeypatch.setattr(instant.InstantSampler, "sample", forgetful)
    with pytest.raises(RuntimeError, match="prompt_alt_tokens_k"):
        sampler.sample(PROMPT, 1, PARAMS, prompt_alt_tokens_k=2).result(HANG)
    with pytest.raises(RuntimeError, match="prompt_logprobs_last_n"):
        sampler.compute_logprobs(PROMPT, prompt_logprobs_last_n=1).result(HANG)
    # RuntimeError is not retried: one asample per failing call.
    assert len(asample_seq_ids(server)) == 3


def test_legacy_server_sampling_without_sequence_ids(make_server, make_client):
    """The sampling half: no sample_sequence_ids and JSON results are accepted
    (docs/design/behavior.md#older-servers)."""
    srv = make_server(protocol="legacy")
    sampler = sampler_of(make_client(srv))
    response = sampler.sample(PROMPT, 2, PARAMS, include_prompt_logprobs=True).result(HANG)
    assert len(response.sequences) == 2
    assert all(s.sequence_id is None for s in response.sequences)
    assert all(len(s.tokens) == 4 for s in response.sequences)
    logprobs = sampler.compute_logprobs(PROMPT).result(HANG)
    assert logprobs[0] is None and len(logprobs) == PROMPT.length
    assert "sample_sequence_ids" not in json.dumps([r.json for r in srv.requests.filter("asample")])


# ------------------------------------------------------------------------------ gates


_T_B1_CHILD = r"""
import json, sys, threading
from tinker_sync._runtime.executor import configure_threads
configure_threads(sample_submit=1200)   # let the dispatch gate, not the pool, bind
import tinker_sync
from tinker_sync import types
url, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
service = tinker_sync.ServiceClient(base_url=url, api_key=key)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
prompt = types.ModelInput.from_ints([1, 2, 3])
barrier = threading.Barrier(8)
futures = []
lock = threading.Lock()
def caller(k):
    barrier.wait(60)
    mine = [sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)) for _ in range(k, n, 8)]
    with lock:
        futures.extend(mine)
threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
for t in threads: t.start()
for t in threads: t.join(60)
ok = sum(1 for f in futures if f.result(120).sequences)
print(json.dumps({"ok": ok}))
service.close()
"""


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    best = cur = 0
    for _, delta in edges:
        cur += delta
        best = max(best, cur)
    return best


@pytest.mark.slow
def test_1000_concurrent_samples_never_exceed_400_in_flight(make_server):
    """With slow submissions, the server never holds more than 400 asamples
    (docs/design/behavior.md#dispatch-gates)."""
    srv = make_server(faults=["asample delay=0.5 x*"])
    proc = subprocess.run(
        [sys.executable, "-c", _T_B1_CHILD, srv.url, srv.api_key or "", "1000"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": REPO},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ok": 1000}
    reqs = srv.requests.filter("asample")
    assert len(reqs) == 1000
    overlap = max_overlap([(r.time, r.time + r.duration_s) for r in reqs])
    assert overlap <= 400
    assert overlap > 100  # the gate binds (not a small thread pool)


@pytest.mark.parametrize(("delay", "wide"), [(0.1, True), (0.0, False)])
def test_the_send_width_follows_the_exchange_latency(
    make_server, make_client, monkeypatch, delay, wide
):
    """Slow ``asample`` exchanges (100 ms) widen the senders past the pool's 8, so the server
    holds more than 8 submissions at once; fast ones keep 8 (docs/limiter.md#send-width).
    The local server plays a distant one (a loopback server keeps 8 by default)."""
    monkeypatch.setenv(LOOPBACK_WIDENS_ENV, "1")
    faults = [f"asample delay={delay} x*"] if delay else []
    srv = make_server(faults=faults)
    service = make_client(srv)
    sampler = sampler_of(service)
    base = pool("sample-submit").max_workers
    futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(80)]
    done, pending = concurrent.futures.wait(futures, timeout=HANG)
    assert not pending and all(f.exception() is None for f in done)
    reqs = srv.requests.filter("asample")
    overlap = max_overlap([(r.time, r.time + r.duration_s) for r in reqs])
    if wide:
        assert base < overlap <= MAX_SEND_WIDTH, overlap
    else:
        assert overlap <= base, overlap
        assert service._session.limiter.send_width == base


def test_a_loopback_server_keeps_the_base_send_width(make_server, make_client):
    """By default slow exchanges with a server on this machine do not widen the senders:
    the machine is busy, not far away (docs/limiter.md#send-width)."""
    srv = make_server(faults=["asample delay=0.1 x*"])
    sampler = sampler_of(make_client(srv))
    base = pool("sample-submit").max_workers
    futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(5 * base)]
    done, pending = concurrent.futures.wait(futures, timeout=HANG)
    assert not pending and all(f.exception() is None for f in done)
    reqs = srv.requests.filter("asample")
    assert max_overlap([(r.time, r.time + r.duration_s) for r in reqs]) <= base


@pytest.mark.parametrize(
    ("poller", "n"),
    [
        (True, 1000),
        (False, 500),  # > 400: still impossible if the gate were held through polling
        pytest.param(False, 1000, marks=pytest.mark.slow),
    ],
)
def test_all_samples_accepted_before_the_first_result(make_server, make_client, poller, n):
    """Gates are released on acceptance, not held through polling
    (docs/design/behavior.md#dispatch-gates)."""
    srv = make_server(client_config={"sample_use_retrieve_futures": poller})
    sampler = sampler_of(make_client(srv))
    hold(srv)
    done_at: list[float] = []
    lock = threading.Lock()

    def stamp(_f: Any) -> None:
        with lock:
            done_at.append(time.time())

    futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(n)]
    for fut in futures:
        fut.add_done_callback(stamp)
    accepted = srv.requests.wait_for("asample", n, timeout=HANG, status=200)
    assert not done_at  # nothing released while held
    release(srv)
    done, pending = concurrent.futures.wait(futures, timeout=HANG * 2)
    assert not pending and all(f.exception() is None for f in done)
    assert min(done_at) > max(r.time for r in accepted)
    assert len(set(asample_seq_ids(srv))) == n


# ------------------------------------------------------------------------------ backoff


def test_429_retry_after_holds_every_client_of_the_tenant_only(make_server, make_client):
    """A 429 with retry-after-ms 750 holds same-tenant clients
    (docs/design/behavior.md#limiter-registry, docs/design/behavior.md#shared-backoff)."""
    srv = make_server(api_key=None, faults=["asample 429 x1 retry_after_ms=750"])
    other_srv = make_server()
    backed_off = threading.Event()

    def on_event(event: Any) -> None:
        if event.kind == "backoff_set":
            backed_off.set()

    a1 = sampler_of(make_client(srv, api_key="tml-tenant-a", hooks=[on_event]))
    # The same server spelled differently (scheme case, trailing slash) is the same limiter.
    alt_url = srv.url.replace("http://", "HTTP://") + "/"
    a2 = sampler_of(make_client(srv, base_url=alt_url, api_key="tml-tenant-a"))
    other_key = sampler_of(make_client(srv, api_key="tml-tenant-b"))
    other_host = sampler_of(make_client(other_srv))
    first = a1.sample(PROMPT, 1, PARAMS)
    (hit,) = srv.requests.wait_for("asample", 1, timeout=HANG, status=429)
    assert backed_off.wait(HANG)  # the 429 reached the client and set the deadline
    held = a2.sample(PROMPT, 1, PARAMS)
    others = 0
    while not held.done():  # the other tenant and the other server keep sampling meanwhile
        other_key.sample(PROMPT, 1, PARAMS).result(HANG)
        other_host.sample(PROMPT, 1, PARAMS).result(HANG)
        others += 1
        assert others < 10_000
    first.result(HANG)
    held.result(HANG)
    window_end = hit.time + hit.duration_s + 0.75
    tenant_ids = {a1.sampler_id, a2.sampler_id}
    tenant_a = [
        r for r in srv.requests.filter("asample") if r.json["sampling_session_id"] in tenant_ids
    ]
    assert [r.status for r in tenant_a] == [429, 200, 200]
    assert all(r.time >= window_end - 0.02 for r in tenant_a[1:])
    assert tenant_a[1].json["seq_id"] == hit.json["seq_id"]  # same seq_id after a 429
    in_window = [
        r
        for r in (*srv.requests.filter("asample"), *other_srv.requests.filter("asample"))
        if hit.time < r.time < window_end - 0.05 and r not in tenant_a
    ]
    assert in_window  # other keys/hosts were never held


@pytest.mark.parametrize(("tokens", "hold"), [(100, 1.0), (14_000, 5.0)])
def test_429_without_retry_after_holds_1s_or_5s_by_prompt_size(
    make_server, make_client, tokens, hold
):
    """No Retry-After: 1 s for prompts <= 128 KiB, 5 s above (fake clock)
    (docs/design/behavior.md#shared-backoff)."""
    srv = make_server(faults=["asample 429 x1"])
    clock = FakeClock(rng=lambda: 0.5)
    events = Events()
    sampler = sampler_of(make_client(srv, _clock=clock, hooks=[events]))
    prompt = types.ModelInput.from_ints([7] * tokens)
    sampler.sample(prompt, 1, PARAMS).result(HANG)
    (backoff,) = events.of("backoff_set")
    assert backoff["seconds"] == hold and backoff["cause"] == "429 on asample"
    assert [r.status for r in srv.requests.filter("asample")] == [429, 200]
    assert len(set(asample_seq_ids(srv))) == 1
    # The resend waited for the deadline on the clock.
    assert clock.monotonic() >= backoff["until"]


@pytest.mark.parametrize(
    ("fault", "hold"),
    [
        ("retry_after=0.5", 0.5),
        ("retry_after=60", 60.0),
        ("retry_after=61", 1.0),  # outside (0, 60]: the size rule
        ("retry_after=-1", 1.0),
        ("retry_after_ms=60001", 1.0),
        ("retry_after=soon", 1.0),
    ],
)
def test_429_retry_after_is_honoured_only_in_0_to_60s(make_server, make_client, fault, hold):
    """Retry-After in (0, 60] s is the hold, else 1 s / 5 s (a deliberate difference:
    docs/design/behavior.md#shared-backoff)."""
    srv = make_server(faults=[f"asample 429 x1 {fault}"])
    events = Events()
    sampler = sampler_of(make_client(srv, _clock=FakeClock(), hooks=[events]))
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    assert [e["seconds"] for e in events.of("backoff_set")] == [hold]


def test_402_inside_the_billing_window_sets_the_backoff(make_server, make_client):
    """A billing 402 on asample sets the shared deadline and resends the seq_id
    (docs/design/behavior.md#shared-backoff)."""
    srv = make_server(faults=["asample 402 x1"])
    clock = FakeClock(rng=lambda: 0.5)
    events = Events()
    sampler = sampler_of(make_client(srv, _clock=clock, hooks=[events]))
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    (backoff,) = events.of("backoff_set")
    assert backoff["seconds"] == 1.0 and backoff["cause"] == "402 on asample"
    assert [r.status for r in srv.requests.filter("asample")] == [402, 200]
    assert asample_seq_ids(srv) == [0, 0]


def test_paused_sampling_poll_extends_the_deadline_training_does_not(make_server, make_client):
    """Pins docs/design/behavior.md#paused-queue-extends-backoff."""
    srv = make_server(
        faults=[
            "retrieve_future paused_rate_limit x1 match.request_type=ForwardBackward",
            "retrieve_future paused_capacity x1 match.request_type=Sample",
        ]
    )
    events = Events()
    service = make_client(srv, hooks=[events])
    training = service.create_lora_training_client(BASE, rank=4)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]},
    )
    training.forward_backward([datum], "cross_entropy").result(HANG)
    assert srv.faults.rules[0].hits == 1
    assert not events.of("backoff_set")
    limiter = service._session.limiter
    assert limiter.backoff_until == float("-inf")
    sampler = sampler_of(service)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    assert srv.faults.rules[1].hits == 1
    (backoff,) = events.of("backoff_set")
    assert backoff["seconds"] == 1.0 and backoff["cause"] == "queue paused_capacity"
    assert limiter.backoff_until > float("-inf")


# ------------------------------------------------------------------------------ retries


def test_retries_take_new_seq_ids_and_request_failures_do_not(make_server, make_client):
    """A 503 escaping the submission loop and a polled 410 retry; failures don't
    (docs/design/behavior.md#sampling-retry-layer)."""
    srv = make_server(
        faults=[
            "asample 503 x1 should_retry=false",
            "retrieve_future expire x1 match.request_type=Sample",
        ]
    )
    clock = FakeClock(rng=lambda: 1.0 - 1e-12)
    events = Events()
    sampler = sampler_of(make_client(srv, _clock=clock, hooks=[events]))
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    assert [r.status for r in srv.requests.filter("asample")] == [503, 200, 200]
    assert asample_seq_ids(srv) == [0, 1, 2]  # each sampling-layer retry: a new seq_id
    retries = [e for e in events.of("retry_scheduled") if e["layer"] == "sample"]
    assert [e["reason"] for e in retries] == ["InternalServerError", "FutureExpiredError"]
    # delay = min(0.5 * 2^a, 10) * (1 + 0.25 * (2u - 1)), u -> 1: the +25 % extreme.
    assert [round(e["delay"], 6) for e in retries] == [0.625, 1.25]
    srv.faults.add("retrieve_future fail:user x1 match.request_type=Sample")
    with pytest.raises(RequestFailedError):
        sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    assert asample_seq_ids(srv) == [0, 1, 2, 3]  # never retried


def test_enable_retry_logic_false_and_server_no_retries(make_server, make_client):
    """The retry layer off (per config) or bypassed for sample() (per server flag)
    (docs/design/behavior.md#sampling-retry-layer)."""
    srv = make_server(faults=["asample 503 x1 should_retry=false"])
    sampler = sampler_of(make_client(srv), retry_config=RetryConfig(enable_retry_logic=False))
    with pytest.raises(InternalServerError):
        sampler.sample(PROMPT, 1, PARAMS).result(HANG)
    srv2 = make_server(
        client_config={"sample_no_retries": True},
        faults=["asample 503 x2 should_retry=false"],
    )
    sampler2 = sampler_of(make_client(srv2))
    with pytest.raises(InternalServerError):
        sampler2.sample(PROMPT, 1, PARAMS).result(HANG)
    assert sampler2.compute_logprobs(PROMPT).result(HANG)[0] is None  # not bypassed
    assert asample_seq_ids(srv2) == [0, 1, 2]


def test_retry_config_delays_and_classification():
    """min(base * 2^a, max) +- jitter, clamped; what is retryable
    (docs/design/behavior.md#sampling-retry-layer, docs/design/surface.md#retry-config)."""
    from tinker_sync._transport import Reply  # noqa: F401  (import check only)
    from tinker_sync.exceptions import (
        APIConnectionError,
        FutureExpiredError,
        RateLimitError,
        ResponseSnapshot,
    )

    config = RetryConfig()
    assert [config.delay(a, 0.5) for a in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert config.delay(0, 0.0) == 0.375 and config.delay(5, 1.0) == 10.0
    assert config.delay(10_000, 0.5) == 10.0  # no overflow
    assert RetryConfig(jitter_factor=2.0).delay(0, 0.0) == 0.0  # clamped at 0
    hash(config)

    def status(code: int) -> Exception:
        from tinker_sync.exceptions import status_error_class

        return status_error_class(code)("x", response=ResponseSnapshot(code, {}, b"", "http://h/x"))

    for exc in (APIConnectionError(), TimeoutError(), FutureExpiredError("gone"), status(429)):
        assert config.is_retryable(exc)
    for code in (408, 409, 500, 503, 599):
        assert config.is_retryable(status(code))
    # one source: the sampling layer repeats exactly the statuses the HTTP retry loop does
    from tinker_sync._flow.retry import is_retryable_status

    for code in range(400, 700):
        assert config.is_retryable(status(code)) == is_retryable_status(code), code
    for exc in (
        status(400),
        status(404),
        RequestFailedError("no"),
        SamplingStuckError("stuck"),
        RuntimeError("x"),
    ):
        assert not config.is_retryable(exc)
    assert isinstance(status(429), RateLimitError)
    with pytest.raises(ValueError):
        RetryConfig(max_connections=0)


@pytest.mark.parametrize("poller", [False, True])
def test_no_progress_for_7200s_fails_with_sampling_stuck_error(make_server, make_client, poller):
    """The progress timeout runs on the injected clock
    (docs/design/behavior.md#sampling-retry-layer)."""
    cc = {"sample_use_retrieve_futures": True} if poller else None
    srv = make_server(client_config=cc, long_poll_s=0.2)
    srv.set_dynamic_config(sample_cancel_enabled=True)
    clock = FakeClock()
    sampler = sampler_of(make_client(srv, _clock=clock))
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)  # progress at t ~ 0
    hold(srv)
    fut = sampler.sample(PROMPT, 1, PARAMS)
    srv.requests.wait_for("asample", 2, timeout=HANG)
    clock.advance(7100.0)
    srv.requests.wait_for("retrieve_futures" if poller else "retrieve_future", 4, timeout=HANG)
    assert not fut.done()  # 7,100 s is not enough
    clock.advance(101.0)
    with pytest.raises(SamplingStuckError, match="No progress made in 7200s"):
        fut.result(HANG)
    (cancel,) = srv.requests.wait_for("cancel_future", 1, timeout=HANG)
    assert cancel.json == {"request_id": fut.request_id}
    release(srv)
    # Stuck detection is per call: a new call starts a fresh window.
    assert sampler.sample(PROMPT, 1, PARAMS).result(HANG).sequences


def test_stuck_detection_can_be_disabled_by_the_server(make_server, make_client):
    """Server sample_enable_stuck_detection=false forces it off
    (docs/design/behavior.md#sampling-retry-layer)."""
    srv = make_server(client_config={"sample_enable_stuck_detection": False}, long_poll_s=0.2)
    clock = FakeClock()
    sampler = sampler_of(make_client(srv, _clock=clock))
    hold(srv)
    fut = sampler.sample(PROMPT, 1, PARAMS)
    srv.requests.wait_for("asample", 1, timeout=HANG)
    clock.advance(10_000.0)
    n = srv.requests.count("retrieve_future")
    srv.requests.wait_for("retrieve_future", n + 2, timeout=HANG)
    assert not fut.done()
    release(srv)
    assert fut.result(HANG).sequences


def test_concurrency_cap_parks_jobs_without_threads(make_server, make_client):
    """max_connections is honoured (capped by the server) and waiting jobs hold no thread
    (docs/design/behavior.md#sampling-retry-layer)."""
    srv = make_server(client_config={"sample_max_concurrent_requests": 3})
    service = make_client(srv)
    capped = sampler_of(service, retry_config=RetryConfig(max_connections=50))
    assert capped._retry_handler().capacity == 3
    sampler = sampler_of(service, retry_config=RetryConfig(max_connections=2))
    hold(srv)
    futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(40)]
    srv.requests.wait_for("asample", 2, timeout=HANG)
    handler = sampler._retry_handler()
    until(lambda: handler.parked == 38)
    assert srv.requests.count("asample") == 2 and handler.in_flight == 2
    futures[-1].cancel()  # a parked job is skipped when its turn comes
    release(srv)
    done, pending = concurrent.futures.wait(futures[:-1], timeout=HANG)
    assert not pending and all(f.exception() is None for f in done)
    assert srv.requests.count("asample") == 39
    until(lambda: handler.in_flight == 0 and handler.parked == 0)
    srv2 = make_server(client_config={"sample_use_retrieve_futures": True})
    unlimited = sampler_of(make_client(srv2), retry_config=RetryConfig(max_connections=2))
    unlimited.sample(PROMPT, 1, PARAMS).result(HANG)
    assert unlimited._retry_handler().unlimited


# ------------------------------------------------------------------------------ cancellation


def test_cancel_during_backoff_sends_nothing_and_restores_permits(make_server, make_client):
    """Through the public API (docs/design/behavior.md#shared-backoff)."""
    srv = make_server(faults=["asample 429 x1 retry_after=30"])
    service = make_client(srv)
    sampler = sampler_of(service)
    limiter = service._session.limiter
    full = limiter.snapshot()
    first = sampler.sample(PROMPT, 1, PARAMS)
    srv.requests.wait_for("asample", 1, status=429, timeout=HANG)
    until(lambda: limiter.backoff_until > float("-inf"))  # the client has seen the 429
    second = sampler.sample(PROMPT, 1, PARAMS)  # recently backed off: also the gate of 10
    until(lambda: (limiter.snapshot()["count"], limiter.snapshot()["backed_off_count"]) == (398, 9))
    assert first.cancel() and second.cancel()
    until(lambda: limiter.snapshot() == {**full, "backoff_until": limiter.backoff_until})
    assert srv.requests.count("asample") == 1
    handler = sampler._retry_handler()
    until(lambda: handler.in_flight == 0)


@pytest.mark.parametrize("poller", [False, True])
def test_cancel_after_acceptance_stops_waiting_and_cancels_on_the_server(
    make_server, make_client, poller
):
    """Polling stops and cancel_future is sent when the server enables it
    (docs/design/behavior.md#sample-cancellation)."""
    cc = {"sample_use_retrieve_futures": True} if poller else None
    srv = make_server(client_config=cc)
    srv.set_dynamic_config(sample_cancel_enabled=True)
    sampler = sampler_of(make_client(srv))
    hold(srv)
    futures = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(3)]
    srv.requests.wait_for("asample", 3, timeout=HANG)
    until(lambda: all(f.request_id for f in futures))
    assert futures[0].cancel() and futures[1].cancel()
    cancels = srv.requests.wait_for("cancel_future", 2, timeout=HANG)
    assert {r.json["request_id"] for r in cancels} == {futures[0].request_id, futures[1].request_id}
    assert futures[0].cancelled() and not futures[2].done()
    release(srv)
    assert futures[2].result(HANG).sequences
    handler = sampler._retry_handler()
    until(lambda: handler.in_flight == 0)
    srv2 = make_server()  # cancels disabled (default): nothing is sent
    sampler2 = sampler_of(make_client(srv2))
    hold(srv2)
    fut = sampler2.sample(PROMPT, 1, PARAMS)
    until(lambda: fut.request_id is not None)
    assert fut.cancel()
    release(srv2)
    assert sampler2.sample(PROMPT, 1, PARAMS).result(HANG).sequences
    assert srv2.requests.count("cancel_future") == 0


@pytest.mark.parametrize("poller", [False, True])
def test_close_fails_pending_samples(make_server, make_client, poller):
    """close() stops the poller; pending samples fail, later calls raise
    (docs/design/surface.md#sampling-client)."""
    cc = {"sample_use_retrieve_futures": True} if poller else None
    srv = make_server(client_config=cc, long_poll_s=0.3)
    sampler = sampler_of(make_client(srv))
    hold(srv)
    fut = sampler.sample(PROMPT, 1, PARAMS)
    srv.requests.wait_for("asample", 1, timeout=HANG)
    sampler.close()
    sampler.close()
    with pytest.raises(ClientClosedError):
        fut.result(HANG)
    with pytest.raises(ClientClosedError):
        sampler.sample(PROMPT, 1, PARAMS)
    release(srv)


# ------------------------------------------------------------------------------ seq_ids


def _seq_id_run(make_server: Any, make_client: Any, threads: int, per_thread: int) -> None:
    srv = make_server()
    service = make_client(srv, pickle_credentials=True)
    original = sampler_of(service)
    clone = pickle.loads(pickle.dumps(original))
    assert clone._clone_id and clone._clone_id != original._clone_id
    barrier = threading.Barrier(threads)
    futures: list[concurrent.futures.Future[Any]] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        sampler = original if k % 2 == 0 else clone
        barrier.wait(HANG)
        mine = [sampler.sample(PROMPT, 1, PARAMS) for _ in range(per_thread)]
        with lock:
            futures.extend(mine)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(HANG)
    done, pending = concurrent.futures.wait(futures, timeout=HANG * 4)
    assert not pending and all(f.exception() is None for f in done)
    total = threads * per_thread
    assert srv.requests.count("asample") == total  # exact even when the log evicts entries
    # The server dedups on (sampler, seq_id): any collision would show as fewer records.
    assert srv.app is not None
    seqs = list(srv.app._samplers[original.sampler_id].by_seq)
    assert len(seqs) == total and len(set(seqs)) == total
    base = clone._clone_id * SEQ_STRIDE
    assert sorted(s for s in seqs if s < SEQ_STRIDE) == list(range(total // 2))
    assert sorted(s for s in seqs if s >= SEQ_STRIDE) == list(range(base, base + total // 2))
    clone.close()


def test_64_threads_on_two_clones_yield_unique_seq_ids(make_server, make_client):
    """64 threads x 16 samples (reduced size) (docs/design/behavior.md#sampling-lock-free-seq-ids)."""
    _seq_id_run(make_server, make_client, 64, 16)


@pytest.mark.full
def test_64_threads_x_500_samples_unique_seq_ids(make_server, make_client):
    """64 threads x 500 samples on two clones (full size)
    (docs/design/behavior.md#sampling-lock-free-seq-ids)."""
    _seq_id_run(make_server, make_client, 64, 500)


def test_join_sampling_session_assigns_clone_ids(make_server, make_client):
    """With sample_join_sampling_session the server hands out clone ids, once each
    (docs/design/behavior.md#credential-free-pickles)."""
    srv = make_server(client_config={"sample_join_sampling_session": True})
    original = sampler_of(make_client(srv, pickle_credentials=True))
    clones = [pickle.loads(pickle.dumps(original)) for _ in range(2)]
    assert all(c._clone_id is None for c in clones)
    assert srv.requests.count("join_sampling_session") == 0  # unpickling makes no request
    results = [c.sample(PROMPT, 1, PARAMS) for c in clones for _ in range(3)]
    for fut in results:
        fut.result(HANG)
    assert srv.requests.count("join_sampling_session") == 2
    assert sorted(c._clone_id or 0 for c in clones) == [1, 2]
    by_clone = sorted(asample_seq_ids(srv))
    assert by_clone == [SEQ_STRIDE + i for i in range(3)] + [2 * SEQ_STRIDE + i for i in range(3)]
    for clone in clones:
        clone.close()


def test_handles_and_pickles_rebuild_clients_without_io(server, service):
    """The handle layout; unpickling and handle rebuilding send nothing
    (docs/design/behavior.md#credential-free-pickles)."""
    sampler = sampler_of(service, record_stability_info=True)
    handle = sampler.get_sampler_handle()
    import base64

    fields = json.loads(base64.urlsafe_b64decode(handle))
    assert set(fields) == {
        "session_id",
        "sampling_session_id",
        "holder",
        "base_model",
        "record_stability_info",
    }
    assert set(fields["holder"]) == {
        "base_url",
        "default_headers_overrides",
        "client_config",
        "client_dynamic_config",
        "api_key",
    }
    assert fields["holder"]["api_key"] is None and server.api_key not in handle
    before = len(server.requests)
    rebuilt = SamplingClient.from_sampler_handle(handle, api_key=server.api_key)
    assert len(server.requests) == before
    assert rebuilt.sampler_id == sampler.sampler_id and rebuilt.get_base_model() == BASE
    response = rebuilt.sample(PROMPT, 1, PARAMS).result(HANG)
    assert response.sequences
    body = server.requests.filter("asample")[-1].json
    assert body["record_stability_info"] is True
    assert body["seq_id"] // SEQ_STRIDE == rebuilt._clone_id != 0
    with pytest.raises(ValueError, match="not a sampler handle"):
        SamplingClient.from_sampler_handle("bm90LWpzb24")
    # The shadow session's threads stop with its last client (the original is untouched).
    shadow = rebuilt._session
    assert shadow is not service._session and shadow.session_id == service._session.session_id
    rebuilt.close()
    assert shadow._stop.is_set() and not service._session._stop.is_set()
    n = server.requests.count("sessions/*/finish")
    assert sampler.sample(PROMPT, 1, PARAMS).result(HANG).sequences  # the session lives on
    assert server.requests.count("sessions/*/finish") == n == 0  # a shadow never finishes it


def test_a_waiting_caller_runs_its_queued_sample_itself(server, make_client):
    """Inlining: a sample no worker has started is sent from the thread blocked in result()
    (any thread but the main one, which only waits: docs/guarantees.md#signals-and-exit)."""
    from tinker_sync._runtime.executor import DEFAULT_SIZES, pool

    senders: list[tuple[str, str]] = []

    def hook(event: Any) -> None:
        if event.kind == "request" and event["path"] in (
            "/api/v1/asample",
            "/api/v1/retrieve_future",
        ):
            senders.append((event["path"], threading.current_thread().name))

    client = make_client(server, hooks=[hook])
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(PROMPT, 1, PARAMS).result(HANG)  # session and sampler are up
    senders.clear()
    release = threading.Event()
    submit = pool("sample-submit")
    for _ in range(max(submit.max_workers, DEFAULT_SIZES["sample-submit"])):
        submit.submit(release.wait, HANG)  # every worker busy: the sample queues behind them
    got: list[int] = []

    def waiter() -> None:
        fut = sampler.sample(PROMPT, 1, PARAMS)
        got.append(len(fut.result().sequences))  # no timeout: result() may run queued steps

    thread = threading.Thread(target=waiter, name="waiter")
    try:
        thread.start()
        thread.join(HANG)
    finally:
        release.set()
    assert got == [1]
    assert senders == [("/api/v1/asample", "waiter"), ("/api/v1/retrieve_future", "waiter")]
    assert server.requests.count("asample") == 2  # nothing sent twice


# ------------------------------------------------------------------------------ dispatch isolation


def test_a_backed_off_key_with_a_backlog_never_delays_another_key(make_server, make_client):
    """The issue's scenario: A (key 1) queues 700 samples and gets a 429 (Retry-After 60);
    C (key 2) submits 50 right after. All of C's complete while A is still held: the server saw
    from A only the sends that were already under way when the 429 came (one per sender)."""
    srv = make_server(api_key=None, faults=["asample 429 x1 retry_after=60"])
    service_a = make_client(srv, api_key="tml-key-one")
    a = sampler_of(service_a)
    c = sampler_of(make_client(srv, api_key="tml-key-two"))
    a_futures = [a.sample(PROMPT, 1, PARAMS) for _ in range(700)]
    srv.requests.wait_for("asample", 1, timeout=HANG, status=429)
    limiter = service_a._session.limiter
    until(lambda: limiter.backoff_until > float("-inf"))
    width = limiter.send_width
    assert width is not None
    c_futures = [c.sample(PROMPT, 1, PARAMS) for _ in range(50)]
    done, pending = concurrent.futures.wait(c_futures, timeout=HANG)
    assert not pending and all(f.exception() is None for f in done)

    def sent_by_a() -> list[int]:
        return [
            r.status
            for r in srv.requests.filter("asample")
            if r.json["sampling_session_id"] == a.sampler_id
        ]

    statuses = sent_by_a()
    # A is still backed off; a slow send may have had one hedged copy.
    assert statuses.count(429) == 1 and len(statuses) <= 2 * width
    assert sum(f.done() for f in a_futures) <= 2 * width
    service_a.close()  # A's parked samples fail at once, nothing else is sent
    failed = [f for f in a_futures if f.exception(HANG) is not None]
    assert len(failed) >= 700 - 2 * width
    assert all(isinstance(f.exception(), ClientClosedError) for f in failed)
    assert sent_by_a() == statuses


def test_a_second_client_is_served_within_one_sender_behind_a_backlog(make_server, make_client):
    """Two clients of one key: B's first sample is sent as soon as a sender frees up, not
    after A's 3,000-sample backlog (checked in the order the server saw requests)."""
    srv = make_server()
    service = make_client(srv)
    a, b = sampler_of(service), sampler_of(service)
    b.sample(PROMPT, 1, PARAMS).result(HANG)  # both clients ready (clone ids known)
    a.sample(PROMPT, 1, PARAMS).result(HANG)
    width = service._session.limiter.send_width
    assert width is not None
    a_futures = [a.sample(PROMPT, 1, PARAMS) for _ in range(3000)]
    b_future = b.sample(PROMPT, 1, PARAMS)  # queued for dispatch when this returns
    seen_before = srv.requests.count("asample")  # after: thread scheduling cannot widen the gap
    assert b_future.result(HANG).sequences
    log = [r.json["sampling_session_id"] for r in srv.requests.filter("asample")]
    b_index = len(log) - 1 - log[::-1].index(b.sampler_id)
    ahead = b_index - seen_before  # A's requests the server logged after B was submitted
    # Only sends already under way when B arrived (one per sender) go first, plus those the
    # server was still answering at the snapshot (it logs a request once answered).
    assert ahead <= 2 * width, (ahead, width)
    done, pending = concurrent.futures.wait(a_futures, timeout=HANG * 2)
    assert not pending and all(f.exception() is None for f in done)
    sent = [
        (r.json["sampling_session_id"], r.json["seq_id"]) for r in srv.requests.filter("asample")
    ]
    assert len(sent) == len(set(sent)) == 3001 + 2  # nothing sent twice


_SPAWNED = r"""
import json, sys
import tinker_sync
from tinker_sync import types
url, key = sys.argv[1], sys.argv[2]
backoffs = []
service = tinker_sync.ServiceClient(
    base_url=url, api_key=key,
    hooks=[lambda e: e.kind == "backoff_set" and backoffs.append(e["seconds"])],
)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
sampler.sample(prompt, 1, params).result(60)
print(json.dumps({"ready": sampler.sampler_id}), flush=True)
for line in sys.stdin:
    n = int(line)
    if n == 0:
        break
    futures = [sampler.sample(prompt, 1, params) for _ in range(n)]
    for f in futures:
        f.result(120)
    print(json.dumps({"done": n, "backoffs": backoffs}), flush=True)
service.close()
"""


def _spawn(srv: LocalServer, count: int, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SPAWNED, srv.url, srv.api_key or ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": REPO, **env},
        )
        for _ in range(count)
    ]
    return procs


def _tell(proc: subprocess.Popen[str], n: int) -> None:
    assert proc.stdin is not None
    proc.stdin.write(f"{n}\n")
    proc.stdin.flush()


def _hear(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "a sampling process died"
    return dict(json.loads(line))


def _finish(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                _tell(proc, 0)
                proc.wait(HANG)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()


def test_four_spawned_processes_share_one_backoff_deadline(make_server):
    """Four processes of one key: after one gets a 429 (Retry-After 2), the three others send
    nothing until that deadline (server arrival times bound the deadline from below)."""
    srv = make_server()
    procs = _spawn(srv, 4, {})
    try:
        ids = [_hear(p)["ready"] for p in procs]
        srv.faults.add(f"asample 429 x1 retry_after=2 match.sampling_session_id={ids[0]}")
        _tell(procs[0], 1)
        assert _hear(procs[0])["backoffs"] == [2.0]
        (hit,) = srv.requests.filter("asample", status=429)
        for proc in procs[1:]:
            _tell(proc, 5)
        for proc in procs[1:]:
            assert _hear(proc) == {"done": 5, "backoffs": []}  # nobody else saw a 429
        others = [
            r
            for r in srv.requests.filter("asample")
            if r.json["sampling_session_id"] in ids[1:] and r.time > hit.time
        ]
        assert len(others) == 15
        assert min(r.time for r in others) >= hit.time + 2.0 - 0.02
    finally:
        _finish(procs)


def test_the_shared_backoff_can_be_turned_off(make_server):
    """TINKER_SYNC_SHARED_BACKOFF=0: another process keeps sampling through a 60 s backoff."""
    srv = make_server()
    procs = _spawn(srv, 2, {"TINKER_SYNC_SHARED_BACKOFF": "0"})
    try:
        ids = [_hear(p)["ready"] for p in procs]
        srv.faults.add(f"asample 429 x1 retry_after=60 match.sampling_session_id={ids[0]}")
        _tell(procs[0], 1)
        srv.requests.wait_for("asample", 1, timeout=HANG, status=429)
        _tell(procs[1], 5)
        assert _hear(procs[1]) == {"done": 5, "backoffs": []}
        first = [
            r.status
            for r in srv.requests.filter("asample")
            if r.json["sampling_session_id"] == ids[0]
        ]
        assert first == [200, 429]  # the first process is still held meanwhile
        assert not list(Path(os.environ["TINKER_SYNC_RUNTIME_DIR"]).glob("*.backoff"))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
