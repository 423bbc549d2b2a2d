"""Outages (issue 25's numbers): what each SDK sends a server in trouble, and how it recovers.

Usage::

    python benchmarks/bench_outage.py --quick        # 500 pending, 20 s windows (~6 minutes)
    python benchmarks/bench_outage.py                # 500 and 2,000 pending, 60 s windows
    python benchmarks/bench_outage.py --quick --only storm,bad --sdk ours
    python benchmarks/bench_outage.py --quick --json # -> benchmarks/results/outage-quick.json

One ``LocalServer(backend="instant", in_subprocess=True, long_poll_s=10)``; each SDK runs each
scenario in its own worker process (``_worker_outage.py``, importing only that SDK), one after
the other, against that same server. This process injects the faults through the server's
admin port (never closed) and counts what the server received (its request log), so the
client side is measured from outside.

Scenarios (:data:`SCENARIOS`):

* ``storm``: the server's sampling work is stopped (``pause("active")``, samples accepted and
  their polls held, as on a busy server), ``pending`` samples are submitted and a training loop
  runs; then every request is answered 503 (``* 503 x*``) for ``window_s``. Reported: requests
  the server received per second after the first 10 s; after the fault is cleared and work
  resumes (the recovery), seconds until every future is done; training ops lost, duplicated or
  reordered in the server's applied log.
* ``refused``: the same, but the server is down: it closes its listener and idle connections
  (``refuse_connections``) and the client talks to it through a loopback TCP proxy
  (``tests/reliability/tcp_faults.py``) that accepts each new connection and closes it at once
  (``accept_close``, a FIN before any byte), counting accepts. Reported: connects per second
  after the first 10 s (the proxy's accepts: a kernel-refused connect cannot be counted from
  user space, and the official SDK's Rust transport bypasses Python's socket hooks), then as
  ``storm``.
* ``paused``: ``pending`` samples are accepted as in ``storm`` (no training loop: it would
  count its own requests), then the server declares a pause (``pause("paused_capacity")``:
  polls answer ``try_again`` with that queue state within 1 s). Reported: requests per second
  after the first 10 s, and the recovery after ``resume``.
* ``bad``: one sample (``num_samples=2``) is answered 500 with the same ``detail`` forever while
  ``ordinary`` samples run alongside (their submissions answered after
  :data:`ORDINARY_DELAY_S`, so that their wall time is not lost in noise). Reported: seconds until that sample's future ends (capped
  at ``bad_cap_s``: "still pending") and whether its error carries the server's words; the
  ordinary samples' wall time against a clean run in the same process (``reps`` each, medians).
* ``lost``: with the session futures poller on (``sample_use_retrieve_futures``, as on the
  hosted service), the server accepts one sample and loses it (``asample lose``: absent from
  ``retrieve_futures``, 404 when polled alone) while ordinary samples keep going. Reported:
  seconds until its future ends (a resubmission answered, or an error), capped at
  ``lost_cap_s``. Skipped on a local server without the ``lose`` fault.

Goals (issue 25, per tenant; each row records its goal and whether each SDK met it): at most
2 req/s (or connects/s) after 10 s of a storm or refused connections; at most 5 req/s while
paused; every future done within 15 s of recovery; 0 training ops lost, duplicated or
reordered; the bad request ends within 30 s with the server's words; ordinary samples not
slowed by more than 20 %; a lost request noticed within 60 s.

Output: a table on stdout; ``--json [PATH]`` writes ``{"rows": [...], "machine", ...}`` in the
shape of ``benchmarks/run.py``'s rows (``ours`` / ``official`` / ``goal`` / ``met`` /
``spread`` / ``detail`` / ``measured``), plus ``met_official``; default path
``benchmarks/results/outage-<mode>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
sys.path.insert(2, str(Path(__file__).resolve().parent.parent / "tests" / "reliability"))

from _common import BENCH_DIR, ROOT, machine_info, subprocess_env  # noqa: E402
from run import Row, _versions, build_row, row_context  # noqa: E402

WORKER = BENCH_DIR / "_worker_outage.py"
SDKS = ("ours", "official")
#: The server holds a pending future's poll this long: every poll held when a fault starts has
#: been answered before the first 10 s of the window are over.
LONG_POLL_S = 10.0
#: Requests in the first seconds of a window are not counted (the issue's "after the first 10 s").
SKIP_S = 10.0
#: What the server answers the bad request, every time.
BAD_WORDS = "token 300000 is out of the model's vocabulary (bench_outage)"
#: In ``bad``, every other sample submission is answered after this delay (a server doing real
#: work): the ordinary samples' wall is then long enough to compare, not ~50 ms of noise.
ORDINARY_DELAY_S = 0.25

#: Per mode: pending counts, window, caps. ``quick`` stays under ~6 minutes for both SDKs.
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "pending": [500, 2000],
        "window_s": 60.0,
        "drain_cap_s": 60.0,
        "bad_cap_s": 60.0,
        "lost_cap_s": 90.0,
        "ordinary": 100,
        "reps": 9,
    },
    "quick": {
        "pending": [500],
        "window_s": 20.0,
        "drain_cap_s": 45.0,
        "bad_cap_s": 35.0,
        "lost_cap_s": 62.0,
        "ordinary": 100,
        "reps": 5,
    },
}

#: Issue 25's goals: (metric, "<=", threshold).
GOALS: dict[str, tuple[str, float]] = {
    "rate": ("<=", 2.0),
    "paused_rate": ("<=", 5.0),
    "recovery_s": ("<=", 15.0),
    "ops_wrong": ("<=", 0.0),
    "bad_s": ("<=", 30.0),
    "slowdown_pct": ("<=", 20.0),
    "lost_s": ("<=", 60.0),
}


@dataclass(frozen=True)
class Scenario:
    """One outage: how the server is set up and broken, and what the worker runs."""

    name: str
    runner: str  # the worker's runner: "outage" or "bad"
    description: str
    train: bool = False
    uses_pending: bool = True
    available: Callable[[], str | None] = lambda: None  # None, or why it is skipped


def _lost_fault_missing() -> str | None:
    from dataclasses import fields

    from tinker_sync.local import Fault

    if "lose" in {f.name for f in fields(Fault)}:
        return None
    return "not available: the local server has no fault that loses a request (issue 25, item 5)"


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("storm", "outage", "every request answered 503", train=True),
        Scenario("refused", "outage", "connections refused (server down)", train=True),
        Scenario("paused", "outage", "sampling paused by the server (queue state)"),
        Scenario(
            "bad", "bad", "one request answered 500 forever, others healthy", uses_pending=False
        ),
        Scenario(
            "lost",
            "lost",
            "a request the server accepted and lost",
            uses_pending=False,
            available=_lost_fault_missing,
        ),
    )
}


# ---------------------------------------------------------------------------------- worker


class Worker:
    """One ``_worker_outage.py`` process, stepped over its stdin (module docs there)."""

    def __init__(self, sdk: str, scenario: str, size: dict[str, Any], url: str, key: str) -> None:
        cmd = [
            sys.executable,
            str(WORKER),
            sdk,
            scenario,
            "--url",
            url,
            "--key",
            key,
            "--size",
            json.dumps({scenario: size}),
        ]
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(sdk),
            cwd=str(ROOT),
        )
        self._stderr: list[str] = []
        assert self._proc.stderr is not None
        self._drain = threading.Thread(
            target=self._keep, args=(self._proc.stderr,), daemon=True, name="bench-stderr"
        )
        self._drain.start()
        self.label = f"{sdk} {scenario}"

    def _keep(self, stream: IO[str]) -> None:
        for line in stream:
            self._stderr.append(line)
            del self._stderr[:-30]

    def expect(self, word: str, timeout: float = 300.0) -> None:
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self._proc.stdout.readline()
            if not line:
                break
            if line.startswith("@outage ") and line.split()[1] == word:
                return
        raise RuntimeError(f"{self.label}: no {word!r} from the worker\n{self.tail()}")

    def send(self, word: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(word + "\n")
        self._proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            out, _ = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            raise RuntimeError(f"{self.label}: no result after {timeout:.0f} s") from None
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if self._proc.returncode != 0 or not lines:
            raise RuntimeError(f"{self.label}: exit {self._proc.returncode}\n{self.tail()}")
        result: dict[str, Any] = next(iter(json.loads(lines[-1])["benches"].values()))
        return result

    def tail(self) -> str:
        return "".join(self._stderr[-15:])

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()


# ---------------------------------------------------------------------------------- scenarios


def _ops_check(applied: list[list[Any]], submitted: list[str]) -> dict[str, int]:
    """Lost / duplicated / reordered training ops: the server's applied log of the model against
    the ops the worker submitted in order (seq ids 1, 2, ... after CreateModel's 0)."""
    seqs = [int(seq) for seq, kind in applied if kind != "CreateModel"]
    expected = set(range(1, len(submitted) + 1))
    seen: set[int] = set()
    duplicated = 0
    for seq in seqs:
        duplicated += seq in seen
        seen.add(seq)
    reordered = sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)
    kinds = {int(seq): kind for seq, kind in applied}
    wrong_kind = sum(1 for i, kind in enumerate(submitted, 1) if i in kinds and kinds[i] != kind)
    return {
        "lost": len(expected - seen),
        "duplicated": duplicated,
        "reordered": reordered + wrong_kind,
        "unexpected": len(seen - expected),
    }


