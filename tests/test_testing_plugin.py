"""The opt-in pytest plugin tinker_sync.testing, exercised through pytester, plus its
VirtualSleepClock on its own."""

from __future__ import annotations

import inspect
import re
import textwrap
import threading
import time

import pytest

import tinker_sync.testing
from tinker_sync.testing import Sleep, VirtualSleepClock

pytest_plugins = ["pytester"]

CONFTEST = 'pytest_plugins = ["tinker_sync.testing"]\n'

INNER_TESTS = """
import os

import pytest
import requests

import tinker_sync
from tinker_sync._runtime.clock import SYSTEM_CLOCK, SystemClock

SEEN = {}


def test_server_is_patched_into_the_environment(tinker_server):
    assert os.environ["TINKER_BASE_URL"] == tinker_server.url
    assert os.environ["TINKER_API_KEY"] == "tml-local"
    assert tinker_server.backend == "instant"
    SEEN["url"] = tinker_server.url


def test_environment_is_restored_and_server_stopped():
    assert os.environ["TINKER_BASE_URL"] == "http://outer.invalid"
    with pytest.raises(requests.ConnectionError):
        requests.get(SEEN["url"] + "/api/v1/healthz", timeout=5)


@pytest.mark.tinker_server(backend="tiny", api_key="tml-custom", client_config={"sample_use_retrieve_futures": True})
def test_marker_configures_the_server(tinker_server):
    assert tinker_server.backend == "tiny"
    assert os.environ["TINKER_API_KEY"] == "tml-custom"
    reply = requests.post(tinker_server.url + "/api/v1/client/config", json={"sdk_version": "0.38.0"},
                          headers={"X-API-Key": "tml-custom"}, timeout=10)
    assert reply.json()["sample_use_retrieve_futures"] is True


def test_service_client_is_bound_and_closed(tinker_service_client, tinker_server):
    caps = tinker_service_client.get_server_capabilities()
    assert caps.supported_models
    training = tinker_service_client.create_lora_training_client("tinker-sync/tiny", rank=2)
    assert training.model_id
    SEEN["client"] = tinker_service_client
    SEEN["server"] = tinker_server


def test_previous_service_client_was_closed_before_its_server_stopped():
    assert SEEN["client"]._session.closed
    finishes = [e for e in SEEN["server"].requests.all() if e.path.endswith("/finish")]
    assert len(finishes) == 1 and finishes[0].status == 200


@pytest.mark.tinker_server(faults=["get_server_capabilities 503 x2"])
def test_sleeps_record_retry_delays(tinker_service_client, tinker_sleeps, tinker_faults, tinker_server):
    start = time.monotonic()
    tinker_service_client.get_server_capabilities()
    assert tinker_sleeps.delays("http-retry") == [0.5, 1.0]
    assert time.monotonic() - start < 1.0  # nothing actually slept
    tinker_faults.assert_exhausted()
    tinker_service_client.create_lora_training_client("tinker-sync/tiny", rank=2)
    SEEN["sleeps_client"] = tinker_service_client
    SEEN["sleeps_server"] = tinker_server


def test_client_with_sleeps_closed_before_its_server_stopped():
    assert SEEN["sleeps_client"]._session.closed
    finishes = [e for e in SEEN["sleeps_server"].requests.all() if e.path.endswith("/finish")]
    assert len(finishes) == 1 and finishes[0].status == 200


def test_sleeps_also_replace_the_default_clock(tinker_server, tinker_faults, tinker_sleeps):
    tinker_faults.add("get_server_capabilities 429 x1 retry_after=7")
    with tinker_sync.RestClient() as rest:
        rest.get_server_capabilities().result(30)
    assert tinker_sleeps.sleeps[-1] == (7.0, "http-retry")


def test_default_clock_is_restored():
    for name in ("monotonic", "time", "sleep", "wait", "random"):
        assert getattr(SYSTEM_CLOCK, name).__func__ is getattr(SystemClock, name)


def test_factory_makes_independent_servers(tinker_server_factory):
    a = tinker_server_factory()
    b = tinker_server_factory(api_key="tml-other")
    assert a.url != b.url and b.api_key == "tml-other"
    SEEN["factory"] = [a.url, b.url]


def test_factory_servers_are_stopped():
    for url in SEEN["factory"]:
        with pytest.raises(requests.ConnectionError):
            requests.get(url + "/api/v1/healthz", timeout=5)


def test_reset_process_state_closes_shared_pools(tinker_server):
    from tinker_sync._transport import _pools
    from tinker_sync.testing import reset_process_state

    with tinker_sync.RestClient() as rest:
        rest.get_server_capabilities().result(30)
        assert _pools._registry
        reset_process_state()
        assert not _pools._registry
"""


