"""forward_backward_custom against the real local server
(docs/design/behavior.md#client-side-custom-loss; needs torch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync.exceptions import RequestErrorCategory, RequestFailedError
from tinker_sync.local import LocalServer

torch = pytest.importorskip("torch")

HANG = 60.0


def datum(n: int = 5, offset: int = 0) -> types.Datum:
    tokens = (np.arange(n + 1, dtype=np.int64) + offset) % 200
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:]},
    )


def fwdbwd_requests(server: LocalServer, model_id: str) -> list[tuple[int, bool]]:
    """``(seq_id, forward_only)`` of each accepted forward_backward request, by seq_id."""
    out = {
        r.proto["seq_id"]: bool(r.proto["forward_only"])
        for r in server.requests.filter(endpoint="forward_backward", status=200)
        if r.proto and r.proto.get("model_id") == model_id
    }
    return sorted(out.items())


def server_metrics(server: LocalServer, model_id: str, seq_id: int) -> dict[str, float]:
    """Metrics of the server-side result of ``(model_id, seq_id)``."""
    app = server.app
    assert app is not None

    def find() -> dict[str, float]:
        for rec in app._futures._by_id.values():
            if rec.owner == model_id and rec.seq_id == seq_id and rec.state == "done":
                return dict(rec.result.metrics)
        raise AssertionError(f"no completed result for seq_id {seq_id}")

    return app._on_loop(find)


def weighted_loss(coef: float) -> Any:
    def loss_fn(data: list[types.Datum], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
        loss = sum(-coef * lp.sum() for lp in logprobs)
        return loss, {"custom_metric:mean": 3.5}

    return loss_fn


@pytest.fixture
def rig():  # type: ignore[no-untyped-def]
    config = {"fwdbwd_max_chunk_len": 2}
    with LocalServer(client_config=config, long_poll_s=2.0, gap_grace_s=60.0) as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            yield server, service.create_lora_training_client("base", rank=4)


def test_successful_custom_loss_renames_metrics_and_sends_gradients(rig) -> None:
    """2C ids (forward chunks, then backward chunks on the same boundaries); the server's
    loss:sum becomes surrogate_loss:sum; user metrics merged; loss:sum is the user's loss.

    See docs/design/behavior.md#client-side-custom-loss.
    """
    server, training = rig
    data = [datum(offset=i) for i in range(5)]  # chunk length 2: C = 3 chunks
    out = training.forward_backward_custom(data, weighted_loss(0.5)).result(HANG)
    assert len(out.loss_fn_outputs) == 5
    assert fwdbwd_requests(server, training.model_id) == [
        (1, True),
        (2, True),
        (3, True),
        (4, False),
        (5, False),
        (6, False),
    ]
    # loss = -0.5 * sum(logprobs), so weights = -dLoss/dlogprobs = 0.5 and the server's
    # cross-entropy surrogate -sum(w * logprobs) equals the user's loss.
    assert out.metrics["custom_metric:mean"] == 3.5
    assert out.metrics["surrogate_loss:sum"] == pytest.approx(out.metrics["loss:sum"], rel=1e-5)
    assert out.metrics["loss:sum"] > 0
    server_loss = sum(server_metrics(server, training.model_id, s)["loss:sum"] for s in (4, 5, 6))
    assert server_loss == pytest.approx(out.metrics["loss:sum"], rel=1e-5)


def test_a_failing_user_loss_fails_only_its_op_and_fills_its_ids(rig) -> None:
    """The backward chunks still go out with zero weights (seq_ids filled); the
    op fails with the user's exception; later ops complete and the client stays usable.

    See docs/design/behavior.md#client-side-custom-loss.
    """
    server, training = rig
    boom = ValueError("user loss exploded")

    def bad_loss(data: list[types.Datum], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
        raise boom

    data = [datum(offset=i) for i in range(3)]  # C = 2 chunks: ids 1..4
    failed = training.forward_backward_custom(data, bad_loss)
    later = training.optim_step(types.AdamParams())
    after = training.forward_backward([datum()], "cross_entropy")
    assert failed.exception(HANG) is boom
    assert later.result(HANG) is not None
    assert after.result(HANG).metrics
    assert fwdbwd_requests(server, training.model_id) == [
        (1, True),
        (2, True),
        (3, False),
        (4, False),
        (6, False),
    ]
    for seq in (3, 4):  # zero weights: a no-op gradient, zero loss on the server
        assert server_metrics(server, training.model_id, seq)["loss:sum"] == 0.0
    assert [s for s, _ in server.app.applied(training.model_id)] == list(range(7))
    # and a good custom loss afterwards still works
    ok = training.forward_backward_custom([datum()], weighted_loss(1.0)).result(HANG)
    assert "surrogate_loss:sum" in ok.metrics


def test_a_failed_forward_pass_still_fills_the_backward_ids(rig) -> None:
    """When the server fails the forward pass, zero-weight backward chunks are still sent
    and the op fails with the server's error.

    See docs/design/behavior.md#client-side-custom-loss.
    """
    server, training = rig
    server.faults.add("retrieve_future fail:user match.request_type=Forward")
    failed = training.forward_backward_custom([datum()], weighted_loss(1.0))
    later = training.optim_step(types.AdamParams())
    exc = failed.exception(HANG)
    assert isinstance(exc, RequestFailedError) and exc.category is RequestErrorCategory.User
    assert later.result(HANG) is not None
    assert fwdbwd_requests(server, training.model_id) == [(1, True), (2, False)]
    assert server_metrics(server, training.model_id, 2)["loss:sum"] == 0.0
    assert [s for s, _ in server.app.applied(training.model_id)] == [0, 1, 2, 3]


def test_loss_type_input_and_argument_checks(rig) -> None:
    """``loss_type_input="logprobs"`` warns; other values and bad data raise at once
    (docs/design/surface.md#training-client)."""
    server, training = rig
    with pytest.warns(DeprecationWarning):
        fut = training.forward_backward_custom(
            [datum()], weighted_loss(1.0), loss_type_input="logprobs"
        )
    fut.result(HANG)
    with pytest.raises(ValueError):
        training.forward_backward_custom([datum()], weighted_loss(1.0), loss_type_input="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        training.forward_backward_custom([], weighted_loss(1.0))
    with pytest.raises(TypeError):
        training.forward_backward_custom([datum()], "not callable")  # type: ignore[arg-type]
    before = training._sequencer.next_seq_id
    with pytest.raises(ValueError):
        training.forward_backward_custom(
            [types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={})],
            weighted_loss(1.0),
        )
    # Validation consumed no id (docs/design/behavior.md#validate-before-reserving).
    assert training._sequencer.next_seq_id == before


def test_a_loss_handle_runs_client_side(rig) -> None:
    """``create_custom_loss`` (alpha) warns and returns a handle run client-side
    (docs/design/surface.md#service-client)."""
    server, training = rig
    service = training._service
    with pytest.warns(tinker_sync.ExperimentalWarning):
        handle = service.create_custom_loss(weighted_loss(1.0), {"target_tokens": 1}).result()
    assert isinstance(handle, tinker_sync.LossHandle)
    out = training.forward_backward_custom([datum()], handle).result(HANG)
    assert out.metrics["loss:sum"] == pytest.approx(out.metrics["surrogate_loss:sum"], rel=1e-5)
    assert server.requests.count("create_custom_loss") == 0
