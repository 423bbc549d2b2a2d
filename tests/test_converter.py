"""Tests of tinker_sync._wire._converter: strict JSON parsing and the exact wire JSON
(docs/design/behavior.md#strict-converter, docs/design/behavior.md#json-encoding-rules)."""

import datetime as dt
import json
import math
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinker_sync import types as T
from tinker_sync._wire._converter import WireValidationError, converter, from_json, to_json

# -- strict primitives ------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,data,path,fragment",
    [
        (T.SamplingParams, {"max_tokens": 1.9}, "$.max_tokens", "expected int"),
        (T.SamplingParams, {"max_tokens": "5"}, "$.max_tokens", "expected int"),
        (T.SamplingParams, {"top_k": True}, "$.top_k", "expected int"),
        (T.SamplingParams, {"temperature": "1.0"}, "$.temperature", "expected float"),
        (T.SamplingParams, {"temperature": False}, "$.temperature", "expected float"),
        (T.LoraConfig, {"rank": 4, "train_mlp": "false"}, "$.train_mlp", "expected bool"),
        (T.LoraConfig, {"rank": 4, "train_mlp": 0}, "$.train_mlp", "expected bool"),
        (
            T.GetSamplerResponse,
            {"sampler_id": 5, "base_model": "b"},
            "$.sampler_id",
            "expected str",
        ),
        (T.CreateSessionResponse, {}, "$.session_id", "required field missing"),
        (
            T.TryAgainResponse,
            {"request_id": "r", "queue_state": "active", "type": "done"},
            "$.type",
            "expected one of",
        ),
        (
            T.UntypedAPIFuture,
            {"request_id": "r", "sample_sequence_ids": ["a", 1]},
            "$.sample_sequence_ids[1]",
            "expected str",
        ),
        (
            T.Checkpoint,
            {"checkpoint_id": "c", "checkpoint_type": "training", "time": 5, "tinker_path": "p"},
            "$.time",
            "datetime",
        ),
        (
            T.Checkpoint,
            {
                "checkpoint_id": "c",
                "checkpoint_type": "training",
                "time": "yesterday",
                "tinker_path": "p",
            },
            "$.time",
            "ISO 8601",
        ),
        (
            T.OptimStepResponse,
            {"metrics": {"loss:sum": "1"}},
            "$.metrics['loss:sum']",
            "expected float",
        ),
    ],
)
def test_strict_errors_name_the_path(cls, data, path, fragment):
    with pytest.raises(WireValidationError) as info:
        from_json(cls, data)
    err = info.value
    assert isinstance(err, ValueError)
    assert any(path in line and fragment in line for line in err.errors), err.errors
    assert cls.__name__ in str(err)


def test_errors_in_nested_lists_name_the_full_path():
    data = {
        "training_runs": [
            {
                "training_run_id": "a",
                "base_model": "b",
                "model_owner": "o",
                "is_lora": True,
                "last_request_time": "2024-01-01T00:00:00Z",
            },
            {
                "training_run_id": "a",
                "base_model": "b",
                "model_owner": "o",
                "is_lora": "yes",
                "last_request_time": "2024-01-01T00:00:00Z",
            },
        ],
        "cursor": {"offset": 0, "limit": 2, "total_count": 2.5},
    }
    with pytest.raises(WireValidationError) as info:
        from_json(T.TrainingRunsResponse, data)
    joined = "\n".join(info.value.errors)
    assert "$.training_runs[1].is_lora" in joined
    assert "$.cursor.total_count" in joined


def test_ints_widen_to_float_and_floats_stay_floats():
    p = from_json(T.SamplingParams, {"temperature": 1, "top_p": 0})
    assert type(p.temperature) is float and type(p.top_p) is float
    assert json.dumps(to_json(p)) == '{"temperature": 1.0, "top_k": -1, "top_p": 0.0}'


