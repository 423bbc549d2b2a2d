"""``SamplingClient``: generate from a base model or saved weights, at high concurrency.

Usage::

    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    futs = [sampler.sample(prompt, 4, SamplingParams(max_tokens=32)) for prompt in prompts]
    texts = [tok.decode(s.tokens) for f in futs for s in f.result().sequences]

Every ``sample()`` passes the shared dispatch gates of its (base URL, credential) limiter (400
in flight, 10 while recently backed off, a byte budget), waits for the shared backoff deadline,
and holds the gates only until the server accepts the request (B12, B13). A 429 moves that
deadline for every client of the same tenant in the process. Failures worth retrying are
retried with a new seq_id (B15); ``RequestFailedError`` never is.

Thread safety: share freely; no lock is held across I/O. Fork safety: in a forked child the
client rebuilds its transport and samples under a new clone id (B52). Pickles carry no
credential unless ``pickle_credentials=True`` (B53).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import random
import threading
from typing import TYPE_CHECKING, Any

import attrs

from tinker_sync._executor import pool
from tinker_sync._futures import APIFuture
from tinker_sync._polldecide import Decision
from tinker_sync._polling import Poll
from tinker_sync._queuestate import QueueStateReporter
from tinker_sync._ratelimit import LARGE_PROMPT_BYTES, Stopped
from tinker_sync._retry import parse_retry_after
from tinker_sync._transport import Pool, RequestSpec, current_sdk_method, sdk_method_scope
from tinker_sync._wire._converter import from_json, to_json
from tinker_sync.exceptions import (
    APIConnectionError,
    APIStatusError,
    ClientClosedError,
    FutureExpiredError,
    MissingCredentialsError,
    RateLimitError,
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


@attrs.frozen(kw_only=True)
class RetryConfig:
    """How ``sample()`` retries whole requests (frozen, hashable).

    ``max_connections``: cap on concurrent in-flight samples (None = the server's
    ``sample_max_concurrent_requests``; an explicit value is capped by it).
    ``progress_timeout``: seconds with no completed request before SamplingStuckError.
    """

    max_connections: int | None = None
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
        if isinstance(exc, RequestFailedError):
            return False
        if isinstance(exc, self.retryable_exceptions):
            return True
        if isinstance(exc, APIStatusError):
            return exc.status_code in (408, 409, 429) or exc.status_code >= 500
        return False

    def delay(self, attempt: int, draw: float) -> float:
        base = min(float(self.retry_delay_base) * 2.0**attempt, float(self.retry_delay_max))
        jittered = base * (1.0 + float(self.jitter_factor) * (2.0 * draw - 1.0))
        return max(0.0, min(jittered, float(self.retry_delay_max)))


class _RetryHandler:
    """Concurrency gate and stuck detection for one (sampler, RetryConfig) (B15)."""

    def __init__(self, config: RetryConfig, server_cap: int, clock: Any) -> None:
        self.config = config
        cap = (
            server_cap
            if config.max_connections is None
            else min(config.max_connections, server_cap)
        )
        self.capacity = max(1, cap)
        self.clock = clock
        self._cond = threading.Condition()
        self._in_flight = 0
        self.last_progress = clock.monotonic()
        self.unlimited = False

    def acquire(self, stop: Any) -> None:
        if self.unlimited:
            return
        with self._cond:
            while self._in_flight >= self.capacity:
                reason = stop()
                if reason is not None:
                    raise reason
                self._cond.wait()
            self._in_flight += 1

    def release(self) -> None:
        if self.unlimited:
            return
        with self._cond:
            self._in_flight -= 1
            self._cond.notify()

    def progressed(self) -> None:
        self.last_progress = self.clock.monotonic()

    def stuck(self) -> bool:
        return (
            self.config.enable_stuck_detection
            and self.clock.monotonic() - self.last_progress > self.config.progress_timeout
        )


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
    _clone_id: int
    _seq_lock: threading.Lock
    _next_seq: int
    _pid: int
    _handler: _RetryHandler | None
    _closed: bool
    _queue_reporter: QueueStateReporter
    _tokenizer: TinkerTokenizer | None

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
        clone_id: int = 0,
        pickle_credentials: bool = False,
    ) -> SamplingClient:
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
        self._clone_id = clone_id
        self._seq_lock = threading.Lock()
        self._next_seq = clone_id * SEQ_STRIDE
        self._pid = os.getpid()
        self._handler = None
        self._closed = False
        self._queue_reporter = QueueStateReporter("sampling", self._session.clock)
        self._tokenizer = None
        return self

    # ---------------------------------------------------------------- identity

    @property
    def sampler_id(self) -> str:
        return self._sampler_id

    def get_base_model(self) -> str:
        return self._base_model

    async def get_base_model_async(self) -> str:
        return self._base_model

    def result(self, timeout: float | None = None) -> SamplingClient:
        """0.38 compatibility: creation already returned the client."""
        return self

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
        with self._seq_lock:
            if os.getpid() == self._pid:
                return
            # A forked child acts as if unpickled (B52): a shadow of the parent's session with
            # fresh transport state, and a new clone id so seq_ids never collide.
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
            self._seq_lock = threading.Lock()
            self._clone_id = random.randint(1, SEQ_STRIDE)
            self._next_seq = self._clone_id * SEQ_STRIDE
            self._handler = None

    def _take_seq_id(self) -> int:
        with self._seq_lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def _retry_handler(self) -> _RetryHandler:
        handler = self._handler
        if handler is None:
            server = self._session.server
            handler = _RetryHandler(
                self._retry_config, server.sample_max_concurrent_requests, self._session.clock
            )
            self._handler = handler
        return handler

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
        """Generate ``num_samples`` continuations of ``prompt``; returns at once."""
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
            no_retries = self._session.started and self._session.server.sample_no_retries
            return self._submit(
                body,
                prompt,
                decode=self._decode_sample,
                retry=not no_retries,
                checks=(prompt_alt_tokens_k, prompt_logprobs_last_n, prompt.length),
            )

    def compute_logprobs(
        self, prompt: ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> APIFuture[list[float | None]]:
        """Per-token prompt logprobs (entry 0 is None)."""
        with sdk_method_scope("SamplingClient.compute_logprobs"):
            body = self._sample_body(
                prompt, 1, SamplingParams(max_tokens=1), True, 0, 0, None, 0, prompt_logprobs_last_n
            )

            def decode(decision: Decision, sequence_ids: list[str] | None) -> list[float | None]:
                response = self._decode_sample(decision, sequence_ids)
                values = response.prompt_logprobs
                if values is None:
                    raise RuntimeError("the server ignored prompt_logprobs=true")
                return list(values)

            return self._submit(
                body,
                prompt,
                decode=decode,
                retry=True,
                checks=(0, prompt_logprobs_last_n, prompt.length),
            )

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

    def _decode_sample(self, decision: Decision, sequence_ids: list[str] | None) -> SampleResponse:
        from tinker_sync._wire._proto import decode_sample_response, sample_response_from_json

        if decision.protobuf:
            return decode_sample_response(decision.body, sequence_ids)
        return sample_response_from_json(decision.body, sequence_ids)

    def _submit(
        self,
        body: dict[str, Any],
        prompt: ModelInput,
        *,
        decode: Any,
        retry: bool,
        checks: tuple[int, int | None, int],
    ) -> APIFuture[Any]:
        if self._closed:
            raise ClientClosedError("this SamplingClient was closed")
        self._session.check_open()
        self._ensure_process()
        sdk_method = current_sdk_method.get()
        estimate = _estimate(prompt)
        limiter_ref: list[Any] = []

        def on_cancel() -> None:
            if limiter_ref:
                limiter_ref[0].wake()

        fut: APIFuture[Any] = APIFuture(on_cancel=on_cancel, description="Sample")
        fut._owner = self._session  # type: ignore[attr-defined]
        job = _SampleJob(self, body, estimate, decode, fut, sdk_method, retry, checks, limiter_ref)
        pool("sample-submit").submit(job.start)
        return fut

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
        """Rebuild a client from a handle, with this process's credentials (no I/O now)."""
        try:
            fields = json.loads(base64.urlsafe_b64decode(handle))
            holder = fields["holder"]
            state = {k: fields[k] for k in ("session_id", "sampling_session_id", "base_model")}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a sampler handle: {exc}") from None
        state["record_stability_info"] = bool(fields.get("record_stability_info", False))
        state["holder"] = {**holder, "api_key": api_key}
        return _restore_sampling_client(state)

    def __reduce__(self) -> Any:
        return (_restore_sampling_client, (self._state(with_key=self.pickle_credentials),))

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop this client's background work; does not finish the session. Idempotent."""
        self._closed = True

    def __enter__(self) -> SamplingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def sample_async(self, *args: Any, **kwargs: Any) -> SampleResponse:
        return await self.sample(*args, **kwargs)

    async def compute_logprobs_async(self, *args: Any, **kwargs: Any) -> list[float | None]:
        return await self.compute_logprobs(*args, **kwargs)


