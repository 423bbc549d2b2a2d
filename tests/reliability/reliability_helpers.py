"""Helpers shared by the reliability tests (imported as ``reliability_helpers``)."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tinker_sync import types

#: Hang guard: generous, and a hang fails the test (docs/design/behavior.md#how-tests-check).
HANG = 60.0


def datum(i: int, n: int = 4) -> types.Datum:
    """A small cross-entropy datum whose tokens depend on ``i`` (so requests are distinct)."""
    tokens = (np.arange(i, i + n + 1, dtype=np.int64) * 7 + i) % 250
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(n, np.float32)},
    )


def prompt(i: int) -> types.ModelInput:
    """A distinct prompt per ``i`` (the instant backend's answer depends on it)."""
    return types.ModelInput.from_ints([1 + (i % 200), 2 + (i * 3) % 200, 3 + (i * 7) % 200])


def wait_all(futures: Sequence[concurrent.futures.Future[Any]], timeout: float = HANG) -> None:
    """Fail the test (not hang) unless every future is done within ``timeout`` seconds."""
    done, pending = concurrent.futures.wait(futures, timeout=timeout)
    assert not pending, f"{len(pending)} of {len(futures)} futures still pending after {timeout}s"


def outcome_of(fut: concurrent.futures.Future[Any]) -> tuple[Any, BaseException | None]:
    """``(result, None)`` or ``(None, exception)`` of a finished future."""
    assert fut.done()
    exc = fut.exception(timeout=0)
    return (None, exc) if exc is not None else (fut.result(timeout=0), None)


def applied(server: Any, model_id: str) -> list[tuple[int, str]]:
    return [(int(s), str(k)) for s, k in server.app.applied(model_id)]


def skipped(server: Any, model_id: str) -> list[int]:
    """Seq ids the server gave up waiting for (never received), from its state snapshot."""
    model = server.state()["models"].get(model_id, {})
    return sorted(seq for first, last in model.get("skipped", []) for seq in range(first, last + 1))


def live_threads() -> set[threading.Thread]:
    return set(threading.enumerate())


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def fd_targets(fds: Iterable[int]) -> dict[int, str]:
    out = {}
    for fd in fds:
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out