def test_unknown_keys_response_vs_request():
    resp = from_json(T.CreateSessionResponse, {"session_id": "s", "brand_new": {"x": 1}})
    assert resp.session_id == "s"
    with pytest.raises(WireValidationError, match="unknown keys"):
        from_json(T.GetInfoRequest, {"model_id": "m", "brand_new": 1})
    with pytest.raises(WireValidationError, match="unknown keys"):
        from_json(
            T.SampleRequest,
            {
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1], "extra": 1}]},
                "sampling_params": {},
            },
        )
    with pytest.raises(WireValidationError, match="unknown keys"):
        from_json(T.OptimStepRequest, {"model_id": "m", "adam_params": {}, "bogus": 1})


def test_top_level_not_an_object():
    with pytest.raises(WireValidationError, match="expected a JSON object"):
        from_json(T.CreateSessionResponse, ["session_id"])
    with pytest.raises(WireValidationError):
        from_json(T.TensorData, 5)


def test_error_pickles():
    try:
        from_json(T.Cursor, {"offset": "0", "limit": 1, "total_count": 1})
    except WireValidationError as exc:
        again = pickle.loads(pickle.dumps(exc))
        assert again.errors == exc.errors and str(again) == str(exc)
    else:  # pragma: no cover
        pytest.fail("no error")


# -- to_json rules ---------------------------------------------------------------------------


def test_defaults_sent_none_dropped():
    body = to_json(
        T.SaveWeightsForSamplerRequest(model_id="m", seq_id=3, sampling_session_seq_id=0)
    )
    assert body == {
        "model_id": "m",
        "sampling_session_seq_id": 0,
        "kind": "snapshot",
        "seq_id": 3,
        "type": "save_weights_for_sampler",
    }
    assert to_json(T.LoraConfig(rank=8)) == {
        "rank": 8,
        "train_unembed": True,
        "train_mlp": True,
        "train_attn": True,
    }


def test_null_allowlist():
    assert to_json(T.FinishSessionRequest(reason="success")) == {
        "reason": {"type": "success"},
        "detail": None,
    }
    assert to_json(T.FinishSessionRequest(reason="interrupted", detail="ctrl-c")) == {
        "reason": {"type": "interrupted"},
        "detail": "ctrl-c",
    }
    assert to_json(T.SetCheckpointTTLRequest(ttl_seconds=None)) == {"ttl_seconds": None}
    assert to_json(T.SetCheckpointTTLRequest(ttl_seconds=7200)) == {"ttl_seconds": 7200}
    # ttl_seconds elsewhere is dropped when None
    assert "ttl_seconds" not in to_json(T.SaveWeightsRequest(model_id="m"))
    assert "ttl_seconds" not in to_json(T.CopyWeightsRequest(source_path="tinker://a/weights/b"))
    # model_dump(exclude_none=True) drops everything, as pydantic would
    assert T.FinishSessionRequest(reason="success").model_dump(mode="json", exclude_none=True) == {
        "reason": {"type": "success"}
    }


def test_sample_request_always_sends_bools():
    body = to_json(
        T.SampleRequest(prompt=T.ModelInput.from_ints([1]), sampling_params=T.SamplingParams())
    )
    assert body["prompt_logprobs"] is False and body["record_stability_info"] is False
    assert body["type"] == "sample"
    for key in (
        "seq_id",
        "sampling_session_id",
        "base_model",
        "model_path",
        "target_prompt_logprobs",
        "prompt_logprobs_last_n",
    ):
        assert key not in body


def test_chunk_json_shapes():
    mi = T.ModelInput(
        chunks=[
            T.EncodedTextChunk(tokens=np.array([1, 2], dtype=np.int64)),
            T.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4),
            T.ImageAssetPointerChunk(format="jpeg", location="s3://x"),
            T.DmelChunk(dmel=b"\x01\x01\x02"),
        ]
    )
    body = to_json(mi)
    assert body == {
        "chunks": [
            {"tokens": [1, 2], "type": "encoded_text"},
            {"data": "iVBORw==", "format": "png", "expected_tokens": 4, "type": "image"},
            {"format": "jpeg", "location": "s3://x", "type": "image_asset_pointer"},
            {"dmel": "AQEC", "type": "dmel"},
        ]
    }
    assert type(body["chunks"][0]["tokens"][0]) is int
    back = from_json(T.ModelInput, body)
    assert back == mi
    with pytest.raises(WireValidationError, match="unknown tag 'image_data'"):
        from_json(T.ModelInput, {"chunks": [{"type": "image_data", "data": ""}]})