BackcompatSamplingClientFuture = SamplingClient


class _SampleJob:
    """One ``sample()`` call: retries (B15) around dispatch (B12, B13) and polling."""

    def __init__(
        self,
        client: SamplingClient,
        body: dict[str, Any],
        estimate: int,
        decode: Any,
        fut: APIFuture[Any],
        sdk_method: str | None,
        retry: bool,
        checks: tuple[int, int | None, int],
        limiter_ref: list[Any],
    ) -> None:
        self.client = client
        self.session = client._session
        self.body = body
        self.estimate = estimate
        self.decode = decode
        self.fut = fut
        self.sdk_method = sdk_method
        self.retry = retry
        self.checks = checks
        self.limiter_ref = limiter_ref
        self.attempt = 0
        self.handler: _RetryHandler | None = None

    def stop_reason(self) -> BaseException | None:
        if self.fut.cancelled():
            return _Cancelled()
        if self.session.closed or self.client._closed:
            return ClientClosedError("the client was closed while this sample was pending")
        return None

    def start(self) -> None:
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
            self.limiter_ref.append(self.session.limiter)
            self.handler = self.client._retry_handler()
            self.handler.acquire(self.stop_reason)
        except _Cancelled:
            return
        except BaseException as exc:
            self.fut._fail(exc)
            return
        self.attempt_once()

    def finish(self, value: Any, error: BaseException | None) -> None:
        handler = self.handler
        if error is None and value is None and self.fut.cancelled():
            if handler is not None:
                handler.release()
            return
        if (
            error is not None
            and self.retry
            and self.client._retry_config.enable_retry_logic
            and self.client._retry_config.is_retryable(error)
            and not self.fut.done()
        ):
            assert handler is not None
            if handler.stuck():
                stuck = SamplingStuckError(
                    f"No progress made on sampler {self.client._sampler_id} for "
                    f"{self.client._retry_config.progress_timeout:.0f} s"
                )
                stuck.__cause__ = error
                handler.release()
                self.fut._fail(stuck)
                return
            delay = self.client._retry_config.delay(self.attempt, self.session.clock.random())
            self.attempt += 1
            log.debug(
                "retrying sample on %s in %.3f s after %r", self.client._sampler_id, delay, error
            )
            pool("sample-submit").submit(self._retry_after, delay)
            return
        if handler is not None:
            handler.release()
            if error is None:
                handler.progressed()
        if error is not None:
            self.fut._fail(error)
        else:
            self.fut._resolve(value)

    def _retry_after(self, delay: float) -> None:
        if delay > 0:
            self.session.clock.sleep(delay, "sample-retry")
        self.attempt_once()

    def attempt_once(self) -> None:
        """Submit under a fresh seq_id (gates held until accepted), then poll."""
        if self.fut.cancelled():
            self.finish(None, None)
            return
        seq_id = self.client._take_seq_id()
        body = dict(self.body, seq_id=seq_id)
        spec = RequestSpec(
            method="POST",
            path="/api/v1/asample",
            pool=Pool.SAMPLE,
            json=body,
            headers={"X-Tinker-Sampling-Backpressure": "1"},
            max_retries=0,
            sdk_method=self.sdk_method,
        )
        created_at = self.session.clock.monotonic()
        try:
            accepted = self._dispatch(spec)
        except _Cancelled:
            self.finish(None, None)
            return
        except Stopped as stopped:
            if isinstance(stopped.exc, _Cancelled):
                self.finish(None, None)
            else:
                self.finish(None, stopped.exc)
            return
        except BaseException as exc:
            self.finish(None, exc)
            return
        self.fut._set_request_ids((accepted.request_id,))
        seq_ids = accepted.sample_sequence_ids
        alt_k, last_n, prompt_len = self.checks

        def decode(decision: Decision) -> Any:
            value = self.decode(decision, seq_ids)
            if isinstance(value, SampleResponse):
                _check_features(value, alt_k, last_n, prompt_len)
            return value

        poll = Poll(
            self.session,
            accepted.request_id,
            "Sample",
            decode=decode,
            on_done=self.finish,
            created_at=created_at,
            sdk_method=self.sdk_method,
            is_cancelled=self.fut.cancelled,
            on_queue_state=self.client.on_queue_state_change,
            sampling=True,
        )
        pool("sample-poll").submit(poll.run)

    def _dispatch(self, spec: RequestSpec) -> UntypedAPIFuture:
        """Gates (B12) -> shared backoff (B13) -> send; 429 resends the same seq_id."""
        from tinker_sync._retry import send_with_retries, submission_loop

        session = self.session
        limiter = session.limiter
        transport = session.transport

        def send() -> UntypedAPIFuture:
            while True:
                limiter.wait_backoff(self.stop_reason)
                try:
                    reply = send_with_retries(transport, spec, max_retries=0)
                except RateLimitError as exc:
                    retry_after = parse_retry_after(exc.response.headers, session.clock.time())
                    if retry_after is None:
                        retry_after = 5.0 if self.estimate > LARGE_PROMPT_BYTES else 1.0
                    limiter.set_backoff(retry_after, "429 on asample", session.hooks)
                    continue
                return from_json(UntypedAPIFuture, reply.json())

        with limiter.dispatch(self.estimate, self.stop_reason):
            return submission_loop(
                send, clock=session.clock, billing=session.billing, hooks=session.hooks
            )


