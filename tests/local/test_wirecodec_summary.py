"""The local server's log summary of a protobuf forward_backward body: read with the project's
own wire reader (protobuf is a test-only dependency), and equal to what protobuf itself reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tinker_sync._wire import tinker_public_pb2 as pb
from tinker_sync.local._wirecodec import WireError, proto_summary


@pytest.mark.parametrize(
    "fields, datums",
    [
        ({}, 0),
        ({"model_id": "m-1", "seq_id": 7, "loss_fn": "cross_entropy"}, 3),
        ({"model_id": "é-model", "seq_id": -2, "forward_only": True}, 1),
        ({"seq_id": 2**31 - 1, "loss_fn": "ppo", "loss_fn_config": {"clip": 0.2}}, 2),
    ],
)
def test_summary_matches_protobuf(fields: dict[str, object], datums: int) -> None:
    msg = pb.ForwardBackwardRequest(**fields)  # type: ignore[arg-type]
    for _ in range(datums):
        msg.data.add().model_input.add().encoded_text.tokens = b"\x01\x00\x00\x00"
    body = msg.SerializeToString()
    parsed = pb.ForwardBackwardRequest()
    parsed.ParseFromString(body)
    assert proto_summary(body) == {
        "model_id": parsed.model_id,
        "seq_id": parsed.seq_id,
        "loss_fn": parsed.loss_fn,
        "forward_only": parsed.forward_only,
        "datums": len(parsed.data),
    }


def test_repeated_scalar_fields_keep_the_last_value_like_protobuf() -> None:
    body = (
        pb.ForwardBackwardRequest(model_id="first", seq_id=1).SerializeToString()
        + pb.ForwardBackwardRequest(model_id="second", seq_id=2).SerializeToString()
    )
    parsed = pb.ForwardBackwardRequest()
    parsed.ParseFromString(body)
    summary = proto_summary(body)
    assert (summary["model_id"], summary["seq_id"]) == (parsed.model_id, parsed.seq_id)


@pytest.mark.parametrize("body", [b"\x0a\x05ab", b"\x12", b"\x0a\x02\xff\xfe"])
def test_malformed_bodies_are_wire_errors(body: bytes) -> None:
    with pytest.raises(WireError, match="malformed protobuf body"):
        proto_summary(body)


def test_client_and_local_server_run_without_protobuf() -> None:
    """A training step through the client and the local server never imports protobuf."""
    code = textwrap.dedent(
        """
        import sys
        import tinker_sync as tinker
        from tinker_sync import types
        from tinker_sync.local import LocalServer

        with LocalServer(backend="instant") as server, tinker.ServiceClient(
            base_url=server.url, api_key=server.api_key
        ) as service:
            training = service.create_lora_training_client("Qwen/Qwen3-8B", rank=8)
            datum = types.Datum(
                model_input=types.ModelInput.from_ints([1, 2, 3]),
                loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]},
            )
            training.forward_backward([datum], "cross_entropy").result(60)
            assert server.requests.count("forward_backward") == 1
        print(sorted(m for m in sys.modules if m.startswith("google")))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
