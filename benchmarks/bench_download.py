"""Benchmark row P13: a checkpoint download cut five times, tinker_sync against the official SDK.

Usage::

    python benchmarks/bench_download.py                    # a 200 MB checkpoint, 5 cuts
    python benchmarks/bench_download.py --small            # 4 MB (the smoke test; seconds)
    python benchmarks/bench_download.py --size-mb 50 --cuts 3 --out /tmp/p13.json

One ``LocalServer(backend="instant", in_subprocess=True)``. A training run gets a training
checkpoint and an external-weights checkpoint; a file of ``size`` random bytes is written into
each on the server's disk. Then, with the fault rule ``/_files/** cut_at=<size/6> x<cuts>``
(each file answer is cut after a sixth of the file):

* ours: ``tinker_sync.checkpoints.download_checkpoint`` of the training checkpoint (the
  server's tar archive: REST only, resumed with ``Range``/``If-Range``, verified against the
  ``Repr-Digest``). Reported: bytes received over every attempt, relative to the archive's size
  (goal: at most 1.1), wall time, attempts, and whether the file on disk has the right sha-256.
* official: the official SDK's download path, ``tinker checkpoint download`` (0.38 has no
  archive call: its CLI downloads an external-weights checkpoint file by file with one plain
  GET each; a training checkpoint would first be exported through a new training run), run on
  the external-weights checkpoint holding the same bytes, with the same cuts and once without
  (``official_uncut``, for its wall time). Reported: its exit status, the bytes it wrote (one
  GET per file and no retry, so the bytes it received), wall time and whether the file is
  intact.

Output: a table on stdout and the JSON document (``--out``). ``benchmarks/run.py`` runs the
same workload as row P13 through ``_worker_download.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BIG_FILE = "model.bin"
TIMEOUT = 600.0


def _write_random(path: Path, size: int) -> str:
    """``size`` random bytes at ``path``; returns their sha-256 hex."""
    sha = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left:
            chunk = os.urandom(min(left, 1 << 22))
            sha.update(chunk)
            fh.write(chunk)
            left -= len(chunk)
    return sha.hexdigest()


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            sha.update(chunk)
    return sha.hexdigest()


def one_run(url: str, key: str, data_dir: Path, size: int, cuts: int) -> dict[str, Any]:
    """Seed the checkpoints, then run both downloads under the same cut rule."""
    from urllib.parse import quote, urlsplit

    import tinker_sync
    from tinker_sync.checkpoints import download_checkpoint
    from tinker_sync.local._admin import AdminChannel, RemoteFaultPlan

    service = tinker_sync.ServiceClient(base_url=url, api_key=key)
    try:
        training = service.create_lora_training_client("tinker-sync/tiny", rank=4)
        run_id = training.model_id
        weights = training.save_state("bench").result(TIMEOUT).path
        external = training.save_weights_external("bench").result(TIMEOUT).path
    finally:
        service.close()
    root = data_dir / "checkpoints" / quote(run_id, safe="")
    digest = _write_random(root / "weights" / "bench" / BIG_FILE, size)
    (root / "external_weights" / "bench" / "files").mkdir(parents=True, exist_ok=True)
    os.link(
        root / "weights" / "bench" / BIG_FILE,
        root / "external_weights" / "bench" / "files" / BIG_FILE,
    )
    port = urlsplit(url).port or 80
    plan = RemoteFaultPlan(AdminChannel(urlsplit(url).hostname or "127.0.0.1", port, key))
    cut = f"/_files/** cut_at={max(size // (cuts + 1), 1)} x{cuts}"
    out: dict[str, Any] = {"size_bytes": size, "cuts": cuts, "rule": cut}
    with tempfile.TemporaryDirectory() as tmp:
        plan.clear()
        plan.add(cut)
        start = time.perf_counter()
        rest = tinker_sync.RestClient(base_url=url, api_key=key)
        try:
            result = download_checkpoint(weights, Path(tmp) / "ours", rest_client=rest)
        finally:
            rest.close()
        ours_s = time.perf_counter() - start
        intact = _sha256(result.path / BIG_FILE) == digest
        out["ours"] = {
            "outcome": "verified" if intact and result.verified_by == "repr-digest" else "corrupt",
            "archive_bytes": result.fetched_bytes,
            "bytes_transferred": result.bytes_transferred,
            "ratio": result.bytes_transferred / result.fetched_bytes,
            "resumed_bytes": result.resumed_bytes,
            "attempts": result.attempts,
            "wall_s": ours_s,
            "cuts_applied": sum(r.hits for r in plan.rules),
        }
        env = dict(os.environ, TINKER_BASE_URL=url, TINKER_API_KEY=key)
        for name, rule in (("official", cut), ("official_uncut", None)):
            plan.clear()
            if rule is not None:
                plan.add(rule)
            out[name] = _official(external, Path(tmp) / name, env, digest, size)
            out[name]["cuts_applied"] = sum(r.hits for r in plan.rules)
        plan.clear()
    return out


def _official(
    external: str, dest: Path, env: dict[str, str], digest: str, size: int
) -> dict[str, Any]:
    """``tinker checkpoint download`` of the external-weights checkpoint, in a subprocess."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tinker.cli", "checkpoint", "download", external, "-o", str(dest)],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT,
        check=False,
    )
    wall = time.perf_counter() - start
    files = list(dest.rglob(BIG_FILE)) if dest.exists() else []
    got = files[0].stat().st_size if files else 0
    if proc.returncode != 0:
        outcome = f"error (exit {proc.returncode})"
    elif not files or _sha256(files[0]) != digest:
        outcome = f"exit 0, truncated file kept ({got} of {size} bytes)"
    else:
        outcome = "verified"
    return {
        "outcome": outcome,
        "bytes_transferred": got,  # one GET per file and no retry: what it wrote
        "ratio": got / size,
        "attempts": 1,
        "wall_s": wall,
        "stderr_tail": proc.stderr.strip().splitlines()[-1:] if proc.stderr else [],
    }


def _table(res: dict[str, Any]) -> str:
    size = res["size_bytes"]
    lines = [
        f"P13: a {size / 1e6:.0f} MB checkpoint download, {res['cuts']} cuts ({res['rule']})",
        f"{'SDK':<15} {'outcome':<48} {'bytes received':>16} {'x size':>7} {'wall s':>7}",
    ]
    for sdk in ("ours", "official", "official_uncut"):
        r = res[sdk]
        lines.append(
            f"{sdk:<15} {r['outcome']:<48} {r['bytes_transferred']:>16,} "
            f"{r['ratio']:>7.3f} {r['wall_s']:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0)
    parser.add_argument("--small", action="store_true", help="4 MB (seconds; the smoke test)")
    parser.add_argument("--cuts", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    size = int((4.0 if args.small else args.size_mb) * 1_000_000)
    from tinker_sync.local import LocalServer

    with LocalServer(backend="instant", in_subprocess=True) as server:
        assert server.api_key is not None
        res = one_run(server.url, server.api_key, server.data_dir, size, args.cuts)
    print(_table(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    ours = res["ours"]
    met = ours["outcome"] == "verified" and ours["ratio"] <= 1.1
    print(f"goal (ours verified, <= 1.1 x the archive's bytes): {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
