"""Parameters: sampling, and small literal aliases.

The optimizer and LoRA parameters are in ``_trainparams`` (loaded on first use, so a first
sample does not build them: docs/scale-out.md#start-up); their old names here still work.

Thread safety: every type here is immutable and safe to share. Fork safety: plain data.
"""

from typing import Any, Literal, TypeAlias

import attrs

from tinker_sync.types._base import TinkerRequest, checked, moved_names
from tinker_sync.types._coerce import Invalid, to_int, to_str

__all__ = [
    "SamplingClientKind",
    "SamplingParams",
    "StopReason",
]

StopReason: TypeAlias = Literal["length", "stop"]
SamplingClientKind: TypeAlias = Literal["snapshot", "inflight"]


def _stop(value: Any) -> str | list[str] | list[int] | None:
    if value is None or type(value) is str:
        return value
    if isinstance(value, (list, tuple)):
        items = list(value)
        if all(type(v) is str for v in items) or all(type(v) is int for v in items):
            return items
        try:  # pydantic's smart union: list[str], then list[int]
            return [to_str(v) for v in items]
        except Invalid:
            pass
        try:
            return [to_int(v) for v in items]
        except Invalid:
            pass
    else:
        try:
            return to_str(value)
        except Invalid:
            pass
    raise TypeError(
        "SamplingParams.stop must be None, a str, a list of str or a list of int (not mixed), "
        f"got {value!r}"
    )


@attrs.frozen(kw_only=True, field_transformer=checked)
class SamplingParams(TinkerRequest):
    """How to sample: ``SamplingParams(max_tokens=64, temperature=0.7, stop=["\\n"])``.

    ``stop=None`` keeps the implicit EOS stop; ``stop=[]`` disables every stop, EOS included.
    """

    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | list[int] | None = attrs.field(default=None, converter=_stop)
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


#: The names that moved to ``_trainparams`` (for imports and pickles that name this module).
__getattr__ = moved_names(
    __name__,
    "tinker_sync.types._trainparams",
    (
        "AdamOptimizerConfig",
        "AdamParams",
        "DimuonOptimizerConfig",
        "DimuonParams",
        "LoraConfig",
        "OptimParams",
        "OptimizerConfig",
        "OtherOptimizerConfig",
    ),
)
