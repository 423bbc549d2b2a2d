"""Worker of ``bench_outage.py``: one SDK through one outage scenario, driven over stdin.

``python _worker_outage.py {ours,official} SCENARIO --url U --key K --size JSON``; imports only
that SDK. The orchestrator injects the faults and counts what the server received; this process
only runs the client side, one step per line it reads on stdin, and answers on stdout with lines
``@outage <word> <json>``; the last stdout line is the JSON result (:func:`_common.finish`).

* ``outage`` (the 503 storm, refused connections, the queue-state pause): say ``ready``; on
  ``go`` submit ``pending`` samples and, with ``train``, start a training loop (forward_backward
  + optim_step, each step awaited); on ``recovered`` stop the loop after its current step and
  wait (at most ``drain_cap_s``) for every future. Reports the monotonic time when the last
  one was done (``CLOCK_MONOTONIC`` is system-wide, so the orchestrator subtracts its own
  recovery time), failures, and the training ops submitted in order.
* ``bad``: say ``ready``; on ``go`` time ``ordinary`` samples ``reps`` times (clean), submit
  the bad sample (``num_samples=2``, which the orchestrator's fault answers 500 forever), time
  the ordinary samples again while it is pending, then wait for it (at most ``bad_cap_s``).
  Reports when its future ended (a done callback), not when the timed samples were over.
* ``lost``: say ``ready``; on ``go`` submit the sample the server loses (``num_samples=2``) and
  one ordinary sample every 0.5 s until it ends (at most ``lost_cap_s``).
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import BASE_MODEL, Admin, finish, parse_worker_args, wait_until  # noqa: E402
from _sdk_rows import SdkBench, _resolve  # noqa: E402

PREFIX = "@outage"


def say(word: str, **data: Any) -> None:
    """One protocol line to the orchestrator."""
    sys.stdout.write(f"{PREFIX} {word} {json.dumps(data)}\n")
    sys.stdout.flush()


def wait_for(word: str) -> None:
    """Block until the orchestrator sends ``word`` (EOF: it went away, so leave)."""
    for line in sys.stdin:
        if line.strip() == word:
            return
    raise SystemExit(f"stdin closed before {word!r}")


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def run_outage(b: SdkBench) -> dict[str, Any]:
    size = b.size
    n, drain_cap = int(size["pending"]), float(size["drain_cap_s"])
    sampler = b._sampler()
    prompt, params = b._prompt(16), b._params(4)
    sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
    training: Any = None
    data, adam = b._datums(2, 32), b.sdk.AdamParams(learning_rate=1e-4)
    ops: list[str] = []
    if size["train"]:
        training = _resolve(b.service.create_lora_training_client(base_model=BASE_MODEL, rank=8))
        training.forward_backward(data, "cross_entropy").result()
        training.optim_step(adam).result()
        ops += ["ForwardBackward", "OptimStep"]
    say("ready")
    wait_for("go")
    futures = b._sample_many(sampler, prompt, params, n)
    stop = threading.Event()
    loop_errors: list[str] = []

    def loop() -> None:
        while not stop.is_set():
            fb = training.forward_backward(data, "cross_entropy")
            opt = training.optim_step(adam)
            ops.extend(["ForwardBackward", "OptimStep"])
            for future in (fb, opt):
                try:
                    future.result()
                except Exception as exc:  # recorded: a failed op is a finding, not a crash
                    loop_errors.append(_error_text(exc))

    thread = threading.Thread(target=loop, name="bench-train-loop", daemon=True)
    if training is not None:
        thread.start()
    say("submitted")
    wait_for("recovered")
    stop.set()
    deadline = time.monotonic() + drain_cap
    done = failed = not_done = 0
    errors: list[str] = []
    for future in futures:
        try:
            future.result(timeout=max(0.01, deadline - time.monotonic()))
            done += 1
        except TimeoutError:
            not_done += 1
        except Exception as exc:
            failed += 1
            if len(errors) < 3:
                errors.append(_error_text(exc))
    if training is not None:
        thread.join(max(0.0, deadline - time.monotonic()))
    t_done = time.monotonic()
    return {
        "t_done": t_done,
        "samples_done": done,
        "samples_failed": failed,
        "samples_not_done": not_done,
        "sample_errors": errors,
        "train_loop_done": not thread.is_alive(),
        "train_ops": list(ops),
        "train_errors": loop_errors[:3],
        "train_failed": len(loop_errors),
    }


def run_bad(b: SdkBench) -> dict[str, Any]:
    size = b.size
    k, reps, cap = int(size["ordinary"]), int(size["reps"]), float(size["bad_cap_s"])
    sampler = b._sampler()
    prompt, params = b._prompt(16), b._params(4)
    sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
    admin = Admin(b.args.url, b.args.api_key)

    def ordinary() -> float:
        t0 = time.monotonic()
        for future in b._sample_many(sampler, prompt, params, k):
            future.result(timeout=120)
        return time.monotonic() - t0

    say("ready")
    wait_for("go")
    ordinary()  # untimed: connections and threads in place
    clean = [ordinary() for _ in range(reps)]

    def answered() -> int:
        """How many times the server answered a sample submission 500 (the bad one)."""
        query = {"endpoint": "asample", "status": 500}
        return int(admin.call("GET", "requests/count", query=query)["count"])

    t_bad = time.monotonic()
    bad = sampler.sample(prompt=prompt, num_samples=2, sampling_params=params)
    ended_at: list[float] = []  # when it ended, not when the timed samples let us look
    bad.future().add_done_callback(lambda _: ended_at.append(time.monotonic()))
    wait_until(lambda: answered() >= 1, timeout=30.0)
    faulted = [ordinary() for _ in range(reps)]
    outcome, text = "pending", ""
    try:
        bad.result(timeout=max(0.01, cap - (time.monotonic() - t_bad)))
        outcome = "succeeded"
    except TimeoutError as exc:
        if time.monotonic() - t_bad < cap - 0.5:  # the SDK's own timeout error, not ours
            outcome, text = "failed", _error_text(exc)
    except Exception as exc:
        outcome, text = "failed", _error_text(exc)
    ended = (ended_at[0] if ended_at else time.monotonic()) - t_bad
    return {
        "clean_s": clean,
        "faulted_s": faulted,
        "bad_outcome": outcome,
        "bad_s": ended,
        "bad_error": text,
        "bad_answers_500": answered(),
    }


def run_lost(b: SdkBench) -> dict[str, Any]:
    size = b.size
    cap = float(size["lost_cap_s"])
    sampler = b._sampler()
    prompt, params = b._prompt(16), b._params(4)
    sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
    say("ready")
    wait_for("go")
    t_lost = time.monotonic()
    lost = sampler.sample(prompt=prompt, num_samples=2, sampling_params=params)
    ordinary = 0
    # other samples keep the poller's answers coming while the lost one waits
    while time.monotonic() - t_lost < cap and not lost.future().done():
        sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result(timeout=60)
        ordinary += 1
        time.sleep(0.5)
    outcome, text = "pending", ""
    try:
        lost.result(timeout=max(0.01, cap - (time.monotonic() - t_lost)))
        outcome = "succeeded"
    except TimeoutError as exc:
        if time.monotonic() - t_lost < cap - 0.5:
            outcome, text = "failed", _error_text(exc)
    except Exception as exc:
        outcome, text = "failed", _error_text(exc)
    return {
        "lost_s": time.monotonic() - t_lost,
        "lost_outcome": outcome,
        "lost_error": text,
        "ordinary_samples": ordinary,
    }


RUNNERS = {"outage": run_outage, "bad": run_bad, "lost": run_lost}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("ours", "official"):
        raise SystemExit(__doc__)
    label = argv[0]
    args = parse_worker_args(argv[1:])
    sdk = importlib.import_module("tinker_sync" if label == "ours" else "tinker")
    warnings.simplefilter("ignore", FutureWarning)
    runner = RUNNERS[str(args.size[args.bench]["runner"])]
    result = runner(SdkBench(sdk, label, args, args.bench))
    finish({"sdk": label, "benches": {args.bench: result}})


if __name__ == "__main__":
    main(sys.argv[1:])
