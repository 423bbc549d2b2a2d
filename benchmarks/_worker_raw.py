"""Raw-HTTP baseline ("limit"): the protocol's round trips over urllib3, no SDK.

Usage: ``python _worker_raw.py BENCH[,BENCH...] --url U --key K --size JSON``; prints one JSON
line ``{"sdk": "raw", "benches": {bench: metrics}}``.

Exactly the requests a client needs and nothing else: ``client/config`` and ``create_session``
once; ``create_sampling_session`` (sampling) or ``create_model`` + its future (training); then
``asample`` / ``forward_backward`` (protobuf) / ``optim_step`` and ``retrieve_future`` long polls
until a result. Results are parsed (protobuf via the generated module, JSON via ``json``) but no
result objects are built. No retries, no heartbeats, no telemetry, no validation. Every request
carries the same header lines, in number and size, as the same request from both SDKs (the
protocol's headers, docs/design/protocol.md#headers, plus the platform headers both send), so
every column puts the same bytes on the wire.

Benches: ``sample`` (pipelined like tinker_sync: every sample is handed at once to a pool of
submit threads that post ``asample``, and each accepted sample to a pool of poll threads that
long-poll its result; the two pool sizes mirror the thread counts tinker_sync itself used in the
same run, ``size["mirror"]``), ``latency`` (sequential on one keep-alive connection) and
``train`` (pipelined fwd/bwd + optim_step: submissions on the main thread, each step's two
results long-polled by two helper threads on their own connections). ``sample_tls`` and
``latency_tls`` are the same against an HTTPS URL (the CA from ``REQUESTS_CA_BUNDLE``).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import urllib3

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import (  # noqa: E402
    BASE_MODEL,
    VOCAB,
    Rusage,
    WorkerArgs,
    cpu_seconds,
    finish,
    parse_worker_args,
    peak_rss_mb,
    percentile,
)

# The generated protobuf module only (no tinker_sync client code runs).
from tinker_sync._wire import tinker_public_pb2 as pb  # noqa: E402

PROTO = "application/x-protobuf"
#: Submit / poll thread counts when tinker_sync's own were not measured (smoke runs).
DEFAULT_MIRROR = {"submit": 32, "poll": 64}


#: Sent with every request, as both SDKs do (values as tinker_sync's).
_COMMON_HEADERS = {
    "Accept-Encoding": "gzip, deflate",
    "User-Agent": "tinker-sync/0.1.0 (protocol 0.38.0)",
    "X-Stainless-Lang": "python",
    "X-Stainless-Package-Version": "0.1.0",
    "X-Stainless-OS": platform.system(),
    "X-Stainless-Arch": {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(
        platform.machine().lower(), platform.machine()
    ),
    "X-Stainless-Runtime": platform.python_implementation(),
    "X-Stainless-Runtime-Version": platform.python_version(),
    "X-Stainless-Async": "false",
    "x-stainless-retry-count": "0",
    "x-sdk-version": "0.38.0",
}
#: Per endpoint: the public method the SDKs name in ``x-sdk-method``, and extra headers.
_ENDPOINT_HEADERS = {
    "/api/v1/asample": {
        "x-sdk-method": "SamplingClient.sample",
        "X-Tinker-Sampling-Backpressure": "1",
    },
    "/api/v1/forward_backward": {"x-sdk-method": "TrainingClient.forward_backward"},
    "/api/v1/optim_step": {"x-sdk-method": "TrainingClient.optim_step"},
}


class RawClient:
    """A urllib3 connection pool speaking the protocol's JSON / protobuf round trips.

    Thread safety: any thread (urllib3 pools are thread-safe). Fork safety: none needed.
    """

    def __init__(self, url: str, api_key: str, maxsize: int = 1) -> None:
        tls: dict[str, Any] = {}
        if urlsplit(url).scheme == "https":
            tls = {"cert_reqs": "CERT_REQUIRED", "ca_certs": os.environ.get("REQUESTS_CA_BUNDLE")}
        self.pool = urllib3.connection_from_url(
            url,
            maxsize=maxsize,
            block=True,
            retries=False,
            timeout=urllib3.Timeout(connect=10.0, read=60.0),
            **tls,
        )
        self.api_key = api_key
        self.session_id = ""

    def headers(
        self, path: str, content_type: str, accept: str = "application/json", read_s: int = 60
    ) -> dict[str, str]:
        """The header lines both SDKs send with this request (a fresh idempotency key)."""
        return {
            "Accept": accept,
            **_COMMON_HEADERS,
            "x-stainless-read-timeout": str(read_s),
            "Content-Type": content_type,
            "X-Idempotency-Key": f"raw-{uuid.uuid4()}",
            **_ENDPOINT_HEADERS.get(path, {}),
            "X-API-Key": self.api_key,
        }

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.pool.request(
            "POST",
            path,
            body=json.dumps(body).encode(),
            headers=self.headers(path, "application/json"),
        )
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status} {r.data[:200]!r}")
        out: dict[str, Any] = json.loads(r.data)
        return out

    def post_proto(self, path: str, body: bytes) -> dict[str, Any]:
        r = self.pool.request("POST", path, body=body, headers=self.headers(path, PROTO))
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status} {r.data[:200]!r}")
        out: dict[str, Any] = json.loads(r.data)
        return out

    def wait(
        self, request_id: str, kind: str = "Sample", created: float | None = None
    ) -> bytes | dict[str, Any]:
        """Long-poll ``retrieve_future`` until the result: protobuf bytes or a JSON object.
        ``kind`` and ``created`` (``time.monotonic()`` at submission) fill the poll headers."""
        allow_metadata = True
        method = "SamplingClient.sample" if kind == "Sample" else f"TrainingClient.{kind}"
        for iteration in itertools.count():
            headers = self.headers("/api/v1/retrieve_future", "application/json", PROTO, 45)
            headers["x-sdk-method"] = method
            headers["X-Tinker-Request-Iteration"] = str(iteration)
            headers["X-Tinker-Request-Type"] = kind
            if iteration == 0:
                roundtrip = time.monotonic() - created if created is not None else 0.0
                headers["X-Tinker-Create-Promise-Roundtrip-Time"] = f"{roundtrip:.6f}"
            r = self.pool.request(
                "POST",
                "/api/v1/retrieve_future",
                body=json.dumps(
                    {"request_id": request_id, "allow_metadata_only": allow_metadata}
                ).encode(),
                headers=headers,
            )
            if r.status == 408 or r.status >= 500:
                continue
            if r.status != 200:
                raise RuntimeError(f"retrieve_future: HTTP {r.status} {r.data[:200]!r}")
            if PROTO in r.headers.get("content-type", ""):
                return bytes(r.data)
            body: dict[str, Any] = json.loads(r.data)
            if body.get("type") == "try_again":
                continue
            if body.get("status") == "complete_metadata":
                allow_metadata = False
                continue
            if "error" in body:
                raise RuntimeError(f"future failed: {body}")
            return body

    def start_session(self) -> None:
        self.post("/api/v1/client/config", {"sdk_version": "0.38.0"})
        self.session_id = self.post(
            "/api/v1/create_session",
            {"tags": [], "user_metadata": {}, "sdk_version": "0.38.0", "type": "create_session"},
        )["session_id"]

    def sampling_session(self, seq: int = 0) -> str:
        return str(
            self.post(
                "/api/v1/create_sampling_session",
                {
                    "session_id": self.session_id,
                    "sampling_session_seq_id": seq,
                    "base_model": BASE_MODEL,
                    "type": "create_sampling_session",
                },
            )["sampling_session_id"]
        )


def _sample_body(sampler: str, seq_id: int, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {
        "sampling_session_id": sampler,
        "seq_id": seq_id,
        "num_samples": 1,
        "prompt": {"chunks": [{"tokens": prompt, "type": "encoded_text"}]},
        "sampling_params": {"max_tokens": max_tokens},
        "prompt_logprobs": False,
        "topk_prompt_logprobs": 0,
        "topk_sample_logprobs": 0,
        "prompt_alt_tokens_k": 0,
        "record_stability_info": False,
        "type": "sample",
    }


def _one_sample(
    client: RawClient, sampler: str, seq_id: int, prompt: list[int], max_tokens: int
) -> int:
    created = time.monotonic()
    future = client.post("/api/v1/asample", _sample_body(sampler, seq_id, prompt, max_tokens))
    payload = client.wait(future["request_id"], created=created)
    if not isinstance(payload, bytes):
        raise RuntimeError(f"expected a protobuf SampleResponse, got {payload}")
    msg = pb.SampleResponse()
    msg.ParseFromString(payload)
    return len(np.frombuffer(msg.sequences[0].tokens, np.int32))


def _prompt(length: int) -> list[int]:
    return [(i * 7 + 3) % VOCAB for i in range(length)]


class RawBench:
    """The raw benches against one server. Not thread-safe (each bench drives its own threads)."""

    def __init__(self, args: WorkerArgs, bench: str) -> None:
        self.args = args
        self.size: dict[str, Any] = args.size[bench]

    # -- P1 / P2 -------------------------------------------------------------------------------

    def _throughput(self, submit_threads: int, poll_threads: int, n: int) -> tuple[float, float]:
        """``n`` samples, all handed over at once: ``submit_threads`` threads post them, and
        ``poll_threads`` threads long-poll each accepted one. Returns (wall s, cpu s)."""
        client = RawClient(self.args.url, self.args.api_key, maxsize=submit_threads + poll_threads)
        client.start_session()
        sampler = client.sampling_session()
        prompt, max_tokens = _prompt(int(self.size["prompt"])), int(self.size["max_tokens"])
        submitters = ThreadPoolExecutor(submit_threads, thread_name_prefix="raw-submit")
        pollers = ThreadPoolExecutor(poll_threads, thread_name_prefix="raw-poll")

        def result(request_id: str, created: float) -> int:
            payload = client.wait(request_id, created=created)
            if not isinstance(payload, bytes):
                raise RuntimeError(f"expected a protobuf SampleResponse, got {payload}")
            msg = pb.SampleResponse()
            msg.ParseFromString(payload)
            return len(np.frombuffer(msg.sequences[0].tokens, np.int32))

        def submit(seq_id: int) -> Future[int]:
            created = time.monotonic()
            accepted = client.post(
                "/api/v1/asample", _sample_body(sampler, seq_id, prompt, max_tokens)
            )
            return pollers.submit(result, accepted["request_id"], created)

        cpu0, t0 = cpu_seconds(), time.perf_counter()
        handed = [submitters.submit(submit, i) for i in range(n)]
        lengths = [f.result().result() for f in handed]
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        submitters.shutdown()
        pollers.shutdown()
        client.pool.close()
        if min(lengths) == 0:
            raise RuntimeError("empty sample")
        return wall, cpu

    def bench_sample(self) -> dict[str, Any]:
        n = int(self.size["n"])
        mirror = {**DEFAULT_MIRROR, **(self.size.get("mirror") or {})}
        submit, poll = max(1, int(mirror["submit"])), max(1, int(mirror["poll"]))
        if self.size["warmup"]:
            self._throughput(submit, poll, int(self.size["warmup"]))
        throughput: list[float] = []
        cpu_per_sample: list[float] = []
        with Rusage() as usage:
            for _ in range(int(self.size["reps"])):
                wall, cpu = self._throughput(submit, poll, n)
                throughput.append(n / wall)
                cpu_per_sample.append(cpu / n)
        return {
            "per_sample": usage.result(per=n * int(self.size["reps"])),
            "samples_per_s": throughput,
            "cpu_s_per_sample": cpu_per_sample,
            "threads": {"submit": submit, "poll": poll},
            "peak_rss_mb": peak_rss_mb(),
        }

    # -- P7 --------------------------------------------------------------------------------------

    def bench_latency(self) -> dict[str, Any]:
        client = RawClient(self.args.url, self.args.api_key)
        client.start_session()
        sampler = client.sampling_session()
        prompt, max_tokens = _prompt(int(self.size["prompt"])), int(self.size["max_tokens"])
        seq = itertools.count()

        def run(count: int) -> list[float]:
            out = []
            for _ in range(count):
                t0 = time.perf_counter()
                _one_sample(client, sampler, next(seq), prompt, max_tokens)
                out.append(time.perf_counter() - t0)
            return out

        if self.size["warmup"]:
            run(int(self.size["warmup"]))
        p50: list[float] = []
        every: list[float] = []
        for _ in range(int(self.size["reps"])):
            lat = run(int(self.size["n"]))
            every.extend(lat)
            p50.append(percentile(lat, 0.5) * 1e3)
        return {"p50_ms": p50, "p90_ms_all": percentile(every, 0.9) * 1e3}

    # -- P3 --------------------------------------------------------------------------------------

    def bench_train(self) -> dict[str, Any]:
        client = RawClient(self.args.url, self.args.api_key, maxsize=3)
        client.start_session()
        created = client.post(
            "/api/v1/create_model",
            {
                "session_id": client.session_id,
                "model_seq_id": 0,
                "base_model": BASE_MODEL,
                "lora_config": {
                    "rank": 8,
                    "train_unembed": True,
                    "train_mlp": True,
                    "train_attn": True,
                },
                "optimizer_config": {"type": "adamw"},
                "type": "create_model",
            },
        )
        result = client.wait(created["request_id"], "CreateModel")
        assert isinstance(result, dict)
        model_id = str(result["model_id"])
        datums, length = int(self.size["datums"]), int(self.size["tokens"])
        rng = np.random.default_rng(0)
        rows = [rng.integers(0, VOCAB, length + 1, dtype=np.int64) for _ in range(datums)]
        inputs = [r[:-1].astype(np.int32) for r in rows]
        targets = [r[1:].copy() for r in rows]
        weights = [np.ones(length, np.float32) for _ in range(datums)]
        seq = itertools.count(1)
        adam = {
            "learning_rate": 1e-4,
            "beta1": 0.9,
            "beta2": 0.95,
            "eps": 1e-12,
            "weight_decay": 0.0,
            "grad_clip_norm": 0.0,
        }

        def fwdbwd() -> str:
            msg = pb.ForwardBackwardRequest(
                model_id=model_id, seq_id=next(seq), loss_fn="cross_entropy"
            )
            for tokens, target, weight in zip(inputs, targets, weights, strict=True):
                datum = msg.data.add()
                datum.model_input.add().encoded_text.tokens = tokens.tobytes()
                t = datum.loss_fn_inputs["target_tokens"]
                t.dense = target.tobytes()
                t.dtype = pb.DTYPE_INT64
                t.shape.append(length)
                w = datum.loss_fn_inputs["weights"]
                w.dense = weight.tobytes()
                w.dtype = pb.DTYPE_FLOAT32
                w.shape.append(length)
            return str(
                client.post_proto("/api/v1/forward_backward", msg.SerializeToString())["request_id"]
            )

        def optim() -> str:
            body = {
                "model_id": model_id,
                "seq_id": next(seq),
                "type": "optim_step",
                "adam_params": adam,
            }
            return str(client.post("/api/v1/optim_step", body)["request_id"])

        def outputs(request_id: str) -> int:
            payload = client.wait(request_id, "ForwardBackward")
            assert isinstance(payload, bytes)
            out = pb.ForwardBackwardOutput()
            out.ParseFromString(payload)
            # Outputs come batched: one record per field group, datums delimited by offsets.
            return sum(
                len(np.frombuffer(record.fields["logprobs"].offsets, np.int64)) - 1
                for record in out.loss_fn_outputs
            )

        # Results are polled on other connections while the next step is submitted.
        waiters = ThreadPoolExecutor(max_workers=2)

        def run(steps: int) -> tuple[float, float]:
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            pending: tuple[Future[int], Future[Any]] | None = None
            for _ in range(steps):
                fb, opt = fwdbwd(), optim()
                step = (waiters.submit(outputs, fb), waiters.submit(client.wait, opt, "OptimStep"))
                if pending is not None:
                    pending[0].result()
                    pending[1].result()
                pending = step
            assert pending is not None
            if pending[0].result() != datums:
                raise AssertionError("forward_backward returned the wrong number of outputs")
            pending[1].result()
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
            return wall / steps, cpu / steps

        for _ in range(int(self.size["warmup"])):
            run(2)
        per_step: list[float] = []
        cpu_per_step: list[float] = []
        for _ in range(int(self.size["reps"])):
            wall, cpu = run(int(self.size["steps"]))
            per_step.append(wall)
            cpu_per_step.append(cpu)
        return {
            "s_per_step": per_step,
            "cpu_s_per_step": cpu_per_step,
            "peak_rss_mb": peak_rss_mb(),
        }

    bench_sample_tls = bench_sample
    bench_latency_tls = bench_latency


BENCHES = ("sample", "latency", "train", "sample_tls", "latency_tls")


def main() -> None:
    args = parse_worker_args()
    names = args.bench.split(",")
    unknown = [name for name in names if name not in BENCHES]
    if unknown:
        raise SystemExit(f"unknown bench {unknown!r}; known: {BENCHES}")
    results = {name: getattr(RawBench(args, name), f"bench_{name}")() for name in names}
    finish({"sdk": "raw", "benches": results})


if __name__ == "__main__":
    main()
