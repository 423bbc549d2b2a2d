"""Client-side checks of call arguments the server would reject: fail before anything is sent.

Usage (inside the clients)::

    check_sampling_params(params)            # ValueError naming the field
    check_loss_inputs(data, "cross_entropy") # ValueError naming data[i] and the input
    run_id = check_str("training_run_id", run_id)   # TypeError / ValueError naming the argument
    limit = check_int("limit", limit)               # an int (not a bool) >= minimum
    ttl = check_ttl(ttl_seconds)                    # None or a positive int
    check_checkpoint_name(name)                     # non-empty, no "/"
    scope = check_scope(access_scope)               # "owned" or "accessible"

The one home of the clients' argument checks: a wrong argument fails in the caller's thread,
before anything is sent, with an error naming it.

Only what every Tinker server rejects is checked here, so that no program the official SDK
runs is refused: a negative or non-finite ``temperature``, ``max_tokens`` below 1, a built-in
loss without an input it needs, and per-token inputs whose length differs from the datum's
``model_input``. The types themselves stay as permissive as the official ones.

Thread safety: pure functions. Fork safety: no state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from tinker_sync.types import SamplingParams, TensorData

if TYPE_CHECKING:
    from tinker_sync.types import Datum

__all__ = [
    "AccessScope",
    "check_checkpoint_name",
    "check_int",
    "check_loss_inputs",
    "check_opt_str",
    "check_sampling_params",
    "check_scope",
    "check_str",
    "check_ttl",
]

AccessScope = Literal["owned", "accessible"]


def check_str(name: str, value: object) -> str:
    """``value`` as a non-empty str (TypeError / ValueError naming ``name``)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty str")
    return value


def check_opt_str(name: str, value: object) -> str | None:
    """None, or ``value`` as a non-empty str."""
    return None if value is None else check_str(name, value)


def check_int(name: str, value: object, *, minimum: int = 0) -> int:
    """``value`` as an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_ttl(ttl_seconds: object) -> int | None:
    """None (no expiry) or a positive int of seconds."""
    if ttl_seconds is None:
        return None
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int):
        raise TypeError(f"ttl_seconds must be an int or None, got {type(ttl_seconds).__name__}")
    if ttl_seconds <= 0:
        raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
    return ttl_seconds


def check_checkpoint_name(name: object) -> None:
    """A checkpoint name: a non-empty str without ``/``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if "/" in name:
        raise ValueError(f"name must not contain '/': {name!r}")


def check_scope(value: object) -> AccessScope:
    """``access_scope``: ``"owned"`` or ``"accessible"``."""
    if value == "owned":
        return "owned"
    if value == "accessible":
        return "accessible"
    raise ValueError(f"access_scope must be 'owned' or 'accessible', got {value!r}")


def check_sampling_params(params: SamplingParams, name: str = "sampling_params") -> None:
    """``temperature`` finite and >= 0; ``max_tokens`` None or >= 1."""
    temperature = params.temperature
    if isinstance(temperature, (int, float)) and not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(f"{name}.temperature must be a finite number >= 0, got {temperature!r}")
    max_tokens = params.max_tokens
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens < 1:
        raise ValueError(f"{name}.max_tokens must be >= 1 (or None), got {max_tokens!r}")


def _dense_shape(tensor: TensorData) -> tuple[int, ...]:
    if tensor.shape is not None:
        return tuple(tensor.shape)
    return tuple(tensor.data_np.shape)


def check_loss_inputs(data: Sequence[Datum], loss_fn: str) -> None:
    """Each datum has the inputs ``loss_fn`` needs, one row per ``model_input`` token."""
    from tinker_sync.types._datum import LOSS_FN_REQUIRED_INPUTS, PER_TOKEN_INPUTS

    required = LOSS_FN_REQUIRED_INPUTS.get(loss_fn)
    if required is None:  # "custom": the client computes it, its inputs are the user's
        return
    for i, datum in enumerate(data):
        inputs = datum.loss_fn_inputs
        missing = [key for key in required if key not in inputs]
        if missing:
            raise ValueError(
                f"data[{i}].loss_fn_inputs lacks {missing[0]!r}, which loss_fn {loss_fn!r} "
                f"needs (it needs {list(required)})"
            )
        n_tokens = datum.model_input.length
        targets = _dense_shape(inputs["target_tokens"])
        if len(targets) not in (1, 2) or targets[0] != n_tokens:
            raise ValueError(
                f"data[{i}].loss_fn_inputs['target_tokens'] has shape {list(targets)} but "
                f"data[{i}].model_input has {n_tokens} tokens: it needs one row per input "
                f"token, shape [{n_tokens}] or [{n_tokens}, K]"
            )
        for key in PER_TOKEN_INPUTS:
            tensor = inputs.get(key)
            if tensor is not None and _dense_shape(tensor) != targets:
                raise ValueError(
                    f"data[{i}].loss_fn_inputs[{key!r}] has shape "
                    f"{list(_dense_shape(tensor))}, not the shape of target_tokens "
                    f"{list(targets)}"
                )
