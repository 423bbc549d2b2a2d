"""P13 worker: a checkpoint download cut five times, tinker_sync and the official SDK's path.

``python _worker_download.py download --url U --key K --size JSON``; prints one JSON line.

Runs :func:`bench_download.one_run` ``size["reps"]`` times against the server at ``U`` (its
data directory comes from the admin ``info``). Fails (the row then has no numbers) unless
tinker_sync's download arrived verified with the right sha-256.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import Admin, finish, parse_worker_args  # noqa: E402


def bench_download(url: str, key: str, size: dict[str, Any]) -> dict[str, Any]:
    from bench_download import one_run

    data_dir = Path(Admin(url, key).call("GET", "info")["data_dir"])
    nbytes = int(float(size["size_mb"]) * 1_000_000)
    out: dict[str, Any] = {}
    for _ in range(int(size["reps"])):
        res = one_run(url, key, data_dir, nbytes, int(size["cuts"]))
        if res["ours"]["outcome"] != "verified":
            raise RuntimeError(f"P13: tinker_sync's download is {res['ours']['outcome']}")
        for sdk in ("ours", "official", "official_uncut"):
            r = res[sdk]
            out.setdefault(f"{sdk}_ratio", []).append(r["ratio"])
            out.setdefault(f"{sdk}_wall_s", []).append(r["wall_s"])
            out.setdefault(f"{sdk}_bytes", []).append(float(r["bytes_transferred"]))
            out.setdefault(f"{sdk}_intact", []).append(1.0 if r["outcome"] == "verified" else 0.0)
        out["official_outcome"] = res["official"]["outcome"]
    return out


if __name__ == "__main__":
    args = parse_worker_args()
    if args.bench != "download":
        raise SystemExit(f"unknown bench {args.bench!r}; known: ['download']")
    finish(
        {
            "sdk": "ours",
            "benches": {"download": bench_download(args.url, args.api_key, args.size["download"])},
        }
    )
