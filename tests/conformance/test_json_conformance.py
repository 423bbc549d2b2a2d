"""JSON conformance against the official ``tinker`` SDK (the oracle),
docs/design/behavior.md#json-encoding-rules.

* Every request type: our ``to_json`` equals the official ``model_dump(mode="json",
  exclude_none=True)`` (what every official ``resources/*.py`` call sends).
* The null allowlist (finish ``detail``, TTL ``ttl_seconds``) and a few session bodies are
  checked against what the official client actually puts on the wire, recorded by a tiny HTTP
  server on 127.0.0.1.
* Official reply JSON parses into our types; field names and defaults match the official models;
  the data helpers (TensorData, Datum, tinker paths, top-k, dmel) build identical values.
"""

import datetime as dt
import inspect
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import numpy as np
import pytest
from _oracle import require

O = require("tinker.types")  # noqa: E741
tinker = require("tinker")
pydantic = require("pydantic")

from tinker.types._pydantic_types.tensor_data import TensorData as OfficialTensorModel  # noqa: E402
from tinker.types.futures_retrieve_request import (  # noqa: E402
    SamplingSessionFuturesTarget as OfficialTarget,
)
from tinker.types.generic_event import GenericEvent as OfficialGenericEvent  # noqa: E402
from tinker.types.session_end_event import SessionEndEvent as OfficialSessionEndEvent  # noqa: E402
from tinker.types.session_start_event import SessionStartEvent as OfficialSessionStartEvent  # noqa: E402
from tinker.types.unhandled_exception_event import (  # noqa: E402
    UnhandledExceptionEvent as OfficialUnhandledExceptionEvent,
)

from tinker_sync import types as T  # noqa: E402


def _official(name: str) -> Any:
    """An official type by name, from ``tinker.types`` or one of its modules."""
    import importlib
    import pkgutil

    if hasattr(O, name):
        return getattr(O, name)
    for info in pkgutil.walk_packages(O.__path__, "tinker.types."):
        module = importlib.import_module(info.name)
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(name)


OX = type("OX", (), {"__getattr__": lambda self, name: _official(name)})()
from tinker_sync._wire._converter import from_json, to_json  # noqa: E402

TS = dt.datetime(2026, 11, 21, 15, 38, 6, 763637, tzinfo=dt.timezone.utc)
PNG = b"\x89PNG\r\n\x1a\n"
DMEL = b"\xfe\x01\x02\x05\x03rest"


def _pair(name: str, official: Any, ours: Any) -> Any:
    return pytest.param(official, ours, id=name)


