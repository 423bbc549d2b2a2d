"""P11 worker: training and sampling through the TCP fault proxy, with and without faults.

``python _worker_lossy.py lossy --url U --key K --size JSON``; prints one JSON line.

Runs :func:`bench_lossy.one_run` twice per repetition against the server at ``U``: every fault
kind at ``size["rate"]`` (seed 11 + repetition), then the same workload through the proxy with
no faults. Both runs
do the same work on the same inputs; the correctness checks (each op applied once and in
order, each sample's own answer) must hold, or the worker fails (and the row has no numbers).
The goals hold per seed: ``*_faults_worst`` is the worst seed's number, ``per_seed`` every
seed's.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import Admin, finish, parse_worker_args  # noqa: E402


def bench_lossy(url: str, key: str, size: dict[str, Any]) -> dict[str, Any]:
    from bench_lossy import one_run
    from tcp_faults import FaultRates

    logging.getLogger("tinker_sync.health").setLevel(logging.ERROR)  # a line per lost reply
    admin = Admin(url, key)

    def state() -> dict[str, Any]:
        result: dict[str, Any] = admin.call("GET", "state")
        return result

    work = {k: int(size[k]) for k in ("threads", "steps", "samples", "sample_threads")}
    out: dict[str, Any] = {}
    per_seed: dict[str, dict[str, Any]] = {}
    for rep in range(int(size["reps"])):
        seed = 11 + rep
        lossy = one_run(url, state, FaultRates.each(float(size["rate"])), work, seed, key)
        clean = one_run(url, state, FaultRates(), work, seed, key)
        per_seed[str(seed)] = {
            **{m: lossy[m] for m in ("train_s", "sample_p99_s", "sample_max_s", "create_max_s")},
            "faults": lossy["faults"],
        }
        for name, res in (("faults", lossy), ("clean", clean)):
            if not res["applied_exactly_once_in_order"]:
                raise RuntimeError(f"P11 ({name}): a training op was not applied once, in order")
            for metric in ("train_s", "sample_p50_s", "sample_p99_s", "sample_max_s"):
                out.setdefault(f"{metric}_{name}", []).append(res[metric])
            out.setdefault(f"create_max_s_{name}", []).append(res["create_max_s"])
        if lossy["answers"] != clean["answers"]:
            raise RuntimeError("P11: a sample through the faults got another answer")
    for metric in ("train_s", "sample_p99_s", "sample_max_s"):
        out[f"{metric}_faults_worst"] = max(out[f"{metric}_faults"])
    out["per_seed"] = per_seed
    return out


if __name__ == "__main__":
    args = parse_worker_args()
    if args.bench != "lossy":
        raise SystemExit(f"unknown bench {args.bench!r}; known: ['lossy']")
    finish(
        {
            "sdk": "ours",
            "benches": {"lossy": bench_lossy(args.url, args.api_key, args.size["lossy"])},
        }
    )
