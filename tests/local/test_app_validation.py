"""Bad requests get 4xx JSON errors with a non-empty body, never a 500 or a hang; auth."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from app_helpers import BASE_MODEL, Harness, fwdbwd_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinker_sync.local._app import TinkerApp
from tinker_sync.local._httpapi import HttpRequest, HttpResponse


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    with Harness(tmp_path, long_poll_s=0.3) as harness:
        yield harness


def _assert_4xx(r: Any, *statuses: int) -> None:
    assert 400 <= r.status < 500, (r.status, r.content)
    if statuses:
        assert r.status in statuses, (r.status, r.content)
    assert r.content and r.json["detail"]


POST_ENDPOINTS = [
    "create_session",
    "session_heartbeat",
    "create_model",
    "get_info",
    "optim_step",
    "save_weights",
    "save_weights_for_sampler",
    "save_weights_external",
    "load_weights",
    "create_custom_loss",
    "create_sampling_session",
    "join_sampling_session",
    "asample",
    "retrieve_future",
    "retrieve_futures",
    "cancel_future",
    "telemetry",
    "weights_info",
    "copy_weights",
    "sessions/search",
    "unload_model",
]


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
def test_malformed_json_is_400(h: Harness, endpoint: str) -> None:
    r = h.post(endpoint, raw=b"{not json", headers={"Content-Type": "application/json"})
    _assert_4xx(r, 400)
    r = h.post(endpoint, raw=b"[1, 2]", headers={"Content-Type": "application/json"})
    _assert_4xx(r, 400)


def test_wrong_field_types_name_the_field(h: Harness) -> None:
    sid = h.new_session()
    mid = h.new_model(sid)
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("create_session", {"tags": "x", "user_metadata": {}, "sdk_version": "v"}, "tags"),
        (
            "create_model",
            {"session_id": sid, "model_seq_id": "1", "base_model": BASE_MODEL},
            "model_seq_id",
        ),
        (
            "create_model",
            {
                "session_id": sid,
                "model_seq_id": 1,
                "base_model": BASE_MODEL,
                "lora_config": {"rank": True},
            },
            "lora_config.rank",
        ),
        (
            "optim_step",
            {"model_id": mid, "seq_id": 1, "adam_params": {"learning_rate": "fast"}},
            "adam_params.learning_rate",
        ),
        ("save_weights", {"model_id": mid, "seq_id": 2, "path": 5}, "path"),
        ("asample", {"sampling_session_id": 3, "seq_id": 0}, "sampling_session_id"),
        ("retrieve_future", {"request_id": None}, "request_id"),
        ("retrieve_futures", {"target": "x"}, "target"),
        ("get_info", {"model_id": ["a"]}, "model_id"),
        ("session_heartbeat", {}, "session_id"),
    ]
    for endpoint, body, field in cases:
        r = h.post(endpoint, body)
        _assert_4xx(r, 400)
        assert field in r.json["detail"], (endpoint, r.json)


def test_malformed_sample_requests(h: Harness) -> None:
    sid = h.new_session()
    sampler = h.sampler(sid, 0, base_model=BASE_MODEL)
    _assert_4xx(
        h.asample(sampler, 0, prompt={"chunks": [{"type": "encoded_text", "tokens": ["a"]}]}), 400
    )
    _assert_4xx(h.asample(sampler, 1, prompt={"chunks": [{"type": "video"}]}), 400)
    _assert_4xx(h.asample(sampler, 2, sampling_params={"stop": [1, "x"]}), 400)
    _assert_4xx(h.asample(sampler, 3, num_samples=0), 400)
    _assert_4xx(h.asample(sampler, 4, target_prompt_logprobs={"data": [1], "dtype": "int8"}), 400)
    _assert_4xx(h.asample(sampler, 5, prompt=None), 400)


def test_malformed_forward_backward_bodies(h: Harness) -> None:
    mid = h.new_model(h.new_session())
    proto = {"Content-Type": "application/x-protobuf"}
    _assert_4xx(h.post("forward_backward", raw=b"\xff\xff\xff\xff", headers=proto), 400)
    _assert_4xx(
        h.post("forward_backward", raw=b"garbage", headers={**proto, "Content-Encoding": "zstd"}),
        400,
    )
    _assert_4xx(
        h.post("forward_backward", raw=b"x", headers={**proto, "Content-Encoding": "br"}), 400
    )
    _assert_4xx(
        h.post("forward_backward", raw=b"{oops", headers={"Content-Type": "application/json"}), 400
    )
    _assert_4xx(
        h.post(
            "forward_backward",
            {"model_id": mid, "seq_id": 1, "forward_backward_input": {"data": "x"}},
        ),
        400,
    )
    _assert_4xx(
        h.post("forward_backward", raw=fwdbwd_body(mid, 1, tokens=[]), headers=proto), 400
    )  # no datums
    _assert_4xx(h.post("forward_backward", raw=fwdbwd_body("", 1), headers=proto), 400)
    # a truncated but otherwise valid body
    body = fwdbwd_body(mid, 2)
    _assert_4xx(h.post("forward_backward", raw=body[: len(body) - 3], headers=proto), 400)


def test_unknown_ids(h: Harness) -> None:
    _assert_4xx(h.post("get_info", {"model_id": "x:train:0"}), 404)
    _assert_4xx(
        h.post("optim_step", {"model_id": "x:train:0", "seq_id": 1, "adam_params": {}}), 404
    )
    _assert_4xx(
        h.post(
            "create_sampling_session",
            {"session_id": "nope", "sampling_session_seq_id": 0, "base_model": BASE_MODEL},
        ),
        404,
    )
    _assert_4xx(h.post("join_sampling_session", {"sampling_session_id": "nope"}), 404)
    _assert_4xx(h.post("retrieve_future", {"request_id": "nope", "allow_metadata_only": True}), 410)
    _assert_4xx(h.post("weights_info", {"tinker_path": "tinker://a/weights/b"}), 404)
    _assert_4xx(h.post("weights_info", {"tinker_path": "http://a/weights/b"}), 400)
    _assert_4xx(h.get("training_runs/x/checkpoints"), 404)
    _assert_4xx(h.call("DELETE", "training_runs/x/checkpoints/weights/y"), 404)
    _assert_4xx(
        h.call("PUT", "training_runs/x/checkpoints/weights/y/ttl", {"ttl_seconds": "x"}), 400
    )
    _assert_4xx(h.get("training_runs", query={"limit": "many"}), 400)
    _assert_4xx(h.get("no/such/endpoint"), 404)
    _assert_4xx(h.get("create_session"), 405)


def test_auth(h: Harness) -> None:
    body = {"tags": [], "user_metadata": {}, "sdk_version": "v"}
    _assert_4xx(h.post("create_session", body, key=""), 401)
    _assert_4xx(h.post("create_session", body, key="tml-wrong"), 401)
    _assert_4xx(h.post("client/config", {"sdk_version": "v"}, key="tml-wrong"), 401)
    assert h.get("healthz", key="").status == 200
    r = h.post("create_session", body, key="tml-wrong")
    assert "tml-wrong" not in r.content.decode()


def test_api_key_none_accepts_any_tml_key(tmp_path: Path) -> None:
    with Harness(tmp_path, api_key=None) as h:
        body = {"tags": [], "user_metadata": {}, "sdk_version": "v"}
        assert h.post("create_session", body, key="tml-abc").status == 200
        assert h.post("create_session", body, key="tml-xyz").status == 200
        _assert_4xx(h.post("create_session", body, key="sk-abc"), 401)
        _assert_4xx(h.post("create_session", body, key="tml-"), 401)


# ---------------------------------------------------------------------------- fuzz (no HTTP)

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=12,
)
_FIELDS = [
    "session_id",
    "model_id",
    "seq_id",
    "model_seq_id",
    "base_model",
    "path",
    "request_id",
    "sampling_session_id",
    "prompt",
    "sampling_params",
    "num_samples",
    "target",
    "prev_cursor",
    "lora_config",
    "adam_params",
    "tinker_path",
    "source_path",
    "optimizer",
    "events",
    "graph",
    "inputs",
]
_bodies = st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6) | _json


@pytest.fixture(scope="module")
def fuzz_app(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TinkerApp, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    app = TinkerApp("instant", data_dir=tmp_path_factory.mktemp("fuzz"), long_poll_s=0.05)
    yield app, loop
    loop.run_until_complete(app.aclose())
    loop.close()


def _call(app: TinkerApp, loop: asyncio.AbstractEventLoop, path: str, body: bytes) -> HttpResponse:
    req = HttpRequest(
        "POST",
        f"/api/v1/{path}",
        {},
        {"x-api-key": "tml-local", "content-type": "application/json"},
        body,
    )
    return loop.run_until_complete(asyncio.wait_for(app.handle(req), 10))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    endpoint=st.sampled_from([*POST_ENDPOINTS, "forward_backward", "client/config", "auth/token"]),
    body=_bodies,
)
def test_fuzzed_bodies_never_500(
    fuzz_app: tuple[TinkerApp, asyncio.AbstractEventLoop], endpoint: str, body: Any
) -> None:
    app, loop = fuzz_app
    r = _call(app, loop, endpoint, json.dumps(body).encode())
    assert r.status < 500, (endpoint, body, r.body)
    assert r.body
    json.loads(r.body)