class _Cancelled(Exception):
    """Internal: the sample future was cancelled."""


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_features(
    response: SampleResponse, alt_k: int, last_n: int | None, prompt_len: int
) -> None:
    """Fail loudly when the server silently ignored a newer sampling option (B16)."""
    if alt_k > 0 and response.prompt_alt_tokens is None:
        raise RuntimeError("the server ignored prompt_alt_tokens_k (no prompt_alt_tokens)")
    if last_n is not None and response.prompt_logprobs is not None:
        cutoff = max(0, prompt_len - last_n)
        early = response.prompt_logprobs[:cutoff]
        if any(v is not None and not math.isnan(v) for v in early):
            raise RuntimeError("the server ignored prompt_logprobs_last_n")


def _restore_sampling_client(state: dict[str, Any]) -> SamplingClient:
    """Unpickle / rebuild from a handle: no I/O until first use (B53)."""
    from tinker_sync._config import ClientConfig, DynamicConfig, ServerConfig
    from tinker_sync._session import Session

    holder = state["holder"]
    config = ClientConfig.from_env(
        base_url=holder["base_url"],
        api_key=holder.get("api_key"),
        default_headers_overrides=holder.get("default_headers_overrides") or None,
    )
    session = Session.shadow(
        config,
        session_id=state["session_id"],
        server=ServerConfig.from_dict(holder.get("client_config") or {}),
        dynamic=DynamicConfig.from_dict(holder.get("client_dynamic_config") or {}),
    )
    clone_id = random.randint(1, SEQ_STRIDE)
    return SamplingClient._create(
        None,
        state["sampling_session_id"],
        base_model=state["base_model"],
        record_stability_info=bool(state.get("record_stability_info", False)),
        session=session,
        clone_id=clone_id,
        pickle_credentials=holder.get("api_key") is not None,
    )
