"""JSON forms of the sample and forward/backward results, read by the client when a server of
an older protocol revision answers in JSON instead of protobuf
(``docs/design/behavior.md#poll-answer-order``, ``docs/design/behavior.md#older-servers``).

Usage::

    response = sample_response_from_json(reply.json(), future.sample_sequence_ids)
    output = forward_backward_output_from_json(reply.json())

Integer fields accept only JSON integers (no ``1.9 -> 1``); unknown keys are ignored.

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tinker_sync._wire import _pbwire as pb
from tinker_sync._wire._pbwire import (
    STOP_REASON_CODES,
    TOPK_SENTINEL_LOGPROB,
    AnyArray,
    tensor_data,
)
from tinker_sync.types import (
    ForwardBackwardOutput,
    PromptAltTokens,
    SampledSequence,
    SampleResponse,
    TensorData,
    TopkLogprobs,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["forward_backward_output_from_json", "sample_response_from_json"]


def _json_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what}: expected a list, got {type(value).__name__}")
    return value


def _json_numbers(value: Any, dtype: np.dtype[Any], what: str) -> AnyArray:
    """A flat JSON list of numbers as an array; integer dtypes accept only ints (no 1.9 -> 1)."""
    import numpy as np

    items = _json_list(value, what)
    allowed: type | tuple[type, ...] = int if dtype.kind == "i" else (int, float)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, allowed):
            expected = "integers" if dtype.kind == "i" else "numbers"
            raise TypeError(f"{what}: expected {expected}, got {type(item).__name__} {item!r}")
    if dtype.kind == "i" and items:
        # numpy 1.x wraps out-of-range integers silently (2.x raises): check the range here
        info = np.iinfo(dtype)
        low, high = min(items), max(items)
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise ValueError(f"{what}: {bad} is out of bounds for {dtype.name}")
    try:
        return np.asarray(items, dtype=dtype).reshape(-1)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{what}: {exc}") from exc


def _tensor_from_json(obj: Any, what: str) -> TensorData:
    if not isinstance(obj, Mapping):
        raise TypeError(f"{what}: expected a TensorData object, got {type(obj).__name__}")
    dtype = obj.get("dtype")
    if dtype not in pb.DTYPE_NUMPY:
        raise ValueError(f"{what}.dtype: expected 'int64' or 'float32', got {dtype!r}")
    data = _json_numbers(obj.get("data", []), pb.DTYPE_NUMPY[dtype], f"{what}.data")
    shape_obj = obj.get("shape")
    shape = (
        None
        if shape_obj is None
        else [int(s) for s in _json_numbers(shape_obj, pb.LE_I8, f"{what}.shape")]
    )
    crow_obj = obj.get("sparse_crow_indices")
    col_obj = obj.get("sparse_col_indices")
    if crow_obj is not None or col_obj is not None:
        if crow_obj is None or col_obj is None or shape is None:
            raise ValueError(f"{what}: CSR needs both index lists and a shape")
        return tensor_data(
            data,
            dtype,
            shape,
            _json_numbers(crow_obj, pb.LE_I8, f"{what}.sparse_crow_indices"),
            _json_numbers(col_obj, pb.LE_I8, f"{what}.sparse_col_indices"),
        )
    if shape is not None and math.prod(shape) != data.size:
        raise ValueError(f"{what}: {data.size} values do not fit shape {shape}")
    return tensor_data(data, dtype, shape)


def _topk_from_json(value: Any, what: str) -> TopkLogprobs | None:
    if value is None:
        return None
    rows = _json_list(value, what)
    width = 0
    for row in rows:
        if row is not None:
            width = max(width, len(_json_list(row, what)))
    k = max(width, 1) if rows else 0
    import numpy as np

    ids = np.zeros((len(rows), k), dtype=np.int32)
    lps = np.full((len(rows), k), TOPK_SENTINEL_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        if row is None:
            continue
        for j, pair in enumerate(row):
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise TypeError(f"{what}[{i}][{j}]: expected a [token_id, logprob] pair")
            token, logprob = pair
            if isinstance(token, bool) or not isinstance(token, int):
                raise TypeError(f"{what}[{i}][{j}]: token id must be an int")
            if isinstance(logprob, bool) or not isinstance(logprob, int | float):
                raise TypeError(f"{what}[{i}][{j}]: logprob must be a number")
            ids[i, j] = token
            lps[i, j] = logprob
    return TopkLogprobs(token_ids=ids, logprobs=lps)


def sample_response_from_json(
    obj: Mapping[str, Any], sequence_ids: Sequence[str] | None
) -> SampleResponse:
    """Build a SampleResponse from a JSON result (older servers,
    docs/design/behavior.md#poll-answer-order step 5).

    Usage: ``sample_response_from_json(response.json(), future.sample_sequence_ids)``.

    Accepts ``sequences`` (each ``stop_reason``, ``tokens``, optional ``logprobs`` and
    ``topk_logprobs``), ``prompt_logprobs`` (``null`` entries = not computed),
    ``topk_prompt_logprobs`` (rows of ``[token_id, logprob]`` pairs or ``null``),
    ``prompt_cache_hit_tokens``, ``target_prompt_logprobs`` (TensorData JSON) and
    ``prompt_alt_tokens`` (``{"tokens", "logprobs"}`` TensorData JSON); unknown keys are ignored.

    :raises ValueError | TypeError: a missing or ill-typed field, an unknown stop reason, or a
        sequence-id count mismatch.
    """
    import numpy as np

    if not isinstance(obj, Mapping):
        raise TypeError(f"SampleResponse: expected an object, got {type(obj).__name__}")
    raw_sequences = _json_list(obj.get("sequences"), "sequences")
    if sequence_ids is not None and len(sequence_ids) != len(raw_sequences):
        raise ValueError(
            f"the server sent {len(sequence_ids)} sample_sequence_ids "
            f"for {len(raw_sequences)} sequences"
        )
    sequences: list[SampledSequence] = []
    for index, raw in enumerate(raw_sequences):
        what = f"sequences[{index}]"
        if not isinstance(raw, Mapping):
            raise TypeError(f"{what}: expected an object")
        stop_reason = raw.get("stop_reason")
        if stop_reason not in STOP_REASON_CODES:
            raise ValueError(f"{what}.stop_reason: unknown value {stop_reason!r}")
        logprobs = raw.get("logprobs")
        sequences.append(
            SampledSequence(
                stop_reason=stop_reason,
                sequence_id=None if sequence_ids is None else sequence_ids[index],
                tokens_np=_json_numbers(raw.get("tokens"), pb.LE_I4, f"{what}.tokens").astype(
                    np.int32
                ),
                logprobs_np=(
                    None
                    if logprobs is None
                    else _json_numbers(
                        [math.nan if v is None else v for v in _json_list(logprobs, what)],
                        pb.LE_F4,
                        f"{what}.logprobs",
                    ).astype(np.float32)
                ),
                topk_logprobs_np=_topk_from_json(raw.get("topk_logprobs"), f"{what}.topk_logprobs"),
            )
        )
    prompt_logprobs = obj.get("prompt_logprobs")
    prompt_np = None
    if prompt_logprobs is not None:
        prompt_np = _json_numbers(
            [math.nan if v is None else v for v in _json_list(prompt_logprobs, "prompt_logprobs")],
            pb.LE_F4,
            "prompt_logprobs",
        ).astype(np.float32)
    target = obj.get("target_prompt_logprobs")
    alt = obj.get("prompt_alt_tokens")
    prompt_alt = None
    if alt is not None:
        if not isinstance(alt, Mapping):
            raise TypeError("prompt_alt_tokens: expected an object")
        prompt_alt = PromptAltTokens(
            tokens=_tensor_from_json(alt.get("tokens"), "prompt_alt_tokens.tokens"),
            logprobs=_tensor_from_json(alt.get("logprobs"), "prompt_alt_tokens.logprobs"),
        )
    hits = obj.get("prompt_cache_hit_tokens", 0)
    if hits is None:
        hits = 0
    if isinstance(hits, bool) or not isinstance(hits, int):
        raise TypeError("prompt_cache_hit_tokens: expected an int")
    return SampleResponse(
        sequences=sequences,
        prompt_logprobs_np=prompt_np,
        topk_prompt_logprobs_np=_topk_from_json(
            obj.get("topk_prompt_logprobs"), "topk_prompt_logprobs"
        ),
        target_prompt_logprobs=(
            None if target is None else _tensor_from_json(target, "target_prompt_logprobs")
        ),
        prompt_cache_hit_tokens=hits,
        prompt_alt_tokens=prompt_alt,
    )


def forward_backward_output_from_json(obj: Mapping[str, Any]) -> ForwardBackwardOutput:
    """Build a ForwardBackwardOutput from a JSON result (older servers,
    docs/design/behavior.md#poll-answer-order step 5).

    Usage: ``forward_backward_output_from_json(response.json())``.

    Accepts ``loss_fn_output_type`` (default ``"ArrayRecord"``), ``loss_fn_outputs`` (a list of
    ``{name: TensorData JSON}``) and ``metrics`` (missing or null = ``{}``,
    docs/design/behavior.md#older-servers).

    :raises ValueError | TypeError: a missing or ill-typed field.
    """
    if not isinstance(obj, Mapping):
        raise TypeError(f"ForwardBackwardOutput: expected an object, got {type(obj).__name__}")
    output_type = obj.get("loss_fn_output_type", "ArrayRecord")
    if not isinstance(output_type, str):
        raise TypeError("loss_fn_output_type: expected a string")
    outputs: list[dict[str, TensorData]] = []
    for index, raw in enumerate(_json_list(obj.get("loss_fn_outputs", []), "loss_fn_outputs")):
        if not isinstance(raw, Mapping):
            raise TypeError(f"loss_fn_outputs[{index}]: expected an object")
        outputs.append(
            {
                str(name): _tensor_from_json(value, f"loss_fn_outputs[{index}][{name!r}]")
                for name, value in raw.items()
            }
        )
    raw_metrics = obj.get("metrics") or {}
    if not isinstance(raw_metrics, Mapping):
        raise TypeError("metrics: expected an object")
    metrics: dict[str, float] = {}
    for name, value in raw_metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"metrics[{name!r}]: expected a number")
        metrics[str(name)] = float(value)
    return ForwardBackwardOutput(
        loss_fn_output_type=output_type, loss_fn_outputs=outputs, metrics=metrics
    )