REQUESTS = [
    _pair("sp-defaults", O.SamplingParams(), T.SamplingParams()),
    _pair(
        "sp-stop-none-max",
        O.SamplingParams(max_tokens=16, seed=7),
        T.SamplingParams(max_tokens=16, seed=7),
    ),
    _pair("sp-stop-empty", O.SamplingParams(stop=[]), T.SamplingParams(stop=[])),
    _pair("sp-stop-str", O.SamplingParams(stop="\n\n"), T.SamplingParams(stop="\n\n")),
    _pair("sp-stop-strs", O.SamplingParams(stop=["a", "b"]), T.SamplingParams(stop=["a", "b"])),
    _pair(
        "sp-stop-ints",
        O.SamplingParams(stop=[0, 2], temperature=0.7, top_k=50, top_p=0.9),
        T.SamplingParams(stop=[0, 2], temperature=0.7, top_k=50, top_p=0.9),
    ),
    _pair("sp-int-temperature", O.SamplingParams(temperature=0), T.SamplingParams(temperature=0)),
    _pair("lora", O.LoraConfig(rank=32), T.LoraConfig(rank=32)),
    _pair(
        "lora-seed",
        O.LoraConfig(rank=8, seed=3, train_unembed=False, train_attn=False),
        T.LoraConfig(rank=8, seed=3, train_unembed=False, train_attn=False),
    ),
    _pair("adam", O.AdamParams(), T.AdamParams()),
    _pair(
        "adam-custom",
        O.AdamParams(learning_rate=3e-4, beta2=0.999, weight_decay=0.01, grad_clip_norm=1.0),
        T.AdamParams(learning_rate=3e-4, beta2=0.999, weight_decay=0.01, grad_clip_norm=1.0),
    ),
    _pair(
        "dimuon",
        O.DimuonParams(learning_rate=0.02, beta1=0.5),
        T.DimuonParams(learning_rate=0.02, beta1=0.5),
    ),
    _pair("adam-config", O.AdamOptimizerConfig(), T.AdamOptimizerConfig()),
    _pair("dimuon-config", O.DimuonOptimizerConfig(), T.DimuonOptimizerConfig()),
    _pair(
        "chunk-text",
        O.EncodedTextChunk(tokens=[1, 2, 3]),
        T.EncodedTextChunk(tokens=np.array([1, 2, 3], dtype=np.int32)),
    ),
    _pair(
        "chunk-image",
        O.ImageChunk(data=PNG, format="png", expected_tokens=4),
        T.ImageChunk(data=PNG, format="png", expected_tokens=4),
    ),
    _pair(
        "chunk-image-no-tokens",
        O.ImageChunk(data=PNG, format="jpeg"),
        T.ImageChunk(data=PNG, format="jpeg"),
    ),
    _pair(
        "chunk-image-pointer",
        O.ImageAssetPointerChunk(format="png", location="s3://b/k"),
        T.ImageAssetPointerChunk(format="png", location="s3://b/k"),
    ),
    _pair(
        "chunk-image-pointer-tokens",
        O.ImageAssetPointerChunk(format="jpeg", location="https://x/y.jpg", expected_tokens=9),
        T.ImageAssetPointerChunk(format="jpeg", location="https://x/y.jpg", expected_tokens=9),
    ),
    _pair("chunk-dmel", O.DmelChunk(dmel=DMEL), T.DmelChunk(dmel=DMEL)),
    _pair(
        "model-input-mixed",
        O.ModelInput.from_ints([5, 6])
        .append(O.ImageChunk(data=PNG, format="png", expected_tokens=2))
        .append_int(7),
        T.ModelInput.from_ints([5, 6])
        .append(T.ImageChunk(data=PNG, format="png", expected_tokens=2))
        .append_int(7),
    ),
    _pair("model-input-empty", O.ModelInput.empty(), T.ModelInput.empty()),
    _pair(
        "client-config",
        O.ClientConfigRequest(sdk_version="0.38.0"),
        T.ClientConfigRequest(sdk_version="0.38.0"),
    ),
    _pair(
        "create-session",
        O.CreateSessionRequest(tags=[], user_metadata={"a": "b"}, sdk_version="0.38.0"),
        T.CreateSessionRequest(tags=[], user_metadata={"a": "b"}, sdk_version="0.38.0"),
    ),
    _pair(
        "create-session-full",
        O.CreateSessionRequest(
            tags=["x", "y"],
            user_metadata=None,
            sdk_version="0.38.0",
            project_id="proj",
            display_name="run",
        ),
        T.CreateSessionRequest(
            tags=["x", "y"],
            user_metadata=None,
            sdk_version="0.38.0",
            project_id="proj",
            display_name="run",
        ),
    ),
    _pair(
        "heartbeat",
        O.SessionHeartbeatRequest(session_id="s"),
        T.SessionHeartbeatRequest(session_id="s"),
    ),
    _pair(
        "create-model",
        O.CreateModelRequest(
            session_id="sess1",
            model_seq_id=0,
            base_model="Qwen/Qwen3-8B",
            lora_config=O.LoraConfig(rank=8),
        ),
        T.CreateModelRequest(
            session_id="sess1",
            model_seq_id=0,
            base_model="Qwen/Qwen3-8B",
            lora_config=T.LoraConfig(rank=8),
        ),
    ),
    _pair(
        "create-model-dimuon",
        O.CreateModelRequest(
            session_id="s",
            model_seq_id=3,
            base_model="b",
            user_metadata={"k": [1, 2]},
            optimizer_config=O.DimuonOptimizerConfig(),
        ),
        T.CreateModelRequest(
            session_id="s",
            model_seq_id=3,
            base_model="b",
            user_metadata={"k": [1, 2]},
            optimizer_config=T.DimuonOptimizerConfig(),
        ),
    ),
    _pair(
        "get-info",
        O.GetInfoRequest(model_id="sess1:train:0"),
        T.GetInfoRequest(model_id="sess1:train:0"),
    ),
    _pair(
        "optim-adam",
        O.OptimStepRequest(model_id="sess1:train:0", seq_id=2, optim_params=O.AdamParams()),
        T.OptimStepRequest(model_id="sess1:train:0", seq_id=2, optim_params=T.AdamParams()),
    ),
    _pair(
        "optim-adam-alias",
        O.OptimStepRequest(model_id="m", seq_id=9, adam_params=O.AdamParams(learning_rate=1e-5)),
        T.OptimStepRequest(model_id="m", seq_id=9, adam_params=T.AdamParams(learning_rate=1e-5)),
    ),
    _pair(
        "optim-dimuon",
        O.OptimStepRequest(model_id="m", seq_id=2, optim_params=O.DimuonParams(learning_rate=0.1)),
        T.OptimStepRequest(model_id="m", seq_id=2, optim_params=T.DimuonParams(learning_rate=0.1)),
    ),
    _pair(
        "save-weights",
        O.SaveWeightsRequest(model_id="m", path="step1", seq_id=3),
        T.SaveWeightsRequest(model_id="m", path="step1", seq_id=3),
    ),
    _pair(
        "save-weights-full",
        O.SaveWeightsRequest(
            model_id="m",
            path="n",
            seq_id=3,
            ttl_seconds=3600,
            overwrite=True,
            user_metadata={"a": "b"},
        ),
        T.SaveWeightsRequest(
            model_id="m",
            path="n",
            seq_id=3,
            ttl_seconds=3600,
            overwrite=True,
            user_metadata={"a": "b"},
        ),
    ),
    _pair(
        "save-sampler-named",
        O.SaveWeightsForSamplerRequest(model_id="m", path="n", seq_id=4),
        T.SaveWeightsForSamplerRequest(model_id="m", path="n", seq_id=4),
    ),
    _pair(
        "save-sampler-ephemeral",
        O.SaveWeightsForSamplerRequest(
            model_id="m", sampling_session_seq_id=1, seq_id=4, kind="inflight"
        ),
        T.SaveWeightsForSamplerRequest(
            model_id="m", sampling_session_seq_id=1, seq_id=4, kind="inflight"
        ),
    ),
    _pair(
        "save-external",
        O.SaveWeightsExternalRequest(
            model_id="m",
            path="e",
            seq_id=5,
            ttl_seconds=86400,
            age_encryption_recipients=["age1xyz"],
        ),
        T.SaveWeightsExternalRequest(
            model_id="m",
            path="e",
            seq_id=5,
            ttl_seconds=86400,
            age_encryption_recipients=["age1xyz"],
        ),
    ),
    _pair(
        "load-create",
        O.LoadWeightsRequest(
            session_id="s", model_seq_id=1, path="tinker://r/weights/x", optimizer=True
        ),
        T.LoadWeightsRequest(
            session_id="s", model_seq_id=1, path="tinker://r/weights/x", optimizer=True
        ),
    ),
    _pair(
        "load-create-full",
        O.LoadWeightsRequest(
            session_id="s",
            model_seq_id=1,
            path="tinker://r/weights/x",
            optimizer=False,
            base_model="b",
            user_metadata={"u": 1},
            optimizer_config=O.DimuonOptimizerConfig(),
            weights_access_token="tok",
        ),
        T.LoadWeightsRequest(
            session_id="s",
            model_seq_id=1,
            path="tinker://r/weights/x",
            optimizer=False,
            base_model="b",
            user_metadata={"u": 1},
            optimizer_config=T.DimuonOptimizerConfig(),
            weights_access_token="tok",
        ),
    ),
    _pair(
        "load-legacy",
        O.LoadWeightsRequest(model_id="m", seq_id=4, path="tinker://r/weights/x", optimizer=True),
        T.LoadWeightsRequest(model_id="m", seq_id=4, path="tinker://r/weights/x", optimizer=True),
    ),
    _pair(
        "create-sampling-session",
        O.CreateSamplingSessionRequest(
            session_id="s", sampling_session_seq_id=0, base_model="Qwen/Qwen3-8B"
        ),
        T.CreateSamplingSessionRequest(
            session_id="s", sampling_session_seq_id=0, base_model="Qwen/Qwen3-8B"
        ),
    ),
    _pair(
        "create-sampling-session-path",
        O.CreateSamplingSessionRequest(
            session_id="s", sampling_session_seq_id=2, model_path="tinker://r/sampler_weights/x"
        ),
        T.CreateSamplingSessionRequest(
            session_id="s", sampling_session_seq_id=2, model_path="tinker://r/sampler_weights/x"
        ),
    ),
    _pair(
        "join-sampling-session",
        O.JoinSamplingSessionRequest(sampling_session_id="s:sample:0"),
        T.JoinSamplingSessionRequest(sampling_session_id="s:sample:0"),
    ),
    _pair(
        "sample-basic",
        O.SampleRequest(
            num_samples=2,
            prompt=O.ModelInput.from_ints([1, 2, 3]),
            sampling_params=O.SamplingParams(max_tokens=3, stop=[0]),
            sampling_session_id="sess1:sample:0",
            seq_id=0,
            prompt_logprobs=False,
            record_stability_info=False,
        ),
        T.SampleRequest(
            num_samples=2,
            prompt=T.ModelInput.from_ints([1, 2, 3]),
            sampling_params=T.SamplingParams(max_tokens=3, stop=[0]),
            sampling_session_id="sess1:sample:0",
            seq_id=0,
            prompt_logprobs=False,
            record_stability_info=False,
        ),
    ),
    _pair(
        "sample-all-optionals",
        O.SampleRequest(
            prompt=O.ModelInput.from_ints([1, 2, 3]),
            sampling_params=O.SamplingParams(max_tokens=1, stop="x"),
            sampling_session_id="s:sample:1",
            seq_id=1_000_000_001,
            prompt_logprobs=True,
            topk_prompt_logprobs=5,
            topk_sample_logprobs=2,
            target_prompt_logprobs=OfficialTensorModel(
                data=[4, -1, 6, 7], dtype="int64", shape=[2, 2]
            ),
            prompt_alt_tokens_k=3,
            prompt_logprobs_last_n=2,
            record_stability_info=True,
        ),
        T.SampleRequest(
            prompt=T.ModelInput.from_ints([1, 2, 3]),
            sampling_params=T.SamplingParams(max_tokens=1, stop="x"),
            sampling_session_id="s:sample:1",
            seq_id=1_000_000_001,
            prompt_logprobs=True,
            topk_prompt_logprobs=5,
            topk_sample_logprobs=2,
            target_prompt_logprobs=T.TensorData(data=[4, -1, 6, 7], dtype="int64", shape=[2, 2]),
            prompt_alt_tokens_k=3,
            prompt_logprobs_last_n=2,
            record_stability_info=True,
        ),
    ),
    _pair(
        "sample-sparse-target",
        O.SampleRequest(
            prompt=O.ModelInput.from_ints([1, 2, 3]),
            sampling_params=O.SamplingParams(),
            prompt_logprobs=False,
            record_stability_info=False,
            target_prompt_logprobs=OfficialTensorModel(
                data=[9],
                dtype="int64",
                shape=[2, 3],
                sparse_crow_indices=[0, 1, 1],
                sparse_col_indices=[2],
            ),
        ),
        T.SampleRequest(
            prompt=T.ModelInput.from_ints([1, 2, 3]),
            sampling_params=T.SamplingParams(),
            prompt_logprobs=False,
            record_stability_info=False,
            target_prompt_logprobs=T.TensorData(
                data=[9],
                dtype="int64",
                shape=[2, 3],
                sparse_crow_indices=[0, 1, 1],
                sparse_col_indices=[2],
            ),
        ),
    ),
    _pair(
        "sample-model-path",
        O.SampleRequest(
            prompt=O.ModelInput.from_ints([1]),
            sampling_params=O.SamplingParams(),
            model_path="tinker://r/sampler_weights/s",
            base_model="b",
            prompt_logprobs=False,
            record_stability_info=False,
        ),
        T.SampleRequest(
            prompt=T.ModelInput.from_ints([1]),
            sampling_params=T.SamplingParams(),
            model_path="tinker://r/sampler_weights/s",
            base_model="b",
            prompt_logprobs=False,
            record_stability_info=False,
        ),
    ),
    _pair(
        "retrieve-future",
        O.FutureRetrieveRequest(request_id="s:sample:0:1", allow_metadata_only=True),
        T.FutureRetrieveRequest(request_id="s:sample:0:1", allow_metadata_only=True),
    ),
    _pair(
        "retrieve-future-default",
        O.FutureRetrieveRequest(request_id="r"),
        T.FutureRetrieveRequest(request_id="r"),
    ),
    _pair(
        "retrieve-futures",
        O.FuturesRetrieveRequest(
            target=OfficialTarget(sampling_session_id="s:sample:0"),
            retrieved_request_ids=["a", "b"],
        ),
        T.FuturesRetrieveRequest(
            target=T.SamplingSessionFuturesTarget(sampling_session_id="s:sample:0"),
            retrieved_request_ids=["a", "b"],
        ),
    ),
    _pair(
        "retrieve-futures-ack",
        O.FuturesRetrieveRequest(
            target=OfficialTarget(sampling_session_id="x", cloned_sampler_id=2),
            prev_cursor=5,
            timeout=0.0,
        ),
        T.FuturesRetrieveRequest(
            target=T.SamplingSessionFuturesTarget(sampling_session_id="x", cloned_sampler_id=2),
            prev_cursor=5,
            timeout=0.0,
        ),
    ),
    _pair(
        "copy-weights-project",
        O.CopyWeightsRequest(
            source_path="tinker://a/weights/b", destination_project_id="p", ttl_seconds=3600
        ),
        T.CopyWeightsRequest(
            source_path="tinker://a/weights/b", destination_project_id="p", ttl_seconds=3600
        ),
    ),
    _pair(
        "copy-weights-session",
        O.CopyWeightsRequest(
            source_path="tinker://a/sampler_weights/b", session_id="s", model_seq_id=4
        ),
        T.CopyWeightsRequest(
            source_path="tinker://a/sampler_weights/b", session_id="s", model_seq_id=4
        ),
    ),
    _pair("unload-model", O.UnloadModelRequest(model_id="m"), T.UnloadModelRequest(model_id="m")),
    _pair("session-search-defaults", O.SessionSearchRequest(), T.SessionSearchRequest()),
    _pair(
        "session-search-full",
        O.SessionSearchRequest(
            session_id="s",
            project_ids=["p"],
            user_metadata={"k": "v"},
            display_name="d",
            owner=O.UserSearchOwner(owner_urns=["tml:user:1"]),
            statuses=[
                O.ActiveSessionStatusQuery(),
                O.ClientFinishedSessionStatusQuery(reasons=["success", "errored"]),
            ],
            limit=10,
            cursor=O.SessionSearchCursor(last_created_at=TS, last_session_id="s0"),
        ),
        T.SessionSearchRequest(
            session_id="s",
            project_ids=["p"],
            user_metadata={"k": "v"},
            display_name="d",
            owner=T.UserSearchOwner(owner_urns=["tml:user:1"]),
            statuses=[
                T.ActiveSessionStatusQuery(),
                T.ClientFinishedSessionStatusQuery(reasons=["success", "errored"]),
            ],
            limit=10,
            cursor=T.SessionSearchCursor(last_created_at=TS, last_session_id="s0"),
        ),
    ),
    _pair(
        "telemetry",
        O.TelemetrySendRequest(
            events=[
                OfficialSessionStartEvent(
                    event="SESSION_START",
                    event_id="e0",
                    event_session_index=0,
                    severity="INFO",
                    timestamp=TS,
                ),
                OfficialGenericEvent(
                    event="GENERIC_EVENT",
                    event_id="e1",
                    event_name="n",
                    event_session_index=1,
                    severity="DEBUG",
                    timestamp=TS,
                    event_data={"a": 1, "b": [True, None]},
                ),
                OfficialUnhandledExceptionEvent(
                    event="UNHANDLED_EXCEPTION",
                    event_id="e2",
                    event_session_index=2,
                    severity="ERROR",
                    timestamp=TS,
                    error_type="ValueError",
                    error_message="boom",
                ),
                OfficialSessionEndEvent(
                    event="SESSION_END",
                    event_id="e3",
                    duration="0:00:05",
                    event_session_index=3,
                    severity="INFO",
                    timestamp=TS,
                ),
            ],
            platform="Linux",
            sdk_version="0.38.0",
            session_id="s",
            process_uuid="u",
        ),
        T.TelemetrySendRequest(
            events=[
                T.SessionStartEvent(
                    event_id="e0", event_session_index=0, severity="INFO", timestamp=TS
                ),
                T.GenericEvent(
                    event_id="e1",
                    event_name="n",
                    event_session_index=1,
                    severity="DEBUG",
                    timestamp=TS,
                    event_data={"a": 1, "b": [True, None]},
                ),
                T.UnhandledExceptionEvent(
                    event_id="e2",
                    event_session_index=2,
                    severity="ERROR",
                    timestamp=TS,
                    error_type="ValueError",
                    error_message="boom",
                ),
                T.SessionEndEvent(
                    event_id="e3",
                    duration="0:00:05",
                    event_session_index=3,
                    severity="INFO",
                    timestamp=TS,
                ),
            ],
            platform="Linux",
            sdk_version="0.38.0",
            session_id="s",
            process_uuid="u",
        ),
    ),
]


