"""Profiles of tinker_sync for benchmark rows that missed their goal (``run.py --profile-missed``).

* server rows (P1-P3, P5-P7): the ``ours`` worker runs once (no warm-up, one repetition)
  against a fresh local server with a ``cProfile`` in every thread timed by the thread's own CPU
  clock (``_common.Profiler``), so blocked waits cost nothing and pool threads are included;
  summarised as the hottest functions by own CPU time and the tinker_sync functions by
  cumulative CPU time. (:func:`summarize_collapsed` reads ``py-spy record -f raw`` output, for
  the same kind of summary from a sampling profiler.)
* P4: cProfile of ``ours`` inside the codec worker (single-threaded, so cProfile sees it all).
* P8: ``python -X importtime -c "import tinker_sync"``, slowest modules by self and cumulative time.

Every profile's raw data is written next to the JSON output; the summary goes into the JSON.
"""

from __future__ import annotations

import json
import pstats
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import ROOT, subprocess_env

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
TOP = 15


def _frame_key(frame: str) -> str:
    """``"func (path/to/file.py:12)"`` -> ``"func (path/to/file.py)"`` (lines merged)."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m.group('func')} ({path})"


#: Stacks with these frames are set-up, not the measured work: imports (module bodies).
_SETUP_MARKERS = ("_find_and_load (", "(<frozen importlib._bootstrap")


def summarize_collapsed(path: Path, focus: str = "tinker_sync/") -> dict[str, Any]:
    """Summarise py-spy ``--format raw`` output (``frame;frame;... count`` per line).

    Stacks inside an import are counted apart (``setup_samples``) and left out of the tables.
    """
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    focus_leaf: Counter[str] = Counter()
    total = setup = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        if any(marker in stack for marker in _SETUP_MARKERS):
            setup += count
            continue
        frames = [_frame_key(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        leaf[frames[-1]] += count
        for frame in set(frames):
            if focus in frame:
                inclusive[frame] += count
        inner = [f for f in frames if focus in f]
        if inner:
            focus_leaf[inner[-1]] += count

    def top(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"frame": frame, "samples": n, "pct": round(100.0 * n / total, 1) if total else 0.0}
            for frame, n in counter.most_common(TOP)
        ]

    return {
        "samples": total,
        "setup_samples": setup,
        "self": top(leaf),
        "tinker_sync_inclusive": top(inclusive),
        "tinker_sync_innermost": top(focus_leaf),
    }


def summarize_pstats(path: Path, focus: str = "tinker_sync") -> dict[str, Any]:
    """Top functions of a cProfile dump by own time and by cumulative time."""
    stats = pstats.Stats(str(path))
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((filename, line, func, nc, tt, ct))
    total = sum(r[4] for r in rows) or 1.0

    def fmt(r: tuple[Any, ...]) -> dict[str, Any]:
        filename, line, func, nc, tt, ct = r
        short = filename.split("site-packages/")[-1].split(str(ROOT) + "/")[-1]
        return {
            "frame": f"{func} ({short}:{line})",
            "calls": nc,
            "self_s": round(tt, 4),
            "cum_s": round(ct, 4),
            "self_pct": round(100.0 * tt / total, 1),
        }

    by_self = sorted(rows, key=lambda r: -r[4])[:TOP]
    by_cum = sorted((r for r in rows if focus in r[0]), key=lambda r: -r[5])[:TOP]
    return {
        "total_s": round(total, 4),
        "self": [fmt(r) for r in by_self],
        "tinker_sync_cumulative": [fmt(r) for r in by_cum],
    }


def importtime(stmt: str = "import tinker_sync") -> dict[str, Any]:
    """``-X importtime`` of ``stmt``: the slowest modules by self and by cumulative time (us)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", stmt],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd="/",
        timeout=300,
        check=True,
    )
    entries = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:") :].split("|")
        entries.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
    total = sum(e[0] for e in entries)
    return {
        "statement": stmt,
        "total_self_us": total,
        "modules": len(entries),
        "by_self": [{"module": m.strip(), "self_us": s} for s, _, m in sorted(entries)[::-1][:TOP]],
        "by_cumulative": [
            {"module": m.strip(), "cumulative_us": c}
            for _, c, m in sorted(entries, key=lambda e: -e[1])[:TOP]
        ],
    }


def profile_rows(
    rows: list[Any],
    sizes: dict[str, Any],
    timeout: float,
    outdir: Path,
    run_worker: Callable[..., dict[str, Any]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Profile ``ours`` for each row (``run.Row``); returns {row id: summary}. Raw files go to
    ``outdir``; ``run_worker`` is ``run.run_worker``."""
    from tinker_sync.local import LocalServer

    outdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    done: dict[str, Any] = {}
    for row in rows:
        bench = row.bench
        if bench in done:  # P1 and P2 share one profile
            out[row.id] = {"same_as": done[bench]}
            continue
        log(f"profiling {row.id} ({bench})")
        try:
            if bench in ("import", "first"):  # P8 (its row's bench is "first")
                out[row.id] = {"tool": "importtime", **importtime()}
            elif bench == "codec":
                dump = outdir / f"profile-{row.id}.pstats"
                run_worker("codec", ["codec"], sizes, "", "tml-local", timeout, profile=str(dump))
                out[row.id] = {"tool": "cProfile", "file": str(dump), **summarize_pstats(dump)}
            else:
                one = {**sizes[bench], "warmup": 0, "reps": 1}
                dump = outdir / f"profile-{row.id}.pstats"
                with LocalServer(backend="instant", in_subprocess=True) as server:
                    url, key = server.url, server.api_key or "tml-local"
                    run_worker("ours", [bench], {bench: one}, url, key, timeout, profile=str(dump))
                out[row.id] = {
                    "tool": "cProfile per thread (thread CPU time)",
                    "file": str(dump),
                    **summarize_pstats(dump),
                }
            done[bench] = row.id
        except Exception as exc:
            out[row.id] = {"error": f"{type(exc).__name__}: {exc}"}
        log(json.dumps(out[row.id])[:2000])
    return out