def test_optim_step_wire_names():
    adam = to_json(T.OptimStepRequest(model_id="m", seq_id=1, optim_params=T.AdamParams()))
    assert "adam_params" in adam and "optim_params" not in adam and "optimizer_params" not in adam
    dimuon = to_json(
        T.OptimStepRequest(model_id="m", seq_id=1, optim_params=T.DimuonParams(learning_rate=0.5))
    )
    assert dimuon["optimizer_params"] == {
        "type": "dimuon",
        "learning_rate": 0.5,
        "grad_clip_norm": 0.0,
        "beta1": 0.9,
    }
    assert from_json(T.OptimStepRequest, dimuon).optim_params == T.DimuonParams(learning_rate=0.5)
    assert from_json(T.OptimStepRequest, adam).optim_params == T.AdamParams()


def test_optimizer_config_union():
    assert (
        from_json(T.GetInfoResponse, {"model_id": "m", "model_data": {}}).optimizer_config
        == T.AdamOptimizerConfig()
    )
    dimuon = from_json(
        T.WeightsInfoResponse,
        {"base_model": "b", "is_lora": False, "optimizer_config": {"type": "dimuon", "version": 1}},
    )
    assert dimuon.optimizer_config == T.DimuonOptimizerConfig()
    other = from_json(
        T.GetInfoResponse,
        {"model_id": "m", "model_data": {}, "optimizer_config": {"type": "lion", "beta": 0.9}},
    )
    assert other.optimizer_config == T.OtherOptimizerConfig(type="lion", extra={"beta": 0.9})
    assert to_json(other)["optimizer_config"] == {"type": "lion", "beta": 0.9}


def test_tagged_unions_for_completions_and_events():
    resp = from_json(
        T.FuturesRetrieveResponse,
        {
            "completions": [
                {"state": "finished", "request_id": "a", "response_payload_uncompressed_size": 10},
                {"state": "failed", "request_id": "b"},
            ],
            "cursor": 7,
        },
    )
    assert isinstance(resp.completions[0], T.FutureFinished)
    assert isinstance(resp.completions[1], T.FutureFailed)
    with pytest.raises(WireValidationError, match="unknown tag"):
        from_json(
            T.FuturesRetrieveResponse,
            {"completions": [{"state": "lost", "request_id": "x"}], "cursor": 0},
        )
    ts = "2026-11-21T15:38:06.763637Z"
    req = from_json(
        T.TelemetrySendRequest,
        {
            "events": [
                {
                    "event": "SESSION_START",
                    "event_id": "1",
                    "event_session_index": 0,
                    "severity": "INFO",
                    "timestamp": ts,
                },
                {
                    "event": "GENERIC_EVENT",
                    "event_id": "2",
                    "event_session_index": 1,
                    "severity": "DEBUG",
                    "timestamp": ts,
                    "event_name": "x",
                    "event_data": {"k": [1]},
                },
            ],
            "platform": "Linux",
            "sdk_version": "0.38.0",
            "session_id": "s",
            "process_uuid": "u",
        },
    )
    assert isinstance(req.events[1], T.GenericEvent)
    assert to_json(req)["events"][0]["timestamp"] == ts


def test_datetimes():
    ck = from_json(
        T.Checkpoint,
        {
            "checkpoint_id": "c",
            "checkpoint_type": "sampler",
            "time": "2024-03-01T10:00:00+05:00",
            "tinker_path": "p",
            "expires_at": "2024-03-02T00:00:00",
        },
    )
    assert ck.time == dt.datetime(2024, 3, 1, 5, tzinfo=dt.timezone.utc)
    assert ck.time.tzinfo is dt.timezone.utc
    assert ck.expires_at is not None and ck.expires_at.tzinfo is dt.timezone.utc
    assert to_json(ck)["time"] == "2024-03-01T05:00:00Z"


def test_request_failed_category_is_lenient():
    for raw, expected in [
        ("User", "user"),
        ("SERVER", "server"),
        ("junk", "unknown"),
        (5, "unknown"),
    ]:
        resp = from_json(T.RequestFailedResponse, {"error": "e", "category": raw})
        assert resp.category.value == expected
    assert from_json(T.RequestFailedResponse, {"error": "e"}).category.value == "unknown"


