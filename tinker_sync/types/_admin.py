"""Session search, billing, storage usage and audit types (official names; used by later REST
and admin calls)."""

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

# -- session search (request side) --------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class OwnSearchOwner(TinkerRequest):
    """Search the caller's own sessions.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["own"] = "own"


@attrs.frozen(kw_only=True, field_transformer=checked)
class AccessibleSearchOwner(TinkerRequest):
    """Search every session the caller can access.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["accessible"] = "accessible"


@attrs.frozen(kw_only=True, field_transformer=checked)
class UserSearchOwner(TinkerRequest):
    """Search the sessions of 1 to 10 named users.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["user"] = "user"
    owner_urns: list[str]


SearchOwner: TypeAlias = OwnSearchOwner | AccessibleSearchOwner | UserSearchOwner


@attrs.frozen(kw_only=True, field_transformer=checked)
class ActiveSessionStatusQuery(TinkerRequest):
    """Match active sessions.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["active"] = "active"


@attrs.frozen(kw_only=True, field_transformer=checked)
class CancelledSessionStatusQuery(TinkerRequest):
    """Match cancelled sessions.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["cancelled"] = "cancelled"


@attrs.frozen(kw_only=True, field_transformer=checked)
class FailedSessionStatusQuery(TinkerRequest):
    """Match failed sessions.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["failed"] = "failed"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientFinishedSessionStatusQuery(TinkerRequest):
    """Match sessions the client finished (optionally only for some reasons).

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["client_finished"] = "client_finished"
    reasons: list[FinishReasonType] | None = None


SessionStatusQuery: TypeAlias = (
    ActiveSessionStatusQuery
    | CancelledSessionStatusQuery
    | FailedSessionStatusQuery
    | ClientFinishedSessionStatusQuery
)


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionSearchCursor(TinkerModel):
    """Opaque keyset cursor of a session search.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    last_created_at: _dt.datetime
    last_session_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionSearchRequest(TinkerRequest):
    """Body of ``POST /api/v1/sessions/search`` (experimental).

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    session_id: str | None = None
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = attrs.field(factory=dict)
    display_name: str | None = None
    owner: SearchOwner = attrs.field(factory=OwnSearchOwner)
    statuses: list[SessionStatusQuery] | None = None
    limit: int = 50
    cursor: SessionSearchCursor | None = None


# -- session search (reply side) -----------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionActive(TinkerModel):
    """Status of a running session.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["active"] = "active"


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionCancelled(TinkerModel):
    """Status of a cancelled session.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["cancelled"] = "cancelled"
    detail: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinishSuccess(TinkerModel):
    """Finish reason ``success``.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["success"] = "success"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinishErrored(TinkerModel):
    """Finish reason ``errored``.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["errored"] = "errored"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinishInterrupted(TinkerModel):
    """Finish reason ``interrupted``.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["interrupted"] = "interrupted"


@attrs.frozen(kw_only=True, field_transformer=checked)
class ClientSessionFinished(TinkerModel):
    """Status of a session the client finished.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["client_finished"] = "client_finished"
    reason: ClientSessionFinishSuccess | ClientSessionFinishErrored | ClientSessionFinishInterrupted
    detail: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailedRequestReason(TinkerModel):
    """A session failed because of one request.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["request"] = "request"
    request_id: str
    request_type: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailedTrainingRunReason(TinkerModel):
    """A session failed because of a training run.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["training_run"] = "training_run"
    training_run_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailedSamplingSessionReason(TinkerModel):
    """A session failed because of a sampling session.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionFailed(TinkerModel):
    """Status of a failed session.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["failed"] = "failed"
    category: Literal["user", "internal"]
    reason: (
        SessionFailedRequestReason
        | SessionFailedTrainingRunReason
        | SessionFailedSamplingSessionReason
    )
    message: str


SessionStatus: TypeAlias = SessionFailed | SessionCancelled | ClientSessionFinished | SessionActive


@attrs.frozen(kw_only=True, field_transformer=checked)
class SessionSummary(TinkerModel):
    """One session in a search reply.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

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
    """A page of session search results.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    sessions: list[SessionSummary]
    next_cursor: SessionSearchCursor | None = None


# -- billing and storage ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetBillingUsageRequest(TinkerRequest):
    """Query of ``GET /api/v1/billing/usage/events`` (RFC 3339 bounds).

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    starting_on: _dt.datetime
    ending_before: _dt.datetime


@attrs.frozen(kw_only=True, field_transformer=checked)
class TrainingBillingEvent(TinkerModel):
    """Billed training tokens.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["training"] = "training"
    token_count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class SamplingPrefillBillingEvent(TinkerModel):
    """Billed prefill tokens (``cached`` for prefix-cache hits).

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["sampling_prefill"] = "sampling_prefill"
    cached: bool
    token_count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class SamplingSampleBillingEvent(TinkerModel):
    """Billed sampled tokens.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["sampling_sample"] = "sampling_sample"
    token_count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class CheckpointBillingEvent(TinkerModel):
    """Billed checkpoint saves.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    type: Literal["checkpoint"] = "checkpoint"
    count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class StorageBillingEvent(TinkerModel):
    """Billed checkpoint storage.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

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
    """One bucket of billed usage.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

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
    """Session metadata referenced by billing events.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    user_metadata: dict[str, str] | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class BillingUsageResponse(TinkerModel):
    """Billed usage events.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    data: list[BillingUsageEvent]
    sessions: dict[str, BillingUsageSession] = attrs.field(factory=dict)
    cost_data_through: _dt.datetime | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetCurrentCheckpointStorageUsageRequest(TinkerRequest):
    """Query of ``GET /api/v1/billing/usage/checkpoints/current``.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    project_id: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class CurrentCheckpointStorageUsageItem(TinkerModel):
    """Checkpoint storage of one project or user.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

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
    """Current checkpoint storage usage.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    effective_rate_usd_per_gigabyte_month: float | None = None
    data: list[CurrentCheckpointStorageUsageItem]


# -- audit -------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, field_transformer=checked)
class AuditLogEntry(TinkerModel):
    """One audit log entry.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    timestamp: _dt.datetime
    event: str
    event_details: dict[str, Any] = attrs.field(factory=dict)
    model_id: str | None = None
    tinker_path: str | None = None
    purpose: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class AuditLogResponse(TinkerModel):
    """Audit log entries.

    Thread safety: immutable, safe to share. Fork safety: plain data.
    """

    entries: list[AuditLogEntry]
