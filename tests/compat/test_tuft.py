"""tinker_sync against TuFT 0.2.2, an independent Tinker server, on loopback.

TuFT speaks protocol 0.25 and its request models forbid unknown keys; it runs on CPU with its
dummy backends under ``TUFT_CPU_TEST=1``. Its pins (``tinker<0.26``, ``torch==2.11.0``,
``vllm``) cannot share an environment with this package's test dependencies, so it lives in a
virtual environment of its own, which ``TINKER_SYNC_TUFT_PYTHON`` names (its ``python``);
``.ci/run`` builds one. Run alone::

    TINKER_SYNC_TUFT_PYTHON=/path/to/tuft-venv/bin/python pytest tests/compat/test_tuft.py -s

The module starts one TuFT server (a subprocess bound to 127.0.0.1, started within 120 s,
stopped at the end), runs every operation its dummy backend supports through tinker_sync and
records an operation table (printed with ``-s``, and attached to a failure). Without TuFT it
skips, except with CI=true, where it fails. See docs/migration.md#older-and-independent-servers.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import tinker_sync
from tinker_sync import types

ENV = "TINKER_SYNC_TUFT_PYTHON"
MODEL = "Qwen/Qwen3-0.6B"  # a name only: the dummy backends load no weights
KEY = "tml-tuft-test"
START_TIMEOUT = 120.0
OP_TIMEOUT = 60.0


def _tuft_python() -> str:
    python = os.environ.get(ENV)
    problem = None
    if not python:
        problem = f"{ENV} is not set (the python of a virtual environment with tuft==0.2.2)"
    else:
        probe = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('tuft'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        version = probe.stdout.strip()
        if probe.returncode != 0 or version != "0.2.2":
            problem = f"{python} has no tuft 0.2.2 ({version or probe.stderr.strip()[-200:]})"
    if problem is None:
        assert python is not None
        return python
    if os.environ.get("CI"):
        pytest.fail(f"{problem}: CI must install it (.ci/run)")
    pytest.skip(problem)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def tuft_python() -> str:
    return _tuft_python()


@pytest.fixture(scope="module")
def tuft(tuft_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a TuFT server on loopback (dummy backends, one model, one key)."""
    home = tmp_path_factory.mktemp("tuft")
    config = home / "tuft.yaml"
    config.write_text(
        f"checkpoint_dir: {home / 'checkpoints'}\n"
        f"authorized_users:\n  {KEY}: default\n"
        f"supported_models:\n  - model_name: {MODEL}\n"
        f"    model_path: {MODEL}\n    max_model_len: 4096\n"
    )
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "TUFT_"))}
    env.update(TUFT_CPU_TEST="1", TUFT_HOME=str(home), HF_HUB_OFFLINE="1")
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
        [tuft_python, "-m", "tuft", "launch", "--host", "127.0.0.1", "--port", str(port)]
        + ["--config", str(config), "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"TuFT exited with {proc.returncode}: {_tail(home / 'server.log')}")
            try:
                if requests.get(f"{url}/api/v1/healthz", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"TuFT not healthy after {START_TIMEOUT:.0f} s")
            time.sleep(0.5)  # polling a subprocess's start-up, not synchronising threads
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(20)
        log.close()


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


DATUM = types.Datum(
    model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
    loss_fn_inputs={
        "target_tokens": types.TensorData(data=[2, 3, 4, 5], dtype="int64", shape=[4]),
        "weights": types.TensorData(data=[1.0, 1.0, 1.0, 1.0], dtype="float32", shape=[4]),
    },
)
PROMPT = types.ModelInput.from_ints([1, 2, 3])
PARAMS = types.SamplingParams(max_tokens=4)


def run_operations(service: tinker_sync.ServiceClient) -> dict[str, str]:
    """Every operation TuFT's dummy backends support, in order: ``{operation: outcome}``.

    Not run: ``unpublish_checkpoint`` (TuFT 0.2.2 routes ``DELETE .../publish`` to its
    delete-checkpoint handler, which fails with a 500) and ``save_weights_external`` (no
    endpoint).
    """
    table: dict[str, str] = {}
    ctx: dict[str, Any] = {}
    t = OP_TIMEOUT

    def op(name: str) -> Callable[[Callable[[], object]], None]:
        def run(fn: Callable[[], object]) -> None:
            try:
                value = fn()
            except Exception as exc:
                table[name] = f"FAIL {type(exc).__name__}: {str(exc)[:200]}"
            else:
                table[name] = "ok" if value is None else f"ok ({value})"

        return run

    @op("get_server_capabilities")
    def _() -> object:
        models = service.get_server_capabilities().supported_models
        assert [m.model_name for m in models] == [MODEL]
        return None

    @op("create_lora_training_client")
    def _() -> object:
        ctx["training"] = service.create_lora_training_client(MODEL, rank=4)
        return None

    def training() -> Any:
        return ctx["training"]

    @op("get_info")
    def _() -> object:
        assert training().get_info().model_id == training().model_id
        return None

    @op("forward")
    def _() -> object:
        return len(training().forward([DATUM], "cross_entropy").result(t).loss_fn_outputs)

    @op("forward_backward")
    def _() -> object:
        out = training().forward_backward([DATUM], "cross_entropy").result(t)
        return ",".join(sorted(out.metrics))

    @op("optim_step")
    def _() -> object:
        training().optim_step(types.AdamParams(learning_rate=1e-3)).result(t)
        return None

    @op("save_state")
    def _() -> object:
        ctx["state"] = training().save_state("s1").result(t).path
        return None

    @op("load_state")
    def _() -> object:
        training().load_state(ctx["state"]).result(t)
        return None

    @op("load_state_with_optimizer")
    def _() -> object:
        training().load_state_with_optimizer(ctx["state"]).result(t)
        return None

    @op("save_weights_for_sampler")
    def _() -> object:
        ctx["weights"] = training().save_weights_for_sampler("w1").result(t).path
        return None

    @op("create_sampling_client(model_path)")
    def _() -> object:
        ctx["sampler"] = service.create_sampling_client(ctx["weights"])
        return None

    @op("sample")
    def _() -> object:
        result = ctx["sampler"].sample(PROMPT, 2, PARAMS).result(t)
        assert len(result.sequences) == 2
        return None

    @op("compute_logprobs")
    def _() -> object:
        assert len(ctx["sampler"].compute_logprobs(PROMPT).result(t)) == PROMPT.length
        return None

    @op("create_sampling_client(base_model)")
    def _() -> object:
        sampler = service.create_sampling_client(base_model=MODEL)
        assert sampler.sample(PROMPT, 1, PARAMS).result(t).sequences
        return None

    @op("save_weights_and_get_sampling_client")
    def _() -> object:
        sampler = training().save_weights_and_get_sampling_client()
        assert sampler.sample(PROMPT, 1, PARAMS).result(t).sequences
        return None

    @op("create_training_client_from_state")
    def _() -> object:
        resumed = service.create_training_client_from_state(ctx["state"])
        assert resumed.model_id != training().model_id
        resumed.forward_backward([DATUM], "cross_entropy").result(t)
        return None

    @op("create_training_client_from_state_with_optimizer")
    def _() -> object:
        resumed = service.create_training_client_from_state_with_optimizer(ctx["state"])
        resumed.optim_step(types.AdamParams(learning_rate=1e-3)).result(t)
        return None

    rest = service.create_rest_client()

    @op("rest.list_training_runs")
    def _() -> object:
        runs = rest.list_training_runs().result(t).training_runs
        assert training().model_id in [r.training_run_id for r in runs]
        return None

    @op("rest.get_training_run")
    def _() -> object:
        run = rest.get_training_run(training().model_id).result(t)
        assert run.training_run_id == training().model_id
        return None

    @op("rest.list_checkpoints")
    def _() -> object:
        checkpoints = rest.list_checkpoints(training().model_id).result(t).checkpoints
        assert ctx["state"] in [c.tinker_path for c in checkpoints]
        return None

    @op("rest.list_user_checkpoints")
    def _() -> object:
        assert rest.list_user_checkpoints().result(t).checkpoints
        return None

    @op("rest.get_weights_info_by_tinker_path")
    def _() -> object:
        assert rest.get_weights_info_by_tinker_path(ctx["state"]).result(t).base_model == MODEL
        return None

    @op("rest.publish_checkpoint_from_tinker_path")
    def _() -> object:
        rest.publish_checkpoint_from_tinker_path(ctx["state"]).result(t)
        return None

    @op("rest.list_sessions")
    def _() -> object:
        assert service._session.session_id in rest.list_sessions().result(t).sessions
        return None

    @op("rest.get_session")
    def _() -> object:
        rest.get_session(service._session.session_id).result(t)
        return None

    @op("rest.get_sampler")
    def _() -> object:
        assert rest.get_sampler(ctx["sampler"].sampler_id).result(t).base_model == MODEL
        return None

    @op("rest.delete_checkpoint_from_tinker_path")
    def _() -> object:
        rest.delete_checkpoint_from_tinker_path(ctx["weights"]).result(t)
        return None

    return table


def test_every_operation_of_tuft_runs_through_tinker_sync(
    tuft: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="tinker_sync"):
        with tinker_sync.ServiceClient(base_url=tuft, api_key=KEY) as service:
            table = run_operations(service)
    # TuFT has no session finish route: closing says so at INFO, not as a warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("no session finish endpoint" in r.getMessage() for r in caplog.records)
    report = "\n".join(f"{name:52s} {outcome}" for name, outcome in table.items())
    print(f"\nTuFT 0.2.2 operation table (tinker_sync):\n{report}")
    failed = {name: outcome for name, outcome in table.items() if not outcome.startswith("ok")}
    assert not failed, report
    assert len(table) == 27


def test_newer_fields_are_exactly_those_protocol_025_lacks(tuft_python: str) -> None:
    """TuFT's own tinker 0.25 is the oracle: none of the fields left out at their default
    exists in its request models, and each of those models forbids unknown keys."""
    from tinker_sync._wire._converter import NEWER_REQUEST_FIELDS

    models = {
        "create_session": "CreateSessionRequest",
        "create_model": "CreateModelRequest",
        "load_weights": "LoadWeightsRequest",
        "save_weights": "SaveWeightsRequest",
        "save_weights_for_sampler": "SaveWeightsForSamplerRequest",
        "sample": "SampleRequest",
    }
    assert set(models) == set(NEWER_REQUEST_FIELDS)
    script = (
        "import json; from tinker import types\n"
        f"names = {json.dumps(models)}\n"
        "print(json.dumps({t: [sorted(getattr(types, n).model_fields),"
        " getattr(types, n).model_config.get('extra')] for t, n in names.items()}))\n"
    )
    probe = subprocess.run(
        [tuft_python, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    old = json.loads(probe.stdout)
    for request_type, fields in NEWER_REQUEST_FIELDS.items():
        known, extra = old[request_type]
        assert extra == "forbid", request_type
        assert not set(fields) & set(known), request_type
