"""``SamplingClient``: generate from a base model or saved weights, at high concurrency.

Usage::

    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    futs = [sampler.sample(prompt, 4, SamplingParams(max_tokens=32)) for prompt in prompts]
    texts = [tok.decode(s.tokens) for f in futs for s in f.result().sequences]

How one ``sample()`` travels (nothing blocks the caller; no lock is held across I/O, B10):

1. Validation in the caller's thread (``ValueError`` / ``TypeError``). Once the session is
   started and the clone id known, the sample is queued from the caller's thread; before
   that, a job on the ``sample-submit`` pool does the start-up first.
2. The retry handler's concurrency slot (B15): server ``sample_max_concurrent_requests`` (an
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
   that wakes the waiter, after which the payload is fetched on a bounded lane (B24).
5. Retries (B15): timeouts, connection errors, 408/409/429/5xx and 410 retry the whole
   sample under a new seq_id after ``min(base * 2^a, max)`` s +- jitter, without an attempt
   limit; ``RequestFailedError`` never. ``progress_timeout`` (7,200 s) without any completed
   request fails the call with :class:`SamplingStuckError`.

Steps 1-4 queued on a pool may instead run in a thread already blocked in ``fut.result()``
(no timeout, no done-callback) if no worker has taken them yet (:class:`Claimable`): a
sequential ``sample(...).result()`` loop then sends from the caller's thread, without hand-offs.

Cancelling a sample future (B25) before acceptance releases its gates and sends nothing; after
acceptance, polling stops and, when dynamic config ``sample_cancel_enabled`` is on, the
request id is sent to ``POST /api/v1/cancel_future`` (best effort).

Thread safety: share freely; no lock is held across I/O. Fork safety: in a forked child the
client rebuilds its transport and samples under a new clone id (B52). Pickles carry no
credential unless ``pickle_credentials=True`` (B53).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import logging
import os
import random
import threading
import weakref
from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from tinker_sync import _pending
from tinker_sync._asyncio import awaiting_alias, direct_alias
from tinker_sync._clock import Clock
from tinker_sync._executor import BoundedLane, Claimable, call_later, pool
from tinker_sync._fork import make_lock, register_after_fork
from tinker_sync._futures import APIFuture
from tinker_sync._health import StallWatch
from tinker_sync._polldecide import Decision
from tinker_sync._poller import SessionFuturesPoller, cancel_queue_for
from tinker_sync._polling import Poll
from tinker_sync._queuestate import QueueStateReporter
from tinker_sync._ratelimit import LARGE_PROMPT_BYTES, Limiter, Stopped, Ticket
from tinker_sync._retry import SubmissionRetry, parse_retry_after
from tinker_sync._transport import (
    Pool,
    RequestSpec,
    current_sdk_method,
    emit_hook,
    sdk_method_scope,
)
from tinker_sync._validate import check_sampling_params

# Imported here, not lazily on worker threads: a fork during a first import on another
# thread would leave that module's import lock held forever in the child.
from tinker_sync._wire import _jsonresults, _proto
from tinker_sync._wire._converter import from_json, to_json
from tinker_sync.exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    ClientClosedError,
    FutureExpiredError,
    MissingCredentialsError,
    RequestFailedError,
    SamplingStuckError,
)
from tinker_sync.types import (
    ModelInput,
    SampleResponse,
    SamplingParams,
    TensorData,
    UntypedAPIFuture,
)

if TYPE_CHECKING:
    from tinker_sync._session import Session
    from tinker_sync.service_client import ServiceClient
    from tinker_sync.tokenizer import TinkerTokenizer

log = logging.getLogger("tinker_sync.sampling")

SEQ_STRIDE = 1_000_000_000


def _positive_or_none(_inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value <= 0):
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class RetryConfig:
    """How ``sample()`` retries whole requests (frozen, hashable).

    Usage: ``service.create_sampling_client(base_model=..., retry_config=RetryConfig(...))``.

    ``max_connections``: cap on concurrent in-flight samples (None = the server's
    ``sample_max_concurrent_requests``; an explicit value is capped by it; no cap while the
    session futures poller is in use). ``progress_timeout``: seconds with no completed request
    before SamplingStuckError. ``retry_delay_base`` / ``retry_delay_max`` / ``jitter_factor``:
    the delay before retry ``a`` is ``min(base * 2^a, max)`` times ``1 +- jitter``, clamped to
    [0, max]. ``enable_retry_logic=False`` fails a sample on its first error.
    ``retryable_exceptions``: plus status errors 408/409/429/5xx.

    Thread safety: immutable. Fork safety: plain data.
    """

    max_connections: int | None = attrs.field(default=None, validator=_positive_or_none)
    progress_timeout: float = 7200.0
    retry_delay_base: float = 0.5
    retry_delay_max: float = 10.0
    jitter_factor: float = 0.25
    enable_retry_logic: bool = True
    enable_stuck_detection: bool = True
    retryable_exceptions: tuple[type[BaseException], ...] = (
        APIConnectionError,
        TimeoutError,
        FutureExpiredError,
    )

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether the sampling layer retries ``exc`` (never RequestFailedError)."""
        if isinstance(exc, (RequestFailedError, SamplingStuckError)):
            return False
        if isinstance(exc, self.retryable_exceptions):
            return True
        if isinstance(exc, APIStatusError):
            return exc.status_code in (408, 409, 429) or 500 <= exc.status_code < 600
        return False

    def delay(self, attempt: int, draw: float) -> float:
        """The delay before retry number ``attempt`` (0-based); ``draw`` is U[0, 1)."""
        try:
            base = min(float(self.retry_delay_base) * 2.0**attempt, float(self.retry_delay_max))
        except OverflowError:
            base = float(self.retry_delay_max)
        jittered = base + base * float(self.jitter_factor) * (2.0 * draw - 1.0)
        return max(0.0, min(jittered, float(self.retry_delay_max)))


