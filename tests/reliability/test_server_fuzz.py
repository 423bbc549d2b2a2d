"""Fuzz the local server's endpoints (docs/design/protocol.md#endpoints) with malformed JSON and
protobuf bodies.

Invariants for every request: no 5xx, no hang (each request has a 15 s read timeout while the
server long-polls for at most 0.5 s), and every 4xx carries a non-empty JSON error body. Bodies
that are invalid by construction (not JSON, JSON that is not an object, protobuf sent to a
JSON endpoint, a body missing the endpoint's required fields) must get a 4xx; randomly
filled objects and mutated protobuf may happen to be valid, so they only need "no 5xx". After
every family the server must still answer ``healthz`` and a valid ``create_session``, and the
SDK must still train and sample through it; the request log must hold no 5xx at all.

Examples are bounded (``max_examples=60`` per family, derandomized so CI is reproducible) to
keep the run to seconds; ``TINKER_SYNC_FUZZ_EXAMPLES=N`` runs a longer exploration.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_helpers import HANG, datum

import tinker_sync
from tinker_sync import types
from tinker_sync.local import LocalServer

TIMEOUT = (5.0, 15.0)
FUZZ = settings(
    max_examples=int(os.environ.get("TINKER_SYNC_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)

#: JSON endpoints (POST unless noted) that require at least one field -- an empty object, a
#: non-object or a non-JSON body must be a 4xx there.
REQUIRED_FIELDS = [
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
    "weights_info",
    "copy_weights",
    "unload_model",
]
#: JSON endpoints whose fields are all optional (``{}`` may be fine, a non-object is not).
OPTIONAL_FIELDS = [
    "client/config",
    "client/dynamic_config",
    "create_session",
    "telemetry",
    "sessions/search",
]
PROTO_ENDPOINTS = ["forward_backward", "forward"]
#: The JWT exchange takes ``{}`` and reads only the credential header, so any body goes.
BODY_IGNORED = ["auth/token"]

FIELDS = [
    "session_id",
    "model_id",
    "seq_id",
    "request_id",
    "base_model",
    "model_path",
    "lora_config",
    "sampling_session_id",
    "sampling_session_seq_id",
    "prompt",
    "sampling_params",
    "num_samples",
    "path",
    "tinker_path",
    "source_path",
    "events",
    "target",
    "prev_cursor",
    "timeout",
    "allow_metadata_only",
    "type",
    "sdk_version",
    "tags",
    "user_metadata",
    "adam_params",
    "optimizer_params",
    "model_seq_id",
    "ttl_seconds",
    "optimizer",
    "destination_project_id",
    "retrieved_request_ids",
    "loss_fn",
    "data",
    "chunks",
    "tokens",
    "prompt_logprobs",
    "topk_prompt_logprobs",
    "target_prompt_logprobs",
    "cloned_sampler_id",
]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def _not_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return True
    return False


not_json = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100).map(str.encode),
    st.sampled_from([b"{", b'{"a":', b"[1,", b"\xff\xfe{}", b'{"seq_id": NaN}', b"nul"]),
).filter(_not_json)
non_object_json = st.one_of(json_scalars, st.lists(json_values, max_size=4)).map(
    lambda v: json.dumps(v).encode()
)


# ---------------------------------------------------------------------------------------------


class Target:
    """A started server with real ids to mix into the fuzzed bodies."""

    def __init__(self, server: LocalServer, ids: dict[str, str], proto: bytes) -> None:
        self.server = server
        self.ids = ids
        self.valid_proto = proto
        self.valid_bodies: dict[str, dict[str, Any]] = {}
        self.http = requests.Session()
        self.headers = {"X-API-Key": server.api_key or ""}

    def send(
        self, method: str, endpoint: str, body: bytes | None, ctype: str | None, **extra: Any
    ) -> requests.Response:
        headers = dict(self.headers)
        if ctype:
            headers["Content-Type"] = ctype
        headers.update(extra.pop("headers", {}))
        path = endpoint if endpoint.startswith("/") else f"/api/v1/{endpoint}"
        return self.http.request(
            method, self.server.url + path, data=body, headers=headers, timeout=TIMEOUT, **extra
        )

    def healthy(self) -> None:
        r = self.send("GET", "healthz", None, None)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        body = {"tags": [], "user_metadata": {}, "sdk_version": "0.38.0", "type": "create_session"}
        r = self.send("POST", "create_session", json.dumps(body).encode(), "application/json")
        assert r.status_code == 200 and r.json()["session_id"]


def check(response: requests.Response, *, must_reject: bool) -> None:
    status = response.status_code
    assert status < 500, (status, response.text[:300])
    if must_reject:
        assert 400 <= status < 500, (status, response.text[:300])
    if status >= 400:
        assert response.content, f"{status} with an empty body"
        payload = response.json()  # raises if the error body is not JSON
        assert isinstance(payload, dict) and payload, payload
        assert any(payload.get(k) for k in ("detail", "error", "message")), payload


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    from tinker_sync._wire._proto import encode_forward_backward_request

    with LocalServer(long_poll_s=0.5, gap_grace_s=1.0) as server:
        service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        training = service.create_lora_training_client("base", rank=4)
        sampler = service.create_sampling_client(base_model="base")
        fut = sampler.sample(
            types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)
        )
        fut.result(HANG)
        path = training.save_state("fuzz").result(HANG).path
        training.optim_step(types.AdamParams()).result(HANG)
        training.load_state(path).result(HANG)
        training.save_weights_for_sampler("fuzz-sampler").result(HANG)
        run_id, _, rest = path[len("tinker://") :].partition("/")
        ids = {
            "session_id": service._session.session_id,
            "model_id": training.model_id,
            "sampling_session_id": sampler.sampler_id,
            "request_id": fut.request_id,
            "path": path,
            "run_id": run_id,
            "checkpoint_id": rest,
        }
        proto = encode_forward_backward_request(
            training.model_id, 10_000, [datum(0), datum(1)], "cross_entropy", None, False
        )
        t = Target(server, ids, bytes(proto))
        t.valid_bodies = {
            r.endpoint: r.json
            for r in server.requests.all()
            if r.status == 200 and isinstance(r.json, dict) and r.json and r.method == "POST"
        }
        assert {"create_model", "asample", "optim_step", "retrieve_future"} <= set(t.valid_bodies)
        try:
            yield t
            t.healthy()
            # the SDK still works end to end (a fresh client: fuzzed requests that happened to
            # be valid may have finished the session or unloaded the model above)
            with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as fresh:
                trainer = fresh.create_lora_training_client("base", rank=4)
                assert trainer.forward_backward([datum(2)], "cross_entropy").result(HANG).metrics
                assert (
                    fresh.create_sampling_client(base_model="base")
                    .sample(types.ModelInput.from_ints([3]), 1, types.SamplingParams(max_tokens=2))
                    .result(HANG)
                    .sequences
                )
            # and nothing ever got a 5xx
            fives = [r for r in server.requests.all() if (r.status or 0) >= 500]
            assert not fives, [(r.method, r.path, r.status) for r in fives[:5]]
        finally:
            t.http.close()
            service.close()


@pytest.fixture
def fuzz(target: Target) -> Iterator[Target]:
    yield target
    target.healthy()  # after every family


# ---------------------------------------------------------------------------------------------
# families


@FUZZ
@given(endpoint=st.sampled_from(REQUIRED_FIELDS + OPTIONAL_FIELDS + PROTO_ENDPOINTS), body=not_json)
def test_non_json_bodies_are_rejected(fuzz: Target, endpoint: str, body: bytes) -> None:
    empty_ok = endpoint in OPTIONAL_FIELDS and not body.strip()  # no body = no fields
    check(fuzz.send("POST", endpoint, body, "application/json"), must_reject=not empty_ok)


@FUZZ
@given(endpoint=st.sampled_from(BODY_IGNORED), body=st.one_of(not_json, non_object_json))
def test_endpoints_that_ignore_the_body(fuzz: Target, endpoint: str, body: bytes) -> None:
    check(fuzz.send("POST", endpoint, body, "application/json"), must_reject=False)


@FUZZ
@given(endpoint=st.sampled_from(REQUIRED_FIELDS + OPTIONAL_FIELDS), body=non_object_json)
def test_json_that_is_not_an_object_is_rejected(fuzz: Target, endpoint: str, body: bytes) -> None:
    check(fuzz.send("POST", endpoint, body, "application/json"), must_reject=True)


@FUZZ
@given(
    endpoint=st.sampled_from(REQUIRED_FIELDS),
    body=st.dictionaries(
        st.text(string.ascii_letters, max_size=12), json_values, max_size=3
    ).filter(lambda d: not set(d) & set(FIELDS)),
)
def test_objects_without_the_required_fields_are_rejected(
    fuzz: Target, endpoint: str, body: dict[str, Any]
) -> None:
    check(
        fuzz.send("POST", endpoint, json.dumps(body).encode(), "application/json"), must_reject=True
    )


@FUZZ
@given(
    endpoint=st.sampled_from(REQUIRED_FIELDS + OPTIONAL_FIELDS),
    data=st.data(),
)
def test_objects_with_protocol_fields_and_random_values(
    fuzz: Target, endpoint: str, data: st.DataObject
) -> None:
    real = st.sampled_from(sorted(fuzz.ids.values()))
    body = data.draw(
        st.dictionaries(st.sampled_from(FIELDS), st.one_of(json_values, real), max_size=6)
    )
    check(
        fuzz.send("POST", endpoint, json.dumps(body).encode(), "application/json"),
        must_reject=False,
    )


@FUZZ
@given(endpoint=st.sampled_from(PROTO_ENDPOINTS + REQUIRED_FIELDS), body=st.binary(max_size=400))
def test_random_protobuf_bytes(fuzz: Target, endpoint: str, body: bytes) -> None:
    response = fuzz.send("POST", endpoint, body, "application/x-protobuf")
    # random bytes cannot name an existing model (its id has 40+ characters): always a 4xx
    check(response, must_reject=True)


@FUZZ
@given(endpoint=st.sampled_from(PROTO_ENDPOINTS), data=st.data())
def test_mutated_valid_protobuf(fuzz: Target, endpoint: str, data: st.DataObject) -> None:
    blob = bytearray(fuzz.valid_proto)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        if not blob:
            break
        i = data.draw(st.integers(0, len(blob) - 1))
        if op == "flip":
            blob[i] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del blob[i:]
        elif op == "insert":
            blob[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del blob[i : i + data.draw(st.integers(1, 8))]
    check(fuzz.send("POST", endpoint, bytes(blob), "application/x-protobuf"), must_reject=False)


@FUZZ
@given(body=st.binary(max_size=200), encoding=st.sampled_from(["zstd", "gzip", "br", "x-unknown"]))
def test_compressed_garbage(fuzz: Target, body: bytes, encoding: str) -> None:
    response = fuzz.send(
        "POST",
        "forward_backward",
        body,
        "application/x-protobuf",
        headers={"Content-Encoding": encoding},
    )
    check(response, must_reject=True)


#: Values that break naive handlers: 64-bit overflow, huge sizes numpy refuses at once (never
#: sizes in 2**27..2**39, which a lenient allocator might actually try to fill), wrong types.
EXTREMES = st.one_of(
    st.sampled_from(
        [
            -1,
            0,
            2**40 + 1,
            2**63,
            2**64,
            2**70,
            -(2**70),
            1e308,
            -1e308,
            0.5,
            -0.0,
            "",
            "x" * 10_000,
            "\u0000",
            [],
            {},
            None,
            True,
            [None],
            {"": None},
        ]
    ),
    json_values,
)


def leaves(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every leaf (and every container) of a JSON value."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += leaves(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:4]):
            out += leaves(v, (*prefix, i))
    return out


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


@FUZZ
@given(data=st.data())
def test_valid_bodies_with_one_extreme_field(fuzz: Target, data: st.DataObject) -> None:
    """A real SDK request body with one field (at any depth) replaced by an extreme value."""
    endpoint = data.draw(st.sampled_from(sorted(fuzz.valid_bodies)))
    body = fuzz.valid_bodies[endpoint]
    path = data.draw(st.sampled_from(leaves(body)))
    mutated = replaced(body, path, data.draw(EXTREMES))
    check(
        fuzz.send("POST", endpoint, json.dumps(mutated).encode(), "application/json"),
        must_reject=False,
    )


path_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "..", "%2e%2e", "a/b", "tinker://x", "x" * 2000, "\u00e9\u4e2d", "%00"]),
)

REST_TEMPLATES = [
    ("GET", "samplers/{a}"),
    ("GET", "training_runs/{a}"),
    ("GET", "training_runs/{a}/checkpoints"),
    ("DELETE", "training_runs/{a}/checkpoints/{b}"),
    ("POST", "training_runs/{a}/checkpoints/{b}/publish"),
    ("DELETE", "training_runs/{a}/checkpoints/{b}/publish"),
    ("PUT", "training_runs/{a}/checkpoints/{b}/ttl"),
    ("GET", "training_runs/{a}/checkpoints/{b}/external_weights_urls"),
    ("GET", "sessions/{a}"),
    ("POST", "sessions/{a}/finish"),
    ("PUT", "sessions/{a}/project"),
    ("GET", "sessions/{a}/trace_export"),
    ("GET", "{a}"),
    ("PATCH", "training_runs/{a}"),
]


@FUZZ
@given(
    template=st.sampled_from(REST_TEMPLATES),
    a=path_text,
    b=path_text,
    body=st.one_of(not_json, non_object_json, st.none()),
)
def test_rest_paths_with_fuzzed_parameters(
    fuzz: Target, template: tuple[str, str], a: str, b: str, body: bytes | None
) -> None:
    method, pattern = template
    endpoint = pattern.format(a=quote(a, safe=""), b=quote(b, safe="/"))
    check(
        fuzz.send(method, endpoint, body, "application/json" if body else None), must_reject=False
    )


@FUZZ
@given(
    endpoint=st.sampled_from(["training_runs", "checkpoints", "sessions"]),
    params=st.dictionaries(
        st.sampled_from(["limit", "offset", "access_scope", "cursor", "x"]),
        st.one_of(st.text(max_size=12), st.integers(-(2**70), 2**70).map(str)),
        max_size=3,
    ),
)
def test_rest_queries_with_fuzzed_parameters(
    fuzz: Target, endpoint: str, params: dict[str, str]
) -> None:
    check(fuzz.send("GET", endpoint, None, None, params=params), must_reject=False)


def test_valid_requests_still_work_after_the_fuzzing(target: Target) -> None:
    """Explicit end-of-module check (the module fixture re-checks at teardown)."""
    target.healthy()
    r = target.send(
        "POST",
        "get_info",
        json.dumps({"model_id": target.ids["model_id"], "type": "get_info"}).encode(),
        "application/json",
    )
    assert r.status_code == 200, r.text
    assert r.json()["model_id"] == target.ids["model_id"]


def test_regressions_found_by_this_fuzzer(target: Target) -> None:
    """Each of these once got a 500 or froze the whole server (fixed in tinker_sync.local)."""
    # offset beyond SQLite's 64-bit integers: was a 500 (OverflowError)
    for endpoint in ("training_runs", "checkpoints", "sessions"):
        r = target.send("GET", endpoint, None, None, params={"offset": str(2**63)})
        check(r, must_reject=True)
    # a 64-bit-overflowing id in a JSON body headed for SQLite: was a 500
    body = dict(target.valid_bodies["create_sampling_session"], sampling_session_seq_id=2**63)
    check(
        target.send(
            "POST", "create_sampling_session", json.dumps(body).encode(), "application/json"
        ),
        must_reject=True,
    )
    # num_samples=2**40: the event loop built 2**40 sequence ids, stalling every client
    body = dict(target.valid_bodies["asample"], num_samples=2**40, seq_id=987_654)
    response = target.send("POST", "asample", json.dumps(body).encode(), "application/json")
    check(response, must_reject=True)
    assert "num_samples" in response.json()["detail"]
