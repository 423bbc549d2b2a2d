"""Sampling dispatch isolation, measured from what a local server saw (issue 14's scenarios).

Usage::

    python benchmarks/bench_dispatch.py                # every scenario, one JSON line each
    python benchmarks/bench_dispatch.py --only key,client

Scenarios (times are the server's arrival times minus the client's submission time):

* ``key``: client A (key 1) queues 700 samples and gets one 429 with ``Retry-After: 2``;
  client C (key 2) submits 50 right after. Reports C's first-send delay.
* ``client``: client A queues 10,000 samples; client B (same key) submits 1 right after.
  Reports B's first-send delay and how many of A's samples the server saw before it.
* ``process``: process P2 (same key) sends samples in a loop while process P1 gets a 429 with
  ``Retry-After: 2``. Reports how long after the 429 P2 kept sending.
* ``threads``: peak SDK threads with 1,000 pending samples, session poller on, and the SDK
  threads left 2 s after ``close()``.

Runs whichever ``tinker_sync`` is first on ``PYTHONPATH`` (compare two checkouts that way).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tinker_sync
from tinker_sync import types
from tinker_sync.local import LocalServer

PROMPT = types.ModelInput.from_ints([1, 2, 3, 4])
PARAMS = types.SamplingParams(max_tokens=2)
BASE = "Qwen/Qwen3-8B"


def _first_time(srv: LocalServer, sampler_id: str) -> float:
    return min(
        r.time
        for r in srv.requests.filter("asample")
        if r.json.get("sampling_session_id") == sampler_id
    )


def scenario_key() -> dict[str, Any]:
    with LocalServer(
        backend="instant", api_key=None, faults=["asample 429 x1 retry_after=2"]
    ) as srv:
        a_service = tinker_sync.ServiceClient(base_url=srv.url, api_key="tml-key-one")
        c_service = tinker_sync.ServiceClient(base_url=srv.url, api_key="tml-key-two")
        a = a_service.create_sampling_client(base_model=BASE)
        c = c_service.create_sampling_client(base_model=BASE)
        a_futs = [a.sample(PROMPT, 1, PARAMS) for _ in range(700)]
        srv.requests.wait_for("asample", 1, timeout=60, status=429)
        t_submit = time.time()
        c_futs = [c.sample(PROMPT, 1, PARAMS) for _ in range(50)]
        for f in [*c_futs, *a_futs]:
            f.result(120)
        delay = _first_time(srv, c.sampler_id) - t_submit
        a_service.close()
        c_service.close()
    return {"scenario": "key", "second_key_first_send_ms": round(delay * 1e3, 1)}


def scenario_client() -> dict[str, Any]:
    with LocalServer(backend="instant") as srv:
        service = tinker_sync.ServiceClient(base_url=srv.url, api_key=srv.api_key)
        a = service.create_sampling_client(base_model=BASE)
        b = service.create_sampling_client(base_model=BASE)
        a.sample(PROMPT, 1, PARAMS).result(60)
        b.sample(PROMPT, 1, PARAMS).result(60)
        a_futs = [a.sample(PROMPT, 1, PARAMS) for _ in range(10_000)]
        t_submit = time.time()
        b_fut = b.sample(PROMPT, 1, PARAMS)
        b_fut.result(300)
        b_first = max(
            r.time
            for r in srv.requests.filter("asample")
            if r.json.get("sampling_session_id") == b.sampler_id
        )
        ahead = sum(
            1
            for r in srv.requests.filter("asample")
            if r.json.get("sampling_session_id") == a.sampler_id and t_submit < r.time < b_first
        )
        for f in a_futs:
            f.result(300)
        service.close()
    return {
        "scenario": "client",
        "second_client_first_send_ms": round((b_first - t_submit) * 1e3, 1),
        "backlog_samples_sent_before_it": ahead,
    }


_LOOPER = r"""
import sys, threading, time
import tinker_sync
from tinker_sync import types
url, key, stop_file = sys.argv[1], sys.argv[2], sys.argv[3]
service = tinker_sync.ServiceClient(base_url=url, api_key=key)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
sampler.sample(prompt, 1, params).result(60)
print("ready", flush=True)
import os
while not os.path.exists(stop_file):
    futs = [sampler.sample(prompt, 1, params) for _ in range(4)]
    for f in futs:
        f.result(60)
service.close()
"""


def scenario_process(tmp: Path) -> dict[str, Any]:
    with LocalServer(backend="instant") as srv:
        stop_file = tmp / "stop"
        looper = subprocess.Popen(
            [sys.executable, "-c", _LOOPER, srv.url, srv.api_key or "", str(stop_file)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        try:
            assert looper.stdout is not None
            assert looper.stdout.readline().strip() == "ready"
            service = tinker_sync.ServiceClient(base_url=srv.url, api_key=srv.api_key)
            p1 = service.create_sampling_client(base_model=BASE)
            p1.sample(PROMPT, 1, PARAMS).result(60)
            srv.faults.add(
                f"asample 429 x1 retry_after=2 match.sampling_session_id={p1.sampler_id}"
            )
            p1.sample(PROMPT, 1, PARAMS).result(60)
            (hit,) = srv.requests.filter("asample", status=429)
            t429 = hit.time + hit.duration_s
            others = [
                r.time
                for r in srv.requests.filter("asample")
                if r.json.get("sampling_session_id") != p1.sampler_id
                and t429 <= r.time < t429 + 1.9
            ]
            service.close()
        finally:
            stop_file.touch()
            looper.wait(60)
    kept = (max(others) - t429) if others else 0.0
    return {
        "scenario": "process",
        "other_process_kept_sending_ms": round(kept * 1e3, 1),
        "other_process_sends_in_backoff": len(others),
    }


_THREADS = r"""
import json, sys, threading, time
peak = {"sdk": 0}
_start = threading.Thread.start
def counting_start(self, *a, **k):
    _start(self, *a, **k)
    peak["sdk"] = max(peak["sdk"], sum(t.name.startswith("tinker_sync-") for t in threading.enumerate()))
threading.Thread.start = counting_start
import tinker_sync
from tinker_sync import types
url, key = sys.argv[1], sys.argv[2]
service = tinker_sync.ServiceClient(base_url=url, api_key=key)
sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2)
futures = [sampler.sample(prompt, 1, params) for _ in range(1000)]
while not all(f.request_id for f in futures):
    time.sleep(0.01)
pending = peak["sdk"]
service.close()
time.sleep(2.0)
left = sum(t.name.startswith("tinker_sync-") for t in threading.enumerate())
print(json.dumps({"peak_with_1000_pending": pending, "sdk_threads_2s_after_close": left}))
"""


def scenario_threads() -> dict[str, Any]:
    with LocalServer(backend="instant", client_config={"sample_use_retrieve_futures": True}) as srv:
        assert srv.app is not None
        srv.app.pause("active", None, "sampling")
        out = subprocess.run(
            [sys.executable, "-c", _THREADS, srv.url, srv.api_key or ""],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        srv.resume()
    return {"scenario": "threads", **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="key,client,process,threads")
    args = parser.parse_args()
    print(json.dumps({"tinker_sync": tinker_sync.__file__}), flush=True)
    for name in args.only.split(","):
        if name == "process":
            with tempfile.TemporaryDirectory() as tmp:
                result = scenario_process(Path(tmp))
        else:
            result = {"key": scenario_key, "client": scenario_client, "threads": scenario_threads}[
                name
            ]()
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