def test_try_again_keeps_unknown_queue_state():
    resp = from_json(
        T.TryAgainResponse,
        {
            "type": "try_again",
            "request_id": "r",
            "queue_state": "paused_weather",
            "queue_state_reason": "rain",
        },
    )
    assert resp.queue_state == "paused_weather" and resp.queue_state_reason == "rain"


# -- tensors and numpy pass-through ----------------------------------------------------------------


def test_tensor_data_json():
    td = T.TensorData(data=[1, -1, 2, 3], dtype="int64", shape=[2, 2])
    body = to_json(td)
    assert body == {"data": [1, -1, 2, 3], "dtype": "int64", "shape": [2, 2]}
    back = from_json(T.TensorData, body)
    assert back.tolist() == [[1, -1], [2, 3]] and back.dtype == "int64"
    sparse = T.TensorData.from_numpy_sparse(np.eye(6, dtype=np.float32))
    sbody = to_json(sparse)
    assert sbody["sparse_crow_indices"] == list(range(7)) and sbody["sparse_col_indices"] == list(
        range(6)
    )
    assert from_json(T.TensorData, sbody).tolist() == np.eye(6).tolist()
    with pytest.raises(WireValidationError, match="integers"):
        from_json(T.TensorData, {"data": [1.5], "dtype": "int64"})
    with pytest.raises(WireValidationError, match="numpy kind"):
        from_json(T.TensorData, {"data": [True], "dtype": "float32"})
    with pytest.raises(WireValidationError, match="dtype"):
        from_json(T.TensorData, {"data": [1], "dtype": "int32"})
    with pytest.raises(WireValidationError, match="shape"):
        from_json(
            T.TensorData,
            {
                "data": [1],
                "dtype": "int64",
                "sparse_crow_indices": [0, 1],
                "sparse_col_indices": [0],
            },
        )
    floats = from_json(T.TensorData, {"data": [1, 2.5], "dtype": "float32"})
    assert floats.data_np.dtype == np.float32 and floats.data == [1.0, 2.5]


def test_numpy_token_pass_through_is_zero_copy_only_for_read_only_arrays():
    arr = np.arange(5, dtype=np.int32)
    arr.flags.writeable = False
    chunk = from_json(T.EncodedTextChunk, {"tokens": arr, "type": "encoded_text"})
    assert chunk.tokens is arr
    writable = np.arange(5, dtype=np.int32)
    copied = from_json(T.EncodedTextChunk, {"tokens": writable, "type": "encoded_text"})
    writable[0] = 7
    assert copied.tokens[0] == 0


def test_forward_backward_output_json():
    out = from_json(
        T.ForwardBackwardOutput,
        {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": [
                {"logprobs": {"data": [-0.5, -1.5], "dtype": "float32", "shape": [2]}}
            ],
            "metrics": {"loss:sum": 2},
            "extra": True,
        },
    )
    assert out.loss_fn_outputs[0]["logprobs"].data == [-0.5, -1.5]
    assert out.metrics == {"loss:sum": 2.0}
    again = from_json(T.ForwardBackwardOutput, to_json(out))
    assert again.loss_fn_outputs[0]["logprobs"].data == [-0.5, -1.5]


