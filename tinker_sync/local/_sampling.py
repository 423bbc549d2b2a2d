"""Sampling: sampling sessions and samplers, asample and its work.

Usage (the app builds one and routes requests to it)::

    api = SamplingApi(app)
    response = await api.create_sampling_session(request)

Every handler reads and writes the state of the one :class:`~tinker_sync.local._app.TinkerApp`
it serves (``self.app``), on the app's event loop.

Thread safety: event-loop only, like the app. Fork safety: not fork-safe.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tinker_sync._runtime.redact import scrub
from tinker_sync.local import _wirecodec as codec
from tinker_sync.local._body import (
    Body,
    HttpError,
    json_body,
)
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._state import (
    FutureRecord,
    SamplerRuntime,
)
from tinker_sync.local._store import (
    CheckpointFiles,
    CheckpointRow,
    SamplerRow,
)
from tinker_sync.local.backends.base import (
    BYTE_TOKENIZER_ID,
    SampleOptions,
    Sampler,
    SampleResult,
    UserError,
)

if TYPE_CHECKING:
    from tinker_sync.local._app import TinkerApp

__all__ = ["SamplingApi"]


def _bounded(value: int, name: str, maximum: int) -> int:
    if value > maximum:
        raise HttpError(400, f"{name}: must be <= {maximum}, got {value}")
    return value


#: Upper bound of ``num_samples`` per asample: the sequence ids are built on the event loop,
#: so an unbounded value would stall every client of the server (and exhaust memory).
MAX_NUM_SAMPLES = 10_000

_SAMPLE_CLONE_STRIDE = 1_000_000_000

logger = logging.getLogger("tinker_sync.local")


class SamplingApi:
    """The sampling endpoints of one :class:`TinkerApp` (its ``self.app``)."""

    def __init__(self, app: TinkerApp) -> None:
        self.app = app

    async def _sampler_weights_for(self, row: CheckpointRow, base_model: str) -> bytes:
        if row.checkpoint_type == "sampler":
            return await self.app._run_io(
                lambda: self.app._files.read(row.run_id, row.checkpoint_id, CheckpointFiles.SAMPLER)
            )
        if row.checkpoint_type == "training":
            run = self.app._store.get_run(row.run_id)
            lora = self.app._training_api.lora_spec(run.lora if run else None)

            def build() -> bytes:
                model = self.app._backend.new_model(base_model, lora, self.app.seed)
                self.app._training_api.load_into(model, row, False)
                return model.sampler_weights()

            return await self.app._run(build)
        raise HttpError(
            400, f"cannot sample from an {row.checkpoint_type} checkpoint ({row.tinker_path})"
        )

    async def create_sampling_session(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        seq = b.int_("sampling_session_seq_id", minimum=0)
        base_model = b.opt_str("base_model")
        model_path = b.opt_str("model_path")
        rt = self.app._session_rt(session_id)
        existing = rt.samplers_by_seq.get(seq)
        if existing is not None:
            return HttpResponse.json(
                {"sampling_session_id": existing, "type": "create_sampling_session"}
            )
        if base_model is None and model_path is None:
            raise HttpError(400, "either base_model or model_path is required")
        self.app._session_api.require_active(session_id)
        weights: bytes | None = None
        if model_path is not None:
            row = self.app._rest.live_checkpoint(model_path)
            run = self.app._store.get_run(row.run_id)
            if base_model is None:
                if run is None:
                    raise HttpError(404, f"training run {row.run_id} of {model_path} not found")
                base_model = run.base_model
            self.app._check_base_model(base_model)
            weights = await self._sampler_weights_for(row, base_model)
        else:
            assert base_model is not None
            self.app._check_base_model(base_model)
        existing = rt.samplers_by_seq.get(seq)  # a concurrent duplicate may have won meanwhile
        if existing is not None:
            return HttpResponse.json(
                {"sampling_session_id": existing, "type": "create_sampling_session"}
            )
        sampler_id = f"{session_id}:sample:{seq}"
        bm = base_model
        sampler = await self.app._run(lambda: self.app._backend.sampler(bm, weights))
        self.app._samplers[sampler_id] = SamplerRuntime(
            sampler_id=sampler_id,
            session_id=session_id,
            base_model=base_model,
            model_path=model_path,
            sampler=sampler,
        )
        rt.samplers_by_seq[seq] = sampler_id
        self.app._store.insert_sampler(
            SamplerRow(sampler_id, session_id, seq, base_model, model_path, self.app._now())
        )
        return HttpResponse.json(
            {"sampling_session_id": sampler_id, "type": "create_sampling_session"}
        )

    def remember_ephemeral(self, sampler_id: str) -> None:
        """Keep at most ``max_ephemeral_samplers`` unsaved-weight samplers in memory."""
        self.app._ephemeral.append(sampler_id)
        while len(self.app._ephemeral) > self.app.max_ephemeral_samplers:
            old = self.app._ephemeral.popleft()
            self.app._samplers.pop(old, None)

    def sampler_rt(self, sampler_id: str) -> SamplerRuntime:
        s = self.app._samplers.get(sampler_id)
        if s is not None:
            return s
        row = self.app._store.get_sampler(sampler_id)
        if row is None:
            raise HttpError(404, f"unknown sampling session {sampler_id!r}")
        if row.ephemeral:
            raise HttpError(
                404,
                f"sampling session {sampler_id!r} held unsaved weights that are gone (an "
                "earlier server process, or evicted after newer samplers); save named sampler "
                "weights to sample from them later",
            )
        s = SamplerRuntime(
            sampler_id=sampler_id,
            session_id=row.session_id,
            base_model=row.base_model,
            model_path=row.model_path,
        )
        self.app._samplers[sampler_id] = s
        return s

    async def _ensure_sampler(self, s: SamplerRuntime) -> Sampler:
        if s.sampler is not None:
            return s.sampler
        async with s.load_lock:
            if s.sampler is None:
                weights = s.weights
                if weights is None and s.model_path is not None:
                    row = self.app._rest.live_checkpoint(s.model_path)
                    weights = await self._sampler_weights_for(row, s.base_model)
                s.sampler = await self.app._run(
                    lambda: self.app._backend.sampler(s.base_model, weights)
                )
            return s.sampler

    async def join_sampling_session(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        s = self.sampler_rt(b.str_("sampling_session_id"))
        s.client_counter += 1
        return HttpResponse.json(
            {"client_counter": s.client_counter, "type": "join_sampling_session"}
        )

    async def get_sampler(self, request: HttpRequest, sampler_id: str) -> HttpResponse:
        s = self.app._samplers.get(sampler_id)
        if s is not None:
            base_model, model_path = s.base_model, s.model_path
        else:
            row = self.app._store.get_sampler(sampler_id)
            if row is None:
                raise HttpError(404, f"unknown sampler {sampler_id!r}")
            base_model, model_path = row.base_model, row.model_path
        return HttpResponse.json(
            {
                "sampler_id": sampler_id,
                "base_model": base_model,
                "model_path": model_path,
                "tokenizer_id": BYTE_TOKENIZER_ID,
            }
        )

    def _sample_options(self, b: Body) -> tuple[npt.NDArray[np.int64], SampleOptions]:
        prompt_obj = b.get("prompt")
        if prompt_obj is None:
            raise HttpError(400, "prompt: required")
        prompt = codec.tokens_from_model_input_json(prompt_obj, "prompt")
        sp = Body(b.get("sampling_params") or {}, "sampling_params")
        stop = sp.get("stop")
        stop_strings: list[str] | None = None
        stop_tokens: list[int] | None = None
        if isinstance(stop, str):
            stop_strings = [stop]
        elif isinstance(stop, list):
            if all(isinstance(x, str) for x in stop):
                stop_strings = list(stop)
                if not stop:
                    stop_tokens = []
            elif all(isinstance(x, int) and not isinstance(x, bool) for x in stop):
                stop_tokens = list(stop)
            else:
                raise HttpError(
                    400,
                    "sampling_params.stop: expected a string, a list of strings or a list of ints",
                )
        elif stop is not None:
            raise HttpError(
                400, "sampling_params.stop: expected a string, a list of strings or a list of ints"
            )
        target = b.get("target_prompt_logprobs")
        target_arr = None
        if target is not None:
            target_arr = codec.tensor_from_json(target, "target_prompt_logprobs", pad=-1).astype(
                np.int64
            )
        opts = SampleOptions(
            num_samples=_bounded(
                b.int_or("num_samples", 1, minimum=1), "num_samples", MAX_NUM_SAMPLES
            ),
            max_tokens=sp.opt_int("max_tokens", minimum=0),
            temperature=sp.num_or("temperature", 1.0),
            top_k=sp.int_or("top_k", -1),
            top_p=sp.num_or("top_p", 1.0),
            seed=sp.opt_int("seed"),
            stop_strings=stop_strings,
            stop_tokens=stop_tokens,
            prompt_logprobs=b.bool_("prompt_logprobs", False),
            prompt_logprobs_last_n=b.opt_int("prompt_logprobs_last_n", minimum=1),
            topk_prompt_logprobs=b.int_or("topk_prompt_logprobs", 0, minimum=0),
            topk_sample_logprobs=b.int_or("topk_sample_logprobs", 0, minimum=0),
            target_prompt_logprobs=target_arr,
            prompt_alt_tokens_k=b.int_or("prompt_alt_tokens_k", 0, minimum=0),
        )
        b.bool_("record_stability_info", False)
        return prompt, opts

    async def asample(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        sid = b.opt_str("sampling_session_id")
        seq_id = b.int_("seq_id", minimum=0) if b.has("seq_id") else None
        if sid is not None:
            s = self.sampler_rt(sid)
        else:
            base_model, model_path = b.opt_str("base_model"), b.opt_str("model_path")
            if base_model is None and model_path is None:
                raise HttpError(400, "sampling_session_id (or base_model / model_path) is required")
            s = await self._anonymous_sampler(base_model, model_path)
        if seq_id is not None:
            existing = s.by_seq.get(seq_id)
            if existing is not None:
                return self._sample_reply(existing)
        prompt, opts = self._sample_options(b)
        rec = self.app._futures.create("Sample", owner=s.sampler_id, seq_id=seq_id)
        rec.sample_sequence_ids = [f"{rec.request_id}:{i}" for i in range(opts.num_samples)]
        rec.cloned_sampler_id = (seq_id or 0) // _SAMPLE_CLONE_STRIDE
        if seq_id is not None:
            s.by_seq[seq_id] = rec
        rt = self.app._sessions.get(s.session_id)
        if rt is not None and rt.expired:
            rec.fail("session expired (no heartbeat)", "user", now=self.app._clock())
        self.app._spawn(self._run_sample(s, rec, prompt, opts))
        return self._sample_reply(rec)

    def _sample_reply(self, rec: FutureRecord) -> HttpResponse:
        body: dict[str, Any] = {"request_id": rec.request_id}
        if self.app.protocol == "current":
            body["sample_sequence_ids"] = list(rec.sample_sequence_ids or [])
        return HttpResponse.json(body)

    async def _anonymous_sampler(
        self, base_model: str | None, model_path: str | None
    ) -> SamplerRuntime:
        key = f"anon:{base_model or ''}:{model_path or ''}"
        s = self.app._samplers.get(key)
        if s is not None:
            return s
        weights = None
        if model_path is not None:
            row = self.app._rest.live_checkpoint(model_path)
            if base_model is None:
                run = self.app._store.get_run(row.run_id)
                if run is None:
                    raise HttpError(404, f"training run {row.run_id} of {model_path} not found")
                base_model = run.base_model
            weights = await self._sampler_weights_for(row, base_model)
        assert base_model is not None
        self.app._check_base_model(base_model)
        s = self.app._samplers.setdefault(
            key,
            SamplerRuntime(
                sampler_id=key,
                session_id="",
                base_model=base_model,
                model_path=model_path,
                weights=weights,
            ),
        )
        return s

    async def _run_sample(
        self,
        s: SamplerRuntime,
        rec: FutureRecord,
        prompt: npt.NDArray[np.int64],
        opts: SampleOptions,
    ) -> None:
        try:
            await self.app._wait_unpaused("sampling")
            if self.app.work_delay_s > 0:
                await asyncio.sleep(self.app.work_delay_s)
            if rec.done or rec.lost:
                return
            sampler = await self._ensure_sampler(s)
            seq_ids = rec.sample_sequence_ids

            def work() -> tuple[SampleResult, dict[str, bytes]]:
                result = sampler.sample(prompt, opts)
                return result, self.app._encode_primary("Sample", result, seq_ids)

            if sampler.cheap(int(prompt.size), opts):
                # On the loop thread: handed to a worker, a 0.2 ms call made the loop and
                # the worker trade the GIL while a poll for it waited (see
                # docs/design/local-server.md#model-work).
                result, encoded = work()
            else:
                result, encoded = await self.app._run(work)
            if len(result.sequences) != opts.num_samples:
                raise RuntimeError(
                    f"backend returned {len(result.sequences)} sequences for num_samples={opts.num_samples}"
                )
            rec.complete(result, now=self.app._clock(), encoded=encoded)
        except asyncio.CancelledError:
            raise
        except (UserError, HttpError, ValueError, LookupError) as exc:
            rec.fail(
                exc.detail if isinstance(exc, HttpError) else str(exc),
                "user",
                now=self.app._clock(),
            )
        except Exception as exc:
            logger.exception("sampler %s: sample failed", s.sampler_id)
            rec.fail(
                scrub(f"internal error: {type(exc).__name__}: {exc}"),
                "server",
                now=self.app._clock(),
            )
        finally:
            if rec.done and not rec.lost:
                completion: dict[str, Any]
                if rec.state == "done":
                    completion = {
                        "state": "finished",
                        "request_id": rec.request_id,
                        "response_payload_uncompressed_size": rec.size,
                    }
                else:
                    completion = {"state": "failed", "request_id": rec.request_id}
                s.channel(rec.cloned_sampler_id).push(completion, self.app._clock())