class _RetryHandler:
    """Concurrency slots and progress tracking for one (sampler, RetryConfig) (B15).

    A job that finds no free slot is parked (no thread waits); ``release`` hands the slot to
    the oldest parked job. Thread-safe; the registry is emptied in a forked child.
    """

    def __init__(
        self, config: RetryConfig, capacity: int | None, clock: Clock, *, stuck_detection: bool
    ) -> None:
        self.config = config
        self.capacity = None if capacity is None else max(1, capacity)
        self.clock = clock
        self.stuck_detection = stuck_detection and config.enable_stuck_detection
        self._lock = make_lock()
        self._parked: deque[Callable[[], None]] = deque()
        self.in_flight = 0
        self.last_progress = clock.monotonic()

    @property
    def unlimited(self) -> bool:
        return self.capacity is None

    @property
    def parked(self) -> int:
        return len(self._parked)

    def admit(self, start: Callable[[], None]) -> bool:
        """Take a slot (True), or park ``start`` to run on ``sample-submit`` later (False)."""
        with self._lock:
            if self.capacity is not None and self.in_flight >= self.capacity:
                self._parked.append(start)
                return False
            self._take()
            return True

    def _take(self) -> None:
        if self.in_flight == 0:
            self.last_progress = self.clock.monotonic()
        self.in_flight += 1

    def release(self, *, progressed: bool) -> None:
        with self._lock:
            self.in_flight -= 1
            if progressed:
                self.last_progress = self.clock.monotonic()
            start = None
            if self._parked and (self.capacity is None or self.in_flight < self.capacity):
                start = self._parked.popleft()
                self._take()
        if start is not None:
            pool("sample-submit").submit(start)

    def stuck(self) -> bool:
        return (
            self.stuck_detection
            and self.clock.monotonic() - self.last_progress > self.config.progress_timeout
        )


_handlers: dict[tuple[Any, ...], _RetryHandler] = {}
_MAX_IDLE_HANDLERS = 256
_handlers_lock = make_lock()