def test_sample_response_json_round_trip():
    resp = T.SampleResponse(
        sequences=[
            T.SampledSequence(
                stop_reason="length",
                sequence_id="s:1",
                tokens=[3, 4],
                logprobs=[-0.25, -0.5],
                topk_logprobs=[[(3, -0.25), (9, -2.0)], None],
            )
        ],
        prompt_logprobs=[None, -1.0],
        topk_prompt_logprobs=[None, [(1, -1.0)]],
        target_prompt_logprobs=T.TensorData(data=[0.0, -0.5], dtype="float32", shape=[1, 2]),
        prompt_cache_hit_tokens=2,
        prompt_alt_tokens=T.PromptAltTokens(
            tokens=T.TensorData(data=[5], dtype="int64", shape=[1, 1]),
            logprobs=T.TensorData(data=[-0.1], dtype="float32", shape=[1, 1]),
        ),
    )
    body = to_json(resp)
    assert body["prompt_logprobs"] == [None, -1.0]
    assert body["sequences"][0]["topk_logprobs"] == [[[3, -0.25], [9, -2.0]], None]
    json.dumps(body)
    back = from_json(T.SampleResponse, body)
    assert back == resp
    assert back.sequences[0].tokens == [3, 4]
    with pytest.raises(WireValidationError, match="stop_reason"):
        from_json(T.SampleResponse, {"sequences": [{"stop_reason": "eos", "tokens": []}]})
    absent = from_json(T.SampleResponse, {"sequences": [], "topk_prompt_logprobs": []})
    assert absent.topk_prompt_logprobs_np is None
    k_zero = from_json(T.SampleResponse, {"sequences": [], "topk_prompt_logprobs": [None, []]})
    assert k_zero.topk_prompt_logprobs is None
    missing_id = from_json(
        T.SampleResponse, {"sequences": [{"stop_reason": "stop", "tokens": [1]}]}
    )
    assert missing_id.sequences[0].sequence_id is None


def test_hooks_are_generated_once():
    hook = converter.get_structure_hook(T.TrainingRun)
    assert converter.get_structure_hook(T.TrainingRun) is hook
    assert converter.get_structure_hook(T.SampleRequest) is converter.get_structure_hook(
        T.SampleRequest
    )


def test_converter_unstructure_is_wire_json():
    req = T.FinishSessionRequest(reason="success")
    assert converter.unstructure(req) == to_json(req)


def test_big_token_list_decodes():
    tokens = list(range(200_000))
    chunk = from_json(T.ModelInput, {"chunks": [{"type": "encoded_text", "tokens": tokens}]})
    assert chunk.length == 200_000
    with pytest.raises(WireValidationError, match="index 150000"):
        bad = tokens.copy()
        bad[150_000] = 1.0  # type: ignore[call-overload]
        from_json(T.ModelInput, {"chunks": [{"type": "encoded_text", "tokens": bad}]})


# -- hypothesis round trips ------------------------------------------------------------------------

_text = st.text(max_size=12)
_ints = st.integers(min_value=-(2**62), max_value=2**62)
_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)

sampling_params = st.builds(
    T.SamplingParams,
    max_tokens=st.none() | st.integers(0, 10_000),
    seed=st.none() | _ints,
    stop=st.none() | _text | st.lists(_text, max_size=3) | st.lists(_ints, max_size=3),
    temperature=_floats,
    top_k=_ints,
    top_p=_floats,
)
chunks = st.one_of(
    st.builds(T.EncodedTextChunk, tokens=st.lists(st.integers(0, 2**31 - 1), max_size=20)),
    st.builds(
        T.ImageChunk,
        data=st.binary(max_size=20),
        format=st.sampled_from(["png", "jpeg"]),
        expected_tokens=st.none() | st.integers(0, 100),
    ),
    st.builds(
        T.ImageAssetPointerChunk,
        format=st.sampled_from(["png", "jpeg"]),
        location=_text,
        expected_tokens=st.none() | st.integers(0, 100),
    ),
    st.builds(T.DmelChunk, dmel=st.binary(max_size=10)),
)
model_inputs = st.builds(T.ModelInput, chunks=st.lists(chunks, max_size=4))
sample_requests = st.builds(
    T.SampleRequest,
    num_samples=st.integers(1, 8),
    prompt=model_inputs,
    sampling_params=sampling_params,
    sampling_session_id=st.none() | _text,
    seq_id=st.none() | st.integers(0, 2**40),
    prompt_logprobs=st.booleans(),
    topk_prompt_logprobs=st.integers(0, 20),
    prompt_logprobs_last_n=st.none() | st.integers(1, 100),
)
datetimes = st.datetimes(timezones=st.just(dt.timezone.utc))
checkpoints = st.builds(
    T.Checkpoint,
    checkpoint_id=_text,
    checkpoint_type=st.sampled_from(["training", "sampler", "external"]),
    time=datetimes,
    tinker_path=_text,
    size_bytes=st.none() | st.integers(0, 2**50),
    public=st.booleans(),
    user_metadata=st.none() | st.dictionaries(_text, _text, max_size=3),
    expires_at=st.none() | datetimes,
)
training_runs = st.builds(
    T.TrainingRun,
    training_run_id=_text,
    base_model=_text,
    model_owner=_text,
    is_lora=st.booleans(),
    corrupted=st.booleans(),
    lora_rank=st.none() | st.integers(1, 256),
    last_request_time=datetimes,
    last_checkpoint=st.none() | checkpoints,
    last_sampler_checkpoint=st.none() | checkpoints,
)
optim_steps = st.builds(
    T.OptimStepRequest,
    model_id=_text,
    seq_id=st.none() | st.integers(0, 1000),
    optim_params=st.builds(T.AdamParams, learning_rate=_floats, beta1=_floats)
    | st.builds(T.DimuonParams, learning_rate=st.floats(0, 10), beta1=st.floats(0, 0.99)),
)
models = st.one_of(sample_requests, training_runs, optim_steps, checkpoints, sampling_params)


