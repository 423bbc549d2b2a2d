"""Client-side custom loss for ``TrainingClient.forward_backward_custom``
(docs/design/behavior.md#client-side-custom-loss, needs torch).

Protocol (the official two-pass flow): reserve 2C seq_ids at once; send C forward-only
``cross_entropy`` chunks; run the user's loss on per-datum logprob tensors with autograd; send
C backward chunks on the same boundaries with ``weights = -dLoss/dlogprobs``. The server's
``loss:sum`` becomes ``surrogate_loss:sum``, the user's metrics are merged, and ``loss:sum`` is
the user's loss. **Difference from the official SDK:** if the forward pass or the user's loss
fails, the backward chunks are still sent with all-zero weights (a no-op gradient), so their
seq_ids are filled and later requests are not blocked; the future fails with the original
error and the client stays usable.

Thread safety: runs inside the op's turn on the client's sender thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tinker_sync._futures import APIFuture
from tinker_sync._training.chunkgroup import ChunkGroup
from tinker_sync._transport import current_sdk_method
from tinker_sync.types import Datum, ForwardBackwardOutput, TensorData
from tinker_sync.types._base import accept

if TYPE_CHECKING:
    from tinker_sync.training_client import TrainingClient

log = logging.getLogger("tinker_sync.custom_loss")

LossFn = Callable[[list[Datum], list[Any]], tuple[Any, dict[str, float]]]
CustomLossFnV1 = LossFn
"""The official SDK's name for the ``forward_backward_custom`` loss signature."""


def _require_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            "forward_backward_custom needs torch: pip install 'tinker-sync[torch]'"
        ) from exc
    return torch


def _forward_datum(datum: Datum) -> Datum:
    inputs = datum.loss_fn_inputs
    if "target_tokens" not in inputs:
        raise ValueError(
            "forward_backward_custom needs loss_fn_inputs['target_tokens'] in every datum"
        )
    target = inputs["target_tokens"]
    weights = inputs.get("weights")
    if weights is None:
        weights = TensorData.from_numpy(np.zeros(target.to_numpy().shape, dtype=np.float32))
    return datum.model_copy(
        update={"loss_fn_inputs": {"target_tokens": target, "weights": weights}}
    )


def _backward_datum(datum: Datum, weights: np.ndarray[Any, Any]) -> Datum:
    target = datum.loss_fn_inputs["target_tokens"]
    return datum.model_copy(
        update={
            "loss_fn_inputs": {
                "target_tokens": target,
                "weights": TensorData.from_numpy(weights.astype(np.float32, copy=False)),
            }
        }
    )


def submit_custom_loss(
    client: TrainingClient, data: list[Datum], fn: LossFn
) -> APIFuture[ForwardBackwardOutput]:
    """Validate, reserve 2C seq_ids and queue the two-pass job; returns the op's future."""
    from tinker_sync._wire._chunking import chunk_ranges, estimate_datum_bytes
    from tinker_sync._wire._proto import encode_forward_backward_request

    torch = _require_torch()
    client._check_usable()
    if not isinstance(data, list) or not data:
        raise ValueError("data must be a non-empty list of Datum")
    data = [
        d if isinstance(d, Datum) else accept(d, Datum, f"data[{i}]") for i, d in enumerate(data)
    ]
    fwd_data = [_forward_datum(d) for d in data]
    server = client._session.server
    ranges = chunk_ranges(
        fwd_data, server.fwdbwd_max_chunk_len, server.fwdbwd_max_chunk_bytes_count
    )
    fwd_bodies = [
        encode_forward_backward_request(
            client.model_id, None, fwd_data[a:b], "cross_entropy", None, True
        )
        for a, b in ranges
    ]
    estimates = [sum(estimate_datum_bytes(d) for d in fwd_data[a:b]) for a, b in ranges]
    n = len(ranges)
    sdk_method = current_sdk_method.get()
    fut: APIFuture[ForwardBackwardOutput] = APIFuture(
        cancellable=False, description="ForwardBackwardCustom"
    )
    fut._owner = client._session  # type: ignore[attr-defined]

    def job(ids: list[int]) -> None:
        fwd_ids, bwd_ids = ids[:n], ids[n:]
        error: BaseException | None = None
        user_loss = 0.0
        user_metrics: dict[str, float] = {}
        grads: list[np.ndarray[Any, Any]] = []
        try:
            from tinker_sync._wire._metrics import combine_forward_backward_outputs

            fwd_fut: APIFuture[ForwardBackwardOutput] = APIFuture(cancellable=False)
            group = ChunkGroup(fwd_fut, n, combine_forward_backward_outputs, "forward (custom)")
            client._send_chunks(fwd_ids, fwd_bodies, estimates, "Forward", group, sdk_method)
            forward = fwd_fut.result()
            logprobs = [
                torch.tensor(out["logprobs"].to_numpy(), dtype=torch.float32, requires_grad=True)
                for out in forward.loss_fn_outputs
            ]
            loss, metrics = fn(data, logprobs)
            loss.backward()
            user_loss = float(loss.detach())
            user_metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
            for lp in logprobs:
                grad = lp.grad
                grads.append(
                    np.zeros(lp.shape, np.float32)
                    if grad is None
                    else -grad.detach().numpy().astype(np.float32)
                )
        except BaseException as exc:  # the backward ids must be filled anyway
            error = exc
            grads = [
                np.zeros(d.loss_fn_inputs["target_tokens"].to_numpy().shape, np.float32)
                for d in fwd_data
            ]
        bwd_data = [_backward_datum(d, g) for d, g in zip(fwd_data, grads, strict=True)]
        bwd_bodies = [
            encode_forward_backward_request(
                client.model_id, None, bwd_data[a:b], "cross_entropy", None, False
            )
            for a, b in ranges
        ]

        def combine(outputs: list[ForwardBackwardOutput]) -> ForwardBackwardOutput:
            from tinker_sync._wire._metrics import combine_forward_backward_outputs

            merged = combine_forward_backward_outputs(outputs)
            metrics_out = dict(merged.metrics)
            if "loss:sum" in metrics_out:
                metrics_out["surrogate_loss:sum"] = metrics_out.pop("loss:sum")
            metrics_out.update(user_metrics)
            metrics_out["loss:sum"] = user_loss
            return merged.model_copy(update={"metrics": metrics_out})

        target: APIFuture[ForwardBackwardOutput] = (
            fut if error is None else APIFuture(cancellable=False)
        )
        bwd_group = ChunkGroup(target, n, combine, "backward (custom)")
        client._send_chunks(
            bwd_ids, bwd_bodies, estimates, "ForwardBackward", bwd_group, sdk_method
        )
        if error is not None:
            log.warning(
                "custom loss failed; its backward chunks were sent with zero weights: %r", error
            )
            fut._fail(error)

    client._sequencer.reserve(2 * n, job, on_abandon=fut._fail)
    return fut
