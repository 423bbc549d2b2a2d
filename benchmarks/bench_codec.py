"""Benchmark the protobuf codecs against the official SDK and a raw numpy+protobuf baseline.

Usage::

    python benchmarks/bench_codec.py            # 1024 datums x 4096 tokens, 64 sequences
    python benchmarks/bench_codec.py --quick    # small sizes (CI smoke run)
    python benchmarks/bench_codec.py --json out.json

Cases (each: one warm-up, then ``--reps`` timed runs interleaved round-robin between the
implementations, median reported):

* encode: a forward_backward of N datums x L tokens (``target_tokens`` int64 + ``weights``
  float32 per datum), chunked at 1024 datums / 5,000,000 estimated bytes, every chunk
  serialized. Inputs given as numpy arrays and as Python lists.
* decode fwd/bwd: a ForwardBackwardOutput of N datums (``logprobs`` float32 [L] each).
* decode sample: a SampleResponse of 64 sequences (tokens, logprobs, top-5 logprobs) plus
  prompt logprobs.

``ours`` is tinker_sync, ``official`` is tinker 0.38's converters (skipped when tinker is not
installed), ``raw`` fills generated protobuf messages from numpy ``tobytes()`` and serializes
(encode) or parses and slices ``numpy.frombuffer`` views without building result objects
(decode).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinker_sync import types as T  # noqa: E402
from tinker_sync._wire import _chunking, _proto  # noqa: E402
from tinker_sync._wire import tinker_public_pb2 as pb  # noqa: E402
from tinker_sync.local import _protocodec as server_codec  # noqa: E402
from tinker_sync.local.backends.base import SampledSeq, SampleResult  # noqa: E402

tinker: Any
try:
    import tinker
    from tinker.lib.public_interfaces import training_client as official_training
    from tinker.proto import request_conv as official_request
    from tinker.proto import response_conv as official_response
except ImportError:  # pragma: no cover - the bench extra installs tinker
    tinker = None

MAX_LEN = 1024
MAX_BYTES = 5_000_000


def _time_all(cases: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median seconds per case; the cases run round-robin so machine noise hits all alike."""
    for fn in cases.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(reps):
        for label, fn in cases.items():
            start = time.perf_counter()
            fn()
            samples[label].append(time.perf_counter() - start)
    return {label: statistics.median(values) for label, values in samples.items()}


def _chunks(sizes: list[int]) -> list[tuple[int, int]]:
    return _chunking.chunk_ranges_from_sizes(sizes, MAX_LEN, MAX_BYTES)


# ------------------------------------------------------------------------------ encode


