"""P10 worker: sampling from 1, 2 and 4 worker processes at one total concurrency.

``python _worker_scaleout.py scaleout --url U --key K --size JSON``; prints one JSON line.

Each round starts ``p`` spawn-method processes for every ``p`` in ``size["procs"]`` (the
order rotates from round to round, so a slow spell of the shared machine hits every column
alike). The main process creates one sampling client and hands each worker its handle; the
workers get the API key from their environment, as the scale-out docs recommend. A worker:

1. records the wall clock when its code starts running (``entry``: interpreter up, before
   ``import tinker_sync``), imports tinker_sync, rebuilds the client from the handle and
   samples once (``first``: the time from entry, and from the parent's ``start()``, to that
   first result is the "first sample" number; the CPU its process used in between, all
   threads, is ``first_sample_cpu_s``, which the machine's load does not inflate);
2. warms up, reports ready and waits for the go signal shared by all workers of the round;
3. draws ``n / p`` samples keeping ``concurrency / p`` in flight, and reports its wall-clock
   window and the CPU time its process used (all threads).

Per round and ``p``: aggregate throughput = ``n / (last end - first start)``, client CPU per
sample = the workers' summed CPU / ``n``. Then, for comparison, the first-sample time of
workers forked from a forkserver that preloaded tinker_sync (``first_sample_forkserver_s``). Every column draws the same ``n`` samples of the same
prompt with the same total number in flight. This file imports no SDK at module level, so
a spawned worker's entry time comes before any tinker_sync import.

Before the rounds, tinker_sync's bytecode is compiled once (:func:`compile_package`), as
``pip install`` does: run from a checkout under ``PYTHONDONTWRITEBYTECODE=1`` every worker
would otherwise compile the SDK's modules from source again (about 80 ms of CPU each on
this machine), a cost no installed SDK has. Then one untimed warm-up round (one worker, one
sample) compiles whatever else a worker imports; run.py gives every worker one bytecode cache
for the run (``PYTHONPYCACHEPREFIX``), so this holds whatever the machine's caches say.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import BASE_MODEL, VOCAB, finish, parse_worker_args  # noqa: E402

#: Seconds any one wait in this benchmark may take before the round fails.
WAIT_S = 120.0


def _child(
    handle: str,
    n: int,
    window: int,
    size: dict[str, Any],
    conn: Any,
    go: Any,
) -> None:
    """One worker process (spawn target); reports over ``conn``."""
    entry, entry_cpu = time.time(), time.process_time()
    try:
        import tinker_sync
        from tinker_sync import types

        sampler = tinker_sync.SamplingClient.from_sampler_handle(handle)
        prompt = types.ModelInput.from_ints(
            [(i * 7 + 3) % VOCAB for i in range(int(size["prompt"]))]
        )
        params = types.SamplingParams(max_tokens=int(size["max_tokens"]))
        sampler.sample(prompt, 1, params).result(WAIT_S)
        first, first_cpu = time.time(), time.process_time() - entry_cpu

        def run(count: int) -> None:
            slots = threading.BoundedSemaphore(window)
            futures = []
            for _ in range(count):
                if not slots.acquire(timeout=WAIT_S):
                    raise TimeoutError(f"no sample finished within {WAIT_S} s")
                future = sampler.sample(prompt, 1, params)
                future.add_done_callback(lambda _: slots.release())
                futures.append(future)
            for future in futures:
                future.result(WAIT_S)

        run(int(size["warmup"]))
        conn.send(("ready", entry, first, first_cpu))
        if not go.wait(WAIT_S):
            raise TimeoutError("no go signal")
        cpu0, start = time.process_time(), time.time()
        run(n)
        end, cpu = time.time(), time.process_time() - cpu0
        conn.send(("done", start, end, cpu))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _receive(conn: Any, what: str) -> tuple[Any, ...]:
    if not conn.poll(WAIT_S):
        raise TimeoutError(f"a worker sent no {what} within {WAIT_S} s")
    message: tuple[Any, ...] = conn.recv()
    if message[0] == "error":
        raise RuntimeError(f"worker failed: {message[1]}")
    return message


#: What a forkserver imports once, so that the workers it forks start with tinker_sync loaded.
PRELOAD = [
    "tinker_sync.sampling_client",
    "tinker_sync._session.state",
    "tinker_sync._polling.loop",
    "tinker_sync._wire._proto",
    "tinker_sync.types",
]


def one_round(
    handle: str, procs: int, size: dict[str, Any], method: str = "spawn"
) -> dict[str, Any]:
    """Start ``procs`` workers, release them together, collect their numbers."""
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    total, concurrency = int(size["n"]), int(size["concurrency"])
    go = ctx.Event()
    workers = []
    try:
        for i in range(procs):
            parent_end, child_end = ctx.Pipe(duplex=False)
            share = total // procs + (1 if i < total % procs else 0)
            window = max(1, concurrency // procs)
            proc = ctx.Process(
                target=_child, args=(handle, share, window, size, child_end, go), daemon=True
            )
            launched = time.time()
            proc.start()
            child_end.close()
            workers.append((proc, parent_end, launched))
        ready = [(_receive(conn, "ready"), launched) for _, conn, launched in workers]
        go.set()
        done = [_receive(conn, "result") for _, conn, _ in workers]
    finally:
        for proc, conn, _ in workers:
            proc.join(WAIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(WAIT_S)
            conn.close()
    start = min(d[1] for d in done)
    end = max(d[2] for d in done)
    return {
        "samples_per_s": total / (end - start),
        "cpu_s_per_sample": sum(d[3] for d in done) / total,
        "first_sample_s": [first - entry for (_, entry, first, _), _ in ready],
        "first_sample_from_launch_s": [first - launched for (_, _, first, _), launched in ready],
        "first_sample_cpu_s": [cpu for (*_, cpu), _ in ready],
    }


def compile_package() -> None:
    """Write tinker_sync's bytecode cache (``__pycache__``, git-ignored), as an install does."""
    import compileall

    import tinker_sync

    compileall.compile_dir(Path(tinker_sync.__file__).resolve().parent, quiet=1)


