"""Shared harness for the TinkerApp tests: a real HTTP server on loopback around one app.

Usage::

    with Harness(tmp_path, long_poll_s=0.5) as h:
        sid = h.new_session()
        mid = h.new_model(sid)
        reply = h.post("forward_backward", raw=fwdbwd_body(mid, 1), proto=True)
        out = h.result(reply.json["request_id"], proto=True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests
from tinker.proto.response_conv import (
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from tinker_sync._wire import tinker_public_pb2 as pb
from tinker_sync.local._app import TinkerApp
from tinker_sync.local._faults import FaultPlan
from tinker_sync.local._http import HttpServer
from tinker_sync.local._log import RequestLog

KEY = "tml-local"
BASE_MODEL = "Qwen/Qwen3-8B"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    content: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def is_proto(self) -> bool:
        return "application/x-protobuf" in self.headers.get("content-type", "")


class Harness:
    """A TinkerApp behind the real asyncio HTTP layer, plus small protocol helpers."""

    def __init__(self, data_dir: Path | None, **app_kwargs: Any) -> None:
        app_kwargs.setdefault("long_poll_s", 2.0)
        self.app = TinkerApp(data_dir=data_dir, **app_kwargs)
        self.faults = FaultPlan()
        self.log = RequestLog()
        self.http = HttpServer(
            self.app, port=0, faults=self.faults, log=self.log, on_stop=self.app.aclose
        )
        self.http.start()
        self.url = self.http.url
        self.s = requests.Session()
        api_key = app_kwargs.get("api_key", KEY)
        self.key = api_key if api_key is not None else "tml-anything"

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.s.close()
        self.http.stop()
        self.app.close()

    # ------------------------------------------------------------------ raw calls
    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        query: dict[str, Any] | None = None,
        key: str | None = None,
        timeout: float = 30.0,
    ) -> Reply:
        h = {"X-API-Key": key if key is not None else self.key}
        data: bytes | None = None
        if raw is not None:
            data = raw
        elif body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        url = path if path.startswith("http") else f"{self.url}/api/v1/{path.lstrip('/')}"
        r = self.s.request(
            method, url, data=data, headers=h, params=query, timeout=timeout, allow_redirects=False
        )
        return Reply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return self.call("POST", path, body, **kw)

    def get(self, path: str, **kw: Any) -> Reply:
        return self.call("GET", path, **kw)

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        r = self.call(method, path, body, **kw)
        assert r.status == 200, (r.status, r.content)
        return r.json

    # ------------------------------------------------------------------ futures
    def poll(self, request_id: str, *, proto: bool = False, allow_metadata: bool = False) -> Reply:
        headers = {"Accept": "application/x-protobuf"} if proto else {}
        return self.post(
            "retrieve_future",
            {"request_id": request_id, "allow_metadata_only": allow_metadata},
            headers=headers,
        )

    def result(self, request_id: str, *, proto: bool = False, max_polls: int = 200) -> Reply:
        """Poll until the answer is not try_again (or metadata-only); returns the final reply."""
        for _ in range(max_polls):
            r = self.poll(request_id, proto=proto)
            if r.status == 200 and not r.is_proto:
                body = r.json
                if isinstance(body, dict) and body.get("type") == "try_again":
                    continue
            return r
        raise AssertionError(f"future {request_id} never completed")

    def result_json(self, request_id: str) -> Any:
        r = self.result(request_id)
        assert r.status == 200, (r.status, r.content)
        body = r.json
        assert "error" not in body, body
        return body

    # ------------------------------------------------------------------ setup helpers
    def new_session(self, **extra: Any) -> str:
        body = {"tags": [], "user_metadata": {}, "sdk_version": "0.38.0", "type": "create_session"}
        body.update(extra)
        return str(self.ok("POST", "create_session", body)["session_id"])

    def submit_model(
        self, session_id: str, seq: int = 0, base_model: str = BASE_MODEL, rank: int = 4
    ) -> Reply:
        return self.post(
            "create_model",
            {
                "session_id": session_id,
                "model_seq_id": seq,
                "base_model": base_model,
                "lora_config": {
                    "rank": rank,
                    "train_unembed": True,
                    "train_mlp": True,
                    "train_attn": True,
                },
                "optimizer_config": {"type": "adamw"},
                "type": "create_model",
            },
        )

    def new_model(self, session_id: str, seq: int = 0, **kw: Any) -> str:
        r = self.submit_model(session_id, seq, **kw)
        assert r.status == 200, r.content
        out = self.result_json(r.json["request_id"])
        return str(out["model_id"])

    def fwdbwd(self, model_id: str, seq_id: int, **kw: Any) -> Reply:
        return self.post(
            "forward_backward",
            raw=fwdbwd_body(model_id, seq_id, **kw),
            headers={"Content-Type": "application/x-protobuf"},
        )

    def optim(self, model_id: str, seq_id: int, lr: float = 0.01) -> Reply:
        return self.post(
            "optim_step",
            {
                "model_id": model_id,
                "seq_id": seq_id,
                "type": "optim_step",
                "adam_params": {"learning_rate": lr},
            },
        )

    def save(self, model_id: str, seq_id: int, name: str, **extra: Any) -> str:
        body = {
            "model_id": model_id,
            "seq_id": seq_id,
            "path": name,
            "overwrite": False,
            "type": "save_weights",
        }
        body.update(extra)
        r = self.post("save_weights", body)
        assert r.status == 200, r.content
        return str(self.result_json(r.json["request_id"])["path"])

    def sampler(self, session_id: str, seq: int = 0, **kw: Any) -> str:
        body: dict[str, Any] = {
            "session_id": session_id,
            "sampling_session_seq_id": seq,
            "type": "create_sampling_session",
        }
        body.update(kw)
        return str(self.ok("POST", "create_sampling_session", body)["sampling_session_id"])

    def asample(
        self, sampler_id: str, seq_id: int, tokens: list[int] | None = None, **kw: Any
    ) -> Reply:
        body: dict[str, Any] = {
            "sampling_session_id": sampler_id,
            "seq_id": seq_id,
            "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": tokens or [104, 105]}]},
            "sampling_params": {"max_tokens": 4, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
            "prompt_logprobs": False,
            "topk_prompt_logprobs": 0,
            "topk_sample_logprobs": 0,
            "prompt_alt_tokens_k": 0,
            "record_stability_info": False,
            "type": "sample",
        }
        body.update(kw)
        return self.post("asample", body, headers={"X-Tinker-Sampling-Backpressure": "1"})


def fwdbwd_body(
    model_id: str,
    seq_id: int,
    *,
    tokens: list[list[int]] | None = None,
    loss_fn: str = "cross_entropy",
    forward_only: bool = False,
    config: dict[str, float | str] | None = None,
) -> bytes:
    """A serialized ForwardBackwardRequest built with the generated descriptor."""
    msg = pb.ForwardBackwardRequest(
        model_id=model_id, seq_id=seq_id, loss_fn=loss_fn, forward_only=forward_only
    )
    for key, value in (config or {}).items():
        if isinstance(value, str):
            msg.loss_fn_config_v2[key].text = value
        else:
            msg.loss_fn_config[key] = float(value)
            msg.loss_fn_config_v2[key].number = float(value)
    for toks in [[104, 101, 108, 108]] if tokens is None else tokens:
        d = msg.data.add()
        d.model_input.add().encoded_text.tokens = np.asarray(toks, dtype="<i4").tobytes()
        targets = toks[1:] + [256]
        d.loss_fn_inputs["target_tokens"].dense = np.asarray(targets, dtype="<i8").tobytes()
        d.loss_fn_inputs["target_tokens"].dtype = pb.DTYPE_INT64
        d.loss_fn_inputs["weights"].dense = np.ones(len(toks), dtype="<f4").tobytes()
        d.loss_fn_inputs["weights"].dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


def decode_fwdbwd(reply: Reply) -> Any:
    """Decode a proto forward/backward result with the official SDK (the oracle)."""
    assert reply.is_proto, reply.content[:200]
    return deserialize_forward_backward_output(reply.content)


def decode_sample(reply: Reply) -> Any:
    assert reply.is_proto, reply.content[:200]
    return deserialize_sample_response(reply.content)
