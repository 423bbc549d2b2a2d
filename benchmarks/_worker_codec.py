"""P4 worker: encoding a forward_backward (chunking + serialization), via bench_codec's cases.

Usage: ``python _worker_codec.py codec --size JSON [--profile PATH]``; prints one JSON line
``{"sdk": "codec", "benches": {"codec": {"ours": [s...], "official": [...], "raw": [...]}}}``.

The three encoders (tinker_sync, the official converters, raw numpy + protobuf) come from
``bench_codec._encode_cases`` and run round-robin in this one process, so machine noise hits
all alike (pure CPU work: no server, no threads). ``--profile`` profiles only ``ours``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_codec  # noqa: E402
from _common import Profiler, finish, parse_worker_args, peak_rss_mb  # noqa: E402


def main() -> None:
    args = parse_worker_args()
    if args.bench != "codec":
        raise SystemExit(f"unknown bench {args.bench!r}; known: ('codec',)")
    size = args.size["codec"]
    cases = bench_codec._encode_cases(int(size["datums"]), int(size["tokens"]), False)
    profiler = Profiler(args.profile)
    samples: dict[str, list[float]] = {label: [] for label in cases}
    chunks: dict[str, int] = {}
    for _ in range(int(size["warmup"])):
        for label, fn in cases.items():
            chunks[label] = len(fn())
    for _ in range(int(size["reps"])):
        for label, fn in cases.items():
            if label == "ours":
                with profiler.section():
                    start = time.perf_counter()
                    out: Any = fn()
            else:
                start = time.perf_counter()
                out = fn()
            samples[label].append(time.perf_counter() - start)
            chunks[label] = len(out)
    profiler.save()
    if len(set(chunks.values())) != 1:
        raise AssertionError(f"encoders disagree on the chunk count: {chunks}")
    finish(
        {
            "sdk": "codec",
            "benches": {
                "codec": {**samples, "chunks": chunks["ours"], "peak_rss_mb": peak_rss_mb()}
            },
        }
    )


if __name__ == "__main__":
    main()