def test_table_is_large_enough() -> None:
    assert len(REQUESTS) >= 30


@pytest.mark.parametrize("official,ours", REQUESTS)
def test_request_json_matches_official(official: Any, ours: Any) -> None:
    expected = official.model_dump(mode="json", exclude_none=True)
    got = to_json(ours)
    assert got == expected
    # identical text too (key order aside): floats stay floats, ints stay ints
    assert json.loads(json.dumps(got)) == json.loads(official.model_dump_json(exclude_none=True))
    assert _types_tree(got) == _types_tree(expected)
    # and our strict parser accepts what the official SDK sends
    assert to_json(from_json(type(ours), expected)) == expected


def _types_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types_tree(v) for v in value]
    return type(value).__name__


# -- what the official client actually sends (null allowlist) ---------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    records: list[tuple[str, str, Any]] = []
    REPLIES: dict[str, Any] = {
        "/api/v1/client/config": {"use_pyqwest_transport": False},
        "/api/v1/create_session": {"session_id": "sess1"},
        "/api/v1/create_sampling_session": {"sampling_session_id": "sess1:sample:0"},
        "/api/v1/session_heartbeat": {"type": "session_heartbeat"},
        "/api/v1/telemetry": {"status": "accepted"},
    }

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        self.records.append((self.command, path, json.loads(raw) if raw else None))
        body = json.dumps(self.REPLIES.get(path, {})).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def official_wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, str, Any]]]:
    """Drive the official client against a recording server; yield (method, path, body)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TINKER_TELEMETRY", "0")
    mp.delenv("TINKER_TAGS", raising=False)
    mp.delenv("TINKER_PROJECT_ID", raising=False)
    records: list[tuple[str, str, Any]] = []
    handler = type("Handler", (_Recorder,), {"records": records})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base_url = f"http://127.0.0.1:{server.server_port}"
        rest = tinker.RestClient(base_url=base_url, api_key="tml-conformance")
        rest.set_checkpoint_ttl_from_tinker_path("tinker://r/weights/x", None).result(timeout=60)
        rest.set_checkpoint_ttl_from_tinker_path("tinker://r/weights/x", 7200).result(timeout=60)
        service = tinker.ServiceClient(
            base_url=base_url, api_key="tml-conformance", user_metadata={"k": "v"}
        )
        service.create_sampling_client(base_model="Qwen/Qwen3-8B")
        service.close("errored").result(timeout=60)
        yield list(records)
    finally:
        server.shutdown()
        server.server_close()
        mp.undo()


def _bodies(records: list[tuple[str, str, Any]], suffix: str) -> list[Any]:
    return [body for _, path, body in records if path.endswith(suffix)]


def test_ttl_null_matches_official_wire(official_wire: list[tuple[str, str, Any]]) -> None:
    bodies = _bodies(official_wire, "/ttl")
    assert bodies == [
        to_json(T.SetCheckpointTTLRequest(ttl_seconds=None)),
        to_json(T.SetCheckpointTTLRequest(ttl_seconds=7200)),
    ]
    assert bodies[0] == {"ttl_seconds": None}


def test_finish_null_detail_matches_official_wire(
    official_wire: list[tuple[str, str, Any]],
) -> None:
    bodies = _bodies(official_wire, "/sessions/sess1/finish")
    assert bodies == [to_json(T.FinishSessionRequest(reason="errored"))]
    assert bodies[0] == {"reason": {"type": "errored"}, "detail": None}


def test_session_bodies_match_official_wire(official_wire: list[tuple[str, str, Any]]) -> None:
    assert _bodies(official_wire, "/client/config")[0] == to_json(
        T.ClientConfigRequest(sdk_version=tinker.__version__)
    )
    assert _bodies(official_wire, "/create_session") == [
        to_json(
            T.CreateSessionRequest(
                tags=[], user_metadata={"k": "v"}, sdk_version=tinker.__version__
            )
        )
    ]
    assert _bodies(official_wire, "/create_sampling_session") == [
        to_json(
            T.CreateSamplingSessionRequest(
                session_id="sess1", sampling_session_seq_id=0, base_model="Qwen/Qwen3-8B"
            )
        )
    ]


# -- replies: official JSON parses into our types -------------------------------------------------------

CHECKPOINT = OX.Checkpoint(
    checkpoint_id="weights/s1",
    checkpoint_type="training",
    time=TS,
    tinker_path="tinker://r/weights/s1",
    size_bytes=10,
    public=True,
    user_metadata={"a": "b"},
    expires_at=TS,
)
RESPONSES = [
    OX.CreateSessionResponse(session_id="s", warning_message="careful"),
    OX.CreateModelResponse(model_id="s:train:0"),
    OX.CreateSamplingSessionResponse(sampling_session_id="s:sample:0"),
    OX.JoinSamplingSessionResponse(client_counter=3),
    OX.SessionHeartbeatResponse(),
    OX.UntypedAPIFuture(request_id="r", model_id="m", sample_sequence_ids=["a", "b"]),
    OX.TryAgainResponse(request_id="r", queue_state="paused_rate_limit"),
    OX.RequestFailedResponse(error="bad input", category=OX.RequestErrorCategory.User),
    OX.ClientConfigResponse(),
    OX.ClientConfigResponse(
        pjwt_auth_enabled=True, fwdbwd_max_chunk_len=7, sample_use_retrieve_futures=True
    ),
    OX.ClientDynamicConfigResponse(sample_cancel_enabled=True),
    OX.FuturesRetrieveResponse.model_validate(
        {
            "completions": [
                {"state": "finished", "request_id": "a", "response_payload_uncompressed_size": 5},
                {"state": "failed", "request_id": "b"},
            ],
            "cursor": 9,
        }
    ),
    OX.GetInfoResponse(
        model_id="m",
        model_data=OX.ModelData(
            arch="qwen", model_name="Qwen/Qwen3-8B", tokenizer_id="Qwen/Qwen3-8B:x"
        ),
        is_lora=True,
        lora_rank=8,
        type="get_info",
    ),
    OX.GetInfoResponse(
        model_id="m", model_data=OX.ModelData(), optimizer_config=OX.DimuonOptimizerConfig()
    ),
    OX.GetServerCapabilitiesResponse(
        supported_models=[
            OX.SupportedModel(model_name="a", max_context_length=4096, trainable=True),
            OX.SupportedModel(),
        ]
    ),
    OX.WeightsInfoResponse(base_model="b", is_lora=True, lora_rank=4, train_mlp=False),
    CHECKPOINT,
    OX.TrainingRun(
        training_run_id="r",
        base_model="b",
        model_owner="o",
        is_lora=False,
        last_request_time=TS,
        last_checkpoint=CHECKPOINT,
        user_metadata={"x": "y"},
    ),
    OX.TrainingRunsResponse(training_runs=[], cursor=OX.Cursor(offset=0, limit=20, total_count=0)),
    OX.CheckpointsListResponse(checkpoints=[CHECKPOINT]),
    OX.ExternalWeightsUrlsResponse(urls={"model.safetensors": "https://x"}, expires=TS),
    OX.GetSessionResponse(training_run_ids=["a"], sampler_ids=[], display_name="d"),
    OX.ListSessionsResponse(sessions=["s1", "s2"]),
    OX.GetSamplerResponse(
        sampler_id="s", base_model="b", model_path="tinker://r/sampler_weights/x"
    ),
    OX.WhoamiResponse(user_urn="u", org_urn="o", email="e@x"),
    OX.SaveWeightsResponse(path="tinker://r/weights/n", type="save_weights"),
    OX.SaveWeightsForSamplerResponseInternal(sampling_session_id="s:sample:3"),
    OX.SaveWeightsForSamplerResponseInternal(path="tinker://r/sampler_weights/n"),
    OX.SaveWeightsExternalResponseInternal(path="tinker://r/external_weights/n", size_bytes=99),
    OX.LoadWeightsResponse(path="tinker://r/weights/n", model_id="m"),
    OX.OptimStepResponse(metrics={"grad_norm:mean": 0.5}),
    OX.OptimStepResponse(),
    OX.CopyWeightsResponse(tinker_path="tinker://r2/weights/n"),
    OX.HealthResponse(status="ok"),
    OX.TelemetryResponse(status="accepted"),
    OX.AuthTokenResponse(jwt="a.b.c"),
    OX.UnloadModelResponse(model_id="m"),
    OX.SessionSearchResponse.model_validate(
        {
            "sessions": [
                {
                    "session_id": "a",
                    "created_at": "2024-01-01T00:00:00Z",
                    "owner": "o",
                    "project_id": "p",
                    "checkpoints_count": 2,
                    "status": {"type": "client_finished", "reason": {"type": "interrupted"}},
                },
                {
                    "session_id": "b",
                    "created_at": "2024-01-01T00:00:00Z",
                    "owner": "o",
                    "project_id": "p",
                    "checkpoints_count": 0,
                    "checkpoint_storage_bytes": 5,
                    "status": {
                        "type": "failed",
                        "category": "internal",
                        "message": "m",
                        "reason": {"type": "sampling_session", "sampling_session_id": "x"},
                    },
                },
                {
                    "session_id": "c",
                    "created_at": "2024-01-01T00:00:00Z",
                    "owner": "o",
                    "project_id": "p",
                    "checkpoints_count": 0,
                    "status": {"type": "cancelled"},
                },
            ],
            "next_cursor": {"last_created_at": "2024-01-01T00:00:00Z", "last_session_id": "c"},
        }
    ),
    OX.BillingUsageResponse.model_validate(
        {
            "data": [
                {
                    "bucket_start": "2024-01-01T00:00:00Z",
                    "bucket_end": "2024-01-01T01:00:00Z",
                    "base_model": "b",
                    "estimated_cost_usd": 1.5,
                    "event_info": {"type": "sampling_prefill", "cached": True, "token_count": 10},
                },
                {
                    "bucket_start": "2024-01-01T00:00:00Z",
                    "bucket_end": "2024-01-01T01:00:00Z",
                    "event_info": {"type": "storage", "gigabyte_hours": 2.0},
                },
            ],
            "sessions": {"s": {"user_metadata": {"a": "b"}}},
            "cost_data_through": "2024-01-02T00:00:00Z",
        }
    ),
    OX.CurrentCheckpointStorageUsageResponse.model_validate(
        {
            "data": [
                {"checkpoint_count": 3, "size_bytes": 10, "size_gigabytes": 1e-8, "project_id": "p"}
            ]
        }
    ),
    OX.AuditLogResponse.model_validate(
        {
            "entries": [
                {
                    "timestamp": "2024-01-01T00:00:00Z",
                    "event": "checkpoint.delete",
                    "event_details": {"n": 1},
                    "tinker_path": "tinker://r/weights/a",
                }
            ]
        }
    ),
]

_OUR_NAME = {
    "SaveWeightsForSamplerResponseInternal": "SaveWeightsForSamplerResponse",
    "SaveWeightsExternalResponseInternal": "SaveWeightsExternalResponse",
}


@pytest.mark.parametrize("official", RESPONSES, ids=lambda o: type(o).__name__)
def test_official_reply_parses(official: Any) -> None:
    name = type(official).__name__
    ours_cls = getattr(T, _OUR_NAME.get(name, name))
    data = official.model_dump(mode="json")
    data["some_future_field"] = {"ignored": True}
    ours = from_json(ours_cls, data)
    assert to_json(ours) == official.model_dump(mode="json", exclude_none=True)


# -- field names and defaults ---------------------------------------------------------------------------

# Deliberate, documented differences (docs/design/behavior.md#deliberate-differences).
_DEFAULT_DIFFS = {
    ("SampleRequest", "prompt_logprobs"),  # always sent: False, not None
    ("SampleRequest", "record_stability_info"),
    ("RequestFailedResponse", "category"),  # missing -> Unknown
    ("SessionStartEvent", "event"),  # discriminator defaults to the event's own kind
    ("SessionEndEvent", "event"),
    ("UnhandledExceptionEvent", "event"),
    ("SaveWeightsForSamplerResponse", "path"),  # ephemeral saves carry no path
    ("CreateSessionRequest", "user_metadata"),  # None is dropped on the wire, so it must default
    ("SaveWeightsExternalResponseInternal", "path"),  # required: the SDK asserts a path anyway
}
_EXTRA_FIELDS = {
    "SaveWeightsForSamplerResponse": {"sampling_session_id"},
    "SaveWeightsExternalResponse": {"size_bytes"},
    "TryAgainResponse": {"queue_state_reason"},
}


def _official_models() -> list[type]:
    out = []
    for name in dir(O):
        obj = getattr(O, name)
        if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and hasattr(T, name):
            out.append(obj)
    return out


@pytest.mark.parametrize("official_cls", _official_models(), ids=lambda c: c.__name__)
def test_field_names_and_defaults_match(official_cls: type) -> None:
    ours = getattr(T, official_cls.__name__)
    official_fields = official_cls.model_fields  # type: ignore[attr-defined]
    our_fields = {a.name: a for a in attrs.fields(ours)}
    extra = _EXTRA_FIELDS.get(official_cls.__name__, set())
    assert set(our_fields) - extra == set(official_fields)
    for name, info in official_fields.items():
        if (official_cls.__name__, name) in _DEFAULT_DIFFS:
            continue
        ours_default = our_fields[name].default
        if info.is_required():
            assert ours_default is attrs.NOTHING, name
            continue
        expected = info.default_factory() if info.default_factory else info.default
        got = ours_default.factory() if isinstance(ours_default, attrs.Factory) else ours_default  # type: ignore[arg-type]
        if hasattr(expected, "model_dump"):
            assert to_json(got) == expected.model_dump(mode="json"), name
        else:
            assert got == expected and type(got) in (type(expected), float), name


# -- data helpers build identical values ------------------------------------------------------------------

ARRAYS = [
    np.arange(6, dtype=np.int32).reshape(2, 3),
    np.linspace(-1, 1, 5),
    np.array([[1.5, -2.25]], dtype=np.float16),
    np.array([], dtype=np.int64),
    np.array([3, 1, 2], dtype=">i8"),
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_tensor_from_numpy_matches_official(arr: np.ndarray) -> None:
    official = O.TensorData.from_numpy(arr)
    ours = T.TensorData.from_numpy(arr)
    assert (ours.dtype, ours.shape, ours.data) == (official.dtype, official.shape, official.data)
    np.testing.assert_array_equal(ours.to_numpy(), official.to_numpy())
    assert ours.to_numpy().dtype == official.to_numpy().dtype


@pytest.mark.parametrize("bad", [np.zeros(2, np.uint8), np.zeros(2, bool)], ids=["uint8", "bool"])
def test_tensor_rejections_match_official(bad: np.ndarray) -> None:
    with pytest.raises(ValueError):
        O.TensorData.from_numpy(bad)
    with pytest.raises(ValueError):
        T.TensorData.from_numpy(bad)


@pytest.mark.parametrize(
    "key,value",
    [
        ("target_tokens", [1, 2, 3]),
        ("weights", [1, 0, 1]),
        ("advantages", [0.5, -0.5]),
        ("logprobs", [[-1.0, -2.0], [-3.0, -4.0]]),
        ("clip_low_threshold", [0.8]),
        ("clip_high_threshold", [1.2]),
        ("sequence_ratio_mask", [1, 1, 0]),
        ("target_tokens", np.array([4, 5], dtype=np.int32)),
        ("anything", np.array([0.25], dtype=np.float64)),
    ],
)
def test_datum_coercion_matches_official(key: str, value: Any) -> None:
    official = O.Datum(model_input=O.ModelInput.from_ints([1]), loss_fn_inputs={key: value})
    ours = T.Datum(model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={key: value})
    o, t = official.loss_fn_inputs[key], ours.loss_fn_inputs[key]
    assert (t.dtype, t.shape, t.data) == (o.dtype, o.shape, o.data)


def test_datum_errors_match_official() -> None:
    for cls in (O, T):
        with pytest.raises(KeyError):
            cls.Datum(model_input=cls.ModelInput.from_ints([1]), loss_fn_inputs={"zz": [1.0]})
        with pytest.raises(ValueError):
            cls.Datum(
                model_input=cls.ModelInput.from_ints([1]),
                loss_fn_inputs={"weights": [[1.0], [1.0, 2.0]]},
            )


@pytest.mark.parametrize(
    "path",
    [
        "tinker://r/weights/a",
        "tinker://s:train:1/sampler_weights/b",
        "tinker://x/external_weights/c",
        "tinker://r/weights",
        "tinker://r/other/a",
        "tinker://r/weights/a/b",
        "r/weights/a",
    ],
)
def test_tinker_path_parsing_matches_official(path: str) -> None:
    try:
        expected = O.ParsedCheckpointTinkerPath.from_tinker_path(path).model_dump(mode="json")
    except ValueError:
        with pytest.raises(ValueError):
            T.ParsedCheckpointTinkerPath.from_tinker_path(path)
        return
    assert T.ParsedCheckpointTinkerPath.from_tinker_path(path).model_dump(mode="json") == expected


def test_console_urls_match_official() -> None:
    for path in ["tinker://run 1/weights/s", "tinker://r/sampler_weights/s?x"]:
        assert (
            T.SaveWeightsResponse(path=path).get_console_url()
            == O.SaveWeightsResponse(path=path).get_console_url()
        )
        assert T.SaveWeightsForSamplerResponse(path=path).get_playground_url() == (
            O.SaveWeightsForSamplerResponse(path=path).get_playground_url()
        )


def test_topk_and_prompt_logprobs_views_match_official() -> None:
    from tinker.types.topk_logprobs import TopkLogprobs as OTopk

    ids = np.array([[0, 0], [3, 0], [5, 6], [0, 1]], dtype=np.int32)
    lps = np.array([[-99999.0, -99999.0], [-0.5, -99999.0], [-1, -2], [-0.1, -0.2]], np.float32)
    plp = np.array([np.nan, -0.5, np.nan, -2.0], dtype=np.float32)
    official = O.SampleResponse(
        sequences=[],
        prompt_logprobs_np=plp,
        topk_prompt_logprobs_np=OTopk(token_ids=ids, logprobs=lps),
    )
    ours = T.SampleResponse(
        sequences=[],
        prompt_logprobs_np=plp,
        topk_prompt_logprobs_np=T.TopkLogprobs(token_ids=ids, logprobs=lps),
    )
    assert ours.prompt_logprobs == official.prompt_logprobs
    assert ours.topk_prompt_logprobs == official.topk_prompt_logprobs


def test_chunk_lengths_match_official() -> None:
    for data in [DMEL, b"\x01\x01\x05", b"\x00\x02\x81\x01\x02"]:
        assert T.DmelChunk(dmel=data).length == O.DmelChunk(dmel=data).length
    mi_o = O.ModelInput.from_ints([1, 2]).append(
        O.ImageChunk(data=PNG, format="png", expected_tokens=3)
    )
    mi_t = T.ModelInput.from_ints([1, 2]).append(
        T.ImageChunk(data=PNG, format="png", expected_tokens=3)
    )
    assert mi_t.length == mi_o.length == 5
    assert T.ModelInput.model_validate(mi_o.model_dump(mode="json")) == mi_t


# -- torch conversions (only when torch is installed) ----------------------------------------------


@pytest.mark.torch
def test_torch_conversions_match_official() -> None:
    torch = pytest.importorskip("torch")
    dense = torch.tensor([[0, 0, 5, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 2]])
    for tensor in [
        torch.arange(6, dtype=torch.int32).reshape(2, 3),
        torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        torch.tensor([0.25, 1.0], dtype=torch.float64),
    ]:
        o, t = O.TensorData.from_torch(tensor), T.TensorData.from_torch(tensor)
        assert (t.dtype, t.shape, t.data) == (o.dtype, o.shape, o.data)
    for pad in (0, -1, 5):
        shifted = dense + pad * (dense == 0).to(dense.dtype)
        o = O.TensorData.from_torch_sparse(shifted, pad_value=pad)
        t = T.TensorData.from_torch_sparse(shifted, pad_value=pad)
        assert (t.dtype, t.shape, t.data) == (o.dtype, o.shape, o.data)
        assert t.sparse_crow_indices == o.sparse_crow_indices
        assert t.sparse_col_indices == o.sparse_col_indices
        assert torch.equal(t.to_torch(pad_value=pad), o.to_torch(pad_value=pad))
    weights = torch.zeros(4, 16)
    weights[0, :3] = 1.0
    od = O.Datum(model_input=O.ModelInput.from_ints([1]), loss_fn_inputs={"weights": weights})
    td = T.Datum(model_input=T.ModelInput.from_ints([1]), loss_fn_inputs={"weights": weights})
    assert td.loss_fn_inputs["weights"].is_sparse
    assert td.loss_fn_inputs["weights"].data == od.loss_fn_inputs["weights"].data
    assert td.loss_fn_inputs["weights"].sparse_crow_indices == (
        od.loss_fn_inputs["weights"].sparse_crow_indices
    )
