"""Run every benchmark row of tinker_sync against the official SDK and a raw-HTTP limit.

Usage::

    python benchmarks/run.py                  # full sizes (5+ repetitions; ~20-30 minutes)
    python benchmarks/run.py --quick          # smaller sizes, 3+ repetitions, < 10 minutes
    python benchmarks/run.py --smoke          # toy sizes, 1 repetition (the smoke test)
    python benchmarks/run.py --quick --only P1,P7   # -> results/only/quick-P1_P7.json
    python benchmarks/run.py --quick --only P1,P7 --out /tmp/r.json
    python benchmarks/run.py --quick --profile-missed   # + a CPU profile of ours per missed row
    python benchmarks/run.py --quick --only P3 --profile P3   # profile a row even when met

One process tree: a ``LocalServer(backend="instant", in_subprocess=True)`` in its own process;
per benchmark a worker process for tinker_sync (``_worker_ours.py``), one for the official SDK
(``_worker_official.py``) and one for the raw-HTTP baseline (``_worker_raw.py``, urllib3 doing
exactly the protocol's round trips), all against that same server; P1T / P7T run against a
second server that speaks HTTPS with a throwaway certificate; P4 runs bench_codec's three
encoders round-robin in one process (``_worker_codec.py``); P8 times a first result in fresh
interpreters (``_first_result.py``). Each worker warms up, then runs the repetitions and prints
one JSON line. Every column of a row does the same work on the same inputs (the same payload
types too: token lists for both SDKs). P1-U3 / P2-U3 run the P1 workload with tinker_sync on
its urllib3 request path (``TINKER_SYNC_TRANSPORT=urllib3``, worker ``ours_u3``) in the same
interleaved rounds as P1, so they share P1's official and limit columns. Every process of a run
shares one bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary directory), filled by untimed
warm-ups, so fresh-interpreter rows (P8, P10-FIRST) see both SDKs compiled, as after an install.

Rows (the judged ratio is ours / official unless said; the table shows both ours / official and
ours / limit):

==  ==========================================================  ==================================
P1  sample throughput, n concurrent sample() calls; limit: raw  ratio >= 2.0, ours >= 0.8 x limit
    urllib3 with tinker_sync's pipelining and thread counts
P1T P1 over HTTPS                                                as P1
P1-U3 P1 with tinker_sync on its urllib3 path                    as P1
P2  client CPU-s per sample in P1                                ratio <= 0.15
P2-U3 P2 with tinker_sync on its urllib3 path                    ratio <= 0.2
P3  pipelined training step wall time (fwd/bwd + optim_step)     ratio <= 1.0
P4  encoding a forward_backward (chunking + serialization)       ratio <= 1.0, ours <= 2 x raw
P5  client CPU-s per 10 s while n futures wait on long polls     ratio <= 0.2
P6  peak threads with n pending samples, session poller on       <= 24
P7  single-sample latency p50 (sequential)                       ours / limit <= 1.2
P7T P7 over HTTPS                                                as P7
P8  time to first result in a fresh interpreter: import,          ratio <= 0.3
    ServiceClient, create a sampling client, one sample; both
    SDKs' bytecode compiled by an untimed run of each first
P10 sample throughput from 4 worker processes vs 1, same total    4 processes >= 0.9 x 1 process;
    concurrency; client CPU per sample; spawned worker start to    first sample <= 300 ms (median)
    its first sample (tinker_sync only)
P11 8 x 15 training steps and sample p99 / max through a TCP     train <= 60 s, p99 <= 15 s,
    fault proxy at 5 % per fault kind, vs no faults (ours only);   max <= 30 s, exactly once, on
    one run per seed (11-15, quick too), per-seed numbers kept     the worst seed
P9  pipelined train step p50 while 2,000 samples are in flight   ours <= 1.2 x our idle step
    on the same ServiceClient (limit column: our idle step)       and <= official's step
P13 a 200 MB checkpoint download cut 5 times: bytes received /   ours <= 1.1 and verified
    its size (official: ``tinker checkpoint download``); P13-S
    its wall time
P12 samples/s, 500 samples submitted at once while the main       ratio >= 3.0
    thread runs a pure-Python loop until the last is done
P12-LOOP that loop's speed, % of the same loop alone (run just    ours >= 80 %
    before and after each window in the same worker process)
P14 samples/s, 300 samples at once, every ``asample`` answered   ours >= official
    after 100 ms (a distant server; tinker_sync with
    ``TINKER_SYNC_LOOPBACK_WIDENS=1``, docs/limiter.md#send-width)
==  ==========================================================  ==================================

Plus peak RSS of the P1 and P6 workers (no goal). Output: a table on stdout and JSON (``--out``,
default ``benchmarks/results/<mode>.json``, or ``benchmarks/results/only/<mode>-<ids>.json`` with
``--only``, so a few rows never replace a whole run's file): ``{"rows": [{"id", "name", "unit",
"ours", "official", "limit", "ratio", "ratio_official", "ratio_limit", "goal", "met", "spread",
"detail", "measured"}], "machine": {...}, ...}``; values are medians over the repetitions,
``spread`` holds min / max / quartiles per column, ``measured`` the CPU model, cores, both SDKs'
versions, tinker_sync's commit (``+dirty`` with local changes) and the 1-minute load average
after each of the row's worker runs.
Exit status: 0 when every row produced numbers (goals missed or not), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import (  # noqa: E402
    BENCH_DIR,
    BYTECODE,
    ROOT,
    SERVER_HOLD_S,
    SIZES,
    TELEMETRY,
    TLS_CA,
    machine_info,
    spread,
    subprocess_env,
)

WORKERS = {
    "ours": BENCH_DIR / "_worker_ours.py",
    "ours_u3": BENCH_DIR / "_worker_ours.py",  # TINKER_SYNC_TRANSPORT=urllib3 (WORKER_ENV)
    "official": BENCH_DIR / "_worker_official.py",
    "raw": BENCH_DIR / "_worker_raw.py",
    "codec": BENCH_DIR / "_worker_codec.py",
    "scaleout": BENCH_DIR / "_worker_scaleout.py",
    "lossy": BENCH_DIR / "_worker_lossy.py",
    "download": BENCH_DIR / "_worker_download.py",
}
#: Which workers run each bench (``import`` runs in this process, timing fresh interpreters).
BENCH_WORKERS: dict[str, tuple[str, ...]] = {
    "sample": ("ours", "ours_u3", "official", "raw"),
    "train": ("ours", "official", "raw"),
    "codec": ("codec",),
    "held": ("ours", "official"),
    "poller": ("ours", "official"),
    "latency": ("ours", "official", "raw"),
    "sample_tls": ("ours", "official", "raw"),
    "latency_tls": ("ours", "official", "raw"),
    "import": (),
    "first": (),
    "scaleout": ("scaleout",),
    "lossy": ("lossy",),
    "download": ("download",),
    "busy": ("ours", "official"),  # P9
    "gil": ("ours", "official"),  # P12
    "slow": ("ours", "official"),  # P14
}
#: Benches whose rows are ratios of wall times: their repetitions run in rounds, one worker
#: process per SDK per round (ours, official, raw, ours, ...), so a slow spell of a shared
#: machine hits every column alike instead of whichever worker happened to run during it.
INTERLEAVED = frozenset({"sample", "train", "latency", "sample_tls", "latency_tls", "gil", "slow"})
#: Benches served by the HTTPS server (P1T, P7T).
TLS_BENCHES = frozenset({"sample_tls", "latency_tls"})
#: Seconds a worker may run before it is killed, per mode.
WORKER_TIMEOUT = {"full": 1800.0, "quick": 600.0, "smoke": 180.0}


# ---------------------------------------------------------------------------------- rows


Values = dict[str, list[float] | None]  # column ("ours" / "official" / "limit") -> repetitions


@dataclass(frozen=True)
class Row:
    """One table row: where its numbers come from and how its goal is judged."""

    id: str
    name: str
    unit: str
    bench: str
    #: (column, worker, metric) for each column that has numbers.
    sources: tuple[tuple[str, str, str], ...]
    goal: str | None
    #: ratio = ours / official, or ours / limit.
    ratio_of: str = "official"
    scale: float = 1.0
    judge: Callable[[dict[str, float | None], float | None, dict[str, Any]], bool] | None = None
    #: (key, worker, metric, scale): extra numbers for the JSON ``detail`` (lists -> median).
    detail: tuple[tuple[str, str, str, float], ...] = field(default_factory=tuple)


def _le(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a <= b


def _ge(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a >= b


#: P5: client CPU-s per 10 s while 1,000 futures wait, each window one server hold long (so it
#: includes re-sending every held poll once). The same CPU goal as P2: at most 0.2 x official.
P5_GOAL = "ratio <= 0.2"
P1_GOAL = "ratio >= 2.0 and ours >= 0.8 x limit"
P1_DETAIL = (
    ("ours_peak_threads", "ours", "peak_threads", 1.0),
    ("official_peak_threads", "official", "peak_threads", 1.0),
    ("ours_threads_at_peak", "ours", "thread_groups_at_peak", 1.0),
    ("raw_threads", "raw", "threads", 1.0),
)


def _p1_met(m: dict[str, float | None]) -> bool:
    ours, official, limit = m["ours"], m["official"], m["limit"]
    return (
        ours is not None
        and official is not None
        and limit is not None
        and _ge(ours, 2.0 * official)
        and _ge(ours, 0.8 * limit)
    )


ROWS: tuple[Row, ...] = (
    Row(
        "P1",
        "sample throughput (concurrent sample())",
        "samples/s",
        "sample",
        (
            ("ours", "ours", "samples_per_s"),
            ("official", "official", "samples_per_s"),
            ("limit", "raw", "samples_per_s"),
        ),
        P1_GOAL,
        judge=lambda m, r, s: _p1_met(m),
        detail=P1_DETAIL,
    ),
    Row(
        "P1T",
        "sample throughput over HTTPS (as P1)",
        "samples/s",
        "sample_tls",
        (
            ("ours", "ours", "samples_per_s"),
            ("official", "official", "samples_per_s"),
            ("limit", "raw", "samples_per_s"),
        ),
        P1_GOAL,
        judge=lambda m, r, s: _p1_met(m),
        detail=P1_DETAIL,
    ),
    Row(
        "P1-U3",
        "sample throughput, tinker_sync on its urllib3 path (as P1)",
        "samples/s",
        "sample",
        (
            ("ours", "ours_u3", "samples_per_s"),
            ("official", "official", "samples_per_s"),
            ("limit", "raw", "samples_per_s"),
        ),
        P1_GOAL,
        judge=lambda m, r, s: _p1_met(m),
        detail=(
            ("ours_transport", "ours_u3", "transport", 1.0),
            ("ours_peak_threads", "ours_u3", "peak_threads", 1.0),
        ),
    ),
    Row(
        "P2",
        "client CPU per sample (P1)",
        "CPU-ms/sample",
        "sample",
        (
            ("ours", "ours", "cpu_s_per_sample"),
            ("official", "official", "cpu_s_per_sample"),
            ("limit", "raw", "cpu_s_per_sample"),
        ),
        "ratio <= 0.15",
        scale=1e3,
        judge=lambda m, r, s: _le(r, 0.15),
        detail=(
            ("ours_per_sample", "ours", "per_sample", 1.0),
            ("official_per_sample", "official", "per_sample", 1.0),
            ("limit_per_sample", "raw", "per_sample", 1.0),
        ),
    ),
    Row(
        "P2-U3",
        "client CPU per sample, tinker_sync on its urllib3 path (P1-U3)",
        "CPU-ms/sample",
        "sample",
        (
            ("ours", "ours_u3", "cpu_s_per_sample"),
            ("official", "official", "cpu_s_per_sample"),
            ("limit", "raw", "cpu_s_per_sample"),
        ),
        "ratio <= 0.2",
        scale=1e3,
        judge=lambda m, r, s: _le(r, 0.2),
        detail=(("ours_per_sample", "ours_u3", "per_sample", 1.0),),
    ),
    Row(
        "P3",
        "pipelined train step (fwd/bwd + optim_step)",
        "ms/step",
        "train",
        (
            ("ours", "ours", "s_per_step"),
            ("official", "official", "s_per_step"),
            ("limit", "raw", "s_per_step"),
        ),
        "ratio <= 1.0",
        scale=1e3,
        judge=lambda m, r, s: _le(r, 1.0),
        detail=(
            ("ours_cpu_ms_per_step", "ours", "cpu_s_per_step", 1e3),
            ("official_cpu_ms_per_step", "official", "cpu_s_per_step", 1e3),
        ),
    ),
    Row(
        "P4",
        "encode forward_backward (chunk + serialize)",
        "ms",
        "codec",
        (
            ("ours", "codec", "ours"),
            ("official", "codec", "official"),
            ("limit", "codec", "raw"),
        ),
        "ratio <= 1.0 and ours <= 2 x raw",
        scale=1e3,
        judge=lambda m, r, s: (
            _le(r, 1.0) and m["limit"] is not None and _le(m["ours"], 2.0 * m["limit"])
        ),
        detail=(("chunks", "codec", "chunks", 1.0),),
    ),
    Row(
        "P5",
        "client CPU while futures wait on long polls",
        "CPU-s/10 s",
        "held",
        (
            ("ours", "ours", "cpu_s_per_10s"),
            ("official", "official", "cpu_s_per_10s"),
        ),
        P5_GOAL,
        judge=lambda m, r, s: _le(r, 0.2),
        detail=(
            ("window_s", "ours", "window_s", 1.0),
            ("ours_completed_early", "ours", "completed_early", 1.0),
            ("official_completed_early", "official", "completed_early", 1.0),
            ("ours_cpu_by_thread", "ours", "cpu_s_by_thread_per_window", 1.0),
            ("official_cpu_by_thread", "official", "cpu_s_by_thread_per_window", 1.0),
        ),
    ),
    Row(
        "P6",
        "peak threads, pending samples, poller on",
        "threads",
        "poller",
        (
            ("ours", "ours", "peak_threads"),
            ("official", "official", "peak_threads"),
        ),
        "ours <= 24",
        judge=lambda m, r, s: _le(m["ours"], 24.0),
        detail=(
            ("ours_threads_before", "ours", "threads_before", 1.0),
            ("ours_threads_at_peak", "ours", "thread_groups_at_peak", 1.0),
            ("official_threads_at_peak", "official", "thread_groups_at_peak", 1.0),
            ("ours_completed_early", "ours", "completed_early", 1.0),
        ),
    ),
    Row(
        "P7",
        "single-sample latency p50 (sequential)",
        "ms",
        "latency",
        (
            ("ours", "ours", "p50_ms"),
            ("official", "official", "p50_ms"),
            ("limit", "raw", "p50_ms"),
        ),
        "ours / limit <= 1.2",
        ratio_of="limit",
        judge=lambda m, r, s: _le(r, 1.2),
        detail=(
            ("ours_p90_ms", "ours", "p90_ms_all", 1.0),
            ("official_p90_ms", "official", "p90_ms_all", 1.0),
            ("limit_p90_ms", "raw", "p90_ms_all", 1.0),
        ),
    ),
    Row(
        "P7T",
        "single-sample latency p50 over HTTPS (as P7)",
        "ms",
        "latency_tls",
        (
            ("ours", "ours", "p50_ms"),
            ("official", "official", "p50_ms"),
            ("limit", "raw", "p50_ms"),
        ),
        "ours / limit <= 1.2",
        ratio_of="limit",
        judge=lambda m, r, s: _le(r, 1.2),
        detail=(
            ("ours_p90_ms", "ours", "p90_ms_all", 1.0),
            ("official_p90_ms", "official", "p90_ms_all", 1.0),
            ("limit_p90_ms", "raw", "p90_ms_all", 1.0),
        ),
    ),
    Row(
        "P8",
        "time to first result (import, client, sampling client, one sample), bytecode"
        " compiled by an untimed warm-up run per SDK",
        "ms",
        "first",
        (("ours", "first", "ours"), ("official", "first", "official")),
        "ratio <= 0.3",
        scale=1e3,
        judge=lambda m, r, s: _le(r, 0.3),
        detail=(
            ("ours_first_run_ms", "first", "ours_first_run", 1e3),
            ("official_first_run_ms", "first", "official_first_run", 1e3),
            ("ours_import_ms", "import", "ours", 1e3),
            ("official_import_ms", "import", "official", 1e3),
            ("ours_import_with_ServiceClient_ms", "import", "ours_with_client", 1e3),
        ),
    ),
    # P10 (scale-out, benchmarks/_worker_scaleout.py): tinker_sync only; the "limit" column
    # holds the same workload from 1 worker process, "ours" from 4.
    Row(
        "P10",
        "sample throughput, 4 worker processes (limit: 1)",
        "samples/s",
        "scaleout",
        (("ours", "scaleout", "samples_per_s_4"), ("limit", "scaleout", "samples_per_s_1")),
        "4 processes >= 0.9 x 1 process",
        ratio_of="limit",
        judge=lambda m, r, s: _ge(r, 0.9),
        detail=(("samples_per_s_2_processes", "scaleout", "samples_per_s_2", 1.0),),
    ),
    Row(
        "P10-CPU",
        "client CPU per sample, 4 processes (limit: 1)",
        "CPU-ms/sample",
        "scaleout",
        (("ours", "scaleout", "cpu_s_per_sample_4"), ("limit", "scaleout", "cpu_s_per_sample_1")),
        None,
        ratio_of="limit",
        scale=1e3,
        detail=(("cpu_ms_per_sample_2_processes", "scaleout", "cpu_s_per_sample_2", 1e3),),
    ),
    Row(
        "P10-FIRST",
        "worker start to first sample, spawn, bytecode compiled by an untimed warm-up"
        " (limit: forkserver-preloaded)",
        "ms",
        "scaleout",
        (
            ("ours", "scaleout", "first_sample_s"),
            ("limit", "scaleout", "first_sample_forkserver_s"),
        ),
        "median <= 300 ms",
        ratio_of="limit",
        scale=1e3,
        judge=lambda m, r, s: _le(m["ours"], 300.0),
        detail=(
            ("max_ms", "scaleout", "first_sample_max_s", 1e3),
            ("from_launch_ms", "scaleout", "first_sample_from_launch_s", 1e3),
            ("cpu_ms", "scaleout", "first_sample_cpu_s", 1e3),
        ),
    ),
    # P11 (lossy network, benchmarks/_worker_lossy.py): tinker_sync through the TCP fault proxy
    # of tests/reliability; "ours" with every fault kind at 5 %, "limit" the same run without.
    Row(
        "P11",
        "8 threads x 15 (fwd/bwd + optim_step) at 5 % per TCP fault kind (limit: no faults)",
        "s",
        "lossy",
        (("ours", "lossy", "train_s_faults_worst"), ("limit", "lossy", "train_s_clean")),
        "worst seed <= 60 s (the worker fails unless every op was applied once, in order)",
        ratio_of="limit",
        judge=lambda m, r, s: _le(m["ours"], 60.0),
        detail=(
            ("create_max_s", "lossy", "create_max_s_faults", 1.0),
            ("median_of_seeds_s", "lossy", "train_s_faults", 1.0),
            ("per_seed", "lossy", "per_seed", 1.0),
        ),
    ),
    Row(
        "P11-P99",
        "sample latency p99 at 5 % per TCP fault kind (limit: no faults)",
        "s",
        "lossy",
        (
            ("ours", "lossy", "sample_p99_s_faults_worst"),
            ("limit", "lossy", "sample_p99_s_clean"),
        ),
        "worst seed <= 15 s",
        ratio_of="limit",
        judge=lambda m, r, s: _le(m["ours"], 15.0),
        detail=(
            ("p50_s", "lossy", "sample_p50_s_faults", 1.0),
            ("p50_s_clean", "lossy", "sample_p50_s_clean", 1.0),
        ),
    ),
    Row(
        "P11-MAX",
        "slowest sample at 5 % per TCP fault kind (limit: no faults)",
        "s",
        "lossy",
        (
            ("ours", "lossy", "sample_max_s_faults_worst"),
            ("limit", "lossy", "sample_max_s_clean"),
        ),
        "worst seed <= 30 s",
        ratio_of="limit",
        judge=lambda m, r, s: _le(m["ours"], 30.0),
    ),
    # P9 (issue 14): a training step must not slow down behind a sampling backlog.
    Row(
        "P9",
        "pipelined train step p50, 2,000 samples in flight",
        "ms",
        "busy",
        (
            ("ours", "ours", "busy_p50_ms"),
            ("official", "official", "busy_p50_ms"),
            ("limit", "ours", "idle_p50_ms"),
        ),
        "ours <= 1.2 x our idle step (limit column) and <= official",
        ratio_of="limit",
        judge=lambda m, r, s: _le(r, 1.2) and _le(m["ours"], m["official"]),
        detail=(
            ("official_idle_p50_ms", "official", "idle_p50_ms", 1.0),
            ("ours_busy_over_idle_per_round", "ours", "busy_over_idle", 1.0),
            ("official_busy_over_idle_per_round", "official", "busy_over_idle", 1.0),
            ("ours_during_submission_p50_ms", "ours", "burst_p50_ms", 1.0),
            ("official_during_submission_p50_ms", "official", "burst_p50_ms", 1.0),
            ("ours_pending_at_end", "ours", "pending_at_end", 1.0),
            ("official_pending_at_end", "official", "pending_at_end", 1.0),
        ),
    ),
    # P13 (issue 26, benchmarks/_worker_download.py): a 200 MB checkpoint whose every file
    # answer is cut after a sixth, five times; ours downloads the training checkpoint's archive
    # (REST only, resumed, verified), official runs `tinker checkpoint download` on an
    # external-weights checkpoint holding the same bytes (0.38 has no archive call).
    Row(
        "P13",
        "200 MB checkpoint download cut 5 times: bytes received / its size",
        "x",
        "download",
        (("ours", "download", "ours_ratio"), ("official", "download", "official_ratio")),
        "ours <= 1.1, verified (the worker fails unless ours has the right sha-256)",
        judge=lambda m, r, s: _le(m["ours"], 1.1),
        detail=(
            ("ours_bytes", "download", "ours_bytes", 1.0),
            ("official_bytes", "download", "official_bytes", 1.0),
            ("official_intact", "download", "official_intact", 1.0),
        ),
    ),
    Row(
        "P13-S",
        "wall time of the P13 download (official: until it stopped)",
        "s",
        "download",
        (("ours", "download", "ours_wall_s"), ("official", "download", "official_wall_s")),
        None,
        detail=(("official_uncut_wall_s", "download", "official_uncut_wall_s", 1.0),),
    ),
    # P12 (issue 27): the thread pool under a caller that keeps the GIL busy.
    Row(
        "P12",
        "sample throughput, 500 concurrent samples, the main thread in a pure-Python loop",
        "samples/s",
        "gil",
        (("ours", "ours", "samples_per_s"), ("official", "official", "samples_per_s")),
        "ratio >= 3.0 (and P12-LOOP)",
        judge=lambda m, r, s: _ge(r, 3.0),
        detail=(
            ("ours_submit_ms", "ours", "submit_ms", 1.0),
            ("official_submit_ms", "official", "submit_ms", 1.0),
            ("ours_cpu_ms_per_sample_by_thread", "ours", "cpu_ms_per_sample_by_thread", 1.0),
            (
                "official_cpu_ms_per_sample_by_thread",
                "official",
                "cpu_ms_per_sample_by_thread",
                1.0,
            ),
            ("switch_interval_s", "ours", "switch_interval_s", 1.0),
            ("ours_background_share", "ours", "background_share", 1.0),
            ("ours_paused_ms", "ours", "paused_ms", 1.0),
        ),
    ),
    Row(
        "P12-LOOP",
        "the main thread's loop speed during P12, % of the same loop alone in that process",
        "% of solo",
        "gil",
        (("ours", "ours", "loop_fraction"), ("official", "official", "loop_fraction")),
        "ours >= 80 %",
        scale=100.0,
        judge=lambda m, r, s: _ge(m["ours"], 80.0),
        detail=(
            ("ours_solo_loop_per_s", "ours", "solo_loop_per_s", 1.0),
            ("official_solo_loop_per_s", "official", "solo_loop_per_s", 1.0),
            ("ours_loop_ms_lost_per_sample", "ours", "loop_ms_lost_per_sample", 1.0),
            ("official_loop_ms_lost_per_sample", "official", "loop_ms_lost_per_sample", 1.0),
            ("ours_solo_after_over_before", "ours", "solo_after_over_before", 1.0),
            ("official_solo_after_over_before", "official", "solo_after_over_before", 1.0),
        ),
    ),
    # P14: sampling from a distant server (each submission one 100 ms round trip).
    Row(
        "P14",
        "samples/s with 100 ms per submission exchange, 300 samples at once",
        "samples/s",
        "slow",
        (("ours", "ours", "samples_per_s"), ("official", "official", "samples_per_s")),
        "ours >= official",
        judge=lambda m, r, s: _ge(r, 1.0),
    ),
    Row(
        "P1-RSS",
        "peak RSS of the P1 worker",
        "MiB",
        "sample",
        (
            ("ours", "ours", "peak_rss_mb"),
            ("official", "official", "peak_rss_mb"),
            ("limit", "raw", "peak_rss_mb"),
        ),
        None,
    ),
    Row(
        "P6-RSS",
        "peak RSS of the P6 worker",
        "MiB",
        "poller",
        (("ours", "ours", "peak_rss_mb"), ("official", "official", "peak_rss_mb")),
        None,
    ),
)


# ---------------------------------------------------------------------------------- workers


class WorkerError(RuntimeError):
    """A worker failed or printed no result line."""


def run_worker(
    worker: str,
    benches: list[str],
    sizes: dict[str, Any],
    url: str,
    api_key: str,
    timeout: float,
    prefix: list[str] | None = None,
    profile: str | None = None,
) -> dict[str, Any]:
    """Run one worker process; returns its ``benches`` mapping (bench -> metrics)."""
    cmd = [
        *(prefix or []),
        sys.executable,
        str(WORKERS[worker]),
        ",".join(benches),
        "--url",
        url,
        "--key",
        api_key,
        "--size",
        json.dumps({b: sizes[b] for b in benches}),
    ]
    if profile:
        cmd += ["--profile", profile]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=subprocess_env(worker),
            cwd=str(ROOT),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise WorkerError(f"{worker} {benches}: timed out after {timeout:.0f} s") from exc
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise WorkerError(f"{worker} {benches}: exit {proc.returncode}\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])["benches"]
    return result


IMPORT_SNIPPETS = {
    "ours": "import tinker_sync",
    "official": "import tinker",
    "ours_with_client": "import tinker_sync; tinker_sync.ServiceClient",
}


def bench_import(size: dict[str, Any]) -> dict[str, Any]:
    """Wall time of each import statement in a fresh interpreter, timed inside it (so the
    interpreter's own start-up is excluded), round-robin over the snippets, after at least one
    untimed round (which compiles the bytecode into the run's cache, :data:`BYTECODE`)."""
    out: dict[str, list[float]] = {label: [] for label in IMPORT_SNIPPETS}
    warmup = max(1, int(size["warmup"]))
    for i in range(warmup + int(size["reps"])):
        for label, stmt in IMPORT_SNIPPETS.items():
            code = (
                "import time; t0 = time.perf_counter(); "
                f"{stmt}; print(repr(time.perf_counter() - t0))"
            )
            proc = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                env=subprocess_env(),
                cwd="/",
                timeout=300,
                check=False,
            )
            if proc.returncode != 0:
                raise WorkerError(f"import {label}: {proc.stderr.strip()[-500:]}")
            if i >= warmup:
                out[label].append(float(proc.stdout.strip().splitlines()[-1]))
    return out


# ---------------------------------------------------------------------------------- run


def _needed_benches(rows: list[Row]) -> list[str]:
    order = [
        "sample",
        "train",
        "codec",
        "held",
        "poller",
        "latency",
        "sample_tls",
        "latency_tls",
        "first",
        "import",
        "scaleout",
        "lossy",
        "busy",
        "download",
        "gil",
        "slow",
    ]
    wanted = {row.bench for row in rows}
    return [b for b in order if b in wanted]


def _needed_workers(rows: list[Row]) -> dict[str, tuple[str, ...]]:
    """Per bench, the workers the chosen rows read (in :data:`BENCH_WORKERS` order): ``--only
    P1`` does not run P1-U3's worker."""
    used: dict[str, set[str]] = {}
    for row in rows:
        used.setdefault(row.bench, set()).update(worker for _, worker, _ in row.sources)
    return {
        bench: tuple(w for w in BENCH_WORKERS[bench] if w in workers)
        for bench, workers in used.items()
        if bench in BENCH_WORKERS
    }


def bench_first(size: dict[str, Any], url: str, api_key: str) -> dict[str, Any]:
    """P8: seconds from ``import`` to a first sample in hand, each in a fresh interpreter
    (``_first_result.py``), ours and official alternating, after at least one untimed run of
    each: it compiles that SDK's bytecode (and its dependencies') into the run's cache
    (:data:`BYTECODE`), as ``pip install`` would have. The first (compiling) run of each is
    kept apart, under ``<label>_first_run``."""
    out: dict[str, list[float]] = {"ours": [], "official": []}
    first_run: dict[str, float] = {}
    script = str(BENCH_DIR / "_first_result.py")
    args = [url, api_key, str(size["prompt"]), str(size["max_tokens"])]
    warmup = max(1, int(size["warmup"]))
    for i in range(warmup + int(size["reps"])):
        for label, values in out.items():
            proc = subprocess.run(
                [sys.executable, script, label, *args],
                capture_output=True,
                text=True,
                env=subprocess_env(),
                cwd="/",
                timeout=300,
                check=False,
            )
            if proc.returncode != 0:
                raise WorkerError(f"first result {label}: {proc.stderr.strip()[-500:]}")
            seconds = float(proc.stdout.strip().splitlines()[-1])
            if i == 0:
                first_run[f"{label}_first_run"] = seconds
            if i >= warmup:
                values.append(seconds)
    return {**out, **first_run}


def _mirror(ours: dict[str, Any]) -> dict[str, int] | None:
    """The submit / poll thread counts tinker_sync used at its peak in a P1 round, for the
    raw limit to use the same (None when they were not measured)."""
    groups = ours.get("thread_groups_at_peak") or {}
    submit = sum(int(v) for k, v in groups.items() if "sample-submit" in k)
    poll = sum(int(v) for k, v in groups.items() if "sample-poll" in k)
    return {"submit": submit, "poll": poll} if submit and poll else None


def collect(
    benches: list[str],
    sizes: dict[str, Any],
    mode: str,
    log: Callable[[str], None],
    workers: dict[str, tuple[str, ...]] | None = None,
    loads: dict[str, list[float]] | None = None,
) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """Run the workers; returns ({(bench, worker): metrics}, errors).

    ``workers``: per bench, the workers to run (default :data:`BENCH_WORKERS`); ``loads``, when
    given, gets per bench the 1-minute load average after each of its worker runs."""
    workers_of = {**BENCH_WORKERS, **(workers or {})}
    from tinker_sync.local import LocalServer
    from tinker_sync.local._tls import make_throwaway_pki

    results: dict[tuple[str, str], dict[str, Any]] = {}
    errors: list[str] = []
    timeout = WORKER_TIMEOUT[mode]
    server_benches = [b for b in benches if b not in ("import", "first")]
    with contextlib.ExitStack() as stack:
        urls: dict[bool, str] = {}
        key = "tml-local"
        if any(b not in TLS_BENCHES for b in server_benches) or "first" in benches:
            server = stack.enter_context(
                LocalServer(backend="instant", in_subprocess=True, long_poll_s=SERVER_HOLD_S)
            )
            urls[False], key = server.url, server.api_key or key
            log(f"server {server.url} (pid {server.pid})")
        if any(b in TLS_BENCHES for b in server_benches):
            ca, cert, cert_key = make_throwaway_pki(
                stack.enter_context(tempfile.TemporaryDirectory())
            )
            TLS_CA["path"] = str(ca)
            tls_server = stack.enter_context(
                LocalServer(
                    backend="instant",
                    in_subprocess=True,
                    long_poll_s=SERVER_HOLD_S,
                    api_key=key,
                    tls=(str(cert), str(cert_key)),
                )
            )
            urls[True] = tls_server.url
            log(f"server {tls_server.url} (pid {tls_server.pid}, throwaway certificate)")
        if mode == "smoke":
            # One process per worker and server for all benches: toy sizes, start-up dominates.
            plan = [
                (
                    worker,
                    [
                        b
                        for b in server_benches
                        if worker in workers_of[b] and (b in TLS_BENCHES) == tls
                    ],
                )
                for tls in (False, True)
                for worker in (
                    "ours",
                    "ours_u3",
                    "official",
                    "raw",
                    "codec",
                    "scaleout",
                    "lossy",
                    "download",
                )
            ]
        else:
            plan = []
            for b in server_benches:
                rounds = int(sizes[b]["reps"]) if b in INTERLEAVED else 1
                plan += [(w, [b]) for _ in range(rounds) for w in workers_of[b]]
        rounds_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
        mirror: dict[str, dict[str, int]] = {}
        for worker, group in plan:
            if not group:
                continue
            run_sizes = sizes
            if mode != "smoke" and group[0] in INTERLEAVED:
                run_sizes = {**sizes, group[0]: {**sizes[group[0]], "reps": 1}}
            if worker == "raw":  # the limit uses tinker_sync's pipelining and thread counts
                run_sizes = {
                    **run_sizes,
                    **{b: {**run_sizes[b], "mirror": mirror[b]} for b in group if b in mirror},
                }
            url = urls[group[0] in TLS_BENCHES]
            t0 = time.monotonic()
            try:
                got = run_worker(worker, group, run_sizes, url, key, timeout)
            except WorkerError as exc:
                errors.append(str(exc))
                log(f"  {worker:<8} {','.join(group):<28} FAILED: {exc}")
                continue
            for bench, metrics in got.items():
                rounds_of.setdefault((bench, worker), []).append(metrics)
                # the limit mirrors tinker_sync's default path (its urllib3 path without it)
                mirrored = "ours" if "ours" in workers_of[bench] else "ours_u3"
                if worker == mirrored and (counts := _mirror(metrics)) is not None:
                    mirror[bench] = counts
            _note_load(loads, group)
            log(f"  {worker:<8} {','.join(group):<28} {time.monotonic() - t0:6.1f} s")
        for key_, rounds_ in rounds_of.items():
            results[key_] = merge_rounds(rounds_)
        if "first" in benches:
            t0 = time.monotonic()
            try:
                results[("first", "first")] = bench_first(sizes["first"], urls[False], key)
                results[("import", "import")] = bench_import(sizes["import"])
                _note_load(loads, ["first", "import"])
                log(f"  {'first':<8} {'first,import':<28} {time.monotonic() - t0:6.1f} s")
            except WorkerError as exc:
                errors.append(str(exc))
    if "import" in benches and ("import", "import") not in results:
        t0 = time.monotonic()
        try:
            results[("import", "import")] = bench_import(sizes["import"])
            _note_load(loads, ["import"])
            log(f"  {'import':<8} {'import':<28} {time.monotonic() - t0:6.1f} s")
        except WorkerError as exc:
            errors.append(str(exc))
    return results, errors


def _note_load(loads: dict[str, list[float]] | None, benches: list[str]) -> None:
    if loads is None or not hasattr(os, "getloadavg"):
        return
    now = round(os.getloadavg()[0], 2)
    for bench in benches:
        loads.setdefault(bench, []).append(now)


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One worker's metrics from several rounds, as if one process had run every repetition.

    Lists are concatenated; ``peak*`` numbers take the maximum and ``*_at_peak`` values come
    from the round with the most threads; other numbers become the list of per-round values
    (rows take their median); dicts of numbers are averaged; anything else comes from the last
    round.
    """
    if len(rounds) == 1:
        return rounds[0]
    peak_round = max(rounds, key=lambda r: float(r.get("peak_threads", 0.0)))
    merged: dict[str, Any] = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if key in r]
        first = values[0]
        if key.endswith("_at_peak") and key in peak_round:
            merged[key] = peak_round[key]
        elif isinstance(first, list):
            merged[key] = [v for value in values for v in value]
        elif isinstance(first, (int, float)) and not isinstance(first, bool):
            merged[key] = max(values) if key.startswith("peak") else [float(v) for v in values]
        elif isinstance(first, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in first.values()
        ):
            merged[key] = {k: sum(d.get(k, 0.0) for d in values) / len(values) for k in first}
        else:
            merged[key] = values[-1]
    return merged


def _scaled(values: Any, scale: float) -> list[float] | None:
    if values is None:
        return None
    seq = values if isinstance(values, list) else [values]
    return [float(v) * scale for v in seq]


def build_row(
    row: Row,
    results: dict[tuple[str, str], dict[str, Any]],
    sizes: dict[str, Any],
    context: dict[str, Any] | None = None,
    load: list[float] | None = None,
) -> dict[str, Any]:
    """The JSON row: medians, ratio, goal verdict, spreads and detail; with ``context`` (see
    :func:`row_context`) and ``load`` (1-minute load averages while its bench ran) the row also
    says where and with what it was measured, so it stays meaningful on its own."""
    medians: dict[str, float | None] = {"ours": None, "official": None, "limit": None}
    spreads: dict[str, Any] = {}
    for column, worker, metric in row.sources:
        metrics = results.get((row.bench, worker))
        values = _scaled(None if metrics is None else metrics.get(metric), row.scale)
        if values:
            s = spread(values)
            medians[column] = float(s["median"])
            spreads[column] = s
    ours, base = medians["ours"], medians[row.ratio_of]
    ratio = ours / base if ours is not None and base not in (None, 0.0) else None
    met: bool | None = None
    if row.judge is not None and ours is not None:
        met = bool(row.judge(medians, ratio, sizes))
    detail: dict[str, Any] = {}
    for key, worker, metric, scale in row.detail:
        metrics = results.get((row.bench, worker))
        if metrics is not None and metric in metrics:
            detail[key] = _detail_value(metrics[metric], scale)
    out: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "unit": row.unit,
        **medians,
        "ratio": ratio,
        "ratio_of": f"ours/{row.ratio_of}",
        "ratio_official": _ratio(ours, medians["official"]),
        "ratio_limit": _ratio(ours, medians["limit"]),
        "goal": row.goal,
        "met": met,
        "spread": spreads,
    }
    if detail:
        out["detail"] = detail
    if context is not None:
        out["measured"] = {**context, "loadavg_1min": list(load or [])}
    return out


#: The machine and version facts every row repeats (``measured``), from ``machine_info()`` and
#: :func:`_versions`.
ROW_CONTEXT_KEYS = (
    "cpu",
    "cores",
    "affinity",
    "python",
    "tinker_sync",
    "tinker_sync_commit",
    "tinker",
    "urllib3",
    "date",
)


def row_context(machine: dict[str, Any], mode: str) -> dict[str, Any]:
    """What a row carries about its run: :data:`ROW_CONTEXT_KEYS` of ``machine`` and the mode."""
    return {"mode": mode, **{key: machine.get(key) for key in ROW_CONTEXT_KEYS}}


def default_out(mode: str, only: list[str] | None) -> Path:
    """Where the JSON goes without ``--out``: ``results/<mode>.json`` for a whole run, and
    ``results/only/<mode>-<ids>.json`` (git-ignored) for ``--only``, so a few rows never
    replace a whole run's file."""
    if not only:
        return BENCH_DIR / "results" / f"{mode}.json"
    return BENCH_DIR / "results" / "only" / f"{mode}-{'_'.join(only)}.json"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0.0) else None


