"""Shared helpers of the benchmark workers and of ``benchmarks/run.py``.

Nothing here imports an SDK: a worker imports exactly one (``tinker_sync`` or ``tinker``) so its
measurements (CPU, threads, RSS, import side effects) belong to that SDK alone.

Contents: the size presets per mode, the worker command line, the one-line JSON result, the
statistics, process probes (CPU, threads, RSS) and a tiny client for the local server's admin
endpoints (``/_local/...``, stdlib ``http.client`` only).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent

BASE_MODEL = "Qwen/Qwen3-8B"
#: Prompt token ids stay inside the local server's byte vocabulary (0..255).
VOCAB = 256

# ---------------------------------------------------------------------------------- sizes

#: Held rounds (P5, P6): ``warmup`` samples answered normally, then the server's sampling work
#: is paused in the ``active`` state (samples are accepted and their polls long-polled, as on a
#: busy server) while ``n`` samples are submitted; ``settle_s`` lets the polls get in flight
#: before the first window. A future completing before the last window ends is counted in
#: ``completed_early`` (0 unless the pause leaked). P5 measures ``reps`` consecutive windows of
#: one round; P6 runs ``reps`` whole rounds (submission, pause, drain) with a thread monitor each.
#: How long the benchmark servers hold a pending future's poll (LocalServer's ``long_poll_s``).
#: P5's windows are this long, so each window sees every held poll re-sent once, whatever
#: its phase.
SERVER_HOLD_S = 20.0
_HOLD = {"warmup": 200, "settle_s": 1.0}
_HOLD_SMOKE = {"warmup": 5, "settle_s": 0.2}

#: P10: the same total number of samples, and in flight, split over each count of processes.
_SCALEOUT = {"procs": [1, 2, 4], "prompt": 64, "max_tokens": 16}

#: P11 (lossy network, ``_worker_lossy.py``): every fault kind at ``rate``; each repetition is a
#: faulted and a fault-free run with its own fault seed.
_LOSSY = {"rate": 0.05, "threads": 8, "steps": 15, "sample_threads": 16}

#: P12 (GIL pressure): ``n`` samples submitted at once while the main thread runs a pure-Python
#: loop until the last one is done; the loop alone runs ``solo_s`` seconds before and after.
_GIL = {"prompt": 64, "max_tokens": 16}

#: Per mode and benchmark: the workload size and the repetition counts. ``warmup`` runs are not
#: recorded. ``reps`` >= 5 in the full mode, >= 3 under --quick, 1 under --smoke.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "sample": {"n": 2000, "prompt": 64, "max_tokens": 16, "warmup": 500, "reps": 5},
        "train": {"datums": 32, "tokens": 512, "steps": 50, "warmup": 3, "reps": 5},
        "codec": {"datums": 1024, "tokens": 4096, "warmup": 1, "reps": 5},
        "held": {"n": 1000, "window_s": SERVER_HOLD_S, **_HOLD, "reps": 5},
        "poller": {"n": 1000, "window_s": 3.0, **_HOLD, "reps": 5},
        "latency": {"n": 100, "prompt": 64, "max_tokens": 16, "warmup": 20, "reps": 7},
        "busy": {
            "n": 2000,
            "datums": 32,
            "tokens": 512,
            "steps": 50,
            "warmup": 1,
            "reps": 5,
        },
        "import": {"warmup": 2, "reps": 15},
        "first": {"prompt": 64, "max_tokens": 16, "warmup": 1, "reps": 7},
        "scaleout": {**_SCALEOUT, "concurrency": 64, "n": 3000, "warmup": 100, "reps": 5},
        "lossy": {**_LOSSY, "samples": 1000, "reps": 5},
        "download": {"size_mb": 200, "cuts": 5, "reps": 5},
        "gil": {**_GIL, "n": 500, "warmup": 100, "solo_s": 1.0, "reps": 5},
        "slow": {"n": 300, "delay_s": 0.1, "reps": 5},
    },
    "quick": {
        "sample": {"n": 500, "prompt": 64, "max_tokens": 16, "warmup": 100, "reps": 3},
        "train": {"datums": 32, "tokens": 512, "steps": 20, "warmup": 2, "reps": 3},
        "codec": {"datums": 256, "tokens": 4096, "warmup": 1, "reps": 5},
        "held": {"n": 1000, "window_s": SERVER_HOLD_S, **_HOLD, "reps": 3},
        "poller": {"n": 1000, "window_s": 1.0, **_HOLD, "reps": 3},
        "latency": {"n": 50, "prompt": 64, "max_tokens": 16, "warmup": 10, "reps": 5},
        "busy": {
            "n": 2000,
            "datums": 32,
            "tokens": 512,
            "steps": 30,
            "warmup": 1,
            "reps": 3,
        },
        "import": {"warmup": 1, "reps": 5},
        "first": {"prompt": 64, "max_tokens": 16, "warmup": 1, "reps": 5},
        "scaleout": {**_SCALEOUT, "concurrency": 64, "n": 1000, "warmup": 50, "reps": 3},
        "lossy": {**_LOSSY, "samples": 300, "reps": 5},  # seeds 11-15: the goal is per seed
        "download": {"size_mb": 200, "cuts": 5, "reps": 3},
        "gil": {**_GIL, "n": 500, "warmup": 100, "solo_s": 1.0, "reps": 3},
        "slow": {"n": 300, "delay_s": 0.1, "reps": 3},
    },
    "smoke": {
        "sample": {"n": 20, "prompt": 64, "max_tokens": 16, "warmup": 0, "reps": 1},
        "train": {"datums": 2, "tokens": 16, "steps": 2, "warmup": 0, "reps": 1},
        "codec": {"datums": 4, "tokens": 64, "warmup": 0, "reps": 1},
        "held": {"n": 10, "window_s": 0.3, **_HOLD_SMOKE, "reps": 1},
        "poller": {"n": 10, "window_s": 0.3, **_HOLD_SMOKE, "reps": 1},
        "latency": {"n": 3, "prompt": 64, "max_tokens": 16, "warmup": 0, "reps": 1},
        "busy": {
            "n": 20,
            "datums": 2,
            "tokens": 16,
            "steps": 3,
            "warmup": 0,
            "reps": 1,
        },
        "import": {"warmup": 0, "reps": 1},
        "first": {"prompt": 64, "max_tokens": 16, "warmup": 0, "reps": 1},
        "scaleout": {**_SCALEOUT, "concurrency": 8, "n": 24, "warmup": 0, "reps": 1},
        "lossy": {**_LOSSY, "threads": 1, "steps": 2, "samples": 8, "sample_threads": 4, "reps": 1},
        "download": {"size_mb": 2, "cuts": 5, "reps": 1},
        "gil": {**_GIL, "n": 20, "warmup": 0, "solo_s": 0.1, "reps": 1},
        "slow": {"n": 20, "delay_s": 0.1, "reps": 1},
    },
}
# P1T / P7T: the P1 and P7 workloads over HTTPS (the same sizes).
for _sizes in SIZES.values():
    _sizes["sample_tls"] = dict(_sizes["sample"])
    _sizes["latency_tls"] = dict(_sizes["latency"])

# ---------------------------------------------------------------------------------- worker IO


@dataclass(frozen=True)
class WorkerArgs:
    """What every worker gets on its command line."""

    bench: str
    url: str
    api_key: str
    size: dict[str, Any]
    profile: str | None


def parse_worker_args(argv: list[str] | None = None) -> WorkerArgs:
    """``<worker>.py BENCH[,BENCH...] --url URL --key KEY --size JSON [--profile PATH]``.

    ``--size`` maps each bench to its size dict (one mode's entry of :data:`SIZES`)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("bench")
    parser.add_argument("--url", default="")
    parser.add_argument("--key", default="tml-local")
    parser.add_argument("--size", default="{}", help="JSON {bench: size} (see SIZES)")
    parser.add_argument("--profile", default=None, help="write a cProfile of the timed part")
    args = parser.parse_args(argv)
    return WorkerArgs(args.bench, args.url, args.key, json.loads(args.size), args.profile)


def emit(result: dict[str, Any]) -> None:
    """Print the one JSON result line (the last stdout line the orchestrator parses)."""
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


def finish(result: dict[str, Any]) -> None:
    """Emit the result and leave at once: background SDK threads must not delay or pollute the
    exit (their shutdown is not what is measured)."""
    emit(result)
    sys.stderr.flush()
    os._exit(0)


class _Snapshot:
    """A finished view of a :class:`cProfile.Profile` for :class:`pstats.Stats` (which would
    otherwise call ``create_stats()``, disabling profiling on the *calling* thread)."""

    def __init__(self, prof: Any) -> None:
        prof.snapshot_stats()
        self.stats = prof.stats

    def create_stats(self) -> None:
        pass


class Profiler:
    """CPU profile of a worker when ``--profile PATH`` was given; else a no-op.

    Every thread started after construction is profiled from its start (``threading.setprofile``
    installs a per-thread ``cProfile.Profile``); the main thread only inside :meth:`section`. The
    timer is ``time.thread_time``, so functions are charged the CPU time of their own thread
    (a blocked ``recv`` costs nothing). :meth:`save` merges all threads into one pstats file.
    Thread-safe.
    """

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._profiles: list[Any] = []
        self._lock = threading.Lock()
        self._main: Any = None
        if not path:
            return
        import cProfile

        self._main = cProfile.Profile(timer=time.thread_time)

        def start(*_: object) -> None:
            prof = cProfile.Profile(timer=time.thread_time)
            with self._lock:
                self._profiles.append(prof)
            prof.enable()  # replaces this hook for the rest of the thread's life

        threading.setprofile(start)

    @contextmanager
    def section(self) -> Iterator[None]:
        if self._main is None:
            yield
            return
        self._main.enable()
        try:
            yield
        finally:
            self._main.disable()

    def save(self) -> None:
        if self._main is None or not self._path:
            return
        import pstats

        threading.setprofile(None)
        with self._lock:
            snaps = [_Snapshot(p) for p in [self._main, *self._profiles]]
        snaps = [s for s in snaps if s.stats]
        if not snaps:
            return
        stats = pstats.Stats(snaps[0])  # type: ignore[arg-type]
        for snap in snaps[1:]:
            stats.add(snap)  # type: ignore[arg-type]
        stats.dump_stats(self._path)


# ---------------------------------------------------------------------------------- statistics


def spread(values: list[float]) -> dict[str, float | int]:
    """Median, min, max and the quartiles of ``values`` (n >= 1)."""
    ordered = sorted(values)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": q1,
        "q3": q3,
        "n": len(ordered),
    }


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---------------------------------------------------------------------------------- probes


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, all threads."""
    return time.process_time()


class Rusage:
    """Context switches and user/system CPU of this process over a ``with`` block.

    Usage: ``with Rusage() as ru: ...; ru.result(per=n)``. Not thread-safe (one owner)."""

    def __enter__(self) -> Rusage:
        self._start = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = resource.getrusage(resource.RUSAGE_SELF)

    def result(self, per: float) -> dict[str, float]:
        """User / system CPU seconds and context switches, divided by ``per``."""
        a, b = self._start, self._end
        return {
            "user_cpu_s": (b.ru_utime - a.ru_utime) / per,
            "sys_cpu_s": (b.ru_stime - a.ru_stime) / per,
            "voluntary_switches": (b.ru_nvcsw - a.ru_nvcsw) / per,
            "involuntary_switches": (b.ru_nivcsw - a.ru_nivcsw) / per,
        }


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024.0 if sys.platform != "darwin" else kib / (1024.0 * 1024.0)


def os_threads() -> int:
    """OS threads of this process (``/proc/self/status``), or Python threads elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return threading.active_count()


