"""``TrainingClient``: one LoRA training run, with requests kept in call order.

Usage::

    training = service.create_lora_training_client("Qwen/Qwen3-8B", rank=32)
    fwd = training.forward_backward(data, "cross_entropy")   # returns at once
    opt = training.optim_step(AdamParams(learning_rate=1e-4)) # safe: leaves after fwd
    print(fwd.result().metrics["loss:sum"], opt.result())

**Ordering.** Each call takes its seq_ids under the client's lock in the caller's thread, so
requests leave in the order the calls were made, across threads too
(docs/design/behavior.md#reserve-at-call-time). A chunked forward_backward follows the server's
chunk policy (chunks 2..C concurrently, the lowest seq_id last,
docs/design/behavior.md#send-order-and-chunk-fanout). A failed send fails only its own future; the
client stays usable (docs/design/behavior.md#failed-send-fails-one-op). Training futures are not
cancellable: ``cancel()`` returns False and the request is still sent
(docs/design/behavior.md#training-not-cancellable).

Thread safety: share freely between threads. Fork safety: training operations raise
ForkedProcessError in a forked child (the parent owns the model's seq_ids).
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from tinker_sync import _pending
from tinker_sync._futures import APIFuture
from tinker_sync._polling.decide import Decision
from tinker_sync._polling.loop import Poll
from tinker_sync._polling.queuestate import QueueStateReporter
from tinker_sync._runtime.asyncio_bridge import blocking_alias, direct_alias
from tinker_sync._runtime.executor import pool
from tinker_sync._runtime.imports import imported
from tinker_sync._session.telemetry import captures_exceptions
from tinker_sync._training.chunkgroup import ChunkGroup
from tinker_sync._training.sequencer import Sequencer
from tinker_sync._transport import Pool, RequestSpec, current_sdk_method, sdk_method_scope
from tinker_sync._validate import check_checkpoint_name, check_loss_inputs, check_ttl

# Imported here, not lazily on worker threads (a fork during a first import on another
# thread would leave the module's import lock held in the child).
from tinker_sync._wire._converter import from_json, omit_new_defaults, to_json
from tinker_sync._wire._jsonresults import forward_backward_output_from_json
from tinker_sync._wire._pbwire import uvarint
from tinker_sync._wire._zstd import maybe_compress
from tinker_sync.types import (
    AdamParams,
    Datum,
    DimuonParams,
    ForwardBackwardOutput,
    GetInfoResponse,
    LoadWeightsResponse,
    OptimStepResponse,
    SaveWeightsExternalResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
    UntypedAPIFuture,
    validate_loss_fn,
)
from tinker_sync.types._base import accept

if TYPE_CHECKING:
    from tinker_sync._sampling.retry import RetryConfig
    from tinker_sync._session.state import Session
    from tinker_sync.sampling_client import SamplingClient
    from tinker_sync.service_client import ServiceClient
    from tinker_sync.tokenizer import TinkerTokenizer

T = TypeVar("T")
log = logging.getLogger("tinker_sync.training")

_FWDBWD_PATH = "/api/v1/forward_backward"


class PerDatumLossFn(Protocol):
    """A client-side loss: ``(data, logprobs per datum) -> (loss tensor, metrics)``."""

    def __call__(self, data: list[Datum], logprobs: list[Any]) -> tuple[Any, dict[str, float]]: ...


class LossHandle:
    """A custom loss created by ``ServiceClient.create_custom_loss``; runs client-side in v1.

    Thread-safe and immutable.
    """

    def __init__(self, fn: PerDatumLossFn, input_ranks: Mapping[str, int]) -> None:
        self.fn = fn
        self.input_ranks = dict(input_ranks)
        self.loss_id: str | None = None

    def __repr__(self) -> str:
        return f"<LossHandle {getattr(self.fn, '__name__', self.fn)!r}>"


def _with_seq_id(body: bytes, seq_id: int) -> bytes:
    """Append field 2 (``seq_id``) to a ForwardBackwardRequest encoded without it.

    Protobuf parsers accept fields in any order, so the request can be encoded (and validated)
    before the seq_id is reserved (docs/design/behavior.md#validate-before-reserving) and patched at
    send time without re-encoding.
    """
    return body + b"\x10" + uvarint(seq_id)


class TrainingClient:
    """A training run (``model_id``). Calls return APIFutures and leave in call order.

    Thread-safe; training operations raise ForkedProcessError in a forked child.
    """

    def __init__(self, service: ServiceClient, model_id: str, info: GetInfoResponse) -> None:
        self._service = service
        self._session: Session = service._session
        self.model_id = model_id
        self._info = info
        self._sequencer = Sequencer(model_id)
        self._queue_reporter = QueueStateReporter(
            "training", self._session.clock, identifier=model_id
        )
        self._tokenizer: TinkerTokenizer | None = None
        self._session.add_close_listener(self._sequencer.close, join=self._sequencer.join)
        # The codecs its calls import load now, with the client, so no call imports them for
        # the first time; imported() keeps a signal handler from turning that into
        # ModuleNotFoundError (docs/guarantees.md#signals-and-exit).
        imported(
            "tinker_sync._wire._chunking", "tinker_sync._wire._metrics", "tinker_sync._wire._proto"
        )

    def __repr__(self) -> str:
        return f"<TrainingClient model_id={self.model_id!r}>"

    def __reduce__(self) -> Any:
        raise TypeError(
            "TrainingClient cannot be pickled: to sample in another process, pickle a "
            "SamplingClient (training_client.save_weights_and_get_sampling_client()); to "
            "train there, save_state(name) here and call "
            "ServiceClient().create_training_client_from_state(path) there"
        )

    def result(self, timeout: float | None = None) -> TrainingClient:
        """0.38 compatibility: creation already returned the client."""
        return self

    async def result_async(self, timeout: float | None = None) -> TrainingClient:
        """0.38 compatibility: ``await client.result_async()`` gives the client."""
        return self

    def __await__(self) -> Generator[Any, None, TrainingClient]:
        """``await client`` gives the client at once (creation results are awaitable)."""
        return _pending.ready(self)

    # ---------------------------------------------------------------- metadata

    def get_info(self) -> GetInfoResponse:
        """Model info fetched at creation (cached; never queues behind sends)."""
        return self._info

    get_info_async = direct_alias(get_info)

    @captures_exceptions
    def get_tokenizer(self) -> TinkerTokenizer:
        """The model's tokenizer (server ``tokenizer_id`` first, then the model name)."""
        if self._tokenizer is None:
            imported("tinker_sync.tokenizer")
            from tinker_sync.tokenizer import load_tokenizer

            data = self._info.model_data
            name = data.model_name or self._info.model_name or ""
            self._tokenizer = load_tokenizer(name, tokenizer_id=data.tokenizer_id)
        return self._tokenizer

    def get_console_url(self) -> str:
        return f"https://tinker-console.thinkingmachines.ai/training-runs/{self.model_id}"

    # ---------------------------------------------------------------- plumbing

    def _check_usable(self) -> None:
        self._session.check_open()

    def _poll(
        self,
        request_id: str,
        request_type: str,
        decode: Callable[[Decision], Any],
        on_done: Callable[[Any, BaseException | None], None],
        sdk_method: str | None,
        created_at: float,
    ) -> None:
        poll_job = Poll(
            self._session,
            request_id,
            request_type,
            decode=decode,
            on_done=on_done,
            created_at=created_at,
            sdk_method=sdk_method,
            on_queue_state=self._queue_reporter,
            model_id=self.model_id,
        )
        pool("train-poll").submit(poll_job.run)

    def _submit(self, spec: RequestSpec, seq_id: int) -> str:
        # A repeated seq_id gets the original future back, so a slow send may be hedged.
        reply = self._session.request(spec, hedge=True)
        request_id = reply.parse(UntypedAPIFuture).request_id
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s seq_id %d accepted as %s",
                spec.path.rsplit("/", 1)[-1],
                seq_id,
                request_id,
                extra={
                    "session_id": self._session.session_id,
                    "model_id": self.model_id,
                    "request_id": request_id,
                },
            )
        return request_id

    def _single_op(
        self,
        method_name: str,
        request_type: str,
        path: str,
        body: Callable[[int], dict[str, Any]],
        decode: Callable[[Decision], T],
        *,
        max_retries: int | None = None,
    ) -> APIFuture[T]:
        """Reserve one seq_id and send ``body(seq_id)`` inside its turn."""
        self._check_usable()
        sdk_method = current_sdk_method.get() or method_name
        fut: APIFuture[T] = APIFuture(cancellable=False, description=method_name)
        fut._owner = self._session  # type: ignore[attr-defined]

        def job(ids: list[int]) -> None:
            created_at = self._session.clock.monotonic()
            spec = RequestSpec(
                method="POST",
                path=path,
                pool=Pool.TRAIN,
                json=omit_new_defaults(body(ids[0])),  # 0.25 servers reject newer fields
                sdk_method=sdk_method,
                max_retries=max_retries,
            )
            try:
                request_id = self._submit(spec, ids[0])
            except BaseException as exc:
                fut._fail(exc)
                return
            fut._add_request_id(request_id)

            def settle(value: Any, error: BaseException | None) -> None:
                if error is not None:
                    fut._fail(error)
                else:
                    fut._resolve(value)

            self._poll(request_id, request_type, decode, settle, sdk_method, created_at)

        self._sequencer.reserve(1, job, on_abandon=fut._fail)
        return fut

    # ---------------------------------------------------------------- forward / backward

    @captures_exceptions
    def forward(
        self,
        data: list[Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[ForwardBackwardOutput]:
        """Forward pass only: loss and per-datum outputs (e.g. ``logprobs``), no gradients."""
        with sdk_method_scope("TrainingClient.forward"):
            return self._fwdbwd(data, loss_fn, loss_fn_config, forward_only=True)

    @captures_exceptions
    def forward_backward(
        self,
        data: list[Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[ForwardBackwardOutput]:
        """Compute and accumulate gradients; large batches are chunked and merged."""
        with sdk_method_scope("TrainingClient.forward_backward"):
            return self._fwdbwd(data, loss_fn, loss_fn_config, forward_only=False)

    def _prepare_fwdbwd(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None,
        forward_only: bool,
    ) -> tuple[list[bytes], list[int]]:
        """Validate and encode every chunk (without seq_id) before anything is reserved
        (docs/design/behavior.md#validate-before-reserving)."""
        from tinker_sync._wire._chunking import chunk_plan
        from tinker_sync._wire._proto import encode_forward_backward_request

        if isinstance(data, Datum) or not isinstance(data, Sequence):
            raise TypeError(f"data must be a list of Datum, got {type(data).__name__}")
        data = list(data)
        if not data:
            raise ValueError("data must contain at least one Datum")
        for i, datum in enumerate(data):
            if not isinstance(datum, Datum):  # an official tinker.Datum is converted
                data[i] = accept(datum, Datum, f"data[{i}]")
        validate_loss_fn(loss_fn)
        if loss_fn_config is not None:
            if not isinstance(loss_fn_config, Mapping):
                raise TypeError("loss_fn_config must be a mapping of str to float or str")
            for key, value in loss_fn_config.items():
                if (
                    not isinstance(key, str)
                    or isinstance(value, bool)
                    or not isinstance(value, (int, float, str))
                ):
                    raise TypeError(
                        f"loss_fn_config[{key!r}] must be a float or str, got "
                        f"{type(value).__name__}"
                    )
        server = self._session.server
        # each datum's bytes are estimated once, for the boundaries and the byte gate
        plan = chunk_plan(data, server.fwdbwd_max_chunk_len, server.fwdbwd_max_chunk_bytes_count)
        bodies = [
            encode_forward_backward_request(
                self.model_id, None, data[a:b], loss_fn, loss_fn_config, forward_only
            )
            for a, b, _ in plan
        ]
        check_loss_inputs(data, loss_fn)  # after encoding: its errors are about the data's form
        return bodies, [nbytes for _, _, nbytes in plan]

    def _fwdbwd(
        self,
        data: list[Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None,
        *,
        forward_only: bool,
    ) -> APIFuture[ForwardBackwardOutput]:
        self._check_usable()
        bodies, estimates = self._prepare_fwdbwd(data, loss_fn, loss_fn_config, forward_only)
        kind = "Forward" if forward_only else "ForwardBackward"
        sdk_method = current_sdk_method.get()
        fut: APIFuture[ForwardBackwardOutput] = APIFuture(cancellable=False, description=kind)
        fut._owner = self._session  # type: ignore[attr-defined]
        from tinker_sync._wire._metrics import combine_forward_backward_outputs

        group = ChunkGroup(
            fut,
            len(bodies),
            combine_forward_backward_outputs,
            "forward" if forward_only else "forward_backward",
        )

        def job(ids: list[int]) -> None:
            self._send_chunks(ids, bodies, estimates, kind, group, sdk_method)

        self._sequencer.reserve(len(bodies), job, on_abandon=fut._fail)
        return fut

    def _send_chunk(self, body: bytes, seq_id: int, estimate: int, sdk_method: str | None) -> str:
        payload, headers = maybe_compress(
            _with_seq_id(body, seq_id), self._session.server.proto_compress_fwdbwd
        )
        spec = RequestSpec(
            method="POST",
            path=_FWDBWD_PATH,
            pool=Pool.TRAIN,
            content=payload,
            content_type="application/x-protobuf",
            headers=headers,
            sdk_method=sdk_method,
        )
        with self._session.limiter.fwdbwd_bytes(estimate):
            return self._submit(spec, seq_id)

    def _send_chunks(
        self,
        ids: list[int],
        bodies: list[bytes],
        estimates: list[int],
        kind: str,
        group: ChunkGroup,
        sdk_method: str | None,
    ) -> None:
        """Runs in the op's turn: send every chunk, then hand the ids to the poll pool."""
        n = len(bodies)
        created_at = self._session.clock.monotonic()
        request_ids: list[str | None] = [None] * n
        failures: dict[int, BaseException] = {}

        def send(i: int) -> None:
            try:
                request_ids[i] = self._send_chunk(bodies[i], ids[i], estimates[i], sdk_method)
            except BaseException as exc:
                failures[i] = exc

        if n > 1 and self._session.server.parallel_fwdbwd_chunks:
            done = threading.Semaphore(0)

            def send_and_signal(i: int) -> None:
                try:
                    send(i)
                finally:
                    done.release()

            for i in range(1, n):
                pool("train-submit").submit(send_and_signal, i)
            for _ in range(1, n):
                done.acquire()
            if not failures:
                send(0)  # the lowest seq_id goes last, after all the others were accepted
        else:
            for i in range(n):
                send(i)
                if failures:
                    # Chunks not yet sent are skipped; their ids stay consumed
                    # (docs/design/behavior.md#failed-send-fails-one-op).
                    break

        accepted = [i for i in range(n) if request_ids[i] is not None]
        group.future._set_request_ids(tuple(request_ids[i] for i in accepted))  # type: ignore[misc]
        if failures:
            first = min(failures)
            group.send_failed(first, failures[first], accepted, ids)
        group.expect(len(accepted))
        for i in accepted:
            rid = request_ids[i]
            assert rid is not None
            self._poll(
                rid,
                kind,
                _decode_fwdbwd,
                functools.partial(group.chunk_done, i),
                sdk_method,
                created_at,
            )

    # ---------------------------------------------------------------- custom loss

    @captures_exceptions
    def forward_backward_custom(
        self,
        data: list[Datum],
        loss_fn: PerDatumLossFn | LossHandle,
        *,
        loss_type_input: Literal["logprobs"] | None = None,
    ) -> APIFuture[ForwardBackwardOutput]:
        """Run ``loss_fn`` client-side on per-datum logprob tensors (needs torch).

        A forward pass, the user's loss with autograd, then a backward pass with weights
        ``-dLoss/dlogprobs`` on the same chunks. If the forward pass or the loss fails, the
        backward chunks are still sent with zero weights (their seq_ids are filled) and the
        future fails with the original error; the client stays usable.
        """
        with sdk_method_scope("TrainingClient.forward_backward_custom"):
            imported("tinker_sync._training.custom_loss")
            from tinker_sync._training.custom_loss import submit_custom_loss

            if loss_type_input is not None:
                if loss_type_input != "logprobs":
                    raise ValueError(
                        f"loss_type_input must be 'logprobs' or None, got {loss_type_input!r}"
                    )
                warnings.warn(
                    "loss_type_input is deprecated and has no effect",
                    DeprecationWarning,
                    stacklevel=2,
                )
            fn = loss_fn.fn if isinstance(loss_fn, LossHandle) else loss_fn
            if not callable(fn):
                raise TypeError("loss_fn must be a callable or a LossHandle")
            return submit_custom_loss(self, data, fn)

    # ---------------------------------------------------------------- optimizer / checkpoints

    @captures_exceptions
    def optim_step(
        self,
        optim_params: AdamParams | DimuonParams | None = None,
        *,
        adam_params: AdamParams | None = None,
    ) -> APIFuture[OptimStepResponse]:
        """Apply the accumulated gradients with the optimizer chosen at creation."""
        with sdk_method_scope("TrainingClient.optim_step"):
            if optim_params is not None and adam_params is not None:
                raise ValueError("pass optim_params or adam_params, not both")
            params = optim_params if optim_params is not None else adam_params
            if params is None:
                raise TypeError("optim_step() needs optim_params (AdamParams or DimuonParams)")
            if not isinstance(params, (AdamParams, DimuonParams)):
                params = accept(params, (AdamParams, DimuonParams), "optim_params")
            key = "adam_params" if isinstance(params, AdamParams) else "optimizer_params"
            params_json = to_json(params)

            def body(seq_id: int) -> dict[str, Any]:
                return {
                    "model_id": self.model_id,
                    "seq_id": seq_id,
                    "type": "optim_step",
                    key: params_json,
                }

            return self._single_op(
                "TrainingClient.optim_step",
                "OptimStep",
                "/api/v1/optim_step",
                body,
                _decode_as(OptimStepResponse),
            )

    @captures_exceptions
    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[SaveWeightsResponse]:
        """Save weights and optimizer state at ``tinker://<run>/weights/<name>``."""
        with sdk_method_scope("TrainingClient.save_state"):
            check_checkpoint_name(name)
            check_ttl(ttl_seconds)
            if not isinstance(overwrite, bool):
                raise TypeError("overwrite must be a bool")

            def body(seq_id: int) -> dict[str, Any]:
                return _with_optional(
                    {
                        "model_id": self.model_id,
                        "path": name,
                        "seq_id": seq_id,
                        "overwrite": overwrite,
                        "type": "save_weights",
                    },
                    ttl_seconds=ttl_seconds,
                    user_metadata=None if user_metadata is None else dict(user_metadata),
                )

            return self._single_op(
                "TrainingClient.save_state",
                "SaveWeights",
                "/api/v1/save_weights",
                body,
                _decode_as(SaveWeightsResponse),
                max_retries=0,
            )

    def _load(
        self, path: str, optimizer: bool, weights_access_token: str | None, method: str
    ) -> APIFuture[LoadWeightsResponse]:
        from tinker_sync.types import ParsedCheckpointTinkerPath

        ParsedCheckpointTinkerPath.from_tinker_path(path)

        def body(seq_id: int) -> dict[str, Any]:
            return _with_optional(
                {
                    "model_id": self.model_id,
                    "seq_id": seq_id,
                    "path": path,
                    "optimizer": optimizer,
                    "type": "load_weights",
                },
                weights_access_token=weights_access_token,
            )

        return self._single_op(
            method, "LoadWeights", "/api/v1/load_weights", body, _decode_as(LoadWeightsResponse)
        )

    @captures_exceptions
    def load_state(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[LoadWeightsResponse]:
        """Legacy in-place load of weights (prefer ``create_training_client_from_state``)."""
        with sdk_method_scope("TrainingClient.load_state"):
            return self._load(path, False, weights_access_token, "TrainingClient.load_state")

    @captures_exceptions
    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[LoadWeightsResponse]:
        """Legacy in-place load of weights and optimizer state."""
        with sdk_method_scope("TrainingClient.load_state_with_optimizer"):
            return self._load(
                path, True, weights_access_token, "TrainingClient.load_state_with_optimizer"
            )

    @captures_exceptions
    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[SaveWeightsForSamplerResponse]:
        """Persist sampler weights at ``tinker://<run>/sampler_weights/<name>``."""
        with sdk_method_scope("TrainingClient.save_weights_for_sampler"):
            check_checkpoint_name(name)
            check_ttl(ttl_seconds)

            def body(seq_id: int) -> dict[str, Any]:
                return _with_optional(
                    {
                        "model_id": self.model_id,
                        "path": name,
                        "kind": "snapshot",
                        "seq_id": seq_id,
                        "type": "save_weights_for_sampler",
                    },
                    ttl_seconds=ttl_seconds,
                    user_metadata=None if user_metadata is None else dict(user_metadata),
                )

            return self._single_op(
                "TrainingClient.save_weights_for_sampler",
                "SaveWeightsForSampler",
                "/api/v1/save_weights_for_sampler",
                body,
                _decode_as(SaveWeightsForSamplerResponse),
                max_retries=0,
            )

    @captures_exceptions
    def save_weights_external(
        self,
        name: str,
        ttl_seconds: int | None = None,
        age_encryption_recipients: list[str] | None = None,
    ) -> APIFuture[SaveWeightsExternalResponse]:
        """Export HF-format weights at ``tinker://<run>/external_weights/<name>``."""
        with sdk_method_scope("TrainingClient.save_weights_external"):
            check_checkpoint_name(name)
            check_ttl(ttl_seconds)
            if age_encryption_recipients is not None and (
                not isinstance(age_encryption_recipients, list)
                or not all(isinstance(r, str) for r in age_encryption_recipients)
            ):
                raise TypeError("age_encryption_recipients must be a list of str")

            def body(seq_id: int) -> dict[str, Any]:
                return _with_optional(
                    {
                        "model_id": self.model_id,
                        "path": name,
                        "seq_id": seq_id,
                        "type": "save_weights_external",
                    },
                    ttl_seconds=ttl_seconds,
                    age_encryption_recipients=None
                    if age_encryption_recipients is None
                    else list(age_encryption_recipients),
                )

            return self._single_op(
                "TrainingClient.save_weights_external",
                "SaveWeightsExternal",
                "/api/v1/save_weights_external",
                body,
                _decode_as(SaveWeightsExternalResponse),
                max_retries=0,
            )

    @captures_exceptions
    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
        kind: Literal["snapshot", "inflight"] = "snapshot",
    ) -> SamplingClient:
        """Save ephemeral sampler weights (ordered like any op) and return a sampler on them."""
        with sdk_method_scope("TrainingClient.save_weights_and_get_sampling_client"):
            if name is not None:
                warnings.warn(
                    "name has no effect in save_weights_and_get_sampling_client",
                    DeprecationWarning,
                    stacklevel=2,
                )
            if kind not in ("snapshot", "inflight"):
                raise ValueError(f"kind must be 'snapshot' or 'inflight', got {kind!r}")
            self._check_usable()
            sampling_seq = self._session.next_counter("sampling")

            def body(seq_id: int) -> dict[str, Any]:
                return {
                    "model_id": self.model_id,
                    "kind": kind,
                    "seq_id": seq_id,
                    "sampling_session_seq_id": sampling_seq,
                    "type": "save_weights_for_sampler",
                }

            imported("tinker_sync.sampling_client")  # before the send: nothing left unanswered
            from tinker_sync.sampling_client import PendingSamplingClient

            # The save takes its seq_id here, in the caller's thread, so it stays ordered after
            # the calls made before it; only the wait may move to an SDK thread.
            fut = self._single_op(
                "TrainingClient.save_weights_and_get_sampling_client",
                "SaveWeightsForSampler",
                "/api/v1/save_weights_for_sampler",
                body,
                _decode_as(SaveWeightsForSamplerResponse),
                max_retries=0,
            )
            sampler: SamplingClient = _pending.create(
                PendingSamplingClient,
                "save_weights_and_get_sampling_client",
                self._session,
                self._sampler_after_save,
                fut,
                retry_config,
                record_stability_info,
            )
            return sampler

    def _sampler_after_save(
        self,
        fut: APIFuture[SaveWeightsForSamplerResponse],
        retry_config: RetryConfig | None,
        record_stability_info: bool,
    ) -> SamplingClient:
        with sdk_method_scope("TrainingClient.save_weights_and_get_sampling_client"):
            response = fut.result()
            sampler_id = response.sampling_session_id
            if not sampler_id:
                from tinker_sync.exceptions import APIResponseValidationError

                raise APIResponseValidationError(
                    "save_weights_for_sampler (ephemeral) answered without sampling_session_id"
                )
            from tinker_sync.sampling_client import SamplingClient

            data = self._info.model_data
            return SamplingClient._create(
                self._service,
                sampler_id,
                base_model=data.model_name or self._info.model_name or "",
                model_path=response.path,
                tokenizer_id=data.tokenizer_id,
                retry_config=retry_config,
                record_stability_info=record_stability_info,
            )

    @captures_exceptions
    def create_sampling_client(
        self,
        model_path: str,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
    ) -> SamplingClient:
        """A sampler on saved weights, in this client's session."""
        return self._service.create_sampling_client(
            model_path=model_path,
            retry_config=retry_config,
            record_stability_info=record_stability_info,
        )

    # ---------------------------------------------------------------- async aliases

    forward_async = direct_alias(forward)
    forward_backward_async = direct_alias(forward_backward)
    forward_backward_custom_async = direct_alias(forward_backward_custom)
    optim_step_async = direct_alias(optim_step)
    save_state_async = direct_alias(save_state)
    load_state_async = direct_alias(load_state)
    load_state_with_optimizer_async = direct_alias(load_state_with_optimizer)
    save_weights_for_sampler_async = direct_alias(save_weights_for_sampler)
    save_weights_external_async = direct_alias(save_weights_external)
    save_weights_and_get_sampling_client_async = blocking_alias(
        save_weights_and_get_sampling_client
    )
    create_sampling_client_async = blocking_alias(create_sampling_client)


class PendingTrainingClient(_pending.PendingClient, TrainingClient):
    """A TrainingClient still being created (async code only); ``await`` it for the client."""


BackcompatTrainingClientFuture = TrainingClient


def _decode_fwdbwd(decision: Decision) -> ForwardBackwardOutput:
    from tinker_sync._wire._proto import decode_forward_backward_output

    if decision.protobuf:
        return decode_forward_backward_output(decision.body)
    return forward_backward_output_from_json(decision.body)


def _decode_as(cls: type[T]) -> Callable[[Decision], T]:
    def decode(decision: Decision) -> T:
        if decision.protobuf:
            raise ValueError(f"expected a JSON {cls.__name__}, got protobuf")
        return from_json(cls, decision.body)

    return decode


def _with_optional(body: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """``body`` plus the optional fields that are set (None means "not sent")."""
    body.update({key: value for key, value in optional.items() if value is not None})
    return body
