"""TrainingClient ordering and failure isolation against the real local server (area A)."""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types

HANG = 60.0


def datum(n: int = 4, offset: int = 0) -> types.Datum:
    tokens = np.arange(offset, offset + n + 1, dtype=np.int64) % 250
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(n, np.float32)},
    )


def applied(server, model_id: str) -> list[tuple[int, str]]:
    return [tuple(x) for x in server.app.applied(model_id)]


def test_64_threads_each_send_fwd_bwd_then_optim_step_in_order(server, service):
    """T-A1 (B1, B3): seq_ids contiguous; each thread's fwd precedes its optim_step."""
    training = service.create_lora_training_client("base", rank=4)
    barrier = threading.Barrier(64)
    pairs: list[tuple[concurrent.futures.Future, concurrent.futures.Future]] = [None] * 64  # type: ignore[list-item]

    def worker(i: int) -> None:
        barrier.wait(HANG)
        fwd = training.forward_backward([datum(offset=i)], "cross_entropy")
        opt = training.optim_step(types.AdamParams())
        pairs[i] = (fwd, opt)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    for fwd, opt in pairs:
        fwd.result(HANG)
        opt.result(HANG)
    log = applied(server, training.model_id)
    assert [s for s, _ in log] == list(range(0, 129))  # create_model is seq 0, then contiguous
    futures = server.app._futures
    for fwd, opt in pairs:
        fwd_seq = futures.get(fwd.request_id).seq_id
        opt_seq = futures.get(opt.request_id).seq_id
        assert fwd_seq < opt_seq, (fwd_seq, opt_seq)
    assert sum(kind == "ForwardBackward" for _, kind in log) == 64
    assert sum(kind == "OptimStep" for _, kind in log) == 64
