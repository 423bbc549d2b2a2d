"""``SamplingClient``: generate from a base model or saved weights, at high concurrency.

Usage::

    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    futs = [sampler.sample(prompt, 4, SamplingParams(max_tokens=32)) for prompt in prompts]
    texts = [tok.decode(s.tokens) for f in futs for s in f.result().sequences]

How one ``sample()`` travels (nothing blocks the caller; no lock is held across I/O,
docs/design/behavior.md#sampling-lock-free-seq-ids):

1. Validation in the caller's thread (``ValueError`` / ``TypeError``). Once the session is
   started and the clone id known, the sample is queued from the caller's thread; before
   that, a job on the ``sample-submit`` pool does the start-up first.
2. The retry handler's concurrency slot (docs/design/behavior.md#sampling-retry-layer): server ``sample_max_concurrent_requests`` (an
   explicit ``RetryConfig.max_connections`` is capped by it), unlimited while the session
   futures poller is in use. A job waiting for a slot holds no thread.
3. The dispatcher of the (base URL, credential) limiter (docs/limiter.md): one FIFO queue per
   client, served round-robin when a sender is free and the gates allow (400 in flight, 10
   while recently backed off, a byte budget); then held, without a thread, until the shared
   backoff deadline (set by any client of the tenant, in this process or another) has
   passed. The ``asample`` request goes out on the tenant's own lane of sender threads with
   ``X-Tinker-Sampling-Backpressure: 1`` and 0 HTTP retries. A 429, or a 402 inside the
   billing window, moves the deadline for every client of that tenant (Retry-After when in
   (0, 60] s, else 1 s, or 5 s for prompts over 128 KiB) and parks the request again with
   the same seq_id. The gates are released when the server accepts the request.
4. The result: a per-future long poll on ``sample-poll``, or, when server
   ``sample_use_retrieve_futures`` is on, one session poller thread per (sampler, clone)
   that wakes the waiter, after which the payload is fetched on a bounded lane (docs/design/behavior.md#session-futures-poller).
5. Retries (docs/design/behavior.md#sampling-retry-layer): timeouts, connection errors, 408/409/429/5xx and 410 retry the whole
   sample under a new seq_id after ``min(base * 2^a, max)`` s +- jitter, without an attempt
   limit; ``RequestFailedError`` never. ``progress_timeout`` (7,200 s) without any completed
   request fails the call with :class:`SamplingStuckError`.

Steps 1-4 queued on a pool may instead run in a thread already blocked in ``fut.result()``
(no timeout, no done-callback) if no worker has taken them yet (:class:`Claimable`): a
sequential ``sample(...).result()`` loop then sends from the caller's thread, without hand-offs.

Cancelling a sample future (docs/design/behavior.md#sample-cancellation) before acceptance releases
its gates and sends nothing; after acceptance, polling stops and, when dynamic config
``sample_cancel_enabled`` is on, the request id is sent to ``POST /api/v1/cancel_future`` (best
effort).

Thread safety: share freely; no lock is held across I/O. Fork safety: in a forked child the client
rebuilds its transport and samples under a new clone id
(docs/design/behavior.md#forked-child-clients). Pickles carry no credential unless
``pickle_credentials=True`` (docs/design/behavior.md#credential-free-pickles).
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import logging
import os
import weakref
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from tinker_sync import _pending
from tinker_sync._futures import APIFuture
from tinker_sync._polling.poller import SessionFuturesPoller
from tinker_sync._polling.queuestate import QueueStateReporter
from tinker_sync._runtime.asyncio_bridge import awaiting_alias, direct_alias
from tinker_sync._runtime.fork import make_lock
from tinker_sync._runtime.imports import imported
from tinker_sync._sampling.handles import (
    SEQ_STRIDE,
    new_clone_id,
    release_shadow,
    shadow_session,
)
from tinker_sync._sampling.job import SampleJob, check_features, close_poller
from tinker_sync._sampling.retry import RetryConfig, RetryHandler, handler_for
from tinker_sync._transport import (
    Pool,
    RequestSpec,
    current_sdk_method,
    sdk_method_scope,
)
from tinker_sync._validate import check_int, check_sampling_params

# Imported here, not lazily on worker threads: a fork during a first import on another
# thread would leave that module's import lock held forever in the child.
from tinker_sync._wire._converter import to_json
from tinker_sync._wire._estimates import prompt_json_and_bytes
from tinker_sync.exceptions import (
    APIResponseValidationError,
    ClientClosedError,
)
from tinker_sync.types import (
    ModelInput,
    SampleResponse,
    SamplingParams,
    TensorData,
)
from tinker_sync.types._base import accept

if TYPE_CHECKING:
    from tinker_sync._session.state import Session
    from tinker_sync.service_client import ServiceClient
    from tinker_sync.tokenizer import TinkerTokenizer

log = logging.getLogger("tinker_sync.sampling")


def _params_json(params: SamplingParams) -> tuple[SamplingParams | None, dict[str, Any]]:
    """``to_json(params)``, and ``params`` again when that JSON may be reused for it.

    A frozen SamplingParams whose ``stop`` is None or a str holds only immutable values, so
    its JSON never changes: a client keeps the last one (RL loops pass one object each time).
    """
    wire: dict[str, Any] = to_json(params)
    stop = params.stop
    reusable = type(params) is SamplingParams and (stop is None or type(stop) is str)
    return (params if reusable else None), wire


class SamplingClient:
    """Sampler on one sampling session. Thread-safe; rebuilt after fork; see module docs."""

    _service: ServiceClient | None
    _session: Session
    _sampler_id: str
    _base_model: str
    _model_path: str | None
    _tokenizer_id: str | None
    _retry_config: RetryConfig
    _record_stability_info: bool
    pickle_credentials: bool
    _clone_id: int | None
    _seq_lock: Any
    _next_seq: int
    _joining: concurrent.futures.Future[None] | None
    _pid: int
    _handler: RetryHandler | None
    _poller: SessionFuturesPoller | None
    _closed: bool
    _queue_reporter: QueueStateReporter
    _tokenizer: TinkerTokenizer | None
    _shadow_release: weakref.finalize[..., SamplingClient] | None
    #: The last reusable SamplingParams and its wire JSON (see :func:`_params_json`).
    _params_memo: tuple[SamplingParams | None, dict[str, Any]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "SamplingClient is created by ServiceClient.create_sampling_client, "
            "TrainingClient.save_weights_and_get_sampling_client or from_sampler_handle"
        )

    @classmethod
    def _create(
        cls,
        service: ServiceClient | None,
        sampler_id: str,
        *,
        base_model: str,
        model_path: str | None = None,
        tokenizer_id: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
        session: Session | None = None,
        clone_id: int | None = 0,
        pickle_credentials: bool = False,
    ) -> SamplingClient:
        """Internal constructor. ``clone_id=None`` asks the server (join_sampling_session)."""
        self = object.__new__(cls)
        self._service = service
        if session is None:
            assert service is not None
            session = service._session
        self._session = session
        self._sampler_id = sampler_id
        self._base_model = base_model
        self._model_path = model_path
        self._tokenizer_id = tokenizer_id
        self._retry_config = retry_config or RetryConfig()
        if not isinstance(self._retry_config, RetryConfig):
            raise TypeError("retry_config must be a RetryConfig")
        self._record_stability_info = bool(record_stability_info)
        self.pickle_credentials = (
            service.pickle_credentials if service is not None else pickle_credentials
        )
        self._seq_lock = make_lock()
        self._set_clone(clone_id)
        self._joining = None
        self._pid = os.getpid()
        self._handler = None
        self._poller = None
        self._closed = False
        self._queue_reporter = QueueStateReporter("sampling", self._session.clock)
        self._tokenizer = None
        self._shadow_release = None
        self._params_memo = (None, {})
        return self

    def _set_clone(self, clone_id: int | None) -> None:
        self._clone_id = clone_id
        self._next_seq = (clone_id or 0) * SEQ_STRIDE

    # ---------------------------------------------------------------- identity

    @property
    def sampler_id(self) -> str:
        """The sampling session id, ``"<session>:sample:<n>"``."""
        return self._sampler_id

    def get_base_model(self) -> str:
        return self._base_model

    get_base_model_async = direct_alias(get_base_model)

    def result(self, timeout: float | None = None) -> SamplingClient:
        """0.38 compatibility: creation already returned the client."""
        return self

    async def result_async(self, timeout: float | None = None) -> SamplingClient:
        """0.38 compatibility: ``await client.result_async()`` gives the client."""
        return self

    def __await__(self) -> Generator[Any, None, SamplingClient]:
        """``await client`` gives the client at once (creation results are awaitable)."""
        return _pending.ready(self)

    def __repr__(self) -> str:
        return f"<SamplingClient sampler_id={self._sampler_id!r} base_model={self._base_model!r}>"

    def get_tokenizer(self) -> TinkerTokenizer:
        if self._tokenizer is None:
            imported("tinker_sync.tokenizer")
            from tinker_sync.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self._base_model, tokenizer_id=self._tokenizer_id)
        return self._tokenizer

    def on_queue_state_change(self, queue_state: str, queue_state_reason: str | None) -> None:
        """Observer of queue states; the default logs at most once a minute. Override freely."""
        self._queue_reporter(queue_state, queue_state_reason)

    # ---------------------------------------------------------------- process handling

    def _ensure_process(self) -> None:
        if os.getpid() == self._pid:
            return
        with self._seq_lock:  # fork-safe lock: fresh and unlocked in a child
            if os.getpid() == self._pid:
                return
            # A forked child acts as if unpickled (docs/design/behavior.md#forked-child-clients): a
            # shadow of the parent's session with fresh transport state, and a new clone id so
            # seq_ids never collide. The parent's transport, poller and threads are abandoned, never
            # closed (docs/design/behavior.md#drop-inherited-transport).
            from tinker_sync._session.state import Session

            parent = self._session
            self._session = Session.shadow(
                parent.config,
                session_id=parent.session_id,
                server=parent.server,
                dynamic=parent.dynamic,
                clock=parent.clock,
            )
            self._pid = os.getpid()
            self._set_clone(new_clone_id(parent.server.sample_join_sampling_session))
            self._joining = None
            self._handler = None
            self._poller = None
            # Its lock may have been held by a parent thread at fork time.
            self._queue_reporter = QueueStateReporter("sampling", self._session.clock)
            self._shadow_release = weakref.finalize(
                self, release_shadow, None, self._session, self._pid
            )

    def _ensure_clone(self) -> None:
        """Learn this clone's id from ``join_sampling_session`` once (single flight)."""
        if self._clone_id is not None:
            return
        with self._seq_lock:
            if self._clone_id is not None:
                return
            joining = self._joining
            owner = joining is None
            if owner:
                joining = self._joining = concurrent.futures.Future()
        assert joining is not None
        if not owner:
            joining.result()
            return
        try:
            reply = self._session.request(
                RequestSpec(
                    method="POST",
                    path="/api/v1/join_sampling_session",
                    pool=Pool.SESSION,
                    json={"sampling_session_id": self._sampler_id, "type": "join_sampling_session"},
                    sdk_method=None,
                )
            )
            data = reply.json()
            counter = data.get("client_counter") if isinstance(data, dict) else None
            if isinstance(counter, bool) or not isinstance(counter, int) or counter < 0:
                raise APIResponseValidationError(
                    "join_sampling_session answered without a client_counter",
                    response=reply.snapshot(),
                )
        except BaseException as exc:
            with self._seq_lock:
                self._joining = None  # a failed join is not cached
            joining.set_exception(exc)
            raise
        with self._seq_lock:
            self._set_clone(counter)
            self._joining = None
        joining.set_result(None)

    def _take_seq_id(self) -> int:
        with self._seq_lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def _retry_handler(self) -> RetryHandler:
        handler = self._handler
        if handler is None:
            handler = self._handler = handler_for(
                self._sampler_id, self._retry_config, self._session
            )
        return handler

    def _futures_poller(self) -> SessionFuturesPoller | None:
        """The session futures poller of this clone, or None when the server disables it."""
        if not self._session.server.sample_use_retrieve_futures:
            return None
        poller = self._poller
        if poller is None:
            with self._seq_lock:
                poller = self._poller
                if poller is None:
                    assert self._clone_id is not None
                    poller = self._poller = SessionFuturesPoller(
                        self._session, self._sampler_id, self._clone_id
                    )
                    weakref.finalize(self, close_poller, poller, os.getpid())
        return poller

    # ---------------------------------------------------------------- sampling

    def sample(
        self,
        prompt: ModelInput,
        num_samples: int,
        sampling_params: SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> APIFuture[SampleResponse]:
        """Generate ``num_samples`` continuations of ``prompt``; returns at once.

        Raises ``ValueError``/``TypeError`` for invalid arguments (before any request).
        """
        with sdk_method_scope("SamplingClient.sample"):
            body, estimate = self._sample_request(
                prompt,
                num_samples,
                sampling_params,
                include_prompt_logprobs,
                topk_prompt_logprobs,
                topk_sample_logprobs,
                target_prompt_logprobs,
                prompt_alt_tokens_k,
                prompt_logprobs_last_n,
            )

            def finish(response: SampleResponse) -> SampleResponse:
                check_features(response, prompt_alt_tokens_k, prompt_logprobs_last_n)
                return response

            return self._submit(
                body,
                estimate,
                finish=finish,
                retry=not self._session.server.sample_no_retries,
            )

    def compute_logprobs(
        self, prompt: ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> APIFuture[list[float | None]]:
        """Per-token prompt logprobs (entry 0 is None; entries before the last N are None)."""
        with sdk_method_scope("SamplingClient.compute_logprobs"):
            body, estimate = self._sample_request(
                prompt, 1, SamplingParams(max_tokens=1), True, 0, 0, None, 0, prompt_logprobs_last_n
            )

            def finish(response: SampleResponse) -> list[float | None]:
                check_features(response, 0, prompt_logprobs_last_n)
                values = response.prompt_logprobs
                if values is None:
                    raise RuntimeError("the server ignored prompt_logprobs=true")
                return list(values)

            return self._submit(body, estimate, finish=finish, retry=True)

    def _sample_body(self, *args: Any) -> dict[str, Any]:
        """The ``asample`` body without seq_id (``_sample_request``'s arguments)."""
        return self._sample_request(*args)[0]

    def _sample_request(
        self,
        prompt: ModelInput,
        num_samples: int,
        sampling_params: SamplingParams,
        include_prompt_logprobs: bool,
        topk_prompt_logprobs: int,
        topk_sample_logprobs: int,
        target_prompt_logprobs: TensorData | None,
        prompt_alt_tokens_k: int,
        prompt_logprobs_last_n: int | None,
    ) -> tuple[dict[str, Any], int]:
        """The ``asample`` body (without seq_id) and the prompt's byte charge, validated."""
        if not isinstance(prompt, ModelInput):  # official tinker objects are converted
            prompt = accept(prompt, ModelInput, "prompt")
        if not isinstance(sampling_params, SamplingParams):
            sampling_params = accept(sampling_params, SamplingParams, "sampling_params")
        check_sampling_params(sampling_params)
        check_int("num_samples", num_samples, minimum=1)
        check_int("topk_prompt_logprobs", topk_prompt_logprobs, minimum=0)
        check_int("topk_sample_logprobs", topk_sample_logprobs, minimum=0)
        check_int("prompt_alt_tokens_k", prompt_alt_tokens_k, minimum=0)
        if not isinstance(include_prompt_logprobs, bool):
            raise TypeError("include_prompt_logprobs must be a bool")
        if prompt_logprobs_last_n is not None:
            check_int("prompt_logprobs_last_n", prompt_logprobs_last_n, minimum=1)
            if not include_prompt_logprobs:
                raise ValueError("prompt_logprobs_last_n needs include_prompt_logprobs=True")
        prompt_json, estimate = prompt_json_and_bytes(prompt)  # one pass, for both
        memo = self._params_memo
        if memo[0] is not None and memo[0] is sampling_params:
            params_json = dict(memo[1])  # a fresh dict per body, of immutable values
        else:
            memo = self._params_memo = _params_json(sampling_params)
            params_json = dict(memo[1])
        # The wire body in its field order, without the newer-than-0.25 fields that hold their
        # default (omit_new_defaults' rule, applied while building it: 0.25 servers reject
        # fields they do not know).
        body: dict[str, Any] = {
            "num_samples": num_samples,
            "prompt": prompt_json,
            "sampling_params": params_json,
            "sampling_session_id": self._sampler_id,
            "prompt_logprobs": include_prompt_logprobs,
            "topk_prompt_logprobs": topk_prompt_logprobs,
        }
        if not (type(topk_sample_logprobs) is int and topk_sample_logprobs == 0):
            body["topk_sample_logprobs"] = topk_sample_logprobs
        if not (type(prompt_alt_tokens_k) is int and prompt_alt_tokens_k == 0):
            body["prompt_alt_tokens_k"] = prompt_alt_tokens_k
        if self._record_stability_info is not False:
            body["record_stability_info"] = self._record_stability_info
        body["type"] = "sample"
        if target_prompt_logprobs is not None:
            if not isinstance(target_prompt_logprobs, TensorData):
                target_prompt_logprobs = accept(
                    target_prompt_logprobs, TensorData, "target_prompt_logprobs"
                )
            shape = target_prompt_logprobs.shape
            if (
                target_prompt_logprobs.dtype != "int64"
                or shape is None
                or len(shape) != 2
                or (shape[0] != prompt.length - 1)
            ):
                raise ValueError(
                    "target_prompt_logprobs must be an int64 2-D tensor of shape "
                    f"[len(prompt)-1={prompt.length - 1}, K], got dtype "
                    f"{target_prompt_logprobs.dtype} shape {shape}"
                )
            body["target_prompt_logprobs"] = to_json(target_prompt_logprobs)
        if prompt_logprobs_last_n is not None:
            body["prompt_logprobs_last_n"] = prompt_logprobs_last_n
        return body, estimate

    def _submit(
        self,
        body: dict[str, Any],
        estimate: int,
        *,
        finish: Callable[[SampleResponse], Any],
        retry: bool,
    ) -> APIFuture[Any]:
        if self._closed:
            raise ClientClosedError("this SamplingClient was closed")
        self._session.check_open()
        self._ensure_process()
        job = SampleJob(self, body, estimate, finish, current_sdk_method.get(), retry)
        try:
            if self._session.started and self._clone_id is not None:
                job.admit()  # nothing to wait for: queue for dispatch from this thread, no hand-off
            else:
                job.queue("sample-submit", job.begin)  # session start / clone join do I/O
        except BaseException:
            job.abandon()  # a signal handler's exception: no future returned, nothing goes on
            raise
        return job.fut

    # ---------------------------------------------------------------- pickling and handles

    def _state(self, *, with_key: bool) -> dict[str, Any]:
        session = self._session
        config = session.config
        holder = {
            "base_url": config.base_url,
            "default_headers_overrides": dict(config.public_state()["headers"]),
            "client_config": session.server.to_dict(),
            "client_dynamic_config": session.dynamic.to_dict(),
            "api_key": config.credentials.static_key() if with_key else None,
        }
        return {
            "session_id": session.session_id,
            "sampling_session_id": self._sampler_id,
            "holder": holder,
            "base_model": self._base_model,
            "record_stability_info": self._record_stability_info,
        }

    def get_sampler_handle(self) -> str:
        """A credential-free handle (same layout as the official SDK's) for other processes."""
        payload = json.dumps(self._state(with_key=False), separators=(",", ":"))
        return base64.urlsafe_b64encode(payload.encode()).decode()

    @staticmethod
    def from_sampler_handle(handle: str, *, api_key: str | None = None) -> SamplingClient:
        """Rebuild a client from a handle, with this process's credentials (no I/O now).

        :param handle: from ``get_sampler_handle()`` (of this SDK or the official one).
        :param api_key: use this key instead of the one resolved from the environment.
        """
        try:
            fields = json.loads(base64.urlsafe_b64decode(handle))
            holder = fields["holder"]
            state = {k: fields[k] for k in ("session_id", "sampling_session_id", "base_model")}
            if not isinstance(holder, dict) or not isinstance(holder.get("base_url"), str):
                raise TypeError("holder.base_url is missing")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a sampler handle: {exc}") from None
        state["record_stability_info"] = bool(fields.get("record_stability_info", False))
        state["holder"] = {**holder, "api_key": api_key}
        return _restore_sampling_client(state)

    def __reduce__(self) -> Any:
        return (_restore_sampling_client, (self._state(with_key=self.pickle_credentials),))

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop this client's futures poller; pending samples fail. Idempotent.

        The session is not finished (other clients may share it).
        """
        self._closed = True
        poller = self._poller
        if poller is not None and os.getpid() == self._pid:
            poller.close()
        if self._session.started and not self._session.in_forked_child():
            self._session.limiter.wake()
        release = self._shadow_release
        if release is not None:
            release()  # once: stops an unpickled client's shadow session with its last user

    def __enter__(self) -> SamplingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    sample_async = awaiting_alias(sample)
    compute_logprobs_async = awaiting_alias(compute_logprobs)


class PendingSamplingClient(_pending.PendingClient, SamplingClient):
    """A SamplingClient still being created (async code only); ``await`` it for the client."""


BackcompatSamplingClientFuture = SamplingClient


def _restore_sampling_client(state: dict[str, Any]) -> SamplingClient:
    """Unpickle / rebuild from a handle: no I/O until first use
    (docs/design/behavior.md#credential-free-pickles)."""
    session, key = shadow_session(state)
    holder = state["holder"]
    client = SamplingClient._create(
        None,
        state["sampling_session_id"],
        base_model=state["base_model"],
        record_stability_info=bool(state.get("record_stability_info", False)),
        session=session,
        clone_id=new_clone_id(session.server.sample_join_sampling_session),
        pickle_credentials=holder.get("api_key") is not None,
    )
    client._shadow_release = weakref.finalize(client, release_shadow, key, session, os.getpid())
    return client
