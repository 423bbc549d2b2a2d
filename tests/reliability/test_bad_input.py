"""Bad input across the public API: a typed, field-naming error and nothing on the wire.

Each row is one invalid call. It must raise synchronously a ``ValueError`` / ``TypeError`` /
``KeyError`` subclass (the row says which) whose message names the offending field, and the server's
request log must show that nothing was sent (count before == after, ignoring the session's
background heartbeats). The training rows also prove
docs/design/behavior.md#validate-before-reserving: after all of them, the next valid training op
still gets the next seq_id (no id was burnt by a rejected call).

CLI rows run ``tinker-sync`` (the console script, or ``python -m tinker_sync``, the same entry
point) in a subprocess and expect exit status 2 with the argument named on stderr.

Out of scope on purpose (parity with the official SDK, which accepts them and leaves the
check to the server): range checks on ``SamplingParams`` (``max_tokens=-1``, ``top_p=1.5``)
and ``LoraConfig(rank=0)`` / ``create_lora_training_client(rank=0)``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from reliability_helpers import HANG, applied, datum

import tinker_sync
from tinker_sync import types
from tinker_sync.local import LocalServer

BACKGROUND = ("session_heartbeat", "telemetry", "client/dynamic_config")


@dataclasses.dataclass
class Ctx:
    server: LocalServer
    service: tinker_sync.ServiceClient
    training: Any
    sampler: Any
    rest: Any
    ckpt: str


@pytest.fixture(scope="module")
def ctx() -> Iterator[Ctx]:
    with LocalServer(long_poll_s=1.0) as server:
        service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        training = service.create_lora_training_client("base", rank=4)
        ckpt = training.save_state("bad-input").result(HANG).path
        sampler = service.create_sampling_client(base_model="base")
        sampler.sample(
            types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)
        ).result(HANG)
        rest = service.create_rest_client()
        yield Ctx(server, service, training, sampler, rest, ckpt)
        service.close()


def sent(server: LocalServer) -> int:
    return sum(1 for r in server.requests.all() if r.endpoint not in BACKGROUND)


P = types.ModelInput.from_ints([1, 2, 3])
SP = types.SamplingParams(max_tokens=3)


def image_pointer_datum() -> types.Datum:
    chunk = types.ImageAssetPointerChunk(location="s3://bucket/x.png", format="png")
    return types.Datum(
        model_input=types.ModelInput(chunks=[chunk]),
        loss_fn_inputs={
            "target_tokens": np.array([1], np.int64),
            "weights": np.ones(1, np.float32),
        },
    )


def short_targets_datum() -> types.Datum:
    """Four input tokens, three targets: the server would reject it after a round trip."""
    tokens = np.arange(5, dtype=np.int64)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:4]),
        loss_fn_inputs={"target_tokens": tokens[1:4], "weights": np.ones(3, np.float32)},
    )


def short_weights_datum() -> types.Datum:
    tokens = np.arange(5, dtype=np.int64)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:4]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(3, np.float32)},
    )


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    call: Callable[[Ctx], Any]
    exc: type[BaseException]
    field: str


ROWS = [
    # ---------------------------------------------------------------- types
    Row(
        "ModelInput.chunks-not-a-list",
        lambda c: types.ModelInput(chunks="abc"),
        TypeError,
        "chunks",
    ),
    Row(
        "EncodedTextChunk.tokens-str",
        lambda c: types.EncodedTextChunk(tokens=[1, "a"]),
        TypeError,
        "tokens",
    ),
    Row(
        "EncodedTextChunk.tokens-float",
        lambda c: types.EncodedTextChunk(tokens=[1.5, 2.0]),
        TypeError,
        "tokens",
    ),
    Row(
        "ImageChunk.format",
        lambda c: types.ImageChunk(data=b"\x89PNG", format="gif"),
        ValueError,
        "format",
    ),
    Row(
        "SamplingParams.max_tokens-float",
        lambda c: types.SamplingParams(max_tokens=1.9),
        TypeError,
        "max_tokens",
    ),
    Row(
        "SamplingParams.temperature-str",
        lambda c: types.SamplingParams(temperature="hot"),
        TypeError,
        "temperature",
    ),
    Row(
        "SamplingParams.unknown-kwarg",
        lambda c: types.SamplingParams(max_token=3),
        TypeError,
        "max_token",
    ),
    Row("SamplingParams.stop-type", lambda c: types.SamplingParams(stop=5), TypeError, "stop"),
    Row(
        "AdamParams.learning_rate-str",
        lambda c: types.AdamParams(learning_rate="fast"),
        TypeError,
        "learning_rate",
    ),
    # a bool is a number to pydantic (True -> 1.0), as in the official types; a list is not
    Row("AdamParams.beta1-list", lambda c: types.AdamParams(beta1=[0.9]), TypeError, "beta1"),
    Row(
        "TensorData.dtype",
        lambda c: types.TensorData(data=[1.0, 2.0], dtype="float64"),
        ValueError,
        "dtype",
    ),
    Row(
        "TensorData.shape-mismatch",
        lambda c: types.TensorData(data=[1, 2], dtype="int64", shape=[3]),
        ValueError,
        "shape",
    ),
    Row(
        "TensorData.from_numpy-complex",
        lambda c: types.TensorData.from_numpy(np.array([1j, 2j])),
        ValueError,
        "complex",
    ),
    Row(
        "Datum.loss_fn_inputs-unknown-key",
        lambda c: types.Datum(model_input=P, loss_fn_inputs={"mystery": [1, 2, 3]}),
        KeyError,
        "mystery",
    ),
    Row(
        "Datum.loss_fn_inputs-str",
        lambda c: types.Datum(model_input=P, loss_fn_inputs={"target_tokens": "abc"}),
        TypeError,
        "target_tokens",
    ),
    Row(
        "Datum.loss_fn_inputs-ragged",
        lambda c: types.Datum(model_input=P, loss_fn_inputs={"weights": [[1.0], [1.0, 2.0]]}),
        ValueError,
        "weights",
    ),
    Row(
        "Datum.model_input-str",
        lambda c: types.Datum(model_input="hello", loss_fn_inputs={}),
        TypeError,
        "model_input",
    ),
    Row(
        "tinker-path.scheme",
        lambda c: types.ParsedCheckpointTinkerPath.from_tinker_path("https://x/weights/y"),
        ValueError,
        "tinker://",
    ),
    Row(
        "tinker-path.segments",
        lambda c: types.ParsedCheckpointTinkerPath.from_tinker_path("tinker://run/weights"),
        ValueError,
        "tinker://run/weights",
    ),
    Row(
        "tinker-path.kind",
        lambda c: types.ParsedCheckpointTinkerPath.from_tinker_path("tinker://run/bogus/name"),
        ValueError,
        "bogus",
    ),
    # ---------------------------------------------------------------- ServiceClient
    Row(
        "ServiceClient.max_workers",
        lambda c: tinker_sync.ServiceClient(max_workers=0),
        ValueError,
        "max_workers",
    ),
    Row(
        "ServiceClient.timeout",
        lambda c: tinker_sync.ServiceClient(timeout="soon"),
        TypeError,
        "timeout",
    ),
    Row(
        "ServiceClient.max_retries",
        lambda c: tinker_sync.ServiceClient(max_retries=-1),
        ValueError,
        "max_retries",
    ),
    Row(
        "create_lora_training_client.base_model",
        lambda c: c.service.create_lora_training_client(123),
        ValueError,
        "base_model",
    ),
    Row(
        "create_lora_training_client.train_flags",
        lambda c: c.service.create_lora_training_client(
            "base", train_mlp=False, train_attn=False, train_unembed=False
        ),
        ValueError,
        "train_",
    ),
    Row(
        "create_sampling_client.no-model",
        lambda c: c.service.create_sampling_client(),
        ValueError,
        "base_model",
    ),
    Row(
        "create_sampling_client.model_path",
        lambda c: c.service.create_sampling_client(model_path="https://example.com/x"),
        ValueError,
        "model_path",
    ),
    Row(
        "create_training_client_from_state.path",
        lambda c: c.service.create_training_client_from_state("not-a-path"),
        ValueError,
        "path",
    ),
    # ---------------------------------------------------------------- TrainingClient
    Row(
        "forward_backward.empty-data",
        lambda c: c.training.forward_backward([], "cross_entropy"),
        ValueError,
        "data",
    ),
    Row(
        "forward_backward.loss_fn",
        lambda c: c.training.forward_backward([datum(1)], "no_such_loss"),
        ValueError,
        "loss_fn",
    ),
    Row(
        "forward_backward.datum-type",
        lambda c: c.training.forward_backward(["not a datum"], "cross_entropy"),
        TypeError,
        "data",
    ),
    Row(
        "forward_backward.targets-shorter-than-model_input",
        lambda c: c.training.forward_backward([short_targets_datum()], "cross_entropy"),
        ValueError,
        "data[0].loss_fn_inputs['target_tokens']",
    ),
    Row(
        "forward_backward.weights-length",
        lambda c: c.training.forward_backward([short_weights_datum()], "cross_entropy"),
        ValueError,
        "data[0].loss_fn_inputs['weights']",
    ),
    Row(
        "forward_backward.missing-advantages",
        lambda c: c.training.forward_backward([datum(1)], "importance_sampling"),
        ValueError,
        "'logprobs'",
    ),
    Row(
        "forward.targets-shorter-than-model_input",
        lambda c: c.training.forward([short_targets_datum()], "cross_entropy"),
        ValueError,
        "model_input",
    ),
    Row(
        "forward_backward.image_asset_pointer",
        lambda c: c.training.forward_backward([image_pointer_datum()], "cross_entropy"),
        ValueError,
        "image_asset_pointer",
    ),
    Row(
        "optim_step.type",
        lambda c: c.training.optim_step({"learning_rate": 1e-4}),
        TypeError,
        "optim_params",
    ),
    Row("optim_step.missing", lambda c: c.training.optim_step(), TypeError, "optim_params"),
    Row(
        "optim_step.both",
        lambda c: c.training.optim_step(types.AdamParams(), adam_params=types.AdamParams()),
        ValueError,
        "adam_params",
    ),
    Row("save_state.name-type", lambda c: c.training.save_state(123), ValueError, "name"),
    Row(
        "forward.empty-data", lambda c: c.training.forward([], "cross_entropy"), ValueError, "data"
    ),
    # ---------------------------------------------------------------- SamplingClient
    Row("sample.prompt-type", lambda c: c.sampler.sample("hello", 1, SP), TypeError, "prompt"),
    Row("sample.num_samples-zero", lambda c: c.sampler.sample(P, 0, SP), ValueError, "num_samples"),
    Row(
        "sample.temperature-negative",
        lambda c: c.sampler.sample(P, 1, types.SamplingParams(max_tokens=3, temperature=-0.5)),
        ValueError,
        "sampling_params.temperature",
    ),
    Row(
        "sample.max_tokens-zero",
        lambda c: c.sampler.sample(P, 1, types.SamplingParams(max_tokens=0)),
        ValueError,
        "sampling_params.max_tokens",
    ),
    Row(
        "sample.sampling_params-type",
        lambda c: c.sampler.sample(P, 1, {"max_tokens": 3}),
        TypeError,
        "sampling_params",
    ),
    Row(
        "sample.topk_prompt_logprobs",
        lambda c: c.sampler.sample(P, 1, SP, topk_prompt_logprobs=-1),
        ValueError,
        "topk_prompt_logprobs",
    ),
    Row(
        "sample.prompt_alt_tokens_k",
        lambda c: c.sampler.sample(P, 1, SP, prompt_alt_tokens_k=-2),
        ValueError,
        "prompt_alt_tokens_k",
    ),
    Row(
        "sample.prompt_logprobs_last_n-without-include",
        lambda c: c.sampler.sample(P, 1, SP, prompt_logprobs_last_n=2),
        ValueError,
        "prompt_logprobs_last_n",
    ),
    Row(
        "sample.target_prompt_logprobs-type",
        lambda c: c.sampler.sample(P, 1, SP, target_prompt_logprobs=[[1, 2]]),
        TypeError,
        "target_prompt_logprobs",
    ),
    Row(
        "compute_logprobs.prompt-type",
        lambda c: c.sampler.compute_logprobs([1, 2, 3]),
        TypeError,
        "prompt",
    ),
    # ---------------------------------------------------------------- RestClient
    Row(
        "rest.get_training_run.empty",
        lambda c: c.rest.get_training_run(""),
        ValueError,
        "training_run_id",
    ),
    Row(
        "rest.list_training_runs.limit",
        lambda c: c.rest.list_training_runs(limit=-1),
        ValueError,
        "limit",
    ),
    Row(
        "rest.list_sessions.limit-type",
        lambda c: c.rest.list_sessions(limit="ten"),
        TypeError,
        "limit",
    ),
    Row(
        "rest.set_checkpoint_ttl.negative",
        lambda c: c.rest.set_checkpoint_ttl_from_tinker_path(c.ckpt, ttl_seconds=-5),
        ValueError,
        "ttl_seconds",
    ),
    Row(
        "rest.copy_weights.path",
        lambda c: c.rest.copy_weights("not a path", "proj"),
        ValueError,
        "tinker://",
    ),
    Row(
        "rest.copy_weights.no-project",
        lambda c: c.rest.copy_weights(c.ckpt),
        ValueError,
        "destination_project_id",
    ),
    Row(
        "rest.delete_checkpoint.path",
        lambda c: c.rest.delete_checkpoint_from_tinker_path("tinker://run/sampler_weights"),
        ValueError,
        "tinker://run/sampler_weights",
    ),
    Row(
        "rest.publish.path-type",
        lambda c: c.rest.publish_checkpoint_from_tinker_path(None),
        TypeError,
        "tinker_path",
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_invalid_call_raises_a_typed_field_naming_error_and_sends_nothing(
    ctx: Ctx, row: Row
) -> None:
    before = sent(ctx.server)
    with pytest.raises((ValueError, TypeError, KeyError)) as info:
        result = row.call(ctx)
        # an invalid call must fail synchronously, never as a failed future later
        pytest.fail(f"no synchronous error; returned {result!r}")
    assert isinstance(info.value, row.exc), f"{type(info.value).__name__}: {info.value}"
    message = str(info.value.args[0]) if isinstance(info.value, KeyError) else str(info.value)
    assert row.field in message, f"message does not name {row.field!r}: {message!r}"
    assert sent(ctx.server) == before, "an invalid call reached the server"


def test_rejected_training_calls_burn_no_seq_id(ctx: Ctx) -> None:
    """After every training row above was rejected, the next op takes the next seq_id
    (docs/design/behavior.md#validate-before-reserving)."""
    for row in ROWS:
        if row.id.startswith(("forward_backward.", "optim_step.", "save_state.", "forward.")):
            with pytest.raises((ValueError, TypeError, KeyError)):
                row.call(ctx)
    fut = ctx.training.forward_backward([datum(3)], "cross_entropy")
    fut.result(HANG)
    seqs = [s for s, _ in applied(ctx.server, ctx.training.model_id)]
    assert seqs == list(range(len(seqs))), seqs  # contiguous from 0: no gap was left


# -------------------------------------------------------------------------------- CLI


def cli_command() -> list[str]:
    exe = shutil.which("tinker-sync")
    return [exe] if exe else [sys.executable, "-m", "tinker_sync"]


CLI_ROWS = [
    ("unknown-command", ["no-such-command"], "no-such-command"),
    ("run-list-limit-not-int", ["run", "list", "--limit", "abc"], "--limit"),
    ("run-info-missing-id", ["run", "info"], "required"),
    ("format-choice", ["--format", "xml", "run", "list"], "--format"),
    ("set-ttl-needs-ttl-or-remove", ["checkpoint", "set-ttl", "tinker://r/weights/c"], "--ttl"),
    (
        "set-ttl-both",
        ["checkpoint", "set-ttl", "--ttl", "5", "--remove", "tinker://r/weights/c"],
        "--remove",
    ),
    ("checkpoint-list-limit-not-int", ["checkpoint", "list", "--limit", "x1"], "--limit"),
]


@pytest.mark.parametrize(("args", "field"), [r[1:] for r in CLI_ROWS], ids=[r[0] for r in CLI_ROWS])
def test_cli_rejects_bad_arguments_with_exit_2(ctx: Ctx, args: list[str], field: str) -> None:
    command = cli_command()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TINKER_BASE_URL": ctx.server.url,
        "TINKER_API_KEY": ctx.server.api_key or "",
    }
    before = sent(ctx.server)
    proc = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=HANG, env=env, check=False
    )
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert field in proc.stderr, proc.stderr[-500:]
    assert "Traceback" not in proc.stderr
    assert sent(ctx.server) == before, "a rejected command line reached the server"