def test_plugin_fixtures(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_BASE_URL", "http://outer.invalid")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner="import time\n" + INNER_TESTS)
    result = pytester.runpytest_inprocess(
        "--strict-markers",
        "-p",
        "no:cacheprovider",
        "-q",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
    )
    result.assert_outcomes(passed=12)


def test_plugin_is_opt_in(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner="""
        def test_needs_plugin(tinker_server):
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'tinker_server' not found*"])


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_inprocess("--markers", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*tinker_server(backend=*"])


def docstring_examples() -> dict[str, str]:
    """Every ``::`` example block in tinker_sync.testing's docstrings, as ``{file name: code}``.

    A block is a sequence of files, each introduced by a ``# <name>.py`` comment line.
    """
    module = tinker_sync.testing
    docs = [module.__doc__ or ""] + [
        inspect.getdoc(obj) or ""
        for name in module.__all__
        if (obj := getattr(module, name)) is not None and name != "__doc__"
    ]
    files: dict[str, str] = {}
    for doc in docs:
        for block in re.findall(r"::\n\n((?:(?: {4}.*)?\n)+)", inspect.cleandoc(doc) + "\n"):
            code = textwrap.dedent(block)
            parts = re.split(r"^# (\S+\.py)\n", code, flags=re.M)
            assert not parts[0].strip(), f"example without a '# <file>.py' line: {code!r}"
            for name, body in zip(parts[1::2], parts[2::2], strict=True):
                files[name] = files.get(name, "") + body
    return files


def test_docstring_examples_run(pytester: pytest.Pytester) -> None:
    files = docstring_examples()
    assert "conftest.py" in files and len(files) >= 3
    tests = sum(len(re.findall(r"^def test_", code, flags=re.M)) for code in files.values())
    assert tests >= 4
    for name, code in files.items():
        pytester.path.joinpath(name).write_text(code)
    result = pytester.runpytest_subprocess("--strict-markers", "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=tests)


FAULT_KINDS = """
import pytest

from tinker_sync import types
from tinker_sync.exceptions import RequestFailedError

PROMPT = types.ModelInput.from_ints([1, 2, 3])
DATUM = types.Datum(model_input=PROMPT, loss_fn_inputs={"target_tokens": [2, 3, 4]})

SAMPLE_FAULTS = [
    "asample 429 x2", "asample 429 x2 retry_after=3", "asample 429 retry_after_ms=1500",
    "asample 429 retry_after_date=5", "asample 503 x2", "asample 409", "asample 408",
    "asample drop-before", "asample drop-after", "asample 500 delay=0.1",
    "retrieve_future paused_rate_limit x3", "retrieve_future paused_capacity x3",
    "retrieve_future 503 x2", "retrieve_future 429 x2 retry_after=2", "retrieve_future expire",
    "retrieve_future metadata", "retrieve_future drop-before", "retrieve_future drop-after",
    "create_sampling_session 503",
    # a shorter backoff while the shared record still holds this process's longer one
    "asample 429 retry_after=30 + asample 429 retry_after=1",
]
TRAIN_FAULTS = [
    "forward_backward 429 x2", "forward_backward 503 x2", "forward_backward drop-before",
    "forward_backward drop-after", "optim_step 503", "create_model 503",
    "retrieve_future paused_capacity x3 match.request_type=ForwardBackward",
    "retrieve_future 503 x2 match.request_type=ForwardBackward",
    "retrieve_future 429 retry_after_date=4 match.request_type=OptimStep",
    "retrieve_future drop-after match.request_type=OptimStep",
]


# Virtual time is the sum of the backoffs asked for (31 s at most here): it never runs on
# while a request waits for something real.
MAX_VIRTUAL_S = 120.0


@pytest.mark.tinker_server(backend="tiny")
@pytest.mark.parametrize("fault", SAMPLE_FAULTS)
def test_sample(fault, tinker_faults, tinker_service_client, tinker_sleeps):
    tinker_faults.extend(fault.split(" + "))
    sampler = tinker_service_client.create_sampling_client(base_model="tinker-sync/tiny")
    result = sampler.sample(PROMPT, 2, types.SamplingParams(max_tokens=3)).result(timeout=60)
    assert len(result.sequences) == 2
    tinker_faults.assert_exhausted()
    assert tinker_sleeps.total < MAX_VIRTUAL_S, tinker_sleeps


@pytest.mark.tinker_server(backend="tiny")
@pytest.mark.parametrize("fault", TRAIN_FAULTS)
def test_train(fault, tinker_faults, tinker_service_client, tinker_sleeps):
    tinker_faults.add(fault)
    training = tinker_service_client.create_lora_training_client("tinker-sync/tiny", rank=2)
    training.forward_backward([DATUM], "cross_entropy").result(timeout=60)
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)
    tinker_faults.assert_exhausted()
    assert tinker_sleeps.total < MAX_VIRTUAL_S, tinker_sleeps


@pytest.mark.tinker_server(backend="tiny")
@pytest.mark.parametrize("endpoint", ["retrieve_future fail:server match.request_type=Sample"])
def test_failures_are_raised(endpoint, tinker_faults, tinker_service_client, tinker_sleeps):
    tinker_faults.add(endpoint)
    sampler = tinker_service_client.create_sampling_client(base_model="tinker-sync/tiny")
    with pytest.raises(RequestFailedError):
        sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=3)).result(timeout=60)
