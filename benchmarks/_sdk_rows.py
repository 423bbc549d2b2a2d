"""The SDK-side benchmark bodies, written once against the public surface both SDKs share.

``tinker_sync`` mirrors the official ``tinker`` names (``ServiceClient``, ``ModelInput``,
``SamplingParams``, ``Datum``, ``TensorData``, ``AdamParams``), so the same code drives either;
``_worker_ours.py`` and ``_worker_official.py`` pass in their module. Each worker process imports
exactly one SDK.

Benchmarks (``bench`` argument) and what they report, one value per repetition:

* ``sample``  -- ``n`` concurrent ``sample()`` calls: samples/s and client CPU-s per sample (P1, P2)
* ``train``   -- pipelined forward_backward + optim_step steps: wall s per step (P3)
* ``held``    -- client CPU-s while ``n`` sample futures wait ``window_s`` (server's sampling
  paused in the ``active`` state, polls long-polled) (P5)
* ``poller``  -- peak OS threads with ``n`` pending samples, session poller on (P6)
* ``latency`` -- p50 of sequential single-sample round trips, ms (P7)
* ``busy``    -- p50 of a pipelined training step, idle and with ``n`` samples in flight (P9)
* ``gil``     -- ``n`` concurrent samples while the main thread runs a pure-Python loop:
  samples/s, and the loop's speed against the same loop alone in this process (P12)
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
from _common import (
    BASE_MODEL,
    VOCAB,
    Admin,
    Profiler,
    Rusage,
    ThreadPeak,
    WorkerArgs,
    cpu_by_thread_group,
    cpu_seconds,
    finish,
    os_threads,
    peak_rss_mb,
    percentile,
    thread_cpu,
    wait_until,
)


def _resolve(obj: Any) -> Any:
    """The official SDK returns client futures (``Backcompat*Future``); take their result."""
    if type(obj).__name__.startswith("Backcompat") and hasattr(obj, "result"):
        return obj.result()
    return obj


class SdkBench:
    """One SDK (``tinker_sync`` or ``tinker``) against one server. Not thread-safe."""

    def __init__(self, sdk: ModuleType, label: str, args: WorkerArgs, bench: str) -> None:
        self.sdk = sdk
        self.label = label
        self.args = args
        self.size: dict[str, Any] = args.size[bench]
        self.profiler = Profiler(args.profile)
        self._service: Any = None

    @property
    def service(self) -> Any:
        """The ServiceClient, created on first use (after any server flag change)."""
        if self._service is None:
            self._service = self.sdk.ServiceClient(
                base_url=self.args.url, api_key=self.args.api_key
            )
        return self._service

    def close(self) -> None:
        """Finish the ServiceClient's session (both SDKs: ``close(status)`` returns a future),
        so that its threads and sessions do not count in the next bench run by this process."""
        if self._service is not None:
            self._service.close("success").result(timeout=60)
            self._service = None

    # -- helpers -------------------------------------------------------------------------------

    def _sampler(self) -> Any:
        return _resolve(self.service.create_sampling_client(base_model=BASE_MODEL))

    def _prompt(self, length: int) -> Any:
        tokens = [(i * 7 + 3) % VOCAB for i in range(length)]
        return self.sdk.ModelInput.from_ints(tokens)

    def _params(self, max_tokens: int) -> Any:
        return self.sdk.SamplingParams(max_tokens=max_tokens)

    def _sample_many(self, sampler: Any, prompt: Any, params: Any, n: int) -> list[Any]:
        return [
            sampler.sample(prompt=prompt, num_samples=1, sampling_params=params) for _ in range(n)
        ]

    @staticmethod
    def _check_sample(response: Any, max_tokens: int) -> None:
        tokens = list(response.sequences[0].tokens)
        if not 0 < len(tokens) <= max_tokens:
            raise AssertionError(f"unexpected sample length {len(tokens)}")

    # -- P1 / P2 ---------------------------------------------------------------------------------

    def bench_sample(self) -> dict[str, Any]:
        n, max_tokens = int(self.size["n"]), int(self.size["max_tokens"])
        sampler = self._sampler()
        prompt, params = self._prompt(int(self.size["prompt"])), self._params(max_tokens)

        def run(count: int) -> tuple[float, float]:
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            futures = self._sample_many(sampler, prompt, params, count)
            results = [f.result() for f in futures]
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
            self._check_sample(results[0], max_tokens)
            self._check_sample(results[-1], max_tokens)
            return wall, cpu

        if self.size["warmup"]:
            run(int(self.size["warmup"]))
        throughput: list[float] = []
        cpu_per_sample: list[float] = []
        threads, usage = ThreadPeak(), Rusage()
        with threads, usage, self.profiler.section():
            for _ in range(int(self.size["reps"])):
                wall, cpu = run(n)
                throughput.append(n / wall)
                cpu_per_sample.append(cpu / n)
        return {
            "transport": os.environ.get("TINKER_SYNC_TRANSPORT", "auto"),
            "per_sample": usage.result(per=n * int(self.size["reps"])),
            "samples_per_s": throughput,
            "cpu_s_per_sample": cpu_per_sample,
            "peak_rss_mb": peak_rss_mb(),
            "peak_threads": threads.peak,
            "thread_groups_at_peak": threads.groups,
        }

    # -- P3 --------------------------------------------------------------------------------------

    def _datums(self, count: int, length: int) -> list[Any]:
        sdk = self.sdk
        rng = np.random.default_rng(0)
        out = []
        for _ in range(count):
            tokens = rng.integers(0, VOCAB, length + 1, dtype=np.int64)
            # Both SDKs get the same types: token lists (what the official ModelInput takes)
            # and numpy arrays inside TensorData.
            out.append(
                sdk.Datum(
                    model_input=sdk.ModelInput.from_ints(tokens[:-1].tolist()),
                    loss_fn_inputs={
                        "target_tokens": sdk.TensorData(
                            data=tokens[1:].copy(), dtype="int64", shape=[length]
                        ),
                        "weights": sdk.TensorData(
                            data=np.ones(length, np.float32), dtype="float32", shape=[length]
                        ),
                    },
                )
            )
        return out

    def bench_train(self) -> dict[str, Any]:
        training = _resolve(self.service.create_lora_training_client(base_model=BASE_MODEL, rank=8))
        data = self._datums(int(self.size["datums"]), int(self.size["tokens"]))
        adam = self.sdk.AdamParams(learning_rate=1e-4)

        def run(steps: int) -> tuple[float, float]:
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            pending: tuple[Any, Any] | None = None
            last: Any = None
            for _ in range(steps):
                step = (training.forward_backward(data, "cross_entropy"), training.optim_step(adam))
                if pending is not None:  # read step k only after step k+1 is submitted
                    last = pending[0].result()
                    pending[1].result()
                pending = step
            assert pending is not None
            last = pending[0].result()
            pending[1].result()
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
            if len(last.loss_fn_outputs) != len(data):
                raise AssertionError("forward_backward returned the wrong number of outputs")
            return wall / steps, cpu / steps

        for _ in range(int(self.size["warmup"])):
            run(2)
        per_step: list[float] = []
        cpu_per_step: list[float] = []
        with self.profiler.section():
            for _ in range(int(self.size["reps"])):
                wall, cpu = run(int(self.size["steps"]))
                per_step.append(wall)
                cpu_per_step.append(cpu)
        return {
            "s_per_step": per_step,
            "cpu_s_per_step": cpu_per_step,
            "peak_rss_mb": peak_rss_mb(),
        }

    # -- P5 / P6 ---------------------------------------------------------------------------------

    def _submit(self, sampler: Any, admin: Admin, n: int) -> tuple[list[Any], float]:
        """Submit ``n`` small samples; returns the futures once the server has accepted all of
        them, and how long that took."""
        base = admin.count("asample")
        t0 = time.monotonic()
        futures = self._sample_many(sampler, self._prompt(16), self._params(4), n)
        wait_until(lambda: admin.count("asample") >= base + n, timeout=600.0, interval=0.05)
        return futures, time.monotonic() - t0

    def _warm_up(self, sampler: Any, admin: Admin) -> None:
        """``warmup`` samples answered normally (connections and threads in place)."""
        k = max(1, min(int(self.size["n"]), int(self.size["warmup"])))
        futures, _ = self._submit(sampler, admin, k)
        for f in futures:
            self._check_sample(f.result(), 4)

    def _held_round(
        self, sampler: Any, admin: Admin, measure: Callable[[], Any]
    ) -> tuple[Any, float, int]:
        """Stop the server's sampling work (``pause`` in the ``active`` state: samples are
        accepted and their polls long-polled as on a busy server), submit ``n`` samples, wait
        until the server accepted them, settle, run ``measure`` (the windows), resume and drain.
        Returns (measurement, submit seconds, futures completed before the windows ended -- 0
        unless the pause leaked)."""
        admin.call("POST", "pause", {"state": "active", "kind": "sampling"})
        try:
            futures, submit_s = self._submit(sampler, admin, int(self.size["n"]))
            time.sleep(float(self.size["settle_s"]))
            value = measure()
            early = sum(1 for f in futures if f.done())
        finally:
            admin.call("POST", "resume", {"kind": "sampling"})
        for f in futures:
            f.result()
        return value, submit_s, early

    def bench_held(self) -> dict[str, Any]:
        """``reps`` consecutive CPU windows of ``window_s`` while ``n`` futures wait."""
        window_s, reps = float(self.size["window_s"]), int(self.size["reps"])
        admin = Admin(self.args.url, self.args.api_key)
        sampler = self._sampler()
        self._warm_up(sampler, admin)
        by_thread: dict[str, float] = {}

        def measure() -> list[float]:
            out = []
            with self.profiler.section():
                for _ in range(reps):
                    threads0, cpu0 = thread_cpu(), cpu_seconds()
                    time.sleep(window_s)
                    used, threads1 = cpu_seconds() - cpu0, thread_cpu()
                    out.append(used)
                    for name, sec in cpu_by_thread_group(threads0, threads1, used).items():
                        by_thread[name] = by_thread.get(name, 0.0) + sec / reps
            return out

        values, submit_s, early = self._held_round(sampler, admin, measure)
        return {
            "cpu_s_per_10s": [v * 10.0 / window_s for v in values],
            "cpu_s_in_window": values,
            "cpu_s_by_thread_per_window": by_thread,
            "window_s": window_s,
            "submit_s": [submit_s],
            "completed_early": early,
            "peak_rss_mb": peak_rss_mb(),
        }

    def bench_poller(self) -> dict[str, Any]:
        """Peak threads over ``reps`` rounds (submission, hold, drain), session futures poller
        on: turns the server flag ``sample_use_retrieve_futures`` on for this worker's clients
        and off again afterwards."""
        window_s = float(self.size["window_s"])
        admin = Admin(self.args.url, self.args.api_key)
        admin.set_client_config(sample_use_retrieve_futures=True)
        monitors: list[ThreadPeak] = []
        submits: list[float] = []
        early = 0
        try:
            sampler = self._sampler()
            self._warm_up(sampler, admin)
            baseline = os_threads()
            for _ in range(int(self.size["reps"])):
                with ThreadPeak() as monitor:
                    _, submit_s, done = self._held_round(
                        sampler, admin, lambda: time.sleep(window_s)
                    )
                monitors.append(monitor)
                submits.append(submit_s)
                early += done
        finally:
            admin.set_client_config(sample_use_retrieve_futures=False)
        worst = max(monitors, key=lambda m: m.peak)
        return {
            "peak_threads": [float(m.peak) for m in monitors],
            "thread_groups_at_peak": worst.groups,
            "threads_before": baseline,
            "submit_s": submits,
            "completed_early": early,
            "peak_rss_mb": peak_rss_mb(),
        }

    # -- P7 --------------------------------------------------------------------------------------

    def bench_latency(self) -> dict[str, Any]:
        max_tokens = int(self.size["max_tokens"])
        sampler = self._sampler()
        prompt, params = self._prompt(int(self.size["prompt"])), self._params(max_tokens)

        def run(count: int) -> list[float]:
            out = []
            for _ in range(count):
                t0 = time.perf_counter()
                response = sampler.sample(
                    prompt=prompt, num_samples=1, sampling_params=params
                ).result()
                out.append(time.perf_counter() - t0)
            self._check_sample(response, max_tokens)
            return out

        if self.size["warmup"]:
            run(int(self.size["warmup"]))
        p50: list[float] = []
        every: list[float] = []
        with self.profiler.section():
            for _ in range(int(self.size["reps"])):
                lat = run(int(self.size["n"]))
                every.extend(lat)
                p50.append(percentile(lat, 0.5) * 1e3)
        return {"p50_ms": p50, "p90_ms_all": percentile(every, 0.9) * 1e3}

    # -- P1T / P7T: the same workloads against the HTTPS server ---------------------------------

    bench_sample_tls = bench_sample
    bench_latency_tls = bench_latency

    # -- P9 --------------------------------------------------------------------------------------
    # Kept apart from the other rows: its own size entry ("busy"), its own row in run.py.

    def _step_times(self, training: Any, data: list[Any], adam: Any, count: int) -> list[float]:
        """Wall time of each iteration of the pipelined loop (submit step k, read step k-1)."""
        out: list[float] = []
        pending: tuple[Any, Any] | None = None
        for _ in range(count):
            t0 = time.perf_counter()
            step = (training.forward_backward(data, "cross_entropy"), training.optim_step(adam))
            if pending is not None:
                pending[0].result()
                pending[1].result()
            pending = step
            out.append(time.perf_counter() - t0)
        assert pending is not None
        pending[0].result()
        pending[1].result()
        return out[1:]  # the first iteration only submits

    def bench_busy(self) -> dict[str, Any]:
        """p50 of a pipelined training step, idle and while ``n`` samples are in flight on the
        same ServiceClient: accepted by the server and pending (their polls are held, so they
        stay pending). Also reported: steps run during the submission burst itself."""
        size = self.size
        n, steps = int(size["n"]), int(size["steps"])
        admin = Admin(self.args.url, self.args.api_key)
        training = _resolve(self.service.create_lora_training_client(base_model=BASE_MODEL, rank=8))
        sampler = self._sampler()
        data = self._datums(int(size["datums"]), int(size["tokens"]))
        adam = self.sdk.AdamParams(learning_rate=1e-4)
        prompt, params = self._prompt(16), self._params(4)
        self._check_sample(sampler.sample(prompt, 1, params).result(), 4)
        for _ in range(int(size["warmup"])):
            self._step_times(training, data, adam, 3)
        idle: list[float] = []
        busy: list[float] = []
        burst: list[float] = []  # steps run while the n samples are still being dispatched
        pending_at_end: list[float] = []  # samples still unfinished after the busy steps
        with self.profiler.section():
            for _ in range(int(size["reps"])):
                idle_times = self._step_times(training, data, adam, steps)
                idle.append(percentile(idle_times, 0.5) * 1e3)
                # Sampling work stops (samples accepted and long-polled, as on a busy server)
                # until the busy steps are over; training runs on.
                admin.call("POST", "pause", {"state": "active", "kind": "sampling"})
                try:
                    base = admin.count("asample")
                    futures = self._sample_many(sampler, prompt, params, n)
                    burst_times = self._step_times(training, data, adam, steps)  # dispatching
                    wait_until(lambda: admin.count("asample") >= base + n, timeout=600.0)
                    times = self._step_times(training, data, adam, steps)  # all n pending
                    in_flight = sum(not f.done() for f in futures)
                finally:
                    admin.call("POST", "resume", {"kind": "sampling"})
                for f in futures:
                    self._check_sample(f.result(), 4)
                pending_at_end.append(float(in_flight))
                busy.append(percentile(times, 0.5) * 1e3)
                burst.append(percentile(burst_times, 0.5) * 1e3)
        return {
            "idle_p50_ms": idle,
            "busy_p50_ms": busy,
            # per round, busy over that round's own idle: the machine's load moves less within
            # a round than across rounds
            "busy_over_idle": [b / i for b, i in zip(busy, idle, strict=True)],
            "burst_p50_ms": burst,
            "pending_at_end": pending_at_end,
            "peak_rss_mb": peak_rss_mb(),
        }

    # -- P14 -------------------------------------------------------------------------------------

    def bench_slow(self) -> dict[str, Any]:
        """``n`` samples submitted at once while the server answers every ``asample`` after
        ``delay_s`` (a distant server: each submission is one round trip). tinker_sync is told
        to treat the loopback server as distant (``TINKER_SYNC_LOOPBACK_WIDENS=1``,
        docs/limiter.md#send-width); the official SDK ignores it."""
        size = self.size
        n, delay = int(size["n"]), float(size["delay_s"])
        os.environ["TINKER_SYNC_LOOPBACK_WIDENS"] = "1"
        admin = Admin(self.args.url, self.args.api_key)
        sampler = self._sampler()
        prompt, params = self._prompt(16), self._params(4)
        self._check_sample(sampler.sample(prompt, 1, params).result(), 4)
        samples_per_s: list[float] = []
        admin.add_faults([f"asample delay={delay} x*"])
        try:
            with self.profiler.section():
                for _ in range(int(size["reps"])):
                    t0 = time.perf_counter()
                    for f in self._sample_many(sampler, prompt, params, n):
                        self._check_sample(f.result(), 4)
                    samples_per_s.append(n / (time.perf_counter() - t0))
        finally:
            admin.clear_faults()
        return {"samples_per_s": samples_per_s}

    # -- P12 -------------------------------------------------------------------------------------

    def bench_gil(self) -> dict[str, Any]:
        """``n`` samples submitted at once from the main thread, which then runs
        :func:`user_loop` until every future is done (the window starts before the first
        submission, so submitting counts against the loop). Around each window the same loop
        runs alone for ``solo_s`` seconds in this process, with the SDK idle (its client
        created, its connections warm); the loop's speed in the window is compared with the
        mean of the two solo runs around it (``solo_after_over_before`` far from 1 says the
        machine's own load moved during the window). ``loop_ms_lost_per_sample`` is the loop
        time lost in the window divided by ``n``: unlike the fraction, it does not improve when
        the samples take longer (a slower SDK spreads the same cost over a longer window)."""
        size = self.size
        n, max_tokens = int(size["n"]), int(size["max_tokens"])
        solo_s = float(size["solo_s"])
        sampler = self._sampler()
        prompt, params = self._prompt(int(size["prompt"])), self._params(max_tokens)
        if size["warmup"]:
            for f in self._sample_many(sampler, prompt, params, int(size["warmup"])):
                self._check_sample(f.result(), max_tokens)
        user_loop(lambda: False, 0.05)  # the loop's own warm-up
        samples_per_s: list[float] = []
        loop_fraction: list[float] = []
        solo_rate: list[float] = []
        solo_drift: list[float] = []
        lost_ms: list[float] = []  # the loop's time lost in the window, per sample
        by_thread: dict[str, float] = {}  # CPU-ms per sample in the window, by thread group
        submit_ms: list[float] = []
        paused_ms: list[float] = []  # tinker_sync: the sampling workers' pauses per window
        gov = background_governor(self.sdk)
        with self.profiler.section():
            before = user_loop(lambda: False, solo_s)
            for _ in range(int(size["reps"])):
                threads0, cpu0 = thread_cpu(), cpu_seconds()
                paused0 = gov.paused_s if gov is not None else 0.0
                t0 = time.perf_counter()
                futures = self._sample_many(sampler, prompt, params, n)
                submitted = time.perf_counter() - t0
                all_done = done_checker(futures)
                iterations, _ = user_loop(all_done, WINDOW_LIMIT_S)
                window = time.perf_counter() - t0
                if gov is not None:
                    paused_ms.append((gov.paused_s - paused0) * 1e3)
                used, threads1 = cpu_seconds() - cpu0, thread_cpu()
                for name, sec in cpu_by_thread_group(threads0, threads1, used).items():
                    by_thread[name] = by_thread.get(name, 0.0) + sec * 1e3 / n / int(size["reps"])
                if not all_done():
                    raise TimeoutError(f"{n} samples not done within {WINDOW_LIMIT_S:.0f} s")
                after = user_loop(lambda: False, solo_s)
                for f in futures:
                    self._check_sample(f.result(), max_tokens)
                solo = (before[0] / before[1] + after[0] / after[1]) / 2.0
                solo_drift.append((after[0] / after[1]) / (before[0] / before[1]))
                samples_per_s.append(n / window)
                loop_fraction.append(iterations / window / solo)
                lost_ms.append((window - iterations / solo) / n * 1e3)
                solo_rate.append(solo)
                submit_ms.append(submitted * 1e3)
                before = after
        return {
            "samples_per_s": samples_per_s,
            "loop_fraction": loop_fraction,
            "solo_loop_per_s": solo_rate,
            "solo_after_over_before": solo_drift,
            "loop_ms_lost_per_sample": lost_ms,
            "cpu_ms_per_sample_by_thread": by_thread,
            "submit_ms": submit_ms,
            "switch_interval_s": sys.getswitchinterval(),
            "background_share": gov.share if gov is not None else None,
            "paused_ms": paused_ms,
            "peak_rss_mb": peak_rss_mb(),
        }


def background_governor(sdk: ModuleType) -> Any:
    """tinker_sync's sampling governor (docs/scale-out.md#background-share), None for the
    official SDK or when it is switched off."""
    if not sdk.__name__.startswith("tinker_sync"):
        return None
    from tinker_sync._runtime.governor import governor

    return governor()


#: Seconds a P12 window may last before the bench fails.
WINDOW_LIMIT_S = 600.0
#: Loop iterations between two checks of the loop's stop condition (well under a millisecond).
LOOP_CHUNK = 2000


def done_checker(futures: list[Any]) -> Callable[[], bool]:
    """A cheap "are all done?" for a loop to call often: it walks past finished futures in
    order and stops at the first pending one (each future is passed once: O(n) in all)."""
    pending = iter(futures)
    head: list[Any] = [next(pending, None)]

    def all_done() -> bool:
        while head[0] is not None and head[0].done():
            head[0] = next(pending, None)
        return head[0] is None

    return all_done


def user_loop(stop: Callable[[], bool], limit_s: float) -> tuple[int, float]:
    """A user's pure-Python CPU-bound work (integer arithmetic, no allocation beyond small ints,
    no C calls that release the GIL), checking ``stop`` every :data:`LOOP_CHUNK` iterations;
    runs until ``stop()`` or ``limit_s`` seconds. Returns (iterations, seconds)."""
    x = 0
    iterations = 0
    t0 = time.perf_counter()
    deadline = t0 + limit_s
    while True:
        for i in range(LOOP_CHUNK):
            x = (x * 31 + i) % 1_000_003
        iterations += LOOP_CHUNK
        now = time.perf_counter()
        if stop() or now >= deadline:
            return iterations, now - t0


BENCHES = (
    "sample",
    "train",
    "held",
    "poller",
    "latency",
    "sample_tls",
    "latency_tls",
    "busy",
    "gil",
    "slow",
)


def main(sdk: ModuleType, label: str, args: WorkerArgs) -> None:
    """Run each bench of ``args.bench`` (comma-separated) with ``sdk``; print the result line
    ``{"sdk": label, "benches": {bench: metrics}}``."""
    names = args.bench.split(",")
    unknown = [name for name in names if name not in BENCHES]
    if unknown:
        raise SystemExit(f"unknown bench {unknown!r}; known: {BENCHES}")
    results: dict[str, Any] = {}
    for name in names:
        bench = SdkBench(sdk, label, args, name)
        try:
            results[name] = getattr(bench, f"bench_{name}")()
        finally:
            bench.close()  # the next bench of this process starts without its clients
        bench.profiler.save()
    finish({"sdk": label, "benches": results})