def thread_group(name: str) -> str:
    """A thread name without counters or ids: ``"sample-poll-12"`` -> ``"sample-poll"``,
    ``"x-heartbeat-28903e68-b1c8"`` -> ``"x-heartbeat"``, ``"Thread-3 (worker)"`` -> ``"Thread"``."""
    base = name.split(" (", 1)[0]
    parts = re.split(r"([-_ ])", base)
    while len(parts) > 2 and _ID_TOKEN.fullmatch(parts[-1]):
        parts = parts[:-2]
    return "".join(parts) or name


_ID_TOKEN = re.compile(r"(?=[0-9a-f]*[0-9])[0-9a-f]+")


def thread_groups() -> dict[str, int]:
    """Live Python threads counted by :func:`thread_group` name."""
    counts: dict[str, int] = {}
    for t in threading.enumerate():
        key = thread_group(t.name)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


class ThreadPeak:
    """Samples the thread count every ``interval`` seconds on a monitor thread.

    Usage: ``with ThreadPeak() as tp: ...; tp.peak, tp.groups``. The monitor thread itself is not
    counted; ``groups`` are the Python threads by name at the peak. Not thread-safe.
    """

    def __init__(self, interval: float = 0.005) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-thread-peak", daemon=True)
        self.peak = 0
        self.groups: dict[str, int] = {}

    def _observe(self, count: int) -> None:
        if count > self.peak:
            self.peak = count
            self.groups = thread_groups()
            self.groups.pop("bench-thread-peak", None)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._observe(os_threads() - 1)
            self._stop.wait(self._interval)

    def __enter__(self) -> ThreadPeak:
        self._observe(os_threads())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._observe(os_threads())


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds per live Python thread: ``{ident: (group name, seconds)}`` (per-thread CPU
    clocks, nanosecond resolution; {} where ``pthread_getcpuclockid`` is missing)."""
    out: dict[int, tuple[str, float]] = {}
    getclock = getattr(time, "pthread_getcpuclockid", None)
    if getclock is None:
        return out
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            out[t.ident] = (thread_group(t.name), time.clock_gettime(getclock(t.ident)))
        except (OSError, ProcessLookupError):  # the thread just ended
            continue
    return out


def cpu_by_thread_group(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], total: float
) -> dict[str, float]:
    """CPU seconds spent between two :func:`thread_cpu` snapshots by thread group; threads not
    alive at both snapshots and non-Python threads are in ``"(other)"`` (``total`` minus the
    rest)."""
    out: dict[str, float] = {}
    for ident, (name, cpu) in after.items():
        if ident in before:
            out[name] = out.get(name, 0.0) + max(0.0, cpu - before[ident][1])
    out["(other)"] = max(0.0, total - sum(out.values()))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> None:
    """Poll ``predicate`` until true; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(interval)


