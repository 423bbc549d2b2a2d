"""Results of checkpoint, optimizer and model-info operations (``optim_step``, the saves and
loads, ``get_info``, server capabilities, weights info).

Apart from the sampling results (``_results``) so that a first sample does not build these
classes (docs/scale-out.md#start-up): ``tinker_sync.types`` loads this module on the first
access to one of its names.

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

from typing import Literal
from urllib.parse import quote

import attrs

from tinker_sync.types._base import TinkerModel, checked
from tinker_sync.types._trainparams import AdamOptimizerConfig, OptimizerConfig

__all__ = [
    "GetInfoResponse",
    "GetServerCapabilitiesResponse",
    "LoadWeightsResponse",
    "ModelData",
    "OptimStepResponse",
    "SaveWeightsExternalResponse",
    "SaveWeightsExternalResponseInternal",
    "SaveWeightsForSamplerResponse",
    "SaveWeightsForSamplerResponseInternal",
    "SaveWeightsResponse",
    "SupportedModel",
    "WeightsInfoResponse",
    "checkpoint_console_url",
    "checkpoint_playground_url",
]

_CONSOLE_BASE_URL = "https://tinker.thinkingmachines.ai"


@attrs.frozen(kw_only=True, field_transformer=checked)
class OptimStepResponse(TinkerModel):
    """Result of ``optim_step``: optional metrics."""

    metrics: dict[str, float] | None = None


def checkpoint_console_url(tinker_path: str) -> str:
    """The Tinker Console URL of the checkpoint at ``tinker_path``."""
    from tinker_sync.types._rest import ParsedCheckpointTinkerPath

    parsed = ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
    return (
        f"{_CONSOLE_BASE_URL}/checkpoints/{quote(parsed.training_run_id, safe='')}/"
        f"{quote(parsed.checkpoint_id, safe='')}"
    )


def checkpoint_playground_url(tinker_path: str) -> str:
    """The Tinker Playground URL configured with the checkpoint at ``tinker_path``."""
    return (
        f"{_CONSOLE_BASE_URL}/playground?mode=checkpoint&checkpoint={quote(tinker_path, safe='')}"
    )


def _require_path(path: str | None, what: str) -> str:
    if path is None:
        raise ValueError(f"{what} has no path (an ephemeral save)")
    return path


@attrs.frozen(kw_only=True, field_transformer=checked)
class SaveWeightsResponse(TinkerModel):
    """Result of ``save_state``: ``path`` is ``tinker://<run>/weights/<name>``."""

    path: str
    type: Literal["save_weights"] | None = None

    def get_console_url(self) -> str:
        """The Tinker Console URL of this checkpoint."""
        return checkpoint_console_url(self.path)


@attrs.frozen(kw_only=True, field_transformer=checked)
class SaveWeightsForSamplerResponse(TinkerModel):
    """Result of a sampler save: a ``path`` for a named save, a ``sampling_session_id`` for an
    ephemeral one.
    """

    path: str | None = None
    sampling_session_id: str | None = None
    type: Literal["save_weights_for_sampler"] | None = None

    def get_console_url(self) -> str:
        """The Tinker Console URL of this sampler checkpoint."""
        return checkpoint_console_url(_require_path(self.path, "SaveWeightsForSamplerResponse"))

    def get_playground_url(self) -> str:
        """A Tinker Playground URL configured with this checkpoint."""
        return checkpoint_playground_url(_require_path(self.path, "SaveWeightsForSamplerResponse"))


@attrs.frozen(kw_only=True, field_transformer=checked)
class SaveWeightsExternalResponse(TinkerModel):
    """Result of an external-format save: ``tinker://<run>/external_weights/<name>``."""

    path: str
    size_bytes: int | None = None
    type: Literal["save_weights_external"] | None = None

    def get_console_url(self) -> str:
        """The Tinker Console URL of this checkpoint."""
        return checkpoint_console_url(self.path)

    def get_playground_url(self) -> str:
        """A Tinker Playground URL configured with this checkpoint."""
        return checkpoint_playground_url(self.path)


@attrs.frozen(kw_only=True, field_transformer=checked)
class LoadWeightsResponse(TinkerModel):
    """Result of ``load_weights``."""

    path: str | None = None
    model_id: str | None = None
    type: Literal["load_weights"] | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class ModelData(TinkerModel):
    """Model metadata inside ``GetInfoResponse``."""

    arch: str | None = None
    model_name: str | None = None
    tokenizer_id: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetInfoResponse(TinkerModel):
    """Information about a training model (``TrainingClient.get_info()``)."""

    type: Literal["get_info"] | None = None
    model_data: ModelData
    model_id: str
    optimizer_config: OptimizerConfig = attrs.field(factory=AdamOptimizerConfig)
    is_lora: bool | None = None
    lora_rank: int | None = None
    model_name: str | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class SupportedModel(TinkerModel):
    """One entry of ``GetServerCapabilitiesResponse.supported_models``."""

    model_name: str | None = None
    max_context_length: int | None = None
    trainable: bool | None = None
    sampleable: bool | None = None


@attrs.frozen(kw_only=True, field_transformer=checked)
class GetServerCapabilitiesResponse(TinkerModel):
    """The models a server offers."""

    supported_models: list[SupportedModel]


@attrs.frozen(kw_only=True, field_transformer=checked)
class WeightsInfoResponse(TinkerModel):
    """What a checkpoint holds (``RestClient.get_weights_info_by_tinker_path``)."""

    base_model: str
    optimizer_config: OptimizerConfig = attrs.field(factory=AdamOptimizerConfig)
    is_lora: bool
    lora_rank: int | None = None
    train_unembed: bool | None = None
    train_mlp: bool | None = None
    train_attn: bool | None = None


SaveWeightsForSamplerResponseInternal = SaveWeightsForSamplerResponse
SaveWeightsExternalResponseInternal = SaveWeightsExternalResponse