def _wait_count(server: Any, endpoint: str, target: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while server.requests.count(endpoint=endpoint) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server saw fewer than {target} {endpoint} requests")
        time.sleep(0.05)


def run_outage(
    scenario: Scenario, sdk: str, size: dict[str, Any], server: Any, log: Callable[[str], None]
) -> dict[str, Any]:
    """Storm / refused / paused for one SDK: rate after 10 s, recovery, training-op checks."""
    from tcp_faults import FaultRates, TcpFaultProxy

    window = float(size["window_s"])
    proxy = TcpFaultProxy(server.url, max_connections=8192) if scenario.name == "refused" else None
    url = proxy.start().url if proxy is not None else server.url
    models_before = set(server.state()["models"])
    worker = Worker(sdk, scenario.name, size, url, server.api_key)
    try:
        worker.expect("ready")
        server.pause("active", kind="sampling")  # samples accepted, polls held: all pending
        base = server.requests.count(endpoint="asample")
        worker.send("go")
        worker.expect("submitted")
        _wait_count(server, "asample", base + int(size["pending"]), 120.0)

        def count() -> int:
            if proxy is not None:
                return int(proxy.accepted)
            return int(server.requests.count())

        if scenario.name == "storm":
            server.faults.extend(["* 503 x*"])
        elif scenario.name == "paused":
            server.pause("paused_capacity", "bench_outage: paused", kind="sampling")
        elif proxy is not None:
            proxy.rates = FaultRates(accept_close=1.0)
            server.refuse_connections(window)
        t0 = time.monotonic()
        time.sleep(SKIP_S)
        c1, t1 = count(), time.monotonic()
        time.sleep(max(0.0, t0 + window - time.monotonic()))
        c2, t2 = count(), time.monotonic()
        if proxy is not None:
            server.wait_listening(30.0)
            proxy.rates = FaultRates()
        server.faults.clear()
        server.resume(kind="sampling")
        t_recovered = time.monotonic()
        worker.send("recovered")
        result = worker.result(timeout=float(size["drain_cap_s"]) + 60.0)
    finally:
        worker.kill()
        server.faults.clear()
        server.resume(kind="sampling")
        if proxy is not None:
            proxy.close()
    out: dict[str, Any] = {
        "rate": (c2 - c1) / (t2 - t1),
        "counted": "proxy accepts" if proxy is not None else "server requests",
        "recovery_s": result["t_done"] - t_recovered,
        "all_done": result["samples_not_done"] == 0 and result["train_loop_done"],
        **{k: result[k] for k in ("samples_done", "samples_failed", "samples_not_done")},
        "sample_errors": result["sample_errors"],
    }
    if scenario.train:
        new = [m for m in server.state()["models"].items() if m[0] not in models_before]
        if len(new) != 1:
            raise RuntimeError(f"{sdk} {scenario.name}: expected one new model, got {len(new)}")
        checks = _ops_check(new[0][1]["applied"], result["train_ops"])
        out.update(
            train_ops=len(result["train_ops"]),
            train_failed=result["train_failed"],
            train_errors=result["train_errors"],
            ops=checks,
            ops_wrong=checks["lost"] + checks["duplicated"] + checks["reordered"],
        )
    if not out["all_done"]:
        out["recovery_s"] = None  # not every future was done within drain_cap_s
    log(f"  {sdk:<8} {scenario.name:<8} {out['rate']:8.1f} /s  recovery {out['recovery_s']}")
    return out


def run_bad(
    scenario: Scenario, sdk: str, size: dict[str, Any], server: Any, log: Callable[[str], None]
) -> dict[str, Any]:
    """The bad request: time to end, the server's words, the ordinary samples' slowdown."""
    rule = {
        "endpoint": "asample",
        "status": 500,
        "times": None,
        "match": {"num_samples": 2},
        "body": {"detail": BAD_WORDS},
    }
    slow = {"endpoint": "asample", "delay": ORDINARY_DELAY_S, "times": None}
    worker = Worker(sdk, scenario.name, size, server.url, server.api_key)
    try:
        worker.expect("ready")
        server.faults.extend([rule, slow])
        worker.send("go")
        result = worker.result(timeout=float(size["bad_cap_s"]) + 120.0)
    finally:
        worker.kill()
        server.faults.clear()
    clean, faulted = statistics.median(result["clean_s"]), statistics.median(result["faulted_s"])
    ended = result["bad_outcome"] != "pending"
    out = {
        "bad_s": result["bad_s"],
        "bad_outcome": result["bad_outcome"],
        "bad_words": BAD_WORDS in result["bad_error"],
        "bad_error": result["bad_error"],
        "bad_answers_500": result["bad_answers_500"],
        "slowdown_pct": 100.0 * (faulted / clean - 1.0),
        "ordinary_clean_s": clean,
        "ordinary_faulted_s": faulted,
    }
    state = f"ended {result['bad_s']:.1f} s" if ended else f"pending after {result['bad_s']:.0f} s"
    log(
        f"  {sdk:<8} bad      {state}, words {out['bad_words']}, slowdown {out['slowdown_pct']:.0f} %"
    )
    return out


def run_lost(
    scenario: Scenario, sdk: str, size: dict[str, Any], server: Any, log: Callable[[str], None]
) -> dict[str, Any]:
    """The lost request, session futures poller on (as the hosted service has it): time until
    its future ends (a resubmission succeeds, or a typed error)."""
    rule = {"endpoint": "asample", "lose": True, "times": 1, "match": {"num_samples": 2}}
    server.set_client_config(sample_use_retrieve_futures=True)  # read by clients at start
    try:
        worker = Worker(sdk, scenario.name, size, server.url, server.api_key)
        try:
            worker.expect("ready")
            server.faults.extend([rule])
            worker.send("go")
            result = worker.result(timeout=float(size["lost_cap_s"]) + 120.0)
        finally:
            worker.kill()
            server.faults.clear()
    finally:
        server.set_client_config(sample_use_retrieve_futures=False)
    out = dict(result)
    ended = out["lost_outcome"] != "pending"
    state = f"{out['lost_outcome']} after {out['lost_s']:.1f} s" if ended else "still pending"
    log(f"  {sdk:<8} lost     {state}")
    return out


# ---------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Metric:
    """A reported number of a scenario: its row and goal."""

    key: str  # the metric in the scenario's result
    goal_key: str  # in GOALS
    suffix: str
    name: str
    unit: str


METRICS: dict[str, tuple[Metric, ...]] = {
    "storm": (
        Metric("rate", "rate", "RATE", "requests/s the server received after 10 s", "req/s"),
        Metric("recovery_s", "recovery_s", "RECOVER", "recovery until every future done", "s"),
        Metric(
            "ops_wrong", "ops_wrong", "OPS", "training ops lost + duplicated + reordered", "ops"
        ),
    ),
    "refused": (
        Metric("rate", "rate", "RATE", "connects/s (proxy accepts) after 10 s", "conn/s"),
        Metric("recovery_s", "recovery_s", "RECOVER", "recovery until every future done", "s"),
        Metric(
            "ops_wrong", "ops_wrong", "OPS", "training ops lost + duplicated + reordered", "ops"
        ),
    ),
    "paused": (
        Metric("rate", "paused_rate", "RATE", "requests/s while paused, after 10 s", "req/s"),
    ),
    "bad": (
        Metric("bad_s", "bad_s", "END", "until the bad request ends, with the server's words", "s"),
        Metric("slowdown_pct", "slowdown_pct", "SLOW", "ordinary samples' slowdown vs clean", "%"),
    ),
    "lost": (Metric("lost_s", "lost_s", "NOTICE", "until a lost request is noticed", "s"),),
}


def _met(metric: Metric, result: dict[str, Any] | None) -> bool | None:
    if result is None or result.get(metric.key) is None:
        return None if result is None or metric.key != "recovery_s" else False
    op, limit = GOALS[metric.goal_key]
    ok = float(result[metric.key]) <= limit
    if metric.key == "bad_s":
        ok = ok and result["bad_outcome"] == "failed" and bool(result["bad_words"])
    if metric.key == "lost_s":
        ok = ok and result["lost_outcome"] != "pending"
    return ok


def make_rows(
    results: dict[tuple[str, int, str], dict[str, Any]],
    skipped: dict[str, str],
    mode: str,
    context: dict[str, Any],
    loads: dict[str, list[float]],
) -> list[dict[str, Any]]:
    """``results[(scenario, pending, sdk)]`` -> rows in run.py's shape, plus ``met_official``."""
    rows = []
    keys = sorted(
        {(s, p) for s, p, _ in results}, key=lambda k: (list(SCENARIOS).index(k[0]), k[1])
    )
    keys += [(name, 0) for name in skipped]
    for scenario, pending in keys:
        bench = f"{scenario}-{pending}" if SCENARIOS[scenario].uses_pending else scenario
        for metric in METRICS[scenario]:
            op, limit = GOALS[metric.goal_key]
            row = Row(
                id=f"OUT-{bench.upper()}-{metric.suffix}",
                name=f"{SCENARIOS[scenario].description}"
                + (f", {pending:,} pending" if SCENARIOS[scenario].uses_pending else "")
                + f": {metric.name}",
                unit=metric.unit,
                bench=bench,
                sources=tuple((sdk, sdk, metric.key) for sdk in SDKS),
                goal=f"{op} {limit:g} {metric.unit}",
            )
            per_sdk = {sdk: results.get((scenario, pending, sdk)) for sdk in SDKS}
            by_bench = {(bench, sdk): r for sdk, r in per_sdk.items() if r is not None}
            built = build_row(row, by_bench, {}, context, loads.get(bench))
            built["met"] = _met(metric, per_sdk["ours"])
            built["met_official"] = _met(metric, per_sdk["official"])
            detail: dict[str, Any] = {
                sdk: {k: v for k, v in r.items() if k != metric.key}
                for sdk, r in per_sdk.items()
                if r is not None
            }
            if scenario in skipped:
                detail["skipped"] = skipped[scenario]
            built["detail"] = detail
            rows.append(built)
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return (
        f"{value:,.0f}"
        if abs(value) >= 100
        else f"{value:.2f}"
        if abs(value) >= 1
        else f"{value:.3g}"
    )


def format_rows(rows: list[dict[str, Any]]) -> str:
    verdict = {True: "met", False: "NOT met", None: "-"}
    lines = [f"{'id':<26}{'ours':>10}{'official':>10}  {'goal':<14}{'ours':<9}{'official':<9}row"]
    for r in rows:
        lines.append(
            f"{r['id']:<26}{_fmt(r['ours']):>10}{_fmt(r['official']):>10}  {r['goal']:<14}"
            f"{verdict[r['met']]:<9}{verdict[r['met_official']]:<9}{r['name']}"
        )
        skipped = (r.get("detail") or {}).get("skipped")
        if skipped:
            lines.append(f"{'':<26}skipped: {skipped}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main


RUNNERS = {"outage": run_outage, "bad": run_bad, "lost": run_lost}


@contextlib.contextmanager
def _server() -> Iterator[Any]:
    from tinker_sync.local import LocalServer

    with LocalServer(backend="instant", in_subprocess=True, long_poll_s=LONG_POLL_S) as server:
        yield server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="500 pending, 20 s windows")
    parser.add_argument("--only", help=f"comma-separated scenarios of {list(SCENARIOS)}")
    parser.add_argument("--sdk", default=",".join(SDKS), help="comma-separated: ours,official")
    parser.add_argument("--pending", help="comma-separated pending counts (overrides the mode)")
    parser.add_argument("--window", type=float, help="window seconds (overrides the mode)")
    parser.add_argument(
        "--json",
        nargs="?",
        const="",
        metavar="PATH",
        help="write the JSON document (default path benchmarks/results/outage-<mode>.json)",
    )
    args = parser.parse_args(argv)
    names = [x.strip() for x in (args.only or ",".join(SCENARIOS)).split(",") if x.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown}; known: {list(SCENARIOS)}")
    sdks = [x.strip() for x in args.sdk.split(",") if x.strip()]
    if not sdks or any(s not in SDKS for s in sdks):
        parser.error(f"--sdk takes {SDKS}")
    args.scenarios, args.sdks = names, sdks
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    size = dict(SIZES[mode])
    if args.pending:
        size["pending"] = [int(x) for x in args.pending.split(",")]
    if args.window:
        size["window_s"] = args.window

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = {**machine_info(), **_versions()}
    context = row_context(machine, mode)
    started = time.monotonic()
    results: dict[tuple[str, int, str], dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    errors: list[str] = []
    loads: dict[str, list[float]] = {}
    with _server() as server:
        log(f"server {server.url}; mode {mode}; {machine['cpu']} x{machine['cores']}")
        for name in args.scenarios:
            scenario = SCENARIOS[name]
            why = scenario.available()
            if why is not None:
                skipped[name] = why
                log(f"  {name}: skipped ({why})")
                continue
            for pending in size["pending"] if scenario.uses_pending else [0]:
                bench = f"{name}-{pending}" if scenario.uses_pending else name
                run_size = {
                    **size,
                    "pending": pending,
                    "train": scenario.train,
                    "runner": scenario.runner,
                }
                for sdk in args.sdks:
                    try:
                        results[(name, pending, sdk)] = RUNNERS[scenario.runner](
                            scenario, sdk, run_size, server, log
                        )
                    except Exception as exc:
                        errors.append(f"{sdk} {bench}: {exc}")
                        log(f"  {sdk} {bench} FAILED: {exc}")
                    if hasattr(os, "getloadavg"):
                        loads.setdefault(bench, []).append(round(os.getloadavg()[0], 2))
    rows = make_rows(results, skipped, mode, context, loads)
    elapsed = time.monotonic() - started
    print(format_rows(rows))
    print(f"\n{mode} run in {elapsed:.0f} s")
    for error in errors:
        print(f"ERROR: {error}")
    if args.json is not None:
        path = Path(args.json) if args.json else BENCH_DIR / "results" / f"outage-{mode}.json"
        document = {
            "mode": mode,
            "elapsed_s": elapsed,
            "sizes": size,
            "rows": rows,
            "machine": machine,
            "errors": errors,
            "skipped": skipped,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