# ---------------------------------------------------------------------------------- admin API


class Admin:
    """The local server's ``/_local/`` admin endpoints over stdlib ``http.client``.

    Usage: ``Admin(url, key).add_faults(["retrieve_future* x* delay=12"])``. Not thread-safe
    (one connection per call, so any thread may own one instance).
    """

    def __init__(self, url: str, api_key: str) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._key = api_key

    def call(
        self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None
    ) -> Any:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=60)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"X-API-Key": self._key}
            if data is not None:
                headers["Content-Type"] = "application/json"
            target = "/_local/" + path + ("?" + urlencode(query) if query else "")
            conn.request(method, target, body=data, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            if response.status >= 300:
                raise RuntimeError(f"admin {method} {path}: {response.status} {payload[:200]!r}")
            return json.loads(payload) if payload else None
        finally:
            conn.close()

    def add_faults(self, specs: list[str]) -> None:
        self.call("POST", "faults", {"faults": specs})

    def clear_faults(self) -> None:
        self.call("DELETE", "faults")

    def count(self, endpoint: str) -> int:
        return int(self.call("GET", "requests/count", query={"endpoint": endpoint})["count"])

    def set_client_config(self, **flags: Any) -> None:
        self.call("PUT", "client_config", flags)


# ---------------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
    """CPU model, cores, Python, numpy, OS, date (UTC)."""
    import datetime
    import platform

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import numpy

        numpy_version = numpy.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        numpy_version = None
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        load = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "numpy": numpy_version,
        "os": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_at_start": load,
    }