@settings(max_examples=150, deadline=None)
@given(models)
def test_round_trip_to_json_from_json(obj):
    body = to_json(obj)
    text = json.dumps(body)
    back = from_json(type(obj), json.loads(text))
    assert back == obj
    assert to_json(back) == body


@settings(max_examples=150, deadline=None)
@given(models)
def test_round_trip_model_dump_model_validate(obj):
    for exclude_none in (False, True):
        data = obj.model_dump(mode="json", exclude_none=exclude_none)
        assert type(obj).model_validate(data) == obj
    assert type(obj).model_validate(json.loads(obj.model_dump_json())) == obj


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(allow_nan=False, width=32), min_size=3, max_size=3),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from(["float32", "int64"]),
)
def test_tensor_round_trip(rows, dtype):
    arr = np.asarray(rows, dtype=np.float32)
    if dtype == "int64":
        arr = np.nan_to_num(arr, posinf=0, neginf=0).clip(-1e6, 1e6).astype(np.int64)
    td = T.TensorData.from_numpy(arr)
    back = from_json(T.TensorData, json.loads(json.dumps(to_json(td))))
    assert back.dtype == td.dtype and back.shape == td.shape
    np.testing.assert_array_equal(back.to_numpy(), td.to_numpy())
    sparse = T.TensorData.from_numpy_sparse(arr)
    assert from_json(T.TensorData, to_json(sparse)).tolist() == arr.tolist()


def test_float_special_values_survive_python_json():
    td = T.TensorData(data=[math.inf, -math.inf], dtype="float32")
    assert from_json(T.TensorData, json.loads(json.dumps(to_json(td)))).data == [
        math.inf,
        -math.inf,
    ]


@pytest.mark.parametrize(
    "data",
    [
        {"request_id": "r"},
        {"request_id": "r", "model_id": "m", "sample_sequence_ids": ["a", "b"], "extra": 1},
        {"request_id": "r", "model_id": None, "sample_sequence_ids": None},
        {"request_id": "r", "sample_sequence_ids": []},
    ],
)
def test_untyped_future_read_without_the_converter_equals_the_converters(data):
    """Every future endpoint's first reply is read without building cattrs' hooks (a worker's
    first sample, docs/scale-out.md); the value is the converter's own."""
    got = from_json(T.UntypedAPIFuture, data)
    assert type(got) is T.UntypedAPIFuture
    assert got == converter.structure(data, T.UntypedAPIFuture)
    if got.sample_sequence_ids is not None:
        assert got.sample_sequence_ids is not data["sample_sequence_ids"]  # a copy


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({}, "required field missing @ $.request_id"),
        ({"request_id": 5}, "expected str, got int 5 @ $.request_id"),
        ({"request_id": "r", "model_id": 1}, "@ $.model_id"),
        ({"request_id": "r", "sample_sequence_ids": ["a", 2]}, "@ $.sample_sequence_ids[1]"),
        ([], "expected a JSON object for UntypedAPIFuture"),
    ],
)
def test_untyped_future_errors_still_name_the_field(data, error):
    with pytest.raises(WireValidationError, match=re.escape(error)):
        from_json(T.UntypedAPIFuture, data)
