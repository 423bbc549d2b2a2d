"""Shadow sessions of unpickled SamplingClients (tinker_sync._sampling.handles), against a real
LocalServer: a client finalized by the garbage collector in the middle of another unpickling
(docs/design/behavior.md#credential-free-pickles).

The scenario runs in a child process, so a deadlock there fails this test (with the child's
stack) instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tinker_sync._flow.limiter import reset_limiters
from tinker_sync.local import LocalServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG = 60.0
KEY = "tml-shadow-test-key-0123456789abcdef"

# Two samplers of two sessions, pickled with their key. The first is unpickled, samples and
# becomes garbage that only the cyclic collector frees (as an unpickled client in a Ray worker
# often is); the collection then happens while the second is unpickled, at the point where its
# shadow session is built (any allocation there may start one). The first client's finalizer
# thus runs on the thread that holds the registry lock.
_CHILD = r"""
import faulthandler, gc, json, pickle, sys
faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)  # a deadlock shows its stack
import tinker_sync
from tinker_sync import types
from tinker_sync._session.state import Session
url, key = sys.argv[1], sys.argv[2]
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
services = [tinker_sync.ServiceClient(base_url=url, api_key=key, pickle_credentials=True)
            for _ in range(2)]
blobs = [pickle.dumps(s.create_sampling_client(base_model="Qwen/Qwen3-8B")) for s in services]
gc.disable()  # collections happen only where this script says
first = pickle.loads(blobs[0])
first.sample(prompt, 1, params).result(60)
first_session, finalizer = first._session, first._shadow_release
first.self_reference = first
del first
build = Session.shadow.__func__
def shadow_with_a_collection(cls, *args, **kwargs):
    gc.collect()
    return build(cls, *args, **kwargs)
Session.shadow = classmethod(shadow_with_a_collection)
second = pickle.loads(blobs[1])
result = {
    "first_finalized": not finalizer.alive,
    "first_stopped": first_session._stop.is_set(),
    "second_sequences": len(second.sample(prompt, 1, params).result(60).sequences),
    "second_stopped": second._session._stop.is_set(),
}
second.close()
result["second_stopped_on_close"] = second._session._stop.is_set()
for service in services:
    service.close()
print(json.dumps(result))
"""


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer(backend="instant", api_key=KEY, long_poll_s=1.0) as srv:
        yield srv
    reset_limiters()


def run_child(script: str, *args: str) -> dict[str, object]:
    """Run ``script`` in a child process; its last stdout line is a JSON report."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, *args, str(HANG / 2)],
            capture_output=True,
            text=True,
            timeout=HANG,
            env={**os.environ, "PYTHONPATH": REPO},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child hung past its own stack dump: {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-12000:]
    assert KEY not in proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_a_client_finalized_while_another_is_unpickled_releases_without_deadlock(server):
    """The finalizer's release is applied once the unpickling lets go of the registry lock."""
    assert run_child(_CHILD, server.url, KEY) == {
        "first_finalized": True,
        "first_stopped": True,  # its shadow session's threads stopped with its last client
        "second_sequences": 1,
        "second_stopped": False,
        "second_stopped_on_close": True,
    }


# 16 threads unpickle clients of 3 sessions at once; half are closed, half dropped as cyclic
# garbage, and collections run on every thread now and then (also inside another thread's, or
# the same thread's, unpickling). Afterwards every shadow session has stopped and left the
# registry, and a fresh client of each session still samples.
_MANY = r"""
import faulthandler, gc, json, pickle, sys, threading
faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)
import tinker_sync
from tinker_sync import types
from tinker_sync._sampling import handles
url, key = sys.argv[1], sys.argv[2]
THREADS, ROUNDS = 16, 30
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
services = [tinker_sync.ServiceClient(base_url=url, api_key=key, pickle_credentials=True)
            for _ in range(3)]
blobs = [pickle.dumps(s.create_sampling_client(base_model="Qwen/Qwen3-8B")) for s in services]
gc.set_threshold(50)  # frequent young collections, wherever an allocation happens
barrier = threading.Barrier(THREADS)
seen, errors = [], []
def work(k):
    try:
        barrier.wait(60)
        for i in range(ROUNDS):
            client = pickle.loads(blobs[(k + i) % len(blobs)])
            seen.append(client._session)
            if i % 2:
                client.close()
            else:
                client.self_reference = client
            del client
            if i % 7 == k % 7:
                gc.collect()
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
gc.collect()
shadows = {id(s): s for s in seen}
fresh = [pickle.loads(b) for b in blobs]
sequences = [len(c.sample(prompt, 1, params).result(60).sequences) for c in fresh]
registered = {id(entry[0]) for entry in handles._shadow_sessions.values()}
print(json.dumps({
    "errors": errors,
    "unpickled": len(seen),
    "shadows_running": sum(not s._stop.is_set() for s in shadows.values()),
    "shadows_registered": len(registered & set(shadows)),
    "releases_queued": len(handles._deferred),
    "fresh_sequences": sequences,
}))
for c in fresh:
    c.close()
for s in services:
    s.close()
"""


def test_many_threads_unpickling_and_dropping_clients_leave_no_shadow_running(server):
    report = run_child(_MANY, server.url, KEY)
    assert report == {
        "errors": [],
        "unpickled": 16 * 30,
        "shadows_running": 0,
        "shadows_registered": 0,
        "releases_queued": 0,
        "fresh_sequences": [1, 1, 1],
    }
    # what the server saw: three samples, and only the three owners finished their sessions
    assert len(server.requests.filter("asample")) == 3
    assert server.requests.count("sessions/*/finish") == 3
