"""Raw capacity of the local server on this machine.

Usage::

    python benchmarks/bench_server.py            # full run (~1 minute)
    python benchmarks/bench_server.py --quick    # a few seconds per measurement
    python benchmarks/bench_server.py --json     # one JSON document

Measures, against a ``LocalServer(backend="instant")`` running in a child process (so the load
generator does not share the server's GIL):

1. ``GET /api/v1/healthz`` requests/s over raw keep-alive sockets: one serial connection, then
   several client processes;
2. ``asample`` + ``retrieve_future`` round trips/s (submit, long-poll until the result);
3. concurrently held ``retrieve_future`` long polls, and the healthz latency while they are held.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import selectors
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinker_sync.local import LocalServer  # noqa: E402

KEY = "tml-bench"
HEALTHZ = b"GET /api/v1/healthz HTTP/1.1\r\nHost: bench\r\nX-API-Key: tml-bench\r\n\r\n"
SESSION = {"tags": [], "sdk_version": "0.38.0", "type": "create_session"}
SAMPLE = {
    "base_model": "Qwen/Qwen3-8B",
    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3, 4]}]},
    "sampling_params": {"max_tokens": 4},
    "num_samples": 1,
    "type": "sample",
}


class RawClient:
    """A minimal keep-alive HTTP/1.1 client over one socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> tuple[int, bytes]:
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status = int(head[9:12])
        i = head.lower().find(b"content-length:")
        n = int(head[i + 15 :].split(b"\r\n", 1)[0]) if i >= 0 else 0
        while len(rest) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            rest += chunk
        self.buf = rest[n:]
        return status, rest[:n]

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: bench\r\nX-API-Key: {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode()
        self.send(head + data)
        return self.response()

    def close(self) -> None:
        self.sock.close()


def _healthz_worker(port: int, duration: float, queue: Any) -> None:
    client = RawClient(port)
    n = 0
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline:
        client.send(HEALTHZ)
        status, _ = client.response()
        assert status == 200, status
        n += 1
    client.close()
    queue.put(n)


def bench_healthz(port: int, duration: float, processes: int) -> dict[str, float]:
    out: dict[str, float] = {}
    ctx = multiprocessing.get_context("spawn")
    for procs in sorted({1, processes}):
        queue = ctx.Queue()
        workers = [
            ctx.Process(target=_healthz_worker, args=(port, duration, queue)) for _ in range(procs)
        ]
        for w in workers:
            w.start()
        total = sum(queue.get(timeout=duration + 120) for _ in workers)
        for w in workers:
            w.join()
        out[f"healthz_rps_{procs}_conn"] = total / duration
    return out


def bench_sample_round_trips(port: int, duration: float, threads: int) -> dict[str, float]:
    setup = RawClient(port)
    status, _ = setup.request("POST", "/api/v1/create_session", SESSION)
    assert status == 200, status
    setup.close()
    counts: list[int] = []
    latencies: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        client = RawClient(port)
        n = 0
        lat: list[float] = []
        deadline = time.perf_counter() + duration
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, body = client.request("POST", "/api/v1/asample", SAMPLE)
            assert status == 200, (status, body)
            rid = json.loads(body)["request_id"]
            while True:
                status, body = client.request(
                    "POST", "/api/v1/retrieve_future", {"request_id": rid}
                )
                assert status == 200, (status, body)
                if b'"try_again"' not in body:
                    break
            lat.append(time.perf_counter() - t0)
            n += 1
        client.close()
        with lock:
            counts.append(n)
            latencies.extend(lat)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {
        "sample_round_trips_per_s": sum(counts) / duration,
        "sample_round_trip_p50_ms": statistics.median(latencies) * 1000 if latencies else 0.0,
    }


def bench_held_polls(n: int) -> dict[str, float]:
    with LocalServer(api_key=KEY, in_subprocess=True, work_delay_s=600, long_poll_s=300) as server:
        port = server.port
        setup = RawClient(port)
        assert setup.request("POST", "/api/v1/create_session", SESSION)[0] == 200
        status, body = setup.request("POST", "/api/v1/asample", SAMPLE)
        assert status == 200
        rid = json.loads(body)["request_id"]
        data = json.dumps({"request_id": rid}).encode()
        poll = (
            f"POST /api/v1/retrieve_future HTTP/1.1\r\nHost: bench\r\nX-API-Key: {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode() + data
        t0 = time.perf_counter()
        socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(poll)
            socks.append(s)
        opened = time.perf_counter() - t0
        lat = []
        for _ in range(50):
            t1 = time.perf_counter()
            setup.send(HEALTHZ)
            assert setup.response()[0] == 200
            lat.append(time.perf_counter() - t1)
        with selectors.DefaultSelector() as sel:
            for s in socks:
                sel.register(s, selectors.EVENT_READ)
            answered = sel.select(0)
        assert not answered, f"{len(answered)} polls were answered instead of held"
        stop0 = time.perf_counter()
        server.stop()
        stop_s = time.perf_counter() - stop0
        for s in socks:
            s.close()
        setup.close()
    return {
        "held_polls": float(n),
        "held_polls_open_s": opened,
        "healthz_p50_ms_while_held": statistics.median(lat) * 1000,
        "stop_s_with_held_polls": stop_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short measurements")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--duration", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--processes", type=int, default=2, help="client processes for healthz")
    parser.add_argument("--threads", type=int, default=4, help="client threads for sampling")
    parser.add_argument("--polls", type=int, default=None, help="long polls to hold")
    args = parser.parse_args()
    duration = args.duration or (2.0 if args.quick else 8.0)
    polls = args.polls or (1000 if args.quick else 2000)

    results: dict[str, Any] = {"cpus": os.cpu_count(), "duration_s": duration}
    with LocalServer(api_key=KEY, in_subprocess=True) as server:
        results.update(bench_healthz(server.port, duration, args.processes))
        results.update(bench_sample_round_trips(server.port, duration, args.threads))
    results.update(bench_held_polls(polls))

    if args.json:
        print(json.dumps(results))
    else:
        for key, value in results.items():
            print(f"{key:32s} {value:12.1f}" if isinstance(value, float) else f"{key:32s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
