"""tinker-cookbook 0.6.1's capture module patches tinker_sync's clients as it patches the
official SDK's: every call is recorded once, sync and async (docs/migration.md#patching).

``capture_program.py`` instruments ``tinker.SamplingClient`` / ``tinker.TrainingClient`` with
the cookbook's own ``instrument_tinker`` and makes each patched call in plain code, in an event
loop through the ``*_async`` twins, and by awaiting the sync methods' futures. It runs once
through the ``tinker`` alias and once on the official SDK, against one local server; the
records must be the same, one per call.

It runs when tinker_cookbook 0.6.1 is importable; with CI=true a missing cookbook or official
SDK fails instead of skipping (.ci/run installs both).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("capture_program.py")

EXPECTED = Counter(
    {
        ("train_op", "forward_backward", "sync", "ok"): 1,
        ("train_op", "optim_step", "sync", "ok"): 1,
        ("train_op", "save_weights_for_sampler", "sync", "ok"): 1,
        ("sample", None, "sync", "ok"): 1,
        ("train_op", "forward_backward", "async", "ok"): 1,
        ("train_op", "optim_step", "async", "ok"): 1,
        ("train_op", "save_weights_for_sampler", "async", "ok"): 1,
        ("sample", None, "async", "ok"): 1,
        ("train_op", "forward_backward", "await-sync", "ok"): 1,
        ("sample", None, "await-sync", "ok"): 1,
    }
)


def _require(module: str) -> None:
    reason = None
    if importlib.util.find_spec(module) is None:
        reason = f"{module} is not installed"
    elif module == "tinker_cookbook":
        from importlib.metadata import version

        if version("tinker_cookbook") != "0.6.1":
            reason = f"tinker_cookbook {version('tinker_cookbook')} is installed, not 0.6.1"
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must install it (.ci/run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    _require("tinker_cookbook")
    from tinker_sync.local import LocalServer

    with LocalServer(backend="tiny") as srv:
        yield srv


def run(server: Any, *, official: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "PYTHONPATH"))}
    env.update(
        TINKER_BASE_URL=server.url,
        TINKER_API_KEY=server.api_key,
        TINKER_TELEMETRY="0",
        PYTHONPATH=str(REPO),
        HF_HUB_OFFLINE="1",
    )
    cmd = [sys.executable, "-W", "ignore::FutureWarning", str(PROGRAM)]
    if not official:
        cmd = [sys.executable, "-m", "tinker_sync", "exec", "--", *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def recorded(out: dict[str, Any]) -> Counter[tuple[Any, ...]]:
    assert out["lost"] == 0
    return Counter(tuple(row) for row in out["records"])


def test_capture_records_each_tinker_sync_call_once(server: Any) -> None:
    out = run(server, official=False)
    assert out["sdk"] == "tinker_sync"
    assert recorded(out) == EXPECTED


def test_capture_records_the_same_calls_on_the_official_sdk(server: Any) -> None:
    _require("tinker")
    out = run(server, official=True)
    assert out["sdk"] == "tinker"
    assert recorded(out) == EXPECTED


# -- the mechanism the capture module relies on, on every twin -------------------------------


def _twins(cls: type) -> list[str]:
    return sorted(
        name[: -len("_async")]
        for name in vars(cls)
        if name.endswith("_async") and not name.startswith("_") and name != "result_async"
    )


def test_public_methods_are_plain_functions_on_the_class() -> None:
    import inspect

    from tinker_sync import SamplingClient, TrainingClient

    for cls in (SamplingClient, TrainingClient):
        for name in dir(cls):
            if name.startswith("_") or name in ("sampler_id", "from_sampler_handle"):
                continue  # a property and a staticmethod, as in the official client
            assert inspect.isfunction(inspect.getattr_static(cls, name)), (cls.__name__, name)


def test_patching_a_sync_method_also_patches_its_async_twin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each ``X_async`` calls ``X`` through the class, once, in the awaiting context (so a
    ContextVar set around it, as the capture module's re-entrancy guard is, is seen)."""
    import asyncio
    import contextvars
    import functools

    from tinker_sync import SamplingClient, ServiceClient, TrainingClient, types
    from tinker_sync.local import LocalServer

    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4]},
    )
    prompt = types.ModelInput.from_ints([1, 2, 3])
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="")
    seen: list[tuple[str, str]] = []

    with (
        LocalServer(backend="tiny") as server,
        ServiceClient(base_url=server.url, api_key=server.api_key) as service,
    ):
        training = service.create_lora_training_client("tinker-sync/tiny", rank=2)
        state = training.save_state("twins").result().path
        weights = training.save_weights_for_sampler("twins").result().path
        sampler = training.create_sampling_client(weights)
        args: dict[str, tuple[Any, tuple[Any, ...]]] = {
            "forward": (training, ([datum], "cross_entropy")),
            "forward_backward": (training, ([datum], "cross_entropy")),
            "optim_step": (training, (types.AdamParams(learning_rate=1e-3),)),
            "save_state": (training, ("twins-2",)),
            "load_state": (training, (state,)),
            "load_state_with_optimizer": (training, (state,)),
            "save_weights_for_sampler": (training, ("twins-3",)),
            "save_weights_external": (training, ("twins-4",)),
            "save_weights_and_get_sampling_client": (training, ()),
            "create_sampling_client": (training, (weights,)),
            "get_info": (training, ()),
            "get_tokenizer": (training, ()),
            "sample": (sampler, (prompt, 1, types.SamplingParams(max_tokens=2))),
            "compute_logprobs": (sampler, (prompt,)),
            "get_base_model": (sampler, ()),
        }
        twins = [(TrainingClient, n) for n in _twins(TrainingClient)]
        twins += [(SamplingClient, n) for n in _twins(SamplingClient)]
        missing = {n for _, n in twins} - set(args) - {"forward_backward_custom"}
        assert not missing, f"no arguments for {missing}"

        def spy(cls: type, name: str) -> None:
            original = vars(cls)[name]

            @functools.wraps(original)
            def wrapper(self: Any, *a: Any, **k: Any) -> Any:
                seen.append((name, marker.get()))
                return original(self, *a, **k)

            monkeypatch.setattr(cls, name, wrapper)

        for cls, name in twins:
            if name in args:
                spy(cls, name)

        async def call(name: str) -> None:
            client, call_args = args[name]
            marker.set(name)
            value = await getattr(client, f"{name}_async")(*call_args)
            if hasattr(value, "result") and not isinstance(value, (TrainingClient, SamplingClient)):
                await value  # a training op's future (the "await twice" pattern)

        for _, name in twins:
            if name not in args:
                continue
            seen.clear()
            asyncio.run(call(name))
            assert seen == [(name, name)], name
