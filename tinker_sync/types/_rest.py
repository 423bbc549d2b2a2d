"""Checkpoints, training runs, sessions and other REST replies.

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

import datetime as _dt
from typing import Literal, TypeAlias

import attrs

from tinker_sync.types._base import TinkerModel, checked

__all__ = [
    "Checkpoint",
    "CheckpointType",
    "CheckpointsListResponse",
    "CopyWeightsResponse",
    "Cursor",
    "ExternalWeightsUrlsResponse",
    "GetSamplerResponse",
    "GetSessionResponse",
    "ListSessionsResponse",
    "ModelID",
    "ParsedCheckpointTinkerPath",
    "RequestID",
    "TraceExportResponse",
    "TrainingRun",
    "TrainingRunsResponse",
    "WhoamiResponse",
]

ModelID: TypeAlias = str
RequestID: TypeAlias = str
CheckpointType: TypeAlias = Literal["training", "sampler", "external"]

_SEGMENT_TO_TYPE: dict[str, CheckpointType] = {
    "weights": "training",
    "sampler_weights": "sampler",
    "external_weights": "external",
}
_TINKER_SCHEME = "tinker://"


@attrs.frozen(kw_only=True, field_transformer=checked)
class Checkpoint(TinkerModel):
    """A saved checkpoint (``checkpoint_id`` like ``weights/step1``)."""

    checkpoint_id: str
    checkpoint_type: CheckpointType
    time: _dt.datetime
    tinker_path: str
    size_bytes: int | None = None
    public: bool = False
    user_metadata: dict[str, str] | None = None
    expires_at: _dt.datetime | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class ParsedCheckpointTinkerPath(TinkerModel):
    """The parts of ``tinker://<run>/<weights|sampler_weights|external_weights>/<name>``.

    Usage: ``ParsedCheckpointTinkerPath.from_tinker_path("tinker://run-1/weights/step1")``.
    """

    tinker_path: str
    training_run_id: str
    checkpoint_type: CheckpointType
    checkpoint_id: str

    @classmethod
    def from_tinker_path(cls, tinker_path: str) -> "ParsedCheckpointTinkerPath":
        """Parse a tinker path; ``ValueError`` naming the path unless it has exactly 3 parts."""
        if not isinstance(tinker_path, str):
            raise TypeError(f"tinker path must be a str, got {type(tinker_path).__name__}")
        if not tinker_path.startswith(_TINKER_SCHEME):
            raise ValueError(f"Invalid tinker path {tinker_path!r}: it must start with 'tinker://'")
        parts = tinker_path[len(_TINKER_SCHEME) :].split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(
                f"Invalid tinker path {tinker_path!r}: expected "
                "tinker://<run>/<weights|sampler_weights|external_weights>/<name>"
            )
        checkpoint_type = _SEGMENT_TO_TYPE.get(parts[1])
        if checkpoint_type is None:
            raise ValueError(
                f"Invalid tinker path {tinker_path!r}: unknown segment {parts[1]!r} (expected "
                "weights, sampler_weights or external_weights)"
            )
        return cls(
            tinker_path=tinker_path,
            training_run_id=parts[0],
            checkpoint_type=checkpoint_type,
            checkpoint_id=f"{parts[1]}/{parts[2]}",
        )


@attrs.frozen(kw_only=True, field_transformer=checked)
class TrainingRun(TinkerModel):
    """A training run (a trained model) and its latest checkpoints."""

    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool
    corrupted: bool = False
    lora_rank: int | None = None
    last_request_time: _dt.datetime
    last_checkpoint: Checkpoint | None = None
    last_sampler_checkpoint: Checkpoint | None = None
    user_metadata: dict[str, str] | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class Cursor(TinkerModel):
    """Offset pagination state."""

    offset: int
    limit: int
    total_count: int


@attrs.frozen(kw_only=True, field_transformer=checked)
class TrainingRunsResponse(TinkerModel):
    """A page of training runs."""

    training_runs: list[TrainingRun]
    cursor: Cursor


@attrs.frozen(kw_only=True, field_transformer=checked)
class CheckpointsListResponse(TinkerModel):
    """A list (or page) of checkpoints."""

    checkpoints: list[Checkpoint]
    cursor: Cursor | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class ExternalWeightsUrlsResponse(TinkerModel):
    """Signed download URLs of an external checkpoint (relative path -> URL)."""

    urls: dict[str, str]
    expires: _dt.datetime


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetSessionResponse(TinkerModel):
    """The training runs and samplers of a session."""

    training_run_ids: list[str]
    sampler_ids: list[str]
    user_metadata: dict[str, str] | None = None
    display_name: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class ListSessionsResponse(TinkerModel):
    """A page of session ids."""

    sessions: list[str]


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetSamplerResponse(TinkerModel):
    """A sampler's base model and weights path."""

    sampler_id: str
    base_model: str
    model_path: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class WhoamiResponse(TinkerModel):
    """The caller's identity (decoded from the auth JWT)."""

    user_urn: str
    org_urn: str
    email: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class CopyWeightsResponse(TinkerModel):
    """Result of ``copy_weights``: the new checkpoint's path."""

    tinker_path: str


@attrs.frozen(kw_only=True, field_transformer=checked)
class TraceExportResponse(TinkerModel):
    """State of a session trace export (``pending``, ``ready`` with ``url``, or ``failed``)."""

    status: str
    url: str | None = None
    error: str | None = None