"""


def test_every_fault_kind_works_under_tinker_sleeps(pytester: pytest.Pytester) -> None:
    # A 429 on a sample used to extend its own backoff deadline on every timer pass (the
    # wall-clock copy shared with other processes did not move with the virtual clock), until
    # the stall deadline failed the sample with SamplingStuckError within a second. Then a
    # shorter second backoff re-read the first, still in the shared record, on every pass.
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_faults=FAULT_KINDS)
    result = pytester.runpytest_subprocess("--strict-markers", "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=31)


def test_fault_kinds_on_the_urllib3_path_under_tinker_sleeps(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The urllib3 path's deadline watch waited for each attempt's real deadline on the
    # replaced default clock: every wait returned at once, adding the time left to virtual
    # time, so virtual time ran on for as long as a request was out (SamplingStuckError).
    monkeypatch.setenv("TINKER_SYNC_TRANSPORT", "urllib3")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_faults=FAULT_KINDS)
    result = pytester.runpytest_subprocess(
        "--strict-markers", "-p", "no:cacheprovider", "-q", "-k", "429 or drop"
    )
    result.assert_outcomes(passed=15, deselected=16)


# -- VirtualSleepClock ------------------------------------------------------------------------


def test_sleeps_are_recorded_and_return_at_once() -> None:
    clock = VirtualSleepClock()
    start_real, start_virtual = time.monotonic(), clock.monotonic()
    clock.sleep(30.0, "submission-retry")
    clock.sleep(0.5, "http-retry")
    assert time.monotonic() - start_real < 1.0
    assert clock.monotonic() - start_virtual >= 30.5
    assert clock.sleeps == [Sleep(30.0, "submission-retry"), Sleep(0.5, "http-retry")]
    assert clock.delays("http-retry") == [0.5] and clock.total == 30.5
    assert len(clock) == 2 and clock[0].reason == "submission-retry"
    assert abs(clock.time() - time.time()) < 5.0  # wall time stays real
    clock.clear()
    assert clock.sleeps == []


def test_condition_waits_are_virtual_and_event_waits_real() -> None:
    clock = VirtualSleepClock()
    cond = threading.Condition()
    with cond:
        assert clock.wait(cond, 5.0) is False
    assert clock.sleeps == [Sleep(5.0, "backoff-wait")]
    event = threading.Event()
    threading.Timer(0.05, event.set).start()
    assert clock.wait(event, 10.0) is True
    assert len(clock) == 1  # event waits are not virtual sleeps


def test_jitter_source() -> None:
    clock = VirtualSleepClock()
    assert clock.random() == 0.0
    clock.set_jitter(0.5)
    assert clock.random() == 0.5
    clock.set_jitter(lambda: 0.25)
    assert clock.random() == 0.25
    with pytest.raises(ValueError):
        clock.set_jitter(1.5)