def _handler_for(sampler_id: str, config: RetryConfig, session: Session) -> _RetryHandler:
    """One handler per (sampling session, RetryConfig, server limits) in this process."""
    server = session.server
    if server.sample_use_retrieve_futures:
        capacity: int | None = None
    elif config.max_connections is None:
        capacity = server.sample_max_concurrent_requests
    else:
        capacity = min(config.max_connections, server.sample_max_concurrent_requests)
    key = (sampler_id, config, capacity, server.sample_enable_stuck_detection, id(session.clock))
    with _handlers_lock:
        handler = _handlers.get(key)
        if handler is None:
            if len(_handlers) >= _MAX_IDLE_HANDLERS:  # e.g. a new sampler per RL step
                for stale in [k for k, h in _handlers.items() if h.in_flight == 0]:
                    del _handlers[stale]
            handler = _handlers[key] = _RetryHandler(
                config,
                capacity,
                session.clock,
                stuck_detection=server.sample_enable_stuck_detection,
            )
        return handler


def _estimate(prompt: ModelInput) -> int:
    from tinker_sync._wire._estimates import estimate_prompt_bytes

    return estimate_prompt_bytes(prompt)


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
    _handler: _RetryHandler | None
    _poller: SessionFuturesPoller | None
    _closed: bool
    _queue_reporter: QueueStateReporter
    _tokenizer: TinkerTokenizer | None
    _shadow_release: weakref.finalize[..., SamplingClient] | None

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
            # A forked child acts as if unpickled (B52): a shadow of the parent's session with
            # fresh transport state, and a new clone id so seq_ids never collide. The parent's
            # transport, poller and threads are abandoned, never closed (B50).
            from tinker_sync._session import Session

            parent = self._session
            self._session = Session.shadow(
                parent.config,
                session_id=parent.session_id,
                server=parent.server,
                dynamic=parent.dynamic,
                clock=parent.clock,
            )
            self._pid = os.getpid()
            self._set_clone(_new_clone_id(parent.server.sample_join_sampling_session))
            self._joining = None
            self._handler = None
            self._poller = None
            # Its lock may have been held by a parent thread at fork time.
            self._queue_reporter = QueueStateReporter("sampling", self._session.clock)
            self._shadow_release = weakref.finalize(
                self, _release_shadow, None, self._session, self._pid
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

    def _retry_handler(self) -> _RetryHandler:
        handler = self._handler
        if handler is None:
            handler = self._handler = _handler_for(
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
                    weakref.finalize(self, _close_poller, poller, os.getpid())
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
            body = self._sample_body(
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
                _check_features(response, prompt_alt_tokens_k, prompt_logprobs_last_n)
                return response

            return self._submit(
                body,
                prompt,
                finish=finish,
                retry=not self._session.server.sample_no_retries,
            )

    def compute_logprobs(
        self, prompt: ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> APIFuture[list[float | None]]:
        """Per-token prompt logprobs (entry 0 is None; entries before the last N are None)."""
        with sdk_method_scope("SamplingClient.compute_logprobs"):
            body = self._sample_body(
                prompt, 1, SamplingParams(max_tokens=1), True, 0, 0, None, 0, prompt_logprobs_last_n
            )

            def finish(response: SampleResponse) -> list[float | None]:
                _check_features(response, 0, prompt_logprobs_last_n)
                values = response.prompt_logprobs
                if values is None:
                    raise RuntimeError("the server ignored prompt_logprobs=true")
                return list(values)

            return self._submit(body, prompt, finish=finish, retry=True)

    def _sample_body(
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
    ) -> dict[str, Any]:
        if not isinstance(prompt, ModelInput):
            raise TypeError(f"prompt must be a ModelInput, got {type(prompt).__name__}")
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}"
            )
        check_sampling_params(sampling_params)
        _check_int("num_samples", num_samples, minimum=1)
        _check_int("topk_prompt_logprobs", topk_prompt_logprobs, minimum=0)
        _check_int("topk_sample_logprobs", topk_sample_logprobs, minimum=0)
        _check_int("prompt_alt_tokens_k", prompt_alt_tokens_k, minimum=0)
        if not isinstance(include_prompt_logprobs, bool):
            raise TypeError("include_prompt_logprobs must be a bool")
        if prompt_logprobs_last_n is not None:
            _check_int("prompt_logprobs_last_n", prompt_logprobs_last_n, minimum=1)
            if not include_prompt_logprobs:
                raise ValueError("prompt_logprobs_last_n needs include_prompt_logprobs=True")
        body: dict[str, Any] = {
            "num_samples": num_samples,
            "prompt": to_json(prompt),
            "sampling_params": to_json(sampling_params),
            "sampling_session_id": self._sampler_id,
            "prompt_logprobs": include_prompt_logprobs,
            "topk_prompt_logprobs": topk_prompt_logprobs,
            "topk_sample_logprobs": topk_sample_logprobs,
            "prompt_alt_tokens_k": prompt_alt_tokens_k,
            "record_stability_info": self._record_stability_info,
            "type": "sample",
        }
        if target_prompt_logprobs is not None:
            if not isinstance(target_prompt_logprobs, TensorData):
                raise TypeError("target_prompt_logprobs must be a TensorData")
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
        return body

    def _submit(
        self,
        body: dict[str, Any],
        prompt: ModelInput,
        *,
        finish: Callable[[SampleResponse], Any],
        retry: bool,
    ) -> APIFuture[Any]:
        if self._closed:
            raise ClientClosedError("this SamplingClient was closed")
        self._session.check_open()
        self._ensure_process()
        job = _SampleJob(self, body, _estimate(prompt), finish, current_sdk_method.get(), retry)
        if self._session.started and self._clone_id is not None:
            job.admit()  # nothing to wait for: queue for dispatch from this thread, no hand-off
        else:
            job.queue("sample-submit", job.begin)  # session start / clone join do I/O
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


class _SampleJob:
    """One ``sample()`` call: retries (B15) around dispatch (B12, B13) and the result wait.

    Runs on the sample pools, one step at a time; never blocks a thread while waiting for a
    concurrency slot, a retry delay or (with the session poller) the result.
    """

    def __init__(
        self,
        client: SamplingClient,
        body: dict[str, Any],
        estimate: int,
        finish: Callable[[SampleResponse], Any],
        sdk_method: str | None,
        retry: bool,
    ) -> None:
        self.client = client
        self.session = client._session
        self.config = client._retry_config
        self.body = body
        self.estimate = estimate
        self.postprocess = finish
        self.sdk_method = sdk_method
        self.retry = retry and self.config.enable_retry_logic
        self.attempt = 0
        self.handler: _RetryHandler | None = None
        self.limiter: Limiter | None = None
        self.poller: SessionFuturesPoller | None = None
        self.ticket: Ticket | None = None
        self.spec: RequestSpec | None = None
        self.created_at = 0.0
        self.submit_retry: SubmissionRetry | None = None
        self._lock = threading.Lock()
        self.request_id: str | None = None
        self._cancel_sent: set[str] = set()
        self._stop: BaseException | None = None
        self._released = False
        self.fut: APIFuture[Any] = APIFuture(on_cancel=self._on_cancel, description="Sample")
        self.fut._owner = self.session  # type: ignore[attr-defined]
        self._stall = StallWatch(self.session.clock, self.session.config.stall_timeout, "Sample")

    # ---------------------------------------------------------------- stop conditions

    def stop_reason(self) -> BaseException | None:
        """Why this job must stop now (cancelled, closed, stuck), else None."""
        if self.fut.cancelled():
            return _Cancelled()
        if self.session.closed or self.client._closed:
            return ClientClosedError("the client was closed while this sample was pending")
        handler = self.handler
        if handler is not None and handler.stuck():
            return self._stuck_error()
        return None

    def _stuck_error(self) -> SamplingStuckError:
        return SamplingStuckError(
            f"No progress made in {self.config.progress_timeout:g}s on sampler "
            f"{self.client._sampler_id}. Requests appear to be stuck."
        )

    def _poll_should_stop(self) -> bool:
        """``Poll.is_cancelled`` hook: also stops the poll when closed or stuck."""
        reason = self.stop_reason()
        if reason is None:
            return False
        if not isinstance(reason, _Cancelled):
            self._stop = reason
        return True

    def _on_cancel(self) -> None:
        """Runs in the cancelling thread once ``fut.cancel()`` succeeded (B25)."""
        limiter = self.limiter
        if limiter is not None:
            limiter.wake(everything=False)  # a held ticket stops now, a queued one at its turn
        with self._lock:
            request_id = self.request_id
        if request_id is None:
            return
        self._server_cancel(request_id)
        poller = self.poller
        if poller is not None and poller.forget(request_id):
            self._release(progressed=False)

    def _server_cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._cancel_sent:
                return
            self._cancel_sent.add(request_id)
        cancel_queue_for(self.session).enqueue(request_id)

    # ---------------------------------------------------------------- steps

    def queue(self, role: str, step: Callable[[], None], lane: BoundedLane | None = None) -> None:
        """Run ``step`` on ``pool(role)`` (or ``lane``), or in a thread waiting in ``result()``."""
        if self.fut._waited_on_here():
            step()  # the waiting thread is running this job: go on, nobody to hand over to
            return
        claimable = Claimable(step)
        self.fut._offer(claimable)
        if lane is not None:
            lane.submit(claimable.run)
        else:
            pool(role).submit(claimable.run)

    def begin(self) -> None:
        """First step (sample-submit): session start, clone id, then a concurrency slot."""
        try:
            try:
                self.session.ensure_started()
            except MissingCredentialsError as exc:
                if self.client._service is None:  # unpickled or built from a handle
                    raise MissingCredentialsError(
                        f"{exc} This SamplingClient was unpickled or built from a sampler "
                        "handle, which carries no credential by default: give this process "
                        "TINKER_API_KEY, pass api_key= to from_sampler_handle, or create the "
                        "ServiceClient with pickle_credentials=True."
                    ) from None
                raise
            self.client._ensure_clone()
        except BaseException as exc:
            self.fut._fail(exc)
            return
        self.admit()

    def admit(self) -> None:
        """Take a concurrency slot, or park (no thread) until one frees up."""
        try:
            self.limiter = self.session.limiter
            self.handler = self.client._retry_handler()
        except BaseException as exc:
            self.fut._fail(exc)
            return
        if self.fut.cancelled():
            return
        if self.handler.admit(self.attempt_once):
            self.attempt_once()

    def attempt_once(self) -> None:
        """Queue a submission under a fresh seq_id with the tenant's dispatcher (no waiting)."""
        stop = self.stop_reason()
        if stop is not None:
            self.finish(None, stop)
            return
        seq_id = self.client._take_seq_id()
        self.spec = RequestSpec(
            method="POST",
            path="/api/v1/asample",
            pool=Pool.SAMPLE,
            json=dict(self.body, seq_id=seq_id),
            headers={"X-Tinker-Sampling-Backpressure": "1"},
            max_retries=0,
            sdk_method=self.sdk_method,
        )
        self.created_at = self.session.clock.monotonic()
        self.submit_retry = None  # the submission loop's state for this seq_id, on first send
        limiter = self.limiter
        assert limiter is not None
        self.ticket = Ticket(
            owner=id(self.client),  # the round-robin unit (an int: keeps no client alive)
            estimate=self.estimate,
            start=self._start_send,
            on_stop=self._stopped_waiting,
            stop_reason=self.stop_reason,
        )
        limiter.enqueue(self.ticket)

    def _start_send(self) -> None:
        limiter = self.limiter
        assert limiter is not None
        self.queue("sample-submit", self._send, lane=limiter.sender)

    def _stopped_waiting(self, exc: BaseException) -> None:
        self.finish(None, exc)

    def _send(self) -> None:
        """One send of the held ticket: re-check stop and deadline, POST, then settle.

        A 429 (or a 402 inside the billing window) moves the tenant's deadline and parks the
        ticket again with its gates and seq_id; a retryable failure parks it on the timer for
        the submission loop's delay. Nothing here waits. The sender slot is freed when this
        step returns, so a started ticket never queues behind another for a thread.
        """
        limiter, ticket = self.limiter, self.ticket
        assert limiter is not None and ticket is not None
        try:
            self._send_once()
        finally:
            limiter.sender_done(ticket)

    def _send_once(self) -> None:
        from tinker_sync._retry import send_with_retries

        limiter, ticket, session = self.limiter, self.ticket, self.session
        assert limiter is not None and ticket is not None and self.spec is not None
        clock = session.clock
        stop = self.stop_reason()
        if stop is not None:
            limiter.release(ticket)
            self.finish(None, stop)
            return
        if limiter.backoff_remaining() > 0:  # another client or process backed off meanwhile
            limiter.hold(ticket)
            return
        if self.submit_retry is None:
            self.submit_retry = session.submission_retry("sample", stop=self.stop_reason)
        try:
            reply = send_with_retries(session.transport, self.spec, max_retries=0)
            accepted = from_json(UntypedAPIFuture, reply.json())
        except APIStatusError as exc:
            if exc.status_code == 429 or (
                exc.status_code == 402
                and session.billing.should_pause(clock.monotonic(), exc.message)
            ):
                delay = parse_retry_after(exc.response.headers, clock.time())
                if delay is None:
                    delay = 5.0 if self.estimate > LARGE_PROMPT_BYTES else 1.0
                limiter.set_backoff(delay, f"{exc.status_code} on asample", session.hooks)
                limiter.hold(ticket)  # same seq_id, same gates, after the deadline
                return
            self._submit_failed(exc)
            return
        except Exception as exc:
            self._submit_failed(exc)
            return
        except BaseException as exc:
            limiter.release(ticket)
            self.finish(None, exc)
            return
        limiter.release(ticket)
        self._accepted(accepted)

    def _submit_failed(self, exc: Exception) -> None:
        """The submission loop's retry (same seq_id, gates kept), parked on the timer."""
        limiter, ticket, retry = self.limiter, self.ticket, self.submit_retry
        assert limiter is not None and ticket is not None and retry is not None
        try:
            wait = retry.wait_after(exc)
        except BaseException as final:
            limiter.release(ticket)
            self.finish(None, final)
            return
        call_later(self.session.clock, wait, "sample-submit", limiter.hold, ticket)

    def _accepted(self, accepted: UntypedAPIFuture) -> None:
        """The server took the request: wait for its result (poll or session poller)."""
        request_id = accepted.request_id
        with self._lock:
            self.request_id = request_id
        self.fut._set_request_ids((request_id,))
        sequence_ids = accepted.sample_sequence_ids
        if self.fut.cancelled():
            self._server_cancel(request_id)
            self.finish(None, _Cancelled())
            return
        created_at = self.created_at
        poller = self.client._futures_poller()
        if poller is None:
            poll = self._poll(request_id, sequence_ids, created_at, allow_metadata_only=True)
            self.queue("sample-poll", poll.run)
            return
        self.poller = poller
        poller.wait(request_id, _PollerWaiter(self, request_id, sequence_ids, created_at))
        if self.fut.cancelled() and poller.forget(request_id):
            self._server_cancel(request_id)
            self.finish(None, _Cancelled())

    def _poll(
        self,
        request_id: str,
        sequence_ids: list[str] | None,
        created_at: float,
        *,
        allow_metadata_only: bool,
        on_done: Callable[[Any, BaseException | None], None] | None = None,
    ) -> Poll:
        def decode(decision: Decision) -> SampleResponse:
            decode_sample_response = _proto.decode_sample_response
            sample_response_from_json = _jsonresults.sample_response_from_json

            if decision.protobuf:
                return decode_sample_response(decision.body, sequence_ids)
            return sample_response_from_json(decision.body, sequence_ids)

        return Poll(
            self.session,
            request_id,
            "Sample",
            decode=decode,
            on_done=on_done or self.finish,
            created_at=created_at,
            sdk_method=self.sdk_method,
            is_cancelled=self._poll_should_stop,
            on_queue_state=self.client.on_queue_state_change,
            sampling=True,
            allow_metadata_only=allow_metadata_only,
        )

    # ---------------------------------------------------------------- settling

    def finish(self, value: Any, error: BaseException | None) -> None:
        """One attempt ended: resolve, fail, or schedule a retry under a new seq_id."""
        if error is None and value is None:  # the poll stopped at our request
            error = self._stop or _Cancelled()
        if isinstance(error, _Cancelled) or self.fut.cancelled():
            self._release(progressed=False)
            return
        if error is None:
            try:
                value = self.postprocess(value)
            except Exception as exc:
                error = exc
        if error is not None and isinstance(error, SamplingStuckError):
            with self._lock:
                request_id = self.request_id
            if request_id is not None:
                self._server_cancel(request_id)
        if error is not None and self.retry and self.config.is_retryable(error):
            stalled = self._stalled(error)
            if stalled is not None:
                self._release(progressed=False)
                self.fut._fail(stalled)
                return
            handler = self.handler
            if handler is not None and handler.stuck():
                stuck = self._stuck_error()
                stuck.__cause__ = error
                self._release(progressed=False)
                self.fut._fail(stuck)
                return
            delay = self.config.delay(self.attempt, self.session.clock.random())
            self.attempt += 1
            with self._lock:
                self.request_id = None
            log.debug(
                "retrying sample on %s in %.3f s after %r", self.client._sampler_id, delay, error
            )
            emit_hook(
                self.session.hooks,
                "retry_scheduled",
                layer="sample",
                delay=delay,
                reason=type(error).__name__,
                attempt=self.attempt,
                method="POST",
                path="/api/v1/asample",
            )
            call_later(self.session.clock, delay, "sample-submit", self.attempt_once)
            return
        self._release(progressed=error is None)
        if error is not None:
            self.fut._fail(error)
        else:
            self.fut._resolve(value)

    def _stalled(self, error: BaseException) -> BaseException | None:
        """The user's knobs bound this layer too: ``max_retries=0`` (no retry: ``error``) and
        ``stall_timeout`` without a useful answer (a StalledError)."""
        if self.session.config.max_retries == 0:
            return error
        status = getattr(error, "status_code", None)
        if isinstance(status, int) and status < 500:
            self._stall.useful()
            return None
        return self._stall.unhealthy(error, request_id=self.request_id)

    def _release(self, *, progressed: bool) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        handler = self.handler
        if handler is not None:
            handler.release(progressed=progressed)


class _PollerWaiter:
    """A sample's registration with the session futures poller (B24)."""

    def __init__(
        self,
        job: _SampleJob,
        request_id: str,
        sequence_ids: list[str] | None,
        created_at: float,
    ) -> None:
        self.job = job
        self.request_id = request_id
        self.sequence_ids = sequence_ids
        self.created_at = created_at
        self._reserved = 0

    def abandoned(self) -> BaseException | None:
        reason = self.job.stop_reason()
        if reason is not None and not isinstance(reason, _Cancelled):
            return reason
        return None

    def on_failure(self, exc: BaseException) -> None:
        self.job.finish(None, exc)

    def on_completion(self, completion: dict[str, Any]) -> None:
        """Fetch the payload: a ``finished`` size is reserved first, then fetched in full."""
        job = self.job
        size = completion.get("response_payload_uncompressed_size")
        full = (
            completion.get("state") == "finished"
            and isinstance(size, int)
            and not isinstance(size, bool)
            and size > 0
        )
        if full:
            assert isinstance(size, int)
            limiter = job.session.limiter
            try:
                limiter.reserve_response_bytes(size, job.stop_reason)
            except Stopped as stopped:
                job.finish(None, stopped.exc)
                return
            self._reserved = size
        poll = job._poll(
            self.request_id,
            self.sequence_ids,
            self.created_at,
            allow_metadata_only=not full,
            on_done=self._fetched,
        )
        poll.run()

    def _fetched(self, value: Any, error: BaseException | None) -> None:
        job = self.job
        if self._reserved:
            job.session.limiter.release_response_bytes(self._reserved)
            self._reserved = 0
        poller = job.poller
        if poller is not None and (
            value is not None or isinstance(error, (RequestFailedError, APIResponseValidationError))
        ):
            poller.mark_retrieved(self.request_id)
        job.finish(value, error)


class _Cancelled(Exception):
    """Internal: the sample future was cancelled."""


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_features(response: SampleResponse, alt_k: int, last_n: int | None) -> None:
    """Fail loudly when the server silently ignored a newer sampling option (B16)."""
    if alt_k > 0 and response.prompt_alt_tokens is None:
        raise RuntimeError(
            f"prompt_alt_tokens_k={alt_k} was requested but the server returned no "
            "prompt_alt_tokens; it may predate this feature"
        )
    if last_n is None:
        return
    values = response.prompt_logprobs_np
    if values is None:
        return
    excluded = np.asarray(values, dtype=np.float64)[: max(0, len(values) - last_n)]
    if bool((~np.isnan(excluded)).any()):
        raise RuntimeError(
            f"prompt_logprobs_last_n={last_n} was requested but the server scored earlier "
            "prompt tokens too; it may predate this feature"
        )


def _close_poller(poller: SessionFuturesPoller, pid: int) -> None:
    """Finalizer of a collected client: stop its poller (never a parent's, from a child)."""
    if os.getpid() == pid:
        poller.close()


def _new_clone_id(join: bool) -> int | None:
    """None (ask ``join_sampling_session``) when the server allows it, else random in [1, 1e9]."""
    return None if join else random.SystemRandom().randint(1, SEQ_STRIDE)


#: key -> [shadow session, number of live clients using it]
_shadow_sessions: dict[str, list[Any]] = {}
_shadow_lock = make_lock()


def _shadow_session(state: dict[str, Any]) -> tuple[Session, str]:
    """One shadow session per (session id, holder snapshot) in this process (B53).

    Every client unpickled from the same sampler shares its transport and heartbeat thread;
    the session's background threads stop once the last of those clients is closed or
    collected (:func:`_release_shadow`).
    """
    from tinker_sync._config import ClientConfig, DynamicConfig, ServerConfig
    from tinker_sync._session import Session

    holder = state["holder"]
    api_key = holder.get("api_key")
    key_material = {
        **holder,
        "api_key": None if api_key is None else hashlib.sha256(str(api_key).encode()).hexdigest(),
        "session_id": state["session_id"],
    }
    key = json.dumps(key_material, sort_keys=True, default=str)
    with _shadow_lock:
        entry = _shadow_sessions.get(key)
        if entry is not None and not entry[0].closed:
            entry[1] += 1
            return entry[0], key
        config = ClientConfig.from_env(
            base_url=holder["base_url"],
            api_key=api_key,
            default_headers_overrides=holder.get("default_headers_overrides") or None,
        )
        session = Session.shadow(
            config,
            session_id=state["session_id"],
            server=ServerConfig.from_dict(holder.get("client_config") or {}),
            dynamic=DynamicConfig.from_dict(holder.get("client_dynamic_config") or {}),
        )
        _shadow_sessions[key] = [session, 1]
        return session, key


def _release_shadow(key: str | None, session: Session, pid: int) -> None:
    """A client of a shadow session is gone; stop the session's threads with the last one."""
    if os.getpid() != pid:  # never touch a parent's threads from a forked child
        return
    if key is not None:
        with _shadow_lock:
            entry = _shadow_sessions.get(key)
            if entry is not None and entry[0] is session:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del _shadow_sessions[key]
    # A shadow must never *finish* the original session (that belongs to its creator), so
    # only its heartbeat and timer loops are stopped.
    stop = getattr(session, "_stop", None)
    if isinstance(stop, threading.Event):
        stop.set()


def _restore_sampling_client(state: dict[str, Any]) -> SamplingClient:
    """Unpickle / rebuild from a handle: no I/O until first use (B53)."""
    session, key = _shadow_session(state)
    holder = state["holder"]
    client = SamplingClient._create(
        None,
        state["sampling_session_id"],
        base_model=state["base_model"],
        record_stability_info=bool(state.get("record_stability_info", False)),
        session=session,
        clone_id=_new_clone_id(session.server.sample_join_sampling_session),
        pickle_credentials=holder.get("api_key") is not None,
    )
    client._shadow_release = weakref.finalize(client, _release_shadow, key, session, os.getpid())
    return client


def _after_fork_in_child() -> None:
    _handlers.clear()
    _shadow_sessions.clear()


register_after_fork(_after_fork_in_child)
