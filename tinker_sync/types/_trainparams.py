"""Parameters of training: optimizer steps, optimizer families and LoRA.

Apart from the sampling parameters (``_params``) so that a first sample does not build these
classes (docs/scale-out.md#start-up): ``tinker_sync.types`` loads this module on the first
access to one of its names.

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

import math
from typing import Any, Literal, TypeAlias

import attrs

from tinker_sync.types._base import TinkerModel, TinkerRequest, checked, dump

__all__ = [
    "AdamOptimizerConfig",
    "AdamParams",
    "DimuonOptimizerConfig",
    "DimuonParams",
    "LoraConfig",
    "OptimParams",
    "OptimizerConfig",
    "OtherOptimizerConfig",
]


@attrs.frozen(kw_only=True, field_transformer=checked)
class AdamParams(TinkerRequest):
    """AdamW step hyperparameters (decoupled weight decay; ``grad_clip_norm=0`` disables clipping)."""

    learning_rate: float = 0.0001
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


def _finite(inst: Any, attribute: Any, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"DimuonParams.{attribute.name} must be finite, got {value}")


def _non_negative(inst: Any, attribute: Any, value: float) -> None:
    if value < 0:
        raise ValueError(f"DimuonParams.{attribute.name} must be >= 0, got {value}")


def _beta(inst: Any, attribute: Any, value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"DimuonParams.{attribute.name} must be in [0, 1), got {value}")


@attrs.frozen(kw_only=True, field_transformer=checked)
class DimuonParams(TinkerRequest):
    """Dimuon step hyperparameters: ``DimuonParams(learning_rate=0.02)``."""

    type: Literal["dimuon"] = "dimuon"
    learning_rate: float = attrs.field(validator=[_finite, _non_negative])
    grad_clip_norm: float = attrs.field(default=0.0, validator=_finite)
    beta1: float = attrs.field(default=0.9, validator=[_finite, _beta])


OptimParams: TypeAlias = AdamParams | DimuonParams
"""Per-step optimizer hyperparameters (the family must match the model's optimizer)."""


@attrs.frozen(kw_only=True, field_transformer=checked)
class AdamOptimizerConfig(TinkerRequest):
    """Selects AdamW at model creation (the default)."""

    type: Literal["adamw"] = "adamw"


@attrs.frozen(kw_only=True, field_transformer=checked)
class DimuonOptimizerConfig(TinkerRequest):
    """Selects Dimuon at model creation."""

    type: Literal["dimuon"] = "dimuon"
    version: Literal[1] = 1


@attrs.frozen(kw_only=True, field_transformer=checked)
class OtherOptimizerConfig(TinkerModel):
    """An optimizer family this SDK does not know, kept with its extra keys (server replies)."""

    type: str
    extra: dict[str, Any] = attrs.field(factory=dict)

    def _tinker_dump(self, json: bool, drop_none: bool, wire: bool) -> dict[str, Any]:
        out = {k: dump(v, json, drop_none, wire) for k, v in self.extra.items()}
        out["type"] = self.type
        return out


OptimizerConfig: TypeAlias = AdamOptimizerConfig | DimuonOptimizerConfig | OtherOptimizerConfig
"""The optimizer family chosen at model creation."""


@attrs.frozen(kw_only=True, field_transformer=checked)
class LoraConfig(TinkerRequest):
    """LoRA settings: ``LoraConfig(rank=32)``; ``seed`` is omitted on the wire when None."""

    rank: int
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True
