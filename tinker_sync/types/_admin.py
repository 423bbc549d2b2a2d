"""Session search, billing, storage usage and audit types (official names; used by later REST
and admin calls).

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

import datetime as _dt
from typing import Any, Literal, TypeAlias

import attrs

from tinker_sync.types._base import TinkerModel, TinkerRequest, checked

__all__ = [
    "AccessibleSearchOwner",
    "ActiveSessionStatusQuery",
    "AuditLogEntry",
    "AuditLogResponse",
    "BillingEventInfo",
    "BillingUsageEvent",
    "BillingUsageResponse",
    "BillingUsageSession",
    "CancelledSessionStatusQuery",
    "CheckpointBillingEvent",
    "ClientFinishedSessionStatusQuery",
    "ClientSessionFinishErrored",
    "ClientSessionFinishInterrupted",
    "ClientSessionFinishReason",
    "ClientSessionFinishReasonType",
    "ClientSessionFinishSuccess",
    "ClientSessionFinished",
    "CurrentCheckpointStorageUsageItem",
    "CurrentCheckpointStorageUsageResponse",
    "FailedSessionStatusQuery",
    "GetBillingUsageRequest",
    "GetCurrentCheckpointStorageUsageRequest",
    "OwnSearchOwner",
    "SamplingPrefillBillingEvent",
    "SamplingSampleBillingEvent",
    "SearchOwner",
    "SessionActive",
    "SessionCancelled",
    "SessionFailed",
    "SessionFailedReason",
    "SessionFailedRequestReason",
    "SessionFailedSamplingSessionReason",
    "SessionFailedTrainingRunReason",
    "SessionSearchCursor",
    "SessionSearchRequest",
    "SessionSearchResponse",
    "SessionStatus",
    "SessionStatusQuery",
    "SessionSummary",
    "StorageBillingEvent",
    "TrainingBillingEvent",
    "UserSearchOwner",
]

FinishReasonType: TypeAlias = Literal["success", "errored", "interrupted"]
ClientSessionFinishReasonType: TypeAlias = FinishReasonType

# -- session search (request side) --------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class OwnSearchOwner(TinkerRequest):
    """Search the caller's own sessions."""

    type: Literal["own"] = "own"


@attrs.frozen(kw_only=True, field_transformer=checked)
class AccessibleSearchOwner(TinkerRequest):
    """Search every session the caller can access."""

    type: Literal["accessible"] = "accessible"


@attrs.frozen(kw_only=True, field_transformer=checked)
class UserSearchOwner(TinkerRequest):
    """Search the sessions of 1 to 10 named users."""

    type: Literal["user"] = "user"
    owner_urns: list[str] = attrs.field(metadata={"min_length": 1, "max_length": 10})


SearchOwner: TypeAlias = OwnSearchOwner | AccessibleSearchOwner | UserSearchOwner


@attrs.frozen(kw_only=True, field_transformer=checked)
class ActiveSessionStatusQuery(TinkerRequest):
    """Match active sessions."""

    type: Literal["active"] = "active"


@attrs.frozen(kw_only=True, field_transformer=checked)
class CancelledSessionStatusQuery(TinkerRequest):
    """Match cancelled sessions."""

    type: Literal["cancelled"] = "cancelled"


@attrs.frozen(kw_only=True, field_transformer=checked)
class FailedSessionStatusQuery(TinkerRequest):
    """Match failed sessions."""

    type: Literal["failed"] = "failed"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientFinishedSessionStatusQuery(TinkerRequest):
    """Match sessions the client finished (optionally only for some reasons)."""

    type: Literal["client_finished"] = "client_finished"
    reasons: list[FinishReasonType] | None = attrs.field(default=None, metadata={"min_length": 1})


SessionStatusQuery: TypeAlias = (
    ActiveSessionStatusQuery
    | CancelledSessionStatusQuery
    | FailedSessionStatusQuery
    | ClientFinishedSessionStatusQuery
)


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionSearchCursor(TinkerModel):
    """Opaque keyset cursor of a session search."""

    last_created_at: _dt.datetime
    last_session_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionSearchRequest(TinkerRequest):
    """Body of ``POST /api/v1/sessions/search`` (experimental)."""

    session_id: str | None = None
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = attrs.field(factory=dict)
    display_name: str | None = attrs.field(default=None, metadata={"min_length": 1})
    owner: SearchOwner = attrs.field(factory=OwnSearchOwner)
    statuses: list[SessionStatusQuery] | None = attrs.field(
        default=None, metadata={"min_length": 1}
    )
    limit: int = attrs.field(default=50, metadata={"ge": 1, "le": 200})
    cursor: SessionSearchCursor | None = None