#: ``TINKER_TELEMETRY`` for every worker (``run.py --telemetry``); both SDKs see the same value.
TELEMETRY = {"value": "0"}


#: Set by run.py when HTTPS rows run: the throwaway CA every worker trusts (each SDK reads its
#: own variable: tinker_sync and the raw client REQUESTS_CA_BUNDLE, httpx SSL_CERT_FILE).
TLS_CA: dict[str, str] = {}


#: Set by run.py for the whole run: one bytecode cache (``PYTHONPYCACHEPREFIX``) that every
#: worker and fresh interpreter reads and writes, so both SDKs (and their dependencies) start
#: from bytecode compiled by an untimed warm-up, as after ``pip install``, whatever the
#: machine's ``__pycache__`` directories or ``PYTHONDONTWRITEBYTECODE`` say.
BYTECODE: dict[str, str] = {}

#: Extra environment per worker name: ``ours_u3`` is tinker_sync on its urllib3 request path.
WORKER_ENV: dict[str, dict[str, str]] = {"ours_u3": {"TINKER_SYNC_TRANSPORT": "urllib3"}}


def subprocess_env(worker: str | None = None) -> dict[str, str]:
    """The environment for workers: the repo on PYTHONPATH, no TINKER_* leaking in, telemetry
    as chosen (default off, as in the test suite), the HTTPS rows' CA when there is one, the
    run's bytecode cache when there is one, then ``worker``'s own variables
    (:data:`WORKER_ENV`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    if "path" in TLS_CA:
        env["REQUESTS_CA_BUNDLE"] = env["SSL_CERT_FILE"] = TLS_CA["path"]
    if "prefix" in BYTECODE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = BYTECODE["prefix"]
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    env["TINKER_TELEMETRY"] = TELEMETRY["value"]
    env.update(WORKER_ENV.get(worker or "", {}))
    return env
