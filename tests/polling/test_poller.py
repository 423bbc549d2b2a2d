"""The session futures poller against a real LocalServer
(docs/design/behavior.md#session-futures-poller, docs/design/behavior.md#thread-inventory).

The poller is driven directly (raw ``asample`` submissions plus recording waiters) for the
protocol cases, and through ``SamplingClient`` for the thread-bound test, which runs in a
subprocess so that its thread count is not polluted by other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from waiting import until  # tests/waiting.py

import tinker_sync
from tinker_sync import types
from tinker_sync._flow.limiter import reset_limiters
from tinker_sync._polling.poller import SessionFuturesPoller
from tinker_sync._runtime.clock import FakeClock
from tinker_sync._session.state import Session
from tinker_sync._transport import Pool, RequestSpec
from tinker_sync.exceptions import ClientClosedError, TinkerError
from tinker_sync.local import LocalServer
from tinker_sync.sampling_client import SamplingClient

HANG = 60.0
PROMPT = types.ModelInput.from_ints([1, 2, 3])
PARAMS = types.SamplingParams(max_tokens=3)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Recorder:
    """A poller waiter that records what it was given."""

    def __init__(self, abandon: BaseException | None = None) -> None:
        self.done = threading.Event()
        self.completion: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.thread = ""
        self.abandon = abandon

    def on_completion(self, completion: dict[str, Any]) -> None:
        self.completion = completion
        self.thread = threading.current_thread().name
        self.done.set()

    def on_failure(self, exc: BaseException) -> None:
        self.error = exc
        self.thread = threading.current_thread().name
        self.done.set()

    def abandoned(self) -> BaseException | None:
        return self.abandon

    def wait(self) -> Recorder:
        assert self.done.wait(HANG), "waiter was never called"
        return self


class Rig:
    """A started session, a sampler id and raw submissions on one server."""

    def __init__(self, srv: LocalServer, clock: Any = None) -> None:
        kwargs = {} if clock is None else {"_clock": clock}
        self.srv = srv
        self.service = tinker_sync.ServiceClient(base_url=srv.url, api_key=srv.api_key, **kwargs)
        self.sampler: SamplingClient = self.service.create_sampling_client(base_model="base")
        self.session: Session = self.service._session
        self.seq = 0

    def submit(self) -> str:
        body = self.sampler._sample_body(PROMPT, 1, PARAMS, False, 0, 0, None, 0, None)
        body["seq_id"] = self.seq
        self.seq += 1
        reply = self.session.request(
            RequestSpec(method="POST", path="/api/v1/asample", pool=Pool.SAMPLE, json=body)
        )
        request_id = reply.json()["request_id"]
        assert isinstance(request_id, str)
        return request_id

    def finished_on_server(self, request_id: str) -> None:
        """Block until the server has completed ``request_id`` (a plain retrieve_future)."""
        spec = RequestSpec(
            method="POST",
            path="/api/v1/retrieve_future",
            pool=Pool.RETRIEVE_PROMISE,
            json={"request_id": request_id, "allow_metadata_only": True},
        )
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            reply = self.session.request(spec)
            data = reply.json() if "json" in reply.headers.get("content-type", "") else None
            if not (isinstance(data, dict) and data.get("type") == "try_again"):
                return
        raise AssertionError("request never finished")

    def poller(self) -> SessionFuturesPoller:
        return SessionFuturesPoller(self.session, self.sampler.sampler_id, 0)

    def polls(self, at_least: int = 0) -> list[dict[str, Any]]:
        """The retrieve_futures bodies (the log records a request once it is answered)."""
        if at_least:
            self.srv.requests.wait_for("retrieve_futures", at_least, timeout=HANG)
        return [r.json for r in self.srv.requests.filter("retrieve_futures")]

    def close(self) -> None:
        self.service.close()


@pytest.fixture
def make_rig() -> Iterator[Callable[..., Rig]]:
    made: list[tuple[LocalServer, Rig]] = []

    def make(clock: Any = None, **kwargs: Any) -> Rig:
        kwargs.setdefault("long_poll_s", 2.0)
        srv = LocalServer(
            backend="instant", client_config={"sample_use_retrieve_futures": True}, **kwargs
        ).start()
        rig = Rig(srv, clock)
        made.append((srv, rig))
        return rig

    yield make
    for srv, rig in made:
        rig.close()
        srv.stop()
    reset_limiters()


# ------------------------------------------------------------------- the official poller cases


def test_idle_long_poll_then_ack_with_timeout_zero(make_rig):
    """No thread while idle; long poll with the hold the server advertised (its 2 s,
    under the client's 5 s); ack-only poll with 0.0; idle.

    See docs/design/behavior.md#session-futures-poller.
    """
    rig = make_rig()
    poller = rig.poller()
    assert poller.polls == 0 and not poller.parked.is_set()
    rid = rig.submit()
    assert rig.polls() == []  # nothing waits: nothing is polled
    waiter = Recorder()
    poller.wait(rid, waiter)
    waiter.wait()
    assert waiter.completion is not None and waiter.completion["request_id"] == rid
    assert waiter.completion["state"] == "finished"
    assert waiter.thread.startswith("tinker_sync-sample-poll")  # on the fetch lane
    poller.mark_retrieved(rid)
    assert poller.parked.wait(HANG)
    polls = rig.polls(at_least=poller.polls)
    assert len(polls) == poller.polls  # idle: nothing after the last ack
    first, *acks = polls
    assert first["timeout"] == 2.0 and first["prev_cursor"] == 0
    assert first["retrieved_request_ids"] == []
    assert first["target"] == {
        "type": "sampling_session",
        "sampling_session_id": rig.sampler.sampler_id,
        "cloned_sampler_id": 0,
    }
    assert acks and all(a["timeout"] == 0.0 for a in acks)
    assert acks[-1]["prev_cursor"] == 1
    assert sum(a["retrieved_request_ids"].count(rid) for a in acks) == 1
    long_polls = rig.srv.requests.filter("retrieve_futures")
    assert long_polls[0].headers["x-stainless-read-timeout"] == "4"  # the hold + 2 s
    assert all(r.headers["x-stainless-read-timeout"] == "5" for r in long_polls[1:])


def test_retrieved_ids_are_sorted_and_sent_exactly_once(make_rig):
    """Each fetched id is reported once, on the next successful poll
    (docs/design/behavior.md#session-futures-poller)."""
    rig = make_rig()
    poller = rig.poller()
    rids = [rig.submit() for _ in range(6)]
    waiters = [Recorder() for _ in rids]
    for rid, waiter in zip(rids, waiters):
        poller.wait(rid, waiter)
    for waiter in waiters:
        waiter.wait()
    for rid in reversed(rids):
        poller.mark_retrieved(rid)
    assert poller.parked.wait(HANG)
    reported = [i for p in rig.polls(at_least=poller.polls) for i in p["retrieved_request_ids"]]
    assert sorted(reported) == sorted(rids) and len(reported) == len(set(reported))
    assert all(
        p["retrieved_request_ids"] == sorted(p["retrieved_request_ids"]) for p in rig.polls()
    )


def test_403_fails_current_and_future_waiters(make_rig):
    """A non-retryable status is terminal for every waiter of the poller
    (docs/design/behavior.md#session-futures-poller)."""
    rig = make_rig()
    rig.srv.faults.add("retrieve_futures 403 x*")
    poller = rig.poller()
    waiter = Recorder()
    poller.wait(rig.submit(), waiter)
    assert isinstance(waiter.wait().error, TinkerError)
    assert "retrieve_futures polling failed" in str(waiter.error)
    assert "PermissionDeniedError" in str(waiter.error)
    later = Recorder()
    poller.wait(rig.submit(), later)
    assert isinstance(later.wait().error, TinkerError)
    assert poller.polls == 1 and len(rig.polls(at_least=1)) == 1  # no poll after the failure


def test_a_recorded_completion_wins_over_a_later_failure(make_rig):
    """Completions recorded before a terminal error are still handed out
    (docs/design/behavior.md#session-futures-poller)."""
    rig = make_rig()
    poller = rig.poller()
    a, b = rig.submit(), rig.submit()
    rig.finished_on_server(a)
    rig.finished_on_server(b)
    first = Recorder()
    poller.wait(a, first)  # the one poll returns both completions; b's is recorded
    first.wait()
    rig.srv.faults.add("retrieve_futures 403 x*")
    poller.mark_retrieved(a)  # the ack poll gets the 403: terminal
    until(lambda: poller.failure is not None)
    recorded = Recorder()
    poller.wait(b, recorded)
    assert recorded.wait().completion is not None and recorded.completion["request_id"] == b
    fresh = Recorder()
    poller.wait(rig.submit(), fresh)
    assert isinstance(fresh.wait().error, TinkerError)


def test_400_is_retried_three_times_with_budget_reset(make_rig):
    """400 x3 recovers (1 s apart); the budget resets after a success; x4 is fatal
    (docs/design/behavior.md#session-futures-poller)."""
    clock = FakeClock()
    rig = make_rig(clock)
    rig.srv.faults.add("retrieve_futures 400 x3")
    poller = rig.poller()
    first = Recorder()
    poller.wait(rig.submit(), first)
    assert first.wait().completion is not None
    assert clock.sleeps_for("futures-poller-400") == [1.0, 1.0, 1.0]
    rig.srv.faults.add("retrieve_futures 400 x3")
    second = Recorder()
    poller.wait(rig.submit(), second)
    assert second.wait().completion is not None  # budget was reset by the success
    rig.srv.faults.add("retrieve_futures 400 x4")
    third = Recorder()
    poller.wait(rig.submit(), third)
    assert isinstance(third.wait().error, TinkerError)
    assert "BadRequestError" in str(third.error)
    assert clock.sleeps_for("futures-poller-400") == [1.0] * 9


def test_500_and_402_are_retried(make_rig):
    """Retryable errors sleep 1 s; a billing 402 sleeps 5 s; then the poll succeeds
    (docs/design/behavior.md#session-futures-poller)."""
    clock = FakeClock()
    rig = make_rig(clock)
    rig.srv.faults.extend(["retrieve_futures 500 x2", "retrieve_futures 402 x1"])
    poller = rig.poller()
    waiter = Recorder()
    poller.wait(rig.submit(), waiter)
    assert waiter.wait().completion is not None
    assert clock.sleeps_for("futures-poller-retry") == [1.0, 1.0]
    assert clock.sleeps_for("futures-poller-billing") == [5.0]


def test_completions_of_forgotten_requests_are_dropped(make_rig):
    """A cancelled (forgotten) request's completion is not kept for a waiter
    (docs/design/behavior.md#sample-cancellation)."""
    rig = make_rig()
    assert rig.srv.app is not None
    rig.srv.app.pause("active", None, "sampling")
    poller = rig.poller()
    gone, kept = rig.submit(), rig.submit()
    poller.wait(gone, Recorder())
    assert poller.forget(gone) and not poller.forget(gone)
    waiter = Recorder()
    poller.wait(kept, waiter)
    rig.srv.resume()
    assert waiter.wait().completion is not None
    rig.finished_on_server(gone)
    poller.mark_retrieved(kept)
    assert poller.parked.wait(HANG)
    assert poller._completions == {} and poller._forgotten == {}


def test_pending_shows_samples_waiting_on_the_poller(make_rig):
    """ServiceClient.pending() lists a sample that waits on the session futures poller, with the
    polls sent since it was accepted and what the last poll saw (docs/guarantees.md)."""
    rig = make_rig()
    rig.srv.pause("active", kind="sampling")  # the sample stays pending; polls are held

    def sample_entry() -> Any:
        found = [p for p in rig.service.pending() if p.kind == "Sample"]
        return found[0] if found else None

    try:
        fut = rig.sampler.sample(PROMPT, 1, PARAMS)
        until(lambda: (e := sample_entry()) is not None and e.last_status == "HTTP 200")
        entry = sample_entry()
        assert entry.request_id == fut.request_id and entry.attempts >= 1
        rig.srv.faults.add("retrieve_futures 503 x*")
        until(lambda: (e := sample_entry()) is not None and e.last_status == "HTTP 503")
        assert sample_entry().attempts >= 2  # the poll answered 200, then at least this one
        rig.srv.faults.clear()
    finally:
        rig.srv.resume()
    assert fut.result(HANG).sequences
    assert rig.service.pending() == []


def test_abandoned_waiters_and_close(make_rig):
    """Waiters may abandon (stuck, closed); close fails the rest and later waits."""
    rig = make_rig(long_poll_s=0.2)
    assert rig.srv.app is not None
    rig.srv.app.pause("active", None, "sampling")
    poller = rig.poller()
    gone = Recorder(abandon=RuntimeError("stuck"))
    stays = Recorder()
    poller.wait(rig.submit(), gone)
    poller.wait(rig.submit(), stays)
    assert isinstance(gone.wait().error, RuntimeError)
    assert not stays.done.is_set() and poller.waiting == 1
    poller.close()
    assert isinstance(stays.wait().error, ClientClosedError)
    late = Recorder()
    poller.wait(rig.submit(), late)
    assert isinstance(late.wait().error, ClientClosedError)
    rig.srv.resume()


# ----------------------------------------------------------------------------- thread bounds

_T_C8_CHILD = r"""
import json, sys, threading
peak = {"sdk": 0, "all": 0}
_start = threading.Thread.start
def counting_start(self, *a, **k):
    _start(self, *a, **k)
    names = [t.name for t in threading.enumerate()]
    peak["all"] = max(peak["all"], len(names))
    peak["sdk"] = max(peak["sdk"], sum(n.startswith("tinker_sync-") for n in names))
threading.Thread.start = counting_start
import tinker_sync
from tinker_sync import types
url, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
service = tinker_sync.ServiceClient(base_url=url, api_key=key)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
prompt = types.ModelInput.from_ints([1, 2, 3])
futures = [sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)) for _ in range(n)]
pause = threading.Event()
while not all(f.request_id for f in futures):   # every sample accepted and pending
    pause.wait(0.01)
print(json.dumps({"pending": sum(not f.done() for f in futures), **peak}), flush=True)
sys.stdin.readline()                              # the parent releases the results
ok = sum(1 for f in futures if f.result(240).sequences)
service.close()
def sdk_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("tinker_sync-")]
give_up = threading.Event()
give_up_timer = threading.Timer(30, give_up.set)
give_up_timer.daemon = True                       # the child exits when done, not 30 s later
give_up_timer.start()
while sdk_threads() and not give_up.is_set():   # idle workers exit on close, not after 30 s
    pause.wait(0.01)
print(json.dumps({"ok": ok, **peak, "after_close": sdk_threads()}), flush=True)
"""


def _pending_samples_within_bounds(n: int, poller: bool, bound: int) -> None:
    with LocalServer(
        backend="instant",
        long_poll_s=2.0,
        client_config={"sample_use_retrieve_futures": poller},
    ) as srv:
        assert srv.app is not None
        srv.app.pause("active", None, "sampling")
        proc = subprocess.Popen(
            [sys.executable, "-c", _T_C8_CHILD, srv.url, srv.api_key or "", str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            held = json.loads(proc.stdout.readline() or "null")
            assert held is not None, proc.stderr.read() if proc.stderr else ""
            assert held["pending"] == n
            assert held["sdk"] <= bound, held
            srv.resume()
            proc.stdin.write("\n")
            proc.stdin.flush()
            final = json.loads(proc.stdout.readline() or "null")
            assert final is not None and final["ok"] == n
            assert final["sdk"] <= bound, final
            assert final["after_close"] == [], final
            assert proc.wait(HANG) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert srv.requests.count("asample") == n
        if poller:
            assert srv.requests.count("retrieve_futures") < n  # one poll serves many samples


def test_1000_pending_samples_through_the_poller_stay_within_24_threads():
    """Pending samples hold no thread: peak SDK threads <= 24; none left after close()."""
    _pending_samples_within_bounds(1000, poller=True, bound=24)


@pytest.mark.full
def test_2000_pending_samples_through_the_poller_stay_within_24_threads():
    """Full size of the 1,000 test: 2,000 pending samples, peak SDK threads <= 24; none left
    after close()."""
    _pending_samples_within_bounds(2000, poller=True, bound=24)


@pytest.mark.slow
def test_2000_pending_samples_without_the_poller_stay_within_the_pool_bounds():
    """Without the poller, polling threads are capped by the sample-poll pool (400, polls
    run by lent senders included); senders: 8, and 8 more in place of lent ones
    (docs/design/behavior.md#thread-inventory, docs/polling.md#which-thread-polls)."""
    _pending_samples_within_bounds(2000, poller=False, bound=400 + 16 + 8)


def test_a_cancel_enqueue_interrupted_at_any_signal_point_never_stops_later_cancels() -> None:
    """A user's cancel on the main thread, cut short by a signal handler's exception anywhere in
    the cancel queue's enqueue, may lose its own cancel but never leaves the queue flagged as
    draining with no drain: the next cancel is sent (docs/limiter.md#signals)."""
    from signal_points import interrupt_at

    from tinker_sync._polling import poller as poller_module
    from tinker_sync._polling.poller import CancelQueue

    def where(code: Any) -> bool:
        return code.co_filename == poller_module.__file__

    with LocalServer(backend="instant") as srv:
        srv.set_dynamic_config(sample_cancel_enabled=True)
        service = tinker_sync.ServiceClient(base_url=srv.url, api_key=srv.api_key)
        try:
            sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
            prompt = types.ModelInput.from_ints([1, 2])
            sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1)).result(HANG)
            queue = CancelQueue(service._session)
            points = interrupt_at(None, lambda: queue.enqueue("count"), where)
            assert points > 3
            for point in range(points):
                queue = CancelQueue(service._session)
                interrupt_at(point, lambda: queue.enqueue(f"cut{point}"), where)  # noqa: B023
                assert queue.enqueue(f"next{point}")
                deadline = time.monotonic() + HANG
                while not any(
                    r.endpoint == "cancel_future" and f"next{point}" in str(r.json)
                    for r in srv.requests.all()
                ):
                    assert time.monotonic() < deadline, f"next{point} was never sent"
                    threading.Event().wait(0.005)
        finally:
            service.close()