def _detail_value(value: Any, scale: float) -> Any:
    """Lists of numbers become their (scaled) median; numbers are scaled; others kept."""
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        return spread([float(v) * scale for v in value])["median"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) * scale
    return value


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _fmt_spread(s: dict[str, Any] | None) -> str:
    if not s or s["n"] < 2:
        return ""
    return f"[{_fmt(s['min'])}..{_fmt(s['max'])}]"


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table: medians with [min..max], both ratios (the judged one marked *),
    goal, verdict."""
    header = (
        "id",
        "row",
        "unit",
        "ours",
        "official",
        "limit",
        "÷official",
        "÷limit",
        "met",
        "goal",
    )
    lines = []
    body = []
    for r in rows:
        verdict = {True: "yes", False: "NO", None: "-"}[r["met"]]
        cells = [
            r["id"],
            r["name"],
            r["unit"],
            *(
                f"{_fmt(r[c])} {_fmt_spread(r['spread'].get(c))}".strip()
                for c in ("ours", "official", "limit")
            ),
            _fmt(r.get("ratio_official")) + ("*" if r["ratio_of"] == "ours/official" else ""),
            _fmt(r.get("ratio_limit")) + ("*" if r["ratio_of"] == "ours/limit" else ""),
            verdict,
            r["goal"] or "",
        ]
        body.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    for cells in [list(header), *body]:
        lines.append(
            "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        )
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt_unit(value: float | None, unit: str) -> str:
    """A median with its unit, for the README (``669 samples/s``, ``1.08 ms``)."""
    if value is None:
        return ""
    return f"{_fmt(value)} {unit}".strip()


def format_markdown(rows: list[dict[str, Any]]) -> str:
    """README's table from a run's JSON rows: medians with units, both ratios, the goal and its
    verdict (✓ met, ✗ not met), so the table is copied from a run, never typed.

    Usage: ``python benchmarks/run.py --markdown benchmarks/results/full.json``."""
    lines = [
        "| row | what it measures | tinker_sync | official 0.38.0 | limit | ÷ official "
        "| ÷ limit | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = {True: " ✓", False: " ✗", None: ""}[r["met"]]
        cells = [
            r["id"],
            r["name"],
            *(_fmt_unit(r[c], r["unit"]) for c in ("ours", "official", "limit")),
            "" if r.get("ratio_official") is None else _fmt(r["ratio_official"]),
            "" if r.get("ratio_limit") is None else _fmt(r["ratio_limit"]),
            (r["goal"] or "") + verdict,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode_group = parser.add_mutually_exclusive_group()
    mode_group.add_argument("--quick", action="store_true", help="smaller sizes, < 10 minutes")
    mode_group.add_argument("--smoke", action="store_true", help="toy sizes, 1 repetition")
    parser.add_argument(
        "--out",
        type=Path,
        help="JSON output (default results/<mode>.json; with --only results/only/<mode>-<ids>.json)",
    )
    parser.add_argument("--only", help="comma-separated row ids (e.g. P1,P7)")
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="JSON",
        help="print README's markdown table from a run's JSON file and exit (runs nothing)",
    )
    parser.add_argument(
        "--telemetry",
        choices=("off", "on"),
        default="off",
        help="TINKER_TELEMETRY for both SDKs (default off, as in the test suite)",
    )
    parser.add_argument(
        "--profile-missed",
        action="store_true",
        help="profile tinker_sync for every missed row (per-thread cProfile) next to --out",
    )
    parser.add_argument(
        "--profile",
        metavar="ROWS",
        help="also profile these rows (comma-separated ids), met or not",
    )
    args = parser.parse_args(argv)
    if args.markdown is not None:
        print(format_markdown(json.loads(args.markdown.read_text())["rows"]))
        return 0
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    TELEMETRY["value"] = "1" if args.telemetry == "on" else "0"
    sizes = SIZES[mode]
    rows = list(ROWS)
    if args.only:
        wanted = {x.strip().upper() for x in args.only.split(",") if x.strip()}
        rows = [r for r in rows if r.id.upper() in wanted]
        if not rows:
            parser.error(f"--only matched no row; ids: {[r.id for r in ROWS]}")
    out_path = args.out or default_out(mode, [r.id for r in rows] if args.only else None)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = {**machine_info(), **_versions()}
    context = row_context(machine, mode)
    log(f"mode {mode}; {machine['cpu']} x{machine['cores']}; load {machine['loadavg_at_start']}")
    started = time.monotonic()
    loads: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tinker-bench-pycache-") as pycache:
        BYTECODE["prefix"] = pycache
        try:
            results, errors = collect(
                _needed_benches(rows), sizes, mode, log, _needed_workers(rows), loads
            )
        finally:
            BYTECODE.clear()
    built = [build_row(row, results, sizes, context, loads.get(row.bench)) for row in rows]
    elapsed = time.monotonic() - started
    print(format_table(built))
    missed = [r["id"] for r in built if r["met"] is False]
    print(f"\n{mode} run in {elapsed:.0f} s; rows not met: {', '.join(missed) or 'none'}")
    for error in errors:
        print(f"ERROR: {error}")
    document = {
        "mode": mode,
        "only": [r.id for r in rows] if args.only else None,
        "telemetry": args.telemetry,
        "elapsed_s": elapsed,
        "sizes": sizes,
        "rows": built,
        "machine": machine,
        "errors": errors,
    }
    profiled = set(missed) if args.profile_missed else set()
    if args.profile:
        profiled |= {x.strip().upper() for x in args.profile.split(",") if x.strip()}
    if profiled:
        from _profile import profile_rows

        document["profiles"] = profile_rows(
            [r for r in ROWS if r.id.upper() in profiled],
            sizes,
            WORKER_TIMEOUT[mode],
            out_path.parent,
            run_worker,
            log,
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out_path}")
    complete = all(
        built_row[column] is not None
        for row, built_row in zip(rows, built, strict=True)
        for column, _, _ in row.sources
    )
    return 0 if complete and not errors else 1


def _versions() -> dict[str, Any]:
    code = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({p: m.version(p) for p in ('tinker', 'protobuf', 'urllib3')}))"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env=subprocess_env(),
        )
        versions: dict[str, Any] = json.loads(proc.stdout)
    except (subprocess.SubprocessError, ValueError):
        versions = {}
    from tinker_sync._version import __version__

    versions["tinker_sync"] = __version__
    versions["tinker_sync_commit"] = _commit()
    return versions


def _commit() -> str | None:
    """The checkout's commit, ``+dirty`` when tracked files outside benchmarks/results differ
    from it (None outside a git checkout)."""
    git = ["git", "-C", str(ROOT)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [
                *git,
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)benchmarks/results",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


if __name__ == "__main__":
    raise SystemExit(main())