def bench_scaleout(url: str, api_key: str, size: dict[str, Any]) -> dict[str, Any]:
    import tinker_sync

    compile_package()

    os.environ["TINKER_API_KEY"] = api_key  # the workers' credential (inherited)
    with tinker_sync.ServiceClient(base_url=url) as service:
        handle = service.create_sampling_client(base_model=BASE_MODEL).get_sampler_handle()
        one_round(handle, 1, {**size, "n": 1, "warmup": 0})  # untimed: compiles the imports
        procs = [int(p) for p in size["procs"]]
        out: dict[str, Any] = {
            "first_sample_s": [],
            "first_sample_from_launch_s": [],
            "first_sample_cpu_s": [],
        }
        every_first: list[float] = []
        for p in procs:
            out[f"samples_per_s_{p}"] = []
            out[f"cpu_s_per_sample_{p}"] = []
        for rnd in range(int(size["reps"])):
            shift = rnd % len(procs)
            firsts: list[float] = []
            from_launch: list[float] = []
            cpus: list[float] = []
            for p in procs[shift:] + procs[:shift]:
                got = one_round(handle, p, size)
                out[f"samples_per_s_{p}"].append(got["samples_per_s"])
                out[f"cpu_s_per_sample_{p}"].append(got["cpu_s_per_sample"])
                firsts += got["first_sample_s"]
                from_launch += got["first_sample_from_launch_s"]
                cpus += got["first_sample_cpu_s"]
            # one number per repetition: the median over this round's workers (1 + 2 + 4)
            out["first_sample_s"].append(statistics.median(firsts))
            out["first_sample_from_launch_s"].append(statistics.median(from_launch))
            out["first_sample_cpu_s"].append(statistics.median(cpus))
            every_first += firsts
        out["first_sample_max_s"] = max(every_first)
        # The same start-up through a forkserver that preloaded tinker_sync: the fix for short-
        # lived workers (each is forked from a process that already imported the SDK).
        if "forkserver" in multiprocessing.get_all_start_methods():  # POSIX
            small = {**size, "n": max(procs), "warmup": 0}
            out["first_sample_forkserver_s"] = [
                statistics.median(
                    one_round(handle, max(procs), small, "forkserver")["first_sample_s"]
                )
                for _ in range(int(size["reps"]))
            ]
    return out


if __name__ == "__main__":
    args = parse_worker_args()
    if args.bench != "scaleout":
        raise SystemExit(f"unknown bench {args.bench!r}; known: ['scaleout']")
    finish(
        {
            "sdk": "ours",
            "benches": {"scaleout": bench_scaleout(args.url, args.api_key, args.size["scaleout"])},
        }
    )
