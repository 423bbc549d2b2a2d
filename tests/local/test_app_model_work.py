"""Where the server runs model work: a cheap instant sample on the event-loop thread, anything
bigger (and every tiny-model call) on the worker pool (docs/design/local-server.md#model-work)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from app_helpers import BASE_MODEL, Harness, decode_sample

from tinker_sync.local.backends.base import SampleOptions
from tinker_sync.local.backends.instant import CHEAP_PROMPT, CHEAP_SEQUENCES, InstantSampler
from tinker_sync.local.backends.tiny.sampling import TinySampler


@pytest.fixture
def threads_seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of the threads that ran InstantSampler.sample (the real method, observed)."""
    seen: list[str] = []
    real = InstantSampler.sample

    def observed(self: InstantSampler, prompt: Any, opts: SampleOptions) -> Any:
        seen.append(threading.current_thread().name)
        return real(self, prompt, opts)

    monkeypatch.setattr(InstantSampler, "sample", observed)
    yield seen


@pytest.mark.parametrize(
    ("num_samples", "prompt_len", "where"),
    [
        (1, 2, "loop"),
        (CHEAP_SEQUENCES, CHEAP_PROMPT, "loop"),
        (CHEAP_SEQUENCES + 1, 2, "pool"),
        (1, CHEAP_PROMPT + 1, "pool"),
    ],
)
def test_a_cheap_sample_runs_on_the_loop_thread_and_a_bigger_one_on_the_pool(
    tmp_path: Path, threads_seen: list[str], num_samples: int, prompt_len: int, where: str
) -> None:
    with Harness(tmp_path, long_poll_s=5.0) as h:
        sampler_id = h.sampler(h.new_session(), 0, base_model=BASE_MODEL)
        tokens = [65 + i % 26 for i in range(prompt_len)]
        rid = h.asample(sampler_id, 0, tokens, num_samples=num_samples).json["request_id"]
        out = decode_sample(h.result(rid, proto=True))
    assert len(out.sequences) == num_samples  # the same answer either way
    assert len(threads_seen) == 1
    expected = "tinker-sync-local-http" if where == "loop" else "tinker-local-work"
    assert threads_seen[0].startswith(expected), threads_seen


def test_cheap_is_the_instant_samplers_bound_and_never_the_tiny_models() -> None:
    instant = InstantSampler(seed=0, drift=0.0, step=0)
    assert instant.cheap(CHEAP_PROMPT, SampleOptions(num_samples=CHEAP_SEQUENCES))
    assert not instant.cheap(CHEAP_PROMPT + 1, SampleOptions(num_samples=1))
    assert not instant.cheap(1, SampleOptions(num_samples=CHEAP_SEQUENCES + 1))
    tiny = TinySampler.__new__(TinySampler)  # cheap() reads nothing from the weights
    assert not tiny.cheap(1, SampleOptions(num_samples=1))