def _encode_cases(n: int, length: int, as_lists: bool) -> dict[str, Callable[[], Any]]:
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 150_000, length, dtype=np.int64) for _ in range(n)]
    weights = [np.ones(length, np.float32) for _ in range(n)]
    # The token ids as the caller holds them (every variant starts from these).
    given: list[Any] = [t.tolist() if as_lists else t.astype(np.int32) for t in tokens]

    ours_data = [
        T.Datum(
            model_input=T.ModelInput.from_ints(g),
            loss_fn_inputs={
                "target_tokens": T.TensorData(data=t, dtype="int64", shape=[length]),
                "weights": T.TensorData(data=w, dtype="float32", shape=[length]),
            },
        )
        for g, t, w in zip(given, tokens, weights, strict=True)
    ]

    def ours() -> list[bytes]:
        ranges = _chunking.chunk_ranges(ours_data, MAX_LEN, MAX_BYTES)
        return [
            _proto.encode_forward_backward_request(
                "m", i + 1, ours_data[a:b], "cross_entropy", None, False
            )
            for i, (a, b) in enumerate(ranges)
        ]

    def raw() -> list[bytes]:
        sizes = [t.nbytes // 2 + t.nbytes + w.nbytes for t, w in zip(tokens, weights, strict=True)]
        out = []
        for i, (a, b) in enumerate(_chunks(sizes)):
            msg = pb.ForwardBackwardRequest(model_id="m", seq_id=i + 1, loss_fn="cross_entropy")
            for g, t, w in zip(given[a:b], tokens[a:b], weights[a:b], strict=True):
                datum = msg.data.add()
                datum.model_input.add().encoded_text.tokens = np.asarray(g, np.int32).tobytes()
                target = datum.loss_fn_inputs["target_tokens"]
                target.dense = t.tobytes()
                target.dtype = pb.DTYPE_INT64
                target.shape.append(length)
                weight = datum.loss_fn_inputs["weights"]
                weight.dense = w.tobytes()
                weight.dtype = pb.DTYPE_FLOAT32
                weight.shape.append(length)
            out.append(msg.SerializeToString())
        return out

    cases = {"ours": ours, "raw": raw}
    if tinker is not None:
        ot = tinker.types
        official_data = [
            ot.Datum(
                # pydantic refuses numpy token arrays: the official SDK always gets a list.
                model_input=ot.ModelInput(chunks=[ot.EncodedTextChunk(tokens=t.tolist())]),
                loss_fn_inputs={
                    "target_tokens": ot.TensorData(data=t, dtype="int64", shape=[length]),
                    "weights": ot.TensorData(data=w, dtype="float32", shape=[length]),
                },
            )
            for t, w in zip(tokens, weights, strict=True)
        ]

        def official() -> list[bytes]:
            estimate = official_training._estimate_datum_bytes_count_proto
            sizes = [estimate(d) for d in official_data]
            out = []
            for i, (a, b) in enumerate(_chunks(sizes)):
                request = ot.ForwardBackwardRequest(
                    forward_backward_input=ot.ForwardBackwardInput(
                        data=official_data[a:b], loss_fn="cross_entropy"
                    ),
                    model_id="m",
                    seq_id=i + 1,
                )
                out.append(
                    official_request.forward_backward_request_to_proto(request).SerializeToString()
                )
            return out

        cases["official"] = official
    return cases


# ------------------------------------------------------------------------------ decode


def _fbo_payload(n: int, length: int) -> bytes:
    rng = np.random.default_rng(1)
    outputs = [{"logprobs": -rng.random(length, dtype=np.float32)} for _ in range(n)]
    return server_codec.encode_forward_backward_output(
        "ArrayRecord", outputs, {"loss:sum": 1.0, "ntokens:sum": float(n * length)}
    )


def _decode_fbo_cases(payload: bytes) -> dict[str, Callable[[], Any]]:
    def raw() -> list[np.ndarray]:
        msg = pb.ForwardBackwardOutput()
        msg.ParseFromString(payload)
        arrays: list[np.ndarray] = []
        for record in msg.loss_fn_outputs:
            bt = record.fields["logprobs"]
            data = np.frombuffer(bt.data, np.float32)
            offsets = np.frombuffer(bt.offsets, np.int64) // 4
            arrays.extend(data[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True))
        return arrays

    cases: dict[str, Callable[[], Any]] = {
        "ours": lambda: _proto.decode_forward_backward_output(payload),
        "raw": raw,
    }
    if tinker is not None:
        cases["official"] = lambda: official_response.deserialize_forward_backward_output(payload)
    return cases


def _sample_payload(sequences: int, length: int, prompt: int, k: int) -> bytes:
    rng = np.random.default_rng(2)
    result = SampleResult(
        sequences=[
            SampledSeq(
                tokens=rng.integers(0, 150_000, length).astype(np.int32),
                logprobs=-rng.random(length, dtype=np.float32),
                stop_reason="length",
                topk_ids=rng.integers(0, 150_000, (length, k)).astype(np.int32),
                topk_logprobs=-rng.random((length, k), dtype=np.float32),
            )
            for _ in range(sequences)
        ],
        prompt_logprobs=np.concatenate([[np.nan], -rng.random(prompt - 1)]).astype(np.float32),
    )
    return server_codec.encode_sample_response(result)


def _decode_sample_cases(payload: bytes, sequences: int) -> dict[str, Callable[[], Any]]:
    ids = [f"s:{i}" for i in range(sequences)]

    def raw() -> list[tuple[np.ndarray, ...]]:
        msg = pb.SampleResponse()
        msg.ParseFromString(payload)
        out: list[tuple[np.ndarray, ...]] = []
        for seq in msg.sequences:
            topk = seq.topk_sampled_logprobs
            out.append(
                (
                    np.frombuffer(seq.tokens, np.int32).copy(),
                    np.frombuffer(seq.logprobs, np.float32).copy(),
                    np.frombuffer(topk.token_ids, np.int32).reshape(topk.length, topk.k).copy(),
                    np.frombuffer(topk.logprobs, np.float32).reshape(topk.length, topk.k).copy(),
                )
            )
        return out

    cases: dict[str, Callable[[], Any]] = {
        "ours": lambda: _proto.decode_sample_response(payload, ids),
        "raw": raw,
    }
    if tinker is not None:
        cases["official"] = lambda: official_response.deserialize_sample_response(payload)
    return cases


# ------------------------------------------------------------------------------ main


def _report(name: str, cases: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    times = _time_all(cases, reps)
    ours = times["ours"]
    parts = [f"{label} {seconds * 1e3:8.1f} ms" for label, seconds in times.items()]
    ratios = [
        f"ours/{label} {ours / seconds:5.2f}x"
        for label, seconds in times.items()
        if label != "ours" and seconds > 0
    ]
    print(f"{name:<34} " + " | ".join(parts) + "   (" + ", ".join(ratios) + ")")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (>= 5)")
    parser.add_argument("--json", type=Path, help="also write the medians (seconds) here")
    args = parser.parse_args(argv)
    reps = max(5, args.reps)
    n, length = (64, 512) if args.quick else (1024, 4096)
    sequences, seq_len, prompt, k = (8, 64, 128, 5) if args.quick else (64, 1024, 4096, 5)
    if tinker is None:
        print("tinker is not installed: official SDK columns skipped")
    print(f"median of {reps} runs after one warm-up; ratio < 1 means ours is faster")
    results: dict[str, dict[str, float]] = {}
    results[f"encode {n}x{length} numpy"] = _report(
        f"encode {n}x{length} (numpy tokens)", _encode_cases(n, length, False), reps
    )
    results[f"encode {n}x{length} lists"] = _report(
        f"encode {n}x{length} (list tokens)", _encode_cases(n, length, True), reps
    )
    payload = _fbo_payload(n, length)
    results[f"decode fwdbwd {n}x{length}"] = _report(
        f"decode fwdbwd {n}x{length}", _decode_fbo_cases(payload), reps
    )
    sample = _sample_payload(sequences, seq_len, prompt, k)
    results[f"decode sample {sequences}x{seq_len}"] = _report(
        f"decode sample {sequences}x{seq_len} top{k}",
        _decode_sample_cases(sample, sequences),
        reps,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
