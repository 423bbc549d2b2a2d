"""``tinker://`` checkpoint paths as the clients accept them (one parser for REST, CLI, download).

Usage::

    from tinker_sync._paths import parse_checkpoint_path

    p = parse_checkpoint_path("tinker://run-1/weights/step1")
    p.training_run_id, p.checkpoint_id, p.checkpoint_type   # "run-1", "weights/step1", "training"
    p = parse_checkpoint_path("tinker://run-1/step1")        # no kind segment
    p.checkpoint_id, p.checkpoint_type                       # "step1", None

The official form is ``tinker://<run>/<weights|sampler_weights|external_weights>/<name>``.
Some servers answer ``save_weights_for_sampler`` with ``tinker://<run>/<name>``: that path is
unambiguous for the server that issued it (its checkpoint id is ``<name>``), so it is accepted
with ``checkpoint_type=None`` and sent back as is. ``ParsedCheckpointTinkerPath`` (the official
type) keeps the official rules.

Thread safety: pure functions. Fork safety: no state.
"""

from __future__ import annotations

from dataclasses import dataclass

from tinker_sync.types import CheckpointType, ParsedCheckpointTinkerPath

__all__ = ["CheckpointPath", "parse_checkpoint_path"]

_SCHEME = "tinker://"
_KINDS = ("weights", "sampler_weights", "external_weights")


@dataclass(frozen=True)
class CheckpointPath:
    """A parsed checkpoint path; ``checkpoint_type`` is None when the path names no kind."""

    tinker_path: str
    training_run_id: str
    checkpoint_id: str
    checkpoint_type: CheckpointType | None


def parse_checkpoint_path(tinker_path: object) -> CheckpointPath:
    """Parse ``tinker://<run>/<kind>/<name>`` or ``tinker://<run>/<name>``.

    ``TypeError`` for a non-string; ``ValueError`` naming the path and the accepted forms.
    """
    if not isinstance(tinker_path, str):
        raise TypeError(f"tinker_path must be a str, got {type(tinker_path).__name__}")
    parts = tinker_path[len(_SCHEME) :].split("/") if tinker_path.startswith(_SCHEME) else []
    if len(parts) == 2 and all(parts) and parts[1] not in _KINDS:
        return CheckpointPath(tinker_path, parts[0], parts[1], None)
    try:
        parsed = ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
    except ValueError as exc:
        raise ValueError(f"{exc} (or tinker://<run>/<name>)") from None
    return CheckpointPath(
        tinker_path, parsed.training_run_id, parsed.checkpoint_id, parsed.checkpoint_type
    )
