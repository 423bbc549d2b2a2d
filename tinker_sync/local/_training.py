"""Training: model creation and info, forward/backward, optim_step, saves and loads, custom losses.

Usage (the app builds one and routes requests to it)::

    api = TrainingApi(app)
    response = await api.create_model(request)

Every handler reads and writes the state of the one :class:`~tinker_sync.local._app.TinkerApp`
it serves (``self.app``), on the app's event loop.

Thread safety: event-loop only, like the app. Fork safety: not fork-safe.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from tinker_sync.local import _wirecodec as codec
from tinker_sync.local._age import age_recipients, encrypt_files
from tinker_sync.local._body import (
    Body,
    HttpError,
    checkpoint_name,
    json_body,
    ttl_expiry,
)
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._state import (
    ModelRuntime,
    SamplerRuntime,
    WorkItem,
)
from tinker_sync.local._store import (
    CheckpointFiles,
    CheckpointRow,
    RunRow,
    SamplerRow,
)
from tinker_sync.local.backends.base import (
    BYTE_TOKENIZER_ID,
    ForwardResult,
    LoraSpec,
    Sampler,
    UserError,
)
from tinker_sync.types import LOSS_FN_TYPES

if TYPE_CHECKING:
    from tinker_sync.local._app import TinkerApp

__all__ = ["TrainingApi"]

_LOSS_FNS = frozenset(LOSS_FN_TYPES)

T = TypeVar("T")


class TrainingApi:
    """The training endpoints of one :class:`TinkerApp` (its ``self.app``)."""

    def __init__(self, app: TinkerApp) -> None:
        self.app = app

    def lora_spec(self, obj: dict[str, Any] | None) -> LoraSpec:
        if obj is None:
            return LoraSpec(rank=32)
        lb = Body(obj, "lora_config")
        rank = lb.int_("rank", minimum=1)
        return LoraSpec(
            rank=rank,
            seed=lb.opt_int("seed"),
            train_attn=lb.bool_("train_attn", True),
            train_mlp=lb.bool_("train_mlp", True),
            train_unembed=lb.bool_("train_unembed", True),
        )

    async def create_model(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        model_seq_id = b.int_("model_seq_id", minimum=0)
        base_model = b.str_("base_model")
        lora = self.lora_spec(b.opt_dict("lora_config"))
        optimizer_config = b.opt_dict("optimizer_config") or {"type": "adamw"}
        user_metadata = b.opt_dict("user_metadata")
        rt = self.app._session_rt(session_id)
        existing = rt.create_futures.get(model_seq_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        if existing is not None:
            return self.app._future_reply(existing, model_id)
        self.app._session_api.require_active(session_id)
        self.app._check_base_model(base_model)
        m = self.app._new_model_runtime(
            model_id=model_id,
            session_id=session_id,
            model_seq_id=model_seq_id,
            base_model=base_model,
            lora=lora,
            optimizer_config=optimizer_config,
            user_metadata=user_metadata,
        )
        rec = self.app._futures.create("CreateModel", owner=model_id, seq_id=0)
        rt.create_futures[model_seq_id] = rec
        rt.models_by_seq[model_seq_id] = model_id

        def run() -> dict[str, Any]:
            seed = lora.seed if lora.seed is not None else self.app.seed
            m.model = self.app._backend.new_model(base_model, lora, seed)
            now = self.app._now()
            self.app._store.insert_run(self._run_row(m, now))
            return {"model_id": model_id, "type": "create_model"}

        self.app._submit(m, 0, WorkItem("CreateModel", rec, run))
        return self.app._future_reply(rec, model_id)

    def _run_row(self, m: ModelRuntime, now: float) -> RunRow:
        return RunRow(
            run_id=m.model_id,
            session_id=m.session_id,
            model_seq_id=m.model_seq_id,
            base_model=m.base_model,
            lora={
                "rank": m.lora.rank,
                "seed": m.lora.seed,
                "train_attn": m.lora.train_attn,
                "train_mlp": m.lora.train_mlp,
                "train_unembed": m.lora.train_unembed,
            },
            optimizer_config=m.optimizer_config,
            user_metadata=m.user_metadata,
            created_at=now,
            last_request_time=now,
        )

    async def get_info(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        model_id = b.str_("model_id")
        m = self.app._models.get(model_id)
        if m is not None:
            base_model, rank, opt = m.base_model, m.lora.rank, m.optimizer_config
        else:
            run = self.app._store.get_run(model_id)
            if run is None:
                raise HttpError(404, f"unknown model_id {model_id!r}")
            base_model, rank, opt = (
                run.base_model,
                int(run.lora.get("rank", 32)),
                run.optimizer_config,
            )
        try:
            info = self.app._backend.model_info(base_model)
            arch, tokenizer_id = info.arch, info.tokenizer_id
        except UserError:
            arch, tokenizer_id = self.app.backend_name, BYTE_TOKENIZER_ID
        return HttpResponse.json(
            {
                "model_id": model_id,
                "model_data": {
                    "arch": arch,
                    "model_name": base_model,
                    "tokenizer_id": tokenizer_id,
                },
                "optimizer_config": opt,
                "is_lora": True,
                "lora_rank": rank,
                "model_name": base_model,
                "type": "get_info",
            }
        )

    async def forward_backward(self, request: HttpRequest) -> HttpResponse:
        content_type = request.headers.get("content-type", "")
        if "json" in content_type:
            request.log_json = self.app._json_cached(request)
        try:
            fb = await self.app._run_io(
                functools.partial(
                    codec.decode_forward_backward,
                    request.body,
                    content_type,
                    request.headers.get("content-encoding"),
                )
            )
        except codec.WireError as exc:
            detail = f"malformed forward_backward request: {exc}"
            raise self.app._reject_undecodable(request, detail) from None
        if request.path.endswith("/forward"):
            fb.forward_only = True
        request.log_proto = {
            "model_id": fb.model_id,
            "seq_id": fb.seq_id,
            "loss_fn": fb.loss_fn,
            "forward_only": fb.forward_only,
            "datums": len(fb.datums),
        }
        if not fb.model_id:
            raise HttpError(400, "model_id: required")
        m = self.app._model_for_submission(fb.model_id)
        seq_id = fb.seq_id
        if seq_id < 1:
            raise HttpError(
                400, f"seq_id: must be >= 1 (seq 0 is the model's creation), got {seq_id}"
            )
        dup = self.app._duplicate(m, seq_id)
        if dup is not None:
            return self.app._future_reply(dup)
        if fb.loss_fn not in _LOSS_FNS:
            raise self.app._reject(m, seq_id, 400, f"loss_fn: unknown loss function {fb.loss_fn!r}")
        if not fb.datums:
            raise self.app._reject(m, seq_id, 400, "data: at least one datum is required")
        kind = "Forward" if fb.forward_only else "ForwardBackward"
        rec = self.app._futures.create(kind, owner=m.model_id, seq_id=seq_id)

        def run() -> ForwardResult:
            assert m.model is not None
            return m.model.forward_backward(fb.datums, fb.loss_fn, fb.config, not fb.forward_only)

        return self.app._future_reply(self.app._submit(m, seq_id, WorkItem(kind, rec, run)))

    def _seq_submission(self, request: HttpRequest) -> tuple[Body, ModelRuntime, int]:
        b = json_body(request)
        model_id = b.str_("model_id")
        m = self.app._model_for_submission(model_id)
        seq_id = b.int_("seq_id", minimum=1)
        return b, m, seq_id

    def _validated(self, m: ModelRuntime, seq_id: int, fn: Callable[[], T]) -> T:
        """Run submission validation; a 4xx counts the seq_id as processed."""
        try:
            return fn()
        except HttpError as exc:
            if 400 <= exc.status < 500:
                raise self.app._reject(m, seq_id, exc.status, exc.detail) from None
            raise

    async def optim_step(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self.app._duplicate(m, seq_id)
        if dup is not None:
            return self.app._future_reply(dup)

        def params() -> dict[str, Any]:
            adam = b.opt_dict("adam_params")
            other = b.opt_dict("optimizer_params")
            if adam is not None:
                ab = Body(adam, "adam_params")
                out: dict[str, Any] = {}
                for key in (
                    "learning_rate",
                    "beta1",
                    "beta2",
                    "eps",
                    "weight_decay",
                    "grad_clip_norm",
                ):
                    value = ab.opt_num(key)
                    if value is not None:
                        out[key] = value
                return out
            if other is not None:
                return dict(other)
            return {}

        p = self._validated(m, seq_id, params)
        rec = self.app._futures.create("OptimStep", owner=m.model_id, seq_id=seq_id)
        legacy = self.app.protocol == "legacy"

        def run() -> dict[str, Any]:
            assert m.model is not None
            metrics = m.model.optim_step(cast("dict[str, float]", p))
            return {} if legacy else {"metrics": codec.fix_metrics(metrics)}

        return self.app._future_reply(self.app._submit(m, seq_id, WorkItem("OptimStep", rec, run)))

    async def save_weights(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self.app._duplicate(m, seq_id)
        if dup is not None:
            return self.app._future_reply(dup)

        def validate() -> tuple[str, int | None, bool, dict[str, Any] | None]:
            return (
                checkpoint_name(b.str_("path")),
                b.opt_int("ttl_seconds"),
                b.bool_("overwrite", False),
                b.opt_dict("user_metadata"),
            )

        name, ttl, overwrite, meta = self._validated(m, seq_id, validate)
        rec = self.app._futures.create("SaveWeights", owner=m.model_id, seq_id=seq_id)
        ckpt_id = f"weights/{name}"

        def run() -> dict[str, Any]:
            assert m.model is not None
            self._check_overwrite(m.model_id, ckpt_id, overwrite)
            files = {
                CheckpointFiles.WEIGHTS: m.model.state_bytes(False),
                CheckpointFiles.FULL: m.model.state_bytes(True),
            }
            row = self._store_checkpoint(
                m.model_id, ckpt_id, "training", files, ttl, meta, has_optimizer=True
            )
            return {"path": row.tinker_path, "type": "save_weights"}

        return self.app._future_reply(
            self.app._submit(m, seq_id, WorkItem("SaveWeights", rec, run))
        )

    def _store_checkpoint(
        self,
        run_id: str,
        ckpt_id: str,
        checkpoint_type: str,
        files: dict[str, bytes],
        ttl: int | None,
        meta: dict[str, Any] | None,
        *,
        has_optimizer: bool = False,
    ) -> CheckpointRow:
        """Write a checkpoint's files and record its row (created now, expiring after ``ttl``)."""
        size = self.app._files.write(run_id, ckpt_id, files)
        now = self.app._now()
        row = CheckpointRow(
            run_id=run_id,
            checkpoint_id=ckpt_id,
            checkpoint_type=checkpoint_type,
            created_at=now,
            size_bytes=size,
            user_metadata=meta,
            expires_at=ttl_expiry(ttl, now),
            has_optimizer=has_optimizer,
        )
        self.app._store.put_checkpoint(row)
        return row

    def _check_overwrite(self, run_id: str, ckpt_id: str, overwrite: bool) -> None:
        if not overwrite and self.app._store.get_checkpoint(run_id, ckpt_id) is not None:
            raise UserError(
                f"checkpoint tinker://{run_id}/{ckpt_id} already exists; pass overwrite=True to replace it"
            )

    async def save_weights_for_sampler(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self.app._duplicate(m, seq_id)
        if dup is not None:
            return self.app._future_reply(dup)

        def validate() -> tuple[str | None, int | None, int | None, dict[str, Any] | None]:
            path = b.opt_str("path")
            b.opt_str("kind")
            sseq = b.opt_int("sampling_session_seq_id", minimum=0)
            if path is None and sseq is None:
                raise HttpError(
                    400, "either path (a named save) or sampling_session_seq_id is required"
                )
            return (
                None if path is None else checkpoint_name(path),
                b.opt_int("ttl_seconds"),
                sseq,
                b.opt_dict("user_metadata"),
            )

        name, ttl, sseq, meta = self._validated(m, seq_id, validate)
        rec = self.app._futures.create("SaveWeightsForSampler", owner=m.model_id, seq_id=seq_id)
        if name is not None:
            ckpt_id = f"sampler_weights/{name}"

            def run_named() -> dict[str, Any]:
                assert m.model is not None
                self._check_overwrite(m.model_id, ckpt_id, True)
                files = {CheckpointFiles.SAMPLER: m.model.sampler_weights()}
                row = self._store_checkpoint(m.model_id, ckpt_id, "sampler", files, ttl, meta)
                return {"path": row.tinker_path, "type": "save_weights_for_sampler"}

            item = WorkItem("SaveWeightsForSampler", rec, run_named)
        else:
            assert sseq is not None
            rt = self.app._session_rt(m.session_id)
            sampler_id = f"{m.session_id}:sample:{sseq}"

            def run_ephemeral() -> Sampler:
                assert m.model is not None
                return self.app._backend.sampler(m.base_model, m.model.sampler_weights())

            def register(sampler: Sampler) -> dict[str, Any]:
                self.app._samplers[sampler_id] = SamplerRuntime(
                    sampler_id=sampler_id,
                    session_id=m.session_id,
                    base_model=m.base_model,
                    model_path=None,
                    sampler=sampler,
                )
                self.app._sampling_api.remember_ephemeral(sampler_id)
                rt.samplers_by_seq[sseq] = sampler_id
                self.app._store.insert_sampler(
                    SamplerRow(
                        sampler_id,
                        m.session_id,
                        sseq,
                        m.base_model,
                        None,
                        self.app._now(),
                        ephemeral=True,
                    )
                )
                return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

            item = WorkItem("SaveWeightsForSampler", rec, run_ephemeral, on_loop=register)
        return self.app._future_reply(self.app._submit(m, seq_id, item))

    async def save_weights_external(self, request: HttpRequest) -> HttpResponse:
        b, m, seq_id = self._seq_submission(request)
        dup = self.app._duplicate(m, seq_id)
        if dup is not None:
            return self.app._future_reply(dup)

        def validate() -> tuple[str, int | None, list[Any]]:
            recipients = age_recipients(b.opt_str_list("age_encryption_recipients"))
            return checkpoint_name(b.str_("path")), b.opt_int("ttl_seconds"), recipients

        name, ttl, recipients = self._validated(m, seq_id, validate)
        rec = self.app._futures.create("SaveWeightsExternal", owner=m.model_id, seq_id=seq_id)
        ckpt_id = f"external_weights/{name}"

        def run() -> dict[str, Any]:
            assert m.model is not None
            exported = m.model.export_files()
            if recipients:
                exported = encrypt_files(exported, recipients)
            files = {f"{CheckpointFiles.FILES}/{rel}": data for rel, data in exported.items()}
            row = self._store_checkpoint(m.model_id, ckpt_id, "external", files, ttl, None)
            return {
                "path": row.tinker_path,
                "size_bytes": row.size_bytes,
                "type": "save_weights_external",
            }

        return self.app._future_reply(
            self.app._submit(m, seq_id, WorkItem("SaveWeightsExternal", rec, run))
        )

    async def load_weights(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        if b.has("model_id"):
            return await self._load_in_place(b)
        if self.app.protocol == "legacy":
            raise HttpError(
                422,
                "load_weights needs model_id and seq_id on this server "
                "(create the model with create_model, then load into it)",
            )
        session_id = b.str_("session_id")
        model_seq_id = b.int_("model_seq_id", minimum=0)
        path = b.str_("path")
        optimizer = b.bool_("optimizer", False)
        rt = self.app._session_rt(session_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        existing = rt.create_futures.get(model_seq_id)
        if existing is not None:
            return self.app._future_reply(existing, model_id)
        self.app._session_api.require_active(session_id)
        try:
            row = self.app._rest.live_checkpoint(path, want="training")
        except HttpError as exc:
            # 400, not 404: clients treat 404/422 on create-via-load as "old server"
            # (docs/design/behavior.md#older-servers).
            raise HttpError(400, exc.detail) from None
        run = self.app._store.get_run(row.run_id)
        if run is None:
            raise HttpError(400, f"training run {row.run_id} of {path} not found")
        base_model = b.opt_str("base_model") or run.base_model
        self.app._check_base_model(base_model)
        lora = self.lora_spec(run.lora)
        optimizer_config = b.opt_dict("optimizer_config") or run.optimizer_config
        m = self.app._new_model_runtime(
            model_id=model_id,
            session_id=session_id,
            model_seq_id=model_seq_id,
            base_model=base_model,
            lora=lora,
            optimizer_config=optimizer_config,
            user_metadata=b.opt_dict("user_metadata"),
        )
        rec = self.app._futures.create("LoadWeights", owner=model_id, seq_id=0)
        rt.create_futures[model_seq_id] = rec
        rt.models_by_seq[model_seq_id] = model_id

        def run_load() -> dict[str, Any]:
            seed = lora.seed if lora.seed is not None else self.app.seed
            model = self.app._backend.new_model(base_model, lora, seed)
            self.load_into(model, row, optimizer)
            m.model = model
            self.app._store.insert_run(self._run_row(m, self.app._now()))
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        self.app._submit(m, 0, WorkItem("LoadWeights", rec, run_load))
        return self.app._future_reply(rec, model_id)

    def load_into(self, model: Any, row: CheckpointRow, optimizer: bool) -> None:
        name = CheckpointFiles.FULL if optimizer else CheckpointFiles.WEIGHTS
        try:
            blob = self.app._files.read(row.run_id, row.checkpoint_id, name)
        except FileNotFoundError:
            raise UserError(f"checkpoint {row.tinker_path} has no stored weights") from None
        model.load_state_bytes(blob, optimizer)

    async def _load_in_place(self, b: Body) -> HttpResponse:
        model_id = b.str_("model_id")
        m = self.app._model_for_submission(model_id)
        seq_id = b.int_("seq_id", minimum=1)
        dup = self.app._duplicate(m, seq_id)
        if dup is not None:
            return self.app._future_reply(dup)
        path = self._validated(m, seq_id, lambda: b.str_("path"))
        optimizer = self._validated(m, seq_id, lambda: b.bool_("optimizer", False))
        row = self._validated(
            m, seq_id, lambda: self.app._rest.live_checkpoint(path, want="training")
        )
        rec = self.app._futures.create("LoadWeights", owner=model_id, seq_id=seq_id)

        def run() -> dict[str, Any]:
            assert m.model is not None
            self.load_into(m.model, row, optimizer)
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        return self.app._future_reply(
            self.app._submit(m, seq_id, WorkItem("LoadWeights", rec, run))
        )

    async def unload_model(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        model_id = b.str_("model_id")
        m = self.app._models.get(model_id)
        if m is None:
            raise HttpError(404, f"unknown model_id {model_id!r}")
        rec = self.app._futures.create("UnloadModel", owner=model_id, seq_id=None)
        m.unloaded = True
        m.unload_futures.append(rec)
        m.wake.set()
        return self.app._future_reply(rec, model_id)

    async def create_custom_loss(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        session_id = b.str_("session_id")
        seq = b.int_("custom_loss_seq_id", minimum=0)
        name = b.str_("name")
        inputs = b.get("inputs")
        graph = b.opt_dict("graph")
        if not isinstance(inputs, list) or not inputs or len(inputs) > 16:
            raise HttpError(400, "inputs: expected a list of 1..16 {name, rank} objects")
        for i, item in enumerate(inputs):
            ib = Body(item, f"inputs[{i}]")
            ib.str_("name")
            if ib.int_("rank") not in (0, 1, 2):
                raise HttpError(400, f"inputs[{i}].rank: must be 0, 1 or 2")
        if graph is None or not isinstance(graph.get("nodes"), list):
            raise HttpError(400, "graph: expected {format, nodes: [...]}")
        rt = self.app._session_rt(session_id)
        existing = rt.custom_losses.get(seq)
        if existing is not None:
            return self.app._future_reply(existing)
        self.app._session_api.require_active(session_id)
        loss_id = f"{session_id}:loss:{seq}"
        self.app._custom_losses[loss_id] = {"name": name, "inputs": inputs, "graph": graph}
        rec = self.app._futures.create("CreateCustomLoss", owner=session_id, seq_id=seq)
        rt.custom_losses[seq] = rec
        rec.complete({"loss_id": loss_id, "type": "create_custom_loss"}, now=self.app._clock())
        return self.app._future_reply(rec)
