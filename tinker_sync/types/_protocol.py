"""Request bodies and protocol replies of the Tinker HTTP API (docs/design/protocol.md#endpoints).

Request JSON is ``to_json(request)``: defaults (including the ``type`` discriminators) are sent,
None is dropped except the null allowlist (finish ``detail``, TTL ``ttl_seconds``).

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

import datetime as _dt
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeAlias

import attrs

from tinker_sync.exceptions import RequestErrorCategory
from tinker_sync.types._base import TinkerModel, TinkerRequest, checked
from tinker_sync.types._coerce import ValidationError
from tinker_sync.types._input import ModelInput
from tinker_sync.types._opresults import (
    LoadWeightsResponse,
    OptimStepResponse,
    SaveWeightsExternalResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)
from tinker_sync.types._params import SamplingClientKind, SamplingParams
from tinker_sync.types._results import (
    ForwardBackwardOutput,
    UntypedAPIFuture,  # with the results: the sampling path needs it, not this module
)
from tinker_sync.types._tensor import TensorData
from tinker_sync.types._trainparams import (
    AdamOptimizerConfig,
    AdamParams,
    LoraConfig,
    OptimizerConfig,
    OptimParams,
)

__all__ = [
    "AuthTokenRequest",
    "AuthTokenResponse",
    "CancelFutureRequest",
    "ClientConfigRequest",
    "ClientConfigResponse",
    "ClientDynamicConfigResponse",
    "CopyWeightsRequest",
    "CreateModelRequest",
    "CreateModelResponse",
    "CreateSamplingSessionRequest",
    "CreateSamplingSessionResponse",
    "CreateSessionRequest",
    "CreateSessionResponse",
    "EventType",
    "FinishSessionRequest",
    "FutureCompletion",
    "FutureFailed",
    "FutureFinished",
    "FutureRetrieveRequest",
    "FutureRetrieveResponse",
    "FuturesRetrieveRequest",
    "FuturesRetrieveResponse",
    "GenericEvent",
    "GetInfoRequest",
    "HealthResponse",
    "JoinSamplingSessionRequest",
    "JoinSamplingSessionResponse",
    "LoadWeightsRequest",
    "OptimStepRequest",
    "QueueState",
    "RequestFailedResponse",
    "SampleRequest",
    "SamplingSessionFuturesTarget",
    "SaveWeightsExternalRequest",
    "SaveWeightsForSamplerRequest",
    "SaveWeightsRequest",
    "SessionEndEvent",
    "SessionFinishReason",
    "SessionHeartbeatRequest",
    "SessionHeartbeatResponse",
    "SessionStartEvent",
    "SetCheckpointTTLRequest",
    "SetSessionProjectRequest",
    "Severity",
    "TelemetryEvent",
    "TelemetryRequest",
    "TelemetryResponse",
    "TelemetrySendRequest",
    "TryAgainResponse",
    "UnhandledExceptionEvent",
    "UnloadModelRequest",
    "UnloadModelResponse",
    "UntypedAPIFuture",
    "WeightsInfoRequest",
]


# -- bootstrap --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientConfigRequest(TinkerRequest):
    """Body of ``POST /api/v1/client/config`` (and ``client/dynamic_config``)."""

    sdk_version: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientConfigResponse(TinkerModel):
    """Server feature flags and limits, with the official defaults."""

    pjwt_auth_enabled: bool = False
    credential_default_source: str = "api_key"
    sample_dispatch_bytes_semaphore_size: int = 10485760
    inflight_response_bytes_semaphore_size: int = 52428800
    parallel_fwdbwd_chunks: bool = True
    proto_compress_fwdbwd: bool = False
    fwdbwd_max_chunk_len: int = 1024
    fwdbwd_max_chunk_bytes_count: int = 5000000
    fwdbwd_dispatch_bytes_semaphore_size: int = 50000000
    billing_exception_max_pause_duration_sec: int = 3600
    sample_no_retries: bool = False
    sample_enable_stuck_detection: bool = True
    sample_max_concurrent_requests: int = 2000
    use_pyqwest_transport: bool = True
    sample_use_retrieve_futures: bool = False
    custom_loss_server_side: bool = False
    sample_join_sampling_session: bool = False


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientDynamicConfigResponse(TinkerModel):
    """Dynamic server settings, refetched every ``max(refresh_interval_sec, 10)`` seconds."""

    refresh_interval_sec: int = 300
    sample_cancel_enabled: bool = False
    sample_cancel_max_batch_size: int = 64


@attrs.frozen(kw_only=True, field_transformer=checked)
class AuthTokenRequest(TinkerRequest):
    """Body of ``POST /api/v1/auth/token`` (always ``{}``)."""


@attrs.frozen(kw_only=True, field_transformer=checked)
class AuthTokenResponse(TinkerModel):
    """A JWT for ``X-API-Key``."""

    jwt: str = attrs.field(repr=False)


# -- sessions ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateSessionRequest(TinkerRequest):
    """Body of ``POST /api/v1/create_session`` (the SDK sends ``user_metadata={}`` when unset;
    None is omitted on the wire, so it defaults to None here although the official model
    requires the key).
    """

    tags: list[str]
    sdk_version: str
    user_metadata: dict[str, Any] | None = None
    project_id: str | None = None
    display_name: str | None = None
    type: Literal["create_session"] = "create_session"


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateSessionResponse(TinkerModel):
    """Reply of ``create_session``; the messages are logged at info/warning/error."""

    type: Literal["create_session"] = "create_session"
    info_message: str | None = None
    warning_message: str | None = None
    error_message: str | None = None
    session_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionHeartbeatRequest(TinkerRequest):
    """Body of ``POST /api/v1/session_heartbeat``."""

    session_id: str
    type: Literal["session_heartbeat"] = "session_heartbeat"


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionHeartbeatResponse(TinkerModel):
    """Reply of ``session_heartbeat``."""

    type: Literal["session_heartbeat"] = "session_heartbeat"


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFinishReason(TinkerRequest):
    """``{"type": "success" | "errored" | "interrupted"}`` inside the finish body."""

    type: Literal["success", "errored", "interrupted"]


def _finish_reason(value: Any) -> SessionFinishReason:
    if isinstance(value, SessionFinishReason):
        return value
    if isinstance(value, str):
        return SessionFinishReason(type=value)  # type: ignore[arg-type]
    if isinstance(value, Mapping):
        return SessionFinishReason(**value)
    raise TypeError(
        f"FinishSessionRequest.reason: expected a status str or SessionFinishReason, got {value!r}"
    )


@attrs.frozen(kw_only=True, field_transformer=checked)
class FinishSessionRequest(TinkerRequest):
    """Body of ``POST /api/v1/sessions/{id}/finish``; ``detail`` is sent as null when None.

    Usage: ``FinishSessionRequest(reason="success")``.
    """

    reason: SessionFinishReason = attrs.field(converter=_finish_reason)
    detail: str | None = None

    _tinker_keep_null: ClassVar[frozenset[str]] = frozenset({"detail"})


@attrs.frozen(kw_only=True, field_transformer=checked)
class SetSessionProjectRequest(TinkerRequest):
    """Body of ``PUT /api/v1/sessions/{id}/project``."""

    project_id: str


# -- training ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateModelRequest(TinkerRequest):
    """Body of ``POST /api/v1/create_model``."""

    session_id: str
    model_seq_id: int
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = attrs.field(factory=AdamOptimizerConfig)
    type: Literal["create_model"] = "create_model"


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateModelResponse(TinkerModel):
    """Future result of ``create_model``."""

    model_id: str
    type: Literal["create_model"] = "create_model"


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetInfoRequest(TinkerRequest):
    """Body of ``POST /api/v1/get_info``."""

    model_id: str
    type: Literal["get_info"] = "get_info"


@attrs.frozen(kw_only=True, field_transformer=checked)
class UnloadModelRequest(TinkerRequest):
    """Body of the legacy ``POST /api/v1/unload_model``."""

    model_id: str
    type: Literal["unload_model"] = "unload_model"


@attrs.frozen(kw_only=True, field_transformer=checked)
class UnloadModelResponse(TinkerModel):
    """Future result of the legacy ``unload_model``."""

    model_id: str
    type: Literal["unload_model"] | None = None


@attrs.frozen(kw_only=True, field_transformer=checked, init=False)
class OptimStepRequest(TinkerRequest):
    """Body of ``POST /api/v1/optim_step``.

    ``optim_params`` (aliases ``adam_params`` / ``optimizer_params``) is sent as
    ``adam_params`` for AdamParams and as ``optimizer_params`` otherwise.
    """

    optim_params: OptimParams
    model_id: str
    seq_id: int | None = None
    type: Literal["optim_step"] = "optim_step"

    def __init__(
        self,
        *,
        model_id: str,
        optim_params: OptimParams | None = None,
        seq_id: int | None = None,
        type: Literal["optim_step"] = "optim_step",
        adam_params: AdamParams | None = None,
        optimizer_params: OptimParams | None = None,
    ) -> None:
        given = [p for p in (optim_params, adam_params, optimizer_params) if p is not None]
        if len(given) != 1:
            raise ValidationError.single(
                "OptimStepRequest.optim_params",
                "missing" if not given else "value_error",
                "OptimStepRequest needs exactly one of optim_params, adam_params or "
                "optimizer_params",
                None,
                got=False,
            )
        if adam_params is not None and not isinstance(adam_params, (AdamParams, Mapping)):
            raise ValidationError.single(
                "OptimStepRequest.adam_params", "model_type", "expected AdamParams", adam_params
            )
        self.__attrs_init__(optim_params=given[0], model_id=model_id, seq_id=seq_id, type=type)

    def _tinker_dump(self, json: bool, drop_none: bool, wire: bool) -> dict[str, Any]:
        out = super()._tinker_dump(json, drop_none, wire)
        params = out.pop("optim_params")
        key = "adam_params" if isinstance(self.optim_params, AdamParams) else "optimizer_params"
        out[key] = params
        return out


@attrs.frozen(kw_only=True, field_transformer=checked)
class SaveWeightsRequest(TinkerRequest):
    """Body of ``POST /api/v1/save_weights`` (``path`` is a checkpoint name, not a URI)."""

    model_id: str
    path: str | None = None
    seq_id: int | None = None
    ttl_seconds: int | None = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None
    type: Literal["save_weights"] = "save_weights"


@attrs.frozen(kw_only=True, field_transformer=checked)
class SaveWeightsForSamplerRequest(TinkerRequest):
    """Body of ``POST /api/v1/save_weights_for_sampler`` (named: ``path``; ephemeral:
    ``sampling_session_seq_id``).
    """

    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: SamplingClientKind = "snapshot"
    seq_id: int | None = None
    ttl_seconds: int | None = None
    user_metadata: dict[str, str] | None = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"


@attrs.frozen(kw_only=True, field_transformer=checked)
class SaveWeightsExternalRequest(TinkerRequest):
    """Body of ``POST /api/v1/save_weights_external``."""

    model_id: str
    path: str
    seq_id: int | None = None
    ttl_seconds: int | None = None
    age_encryption_recipients: list[str] | None = None
    type: Literal["save_weights_external"] = "save_weights_external"


@attrs.frozen(kw_only=True, field_transformer=checked)
class LoadWeightsRequest(TinkerRequest):
    """Body of ``POST /api/v1/load_weights`` (create-via-load or the legacy model-id form)."""

    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None
    path: str
    optimizer: bool
    optimizer_config: OptimizerConfig | None = None
    weights_access_token: str | None = attrs.field(default=None, repr=False)
    type: Literal["load_weights"] = "load_weights"


# -- sampling ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateSamplingSessionRequest(TinkerRequest):
    """Body of ``POST /api/v1/create_sampling_session``."""

    session_id: str
    sampling_session_seq_id: int
    base_model: str | None = None
    model_path: str | None = None
    type: Literal["create_sampling_session"] = "create_sampling_session"


@attrs.frozen(kw_only=True, field_transformer=checked)
class CreateSamplingSessionResponse(TinkerModel):
    """Reply of ``create_sampling_session``."""

    type: Literal["create_sampling_session"] = "create_sampling_session"
    sampling_session_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class JoinSamplingSessionRequest(TinkerRequest):
    """Body of ``POST /api/v1/join_sampling_session``."""

    sampling_session_id: str
    type: Literal["join_sampling_session"] = "join_sampling_session"


@attrs.frozen(kw_only=True, field_transformer=checked)
class JoinSamplingSessionResponse(TinkerModel):
    """Reply of ``join_sampling_session``: a counter unique per clone (original = 0)."""

    type: Literal["join_sampling_session"] = "join_sampling_session"
    client_counter: int


def _eq_tensor(a: Any, b: Any) -> bool:
    from tinker_sync.types._results import _tensor_eq

    return _tensor_eq(a, b)


@attrs.frozen(kw_only=True, field_transformer=checked)
class SampleRequest(TinkerRequest):
    """Body of ``POST /api/v1/asample``.

    ``prompt_logprobs`` and ``record_stability_info`` default to False and are always sent
    (the official model defaults them to None, but its SDK always fills them in).
    """

    num_samples: int = 1
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = False
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: TensorData | None = attrs.field(
        default=None, eq=attrs.cmp_using(eq=_eq_tensor, require_same_type=False)
    )
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = False
    type: Literal["sample"] = "sample"


# -- futures ----------------------------------------------------------------------------------


QueueState: TypeAlias = Literal["active", "paused_capacity", "paused_rate_limit"]


@attrs.frozen(kw_only=True, field_transformer=checked)
class TryAgainResponse(TinkerModel):
    """A poll answer meaning "not ready yet".

    ``queue_state`` is kept as the raw string (an unknown state is not an error; see
    ``QueueState`` for the known ones).
    """

    type: Literal["try_again"] = "try_again"
    request_id: str
    queue_state: str
    queue_state_reason: str | None = None


def _category(value: Any) -> RequestErrorCategory:
    if isinstance(value, RequestErrorCategory):
        return value
    if not isinstance(value, str):
        # no member's value equals a non-str; comparing an array to each one warns on numpy 1.x
        return RequestErrorCategory.Unknown
    return RequestErrorCategory(value)


@attrs.frozen(kw_only=True, field_transformer=checked)
class RequestFailedResponse(TinkerModel):
    """A poll answer meaning the request failed on the server."""

    error: str
    category: RequestErrorCategory = attrs.field(
        default=RequestErrorCategory.Unknown, converter=_category
    )


@attrs.frozen(kw_only=True, field_transformer=checked)
class FutureRetrieveRequest(TinkerRequest):
    """Body of ``POST /api/v1/retrieve_future``."""

    request_id: str
    allow_metadata_only: bool = False


@attrs.frozen(kw_only=True, field_transformer=checked)
class CancelFutureRequest(TinkerRequest):
    """Body of ``POST /api/v1/cancel_future``."""

    request_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SamplingSessionFuturesTarget(TinkerRequest):
    """The ``target`` of a ``retrieve_futures`` request."""

    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str
    cloned_sampler_id: int = 0


@attrs.frozen(kw_only=True, field_transformer=checked)
class FuturesRetrieveRequest(TinkerRequest):
    """Body of ``POST /api/v1/retrieve_futures`` (``timeout`` omitted for a normal long-poll)."""

    target: SamplingSessionFuturesTarget
    prev_cursor: int = 0
    timeout: float | None = None
    retrieved_request_ids: list[str] = attrs.field(factory=list)


@attrs.frozen(kw_only=True, field_transformer=checked)
class FutureFinished(TinkerModel):
    """A finished future in a ``retrieve_futures`` reply."""

    state: Literal["finished"] = "finished"
    request_id: str
    response_payload_uncompressed_size: int | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class FutureFailed(TinkerModel):
    """A failed future in a ``retrieve_futures`` reply."""

    state: Literal["failed"] = "failed"
    request_id: str


FutureCompletion: TypeAlias = FutureFinished | FutureFailed
"""One completion of a ``retrieve_futures`` reply, tagged by ``state``."""


@attrs.frozen(kw_only=True, field_transformer=checked)
class FuturesRetrieveResponse(TinkerModel):
    """Reply of ``retrieve_futures``."""

    completions: list[FutureCompletion]
    cursor: int


# -- telemetry --------------------------------------------------------------------------------

EventType: TypeAlias = Literal[
    "SESSION_START", "SESSION_END", "UNHANDLED_EXCEPTION", "GENERIC_EVENT"
]
Severity: TypeAlias = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionStartEvent(TinkerModel):
    """Telemetry: a session started."""

    event: EventType = "SESSION_START"
    event_id: str
    event_session_index: int
    severity: Severity
    timestamp: _dt.datetime


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionEndEvent(TinkerModel):
    """Telemetry: a session ended (``duration`` is timedelta text, e.g. ``0:00:05.123456``)."""

    duration: str
    event: EventType = "SESSION_END"
    event_id: str
    event_session_index: int
    severity: Severity
    timestamp: _dt.datetime


@attrs.frozen(kw_only=True, field_transformer=checked)
class UnhandledExceptionEvent(TinkerModel):
    """Telemetry: an exception escaped user code."""

    error_message: str
    error_type: str
    event: EventType = "UNHANDLED_EXCEPTION"
    event_id: str
    event_session_index: int
    severity: Severity
    timestamp: _dt.datetime
    traceback: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class GenericEvent(TinkerModel):
    """Telemetry: a named event with a JSON payload."""

    event: EventType = "GENERIC_EVENT"
    event_id: str
    event_name: str
    event_session_index: int
    severity: Severity
    timestamp: _dt.datetime
    event_data: dict[str, Any] = attrs.field(factory=dict)


TelemetryEvent: TypeAlias = (
    SessionStartEvent | SessionEndEvent | UnhandledExceptionEvent | GenericEvent
)


@attrs.frozen(kw_only=True, field_transformer=checked)
class TelemetrySendRequest(TinkerRequest):
    """Body of ``POST /api/v1/telemetry`` (at most 100 events)."""

    events: list[TelemetryEvent]
    platform: str
    sdk_version: str
    session_id: str
    process_uuid: str


TelemetryRequest = TelemetrySendRequest


@attrs.frozen(kw_only=True, field_transformer=checked)
class TelemetryResponse(TinkerModel):
    """Reply of ``telemetry``: exactly ``{"status": "accepted"}``."""

    status: Literal["accepted"]


@attrs.frozen(kw_only=True, field_transformer=checked)
class HealthResponse(TinkerModel):
    """Reply of ``healthz``."""

    status: Literal["ok"]


# -- REST bodies ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class SetCheckpointTTLRequest(TinkerRequest):
    """Body of ``PUT .../checkpoints/{ckpt}/ttl``; ``ttl_seconds=None`` is sent as null
    (removes the TTL).
    """

    ttl_seconds: int | None = None

    _tinker_keep_null: ClassVar[frozenset[str]] = frozenset({"ttl_seconds"})


@attrs.frozen(kw_only=True, field_transformer=checked)
class WeightsInfoRequest(TinkerRequest):
    """Body of ``POST /api/v1/weights_info``."""

    tinker_path: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class CopyWeightsRequest(TinkerRequest):
    """Body of ``POST /api/v1/copy_weights`` (no ``type`` field)."""

    session_id: str | None = None
    model_seq_id: int | None = None
    destination_project_id: str | None = None
    source_path: str
    ttl_seconds: int | None = None
    weights_access_token: str | None = attrs.field(default=None, repr=False)


FutureRetrieveResponse: TypeAlias = (
    TryAgainResponse
    | ForwardBackwardOutput
    | OptimStepResponse
    | SaveWeightsResponse
    | LoadWeightsResponse
    | SaveWeightsForSamplerResponse
    | SaveWeightsExternalResponse
    | CreateModelResponse
    | UnloadModelResponse
    | RequestFailedResponse
)
"""What ``retrieve_future`` can return for one request (the official SDK's union)."""