# -- session search (reply side) -----------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionActive(TinkerModel):
    """Status of a running session."""

    type: Literal["active"] = "active"


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionCancelled(TinkerModel):
    """Status of a cancelled session."""

    type: Literal["cancelled"] = "cancelled"
    detail: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinishSuccess(TinkerModel):
    """Finish reason ``success``."""

    type: Literal["success"] = "success"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinishErrored(TinkerModel):
    """Finish reason ``errored``."""

    type: Literal["errored"] = "errored"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinishInterrupted(TinkerModel):
    """Finish reason ``interrupted``."""

    type: Literal["interrupted"] = "interrupted"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinished(TinkerModel):
    """Status of a session the client finished."""

    type: Literal["client_finished"] = "client_finished"
    reason: ClientSessionFinishSuccess | ClientSessionFinishErrored | ClientSessionFinishInterrupted
    detail: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailedRequestReason(TinkerModel):
    """A session failed because of one request."""

    type: Literal["request"] = "request"
    request_id: str
    request_type: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailedTrainingRunReason(TinkerModel):
    """A session failed because of a training run."""

    type: Literal["training_run"] = "training_run"
    training_run_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailedSamplingSessionReason(TinkerModel):
    """A session failed because of a sampling session."""

    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailed(TinkerModel):
    """Status of a failed session."""

    type: Literal["failed"] = "failed"
    category: Literal["user", "internal"]
    reason: (
        SessionFailedRequestReason
        | SessionFailedTrainingRunReason
        | SessionFailedSamplingSessionReason
    )
    message: str


ClientSessionFinishReason: TypeAlias = (
    ClientSessionFinishSuccess | ClientSessionFinishErrored | ClientSessionFinishInterrupted
)
SessionFailedReason: TypeAlias = (
    SessionFailedRequestReason | SessionFailedTrainingRunReason | SessionFailedSamplingSessionReason
)
SessionStatus: TypeAlias = SessionFailed | SessionCancelled | ClientSessionFinished | SessionActive


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionSummary(TinkerModel):
    """One session in a search reply."""

    session_id: str
    created_at: _dt.datetime
    owner: str
    project_id: str
    status: SessionStatus | None = None
    checkpoints_count: int
    display_name: str | None = None
    user_metadata: dict[str, str] | None = None
    checkpoint_storage_bytes: int | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionSearchResponse(TinkerModel):
    """A page of session search results."""

    sessions: list[SessionSummary]
    next_cursor: SessionSearchCursor | None = None


# -- billing and storage ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetBillingUsageRequest(TinkerRequest):
    """Query of ``GET /api/v1/billing/usage/events`` (RFC 3339 bounds)."""

    starting_on: _dt.datetime
    ending_before: _dt.datetime


@attrs.frozen(kw_only=True, field_transformer=checked)
class TrainingBillingEvent(TinkerModel):
    """Billed training tokens."""

    type: Literal["training"] = "training"
    token_count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class SamplingPrefillBillingEvent(TinkerModel):
    """Billed prefill tokens (``cached`` for prefix-cache hits)."""

    type: Literal["sampling_prefill"] = "sampling_prefill"
    cached: bool
    token_count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class SamplingSampleBillingEvent(TinkerModel):
    """Billed sampled tokens."""

    type: Literal["sampling_sample"] = "sampling_sample"
    token_count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class CheckpointBillingEvent(TinkerModel):
    """Billed checkpoint saves."""

    type: Literal["checkpoint"] = "checkpoint"
    count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class StorageBillingEvent(TinkerModel):
    """Billed checkpoint storage."""

    type: Literal["storage"] = "storage"
    free: bool = False
    gigabyte_hours: float


BillingEventInfo: TypeAlias = (
    TrainingBillingEvent
    | SamplingPrefillBillingEvent
    | SamplingSampleBillingEvent
    | CheckpointBillingEvent
    | StorageBillingEvent
)


@attrs.frozen(kw_only=True, field_transformer=checked)
class BillingUsageEvent(TinkerModel):
    """One bucket of billed usage."""

    bucket_start: _dt.datetime
    bucket_end: _dt.datetime
    base_model: str | None = None
    user_id: str | None = None
    user_name: str | None = None
    session_id: str | None = None
    project_id: str | None = None
    estimated_cost_usd: float | None = None
    effective_rate_usd_per_million_tokens: float | None = None
    effective_rate_usd_per_gigabyte_month: float | None = None
    event_info: BillingEventInfo


@attrs.frozen(kw_only=True, field_transformer=checked)
class BillingUsageSession(TinkerModel):
    """Session metadata referenced by billing events."""

    user_metadata: dict[str, str] | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class BillingUsageResponse(TinkerModel):
    """Billed usage events."""

    data: list[BillingUsageEvent]
    sessions: dict[str, BillingUsageSession] = attrs.field(factory=dict)
    cost_data_through: _dt.datetime | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetCurrentCheckpointStorageUsageRequest(TinkerRequest):
    """Query of ``GET /api/v1/billing/usage/checkpoints/current``."""

    project_id: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class CurrentCheckpointStorageUsageItem(TinkerModel):
    """Checkpoint storage of one project or user."""

    project_id: str | None = None
    org_user_urn: str | None = None
    user_email: str | None = None
    user_name: str | None = None
    checkpoint_count: int
    size_bytes: int
    size_gigabytes: float
    estimated_monthly_cost_usd: float | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class CurrentCheckpointStorageUsageResponse(TinkerModel):
    """Current checkpoint storage usage."""

    effective_rate_usd_per_gigabyte_month: float | None = None
    data: list[CurrentCheckpointStorageUsageItem]


# -- audit -------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class AuditLogEntry(TinkerModel):
    """One audit log entry."""

    timestamp: _dt.datetime
    event: str
    event_details: dict[str, Any] = attrs.field(factory=dict)
    model_id: str | None = None
    tinker_path: str | None = None
    purpose: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class AuditLogResponse(TinkerModel):
    """Audit log entries."""

    entries: list[AuditLogEntry]
