"""tinker_sync: a sync-first, thread-pool Python SDK for the Tinker fine-tuning API.

Usage::

    import tinker_sync as tinker

    service = tinker.ServiceClient()
    training = service.create_lora_training_client("Qwen/Qwen3-8B", rank=32)
    fwd = training.forward_backward(data, "cross_entropy")
    opt = training.optim_step(tinker.AdamParams(learning_rate=1e-4))
    print(fwd.result().metrics, opt.result())

Importing this package starts no thread, opens no socket and reads no credential; the public
names below are loaded on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tinker_sync._runtime.imports import load
from tinker_sync._version import __version__

__title__ = "tinker_sync"
__protocol_version__ = "0.38.0"

# name -> module that defines it (loaded lazily, PEP 562)
_EXPORTS: dict[str, str] = {
    # clients
    "ServiceClient": "tinker_sync.service_client",
    "TrainingClient": "tinker_sync.training_client",
    "SamplingClient": "tinker_sync.sampling_client",
    "RestClient": "tinker_sync.rest_client",
    "APIFuture": "tinker_sync._futures",
    "PendingFuture": "tinker_sync._flow.health",
    "TenantState": "tinker_sync._flow.health",
    "BackcompatTrainingClientFuture": "tinker_sync.training_client",
    "BackcompatSamplingClientFuture": "tinker_sync.sampling_client",
    # config
    "RetryConfig": "tinker_sync.sampling_client",
    "Timeout": "tinker_sync._config",
    "HealthPolicy": "tinker_sync._config",
    "RequestOptions": "tinker_sync._config",
    # custom loss
    "LossHandle": "tinker_sync.training_client",
    "PerDatumLossFn": "tinker_sync.training_client",
    # tokenizer
    "TinkerTokenizer": "tinker_sync.tokenizer",
    # common types
    "AdamParams": "tinker_sync.types",
    "AdamOptimizerConfig": "tinker_sync.types",
    "DimuonParams": "tinker_sync.types",
    "DimuonOptimizerConfig": "tinker_sync.types",
    "OptimParams": "tinker_sync.types",
    "Checkpoint": "tinker_sync.types",
    "CheckpointType": "tinker_sync.types",
    "Datum": "tinker_sync.types",
    "DmelChunk": "tinker_sync.types",
    "EncodedTextChunk": "tinker_sync.types",
    "ForwardBackwardOutput": "tinker_sync.types",
    "LoraConfig": "tinker_sync.types",
    "ModelID": "tinker_sync.types",
    "ModelInput": "tinker_sync.types",
    "ModelInputChunk": "tinker_sync.types",
    "OptimStepRequest": "tinker_sync.types",
    "OptimStepResponse": "tinker_sync.types",
    "ParsedCheckpointTinkerPath": "tinker_sync.types",
    "PromptProvenanceSpan": "tinker_sync.types",
    "SampledProvenanceSpan": "tinker_sync.types",
    "SampledSequence": "tinker_sync.types",
    "SampleRequest": "tinker_sync.types",
    "SampleResponse": "tinker_sync.types",
    "SamplingParams": "tinker_sync.types",
    "StopReason": "tinker_sync.types",
    "TensorData": "tinker_sync.types",
    "TensorDtype": "tinker_sync.types",
    "TrainingRun": "tinker_sync.types",
    # exceptions
    "TinkerError": "tinker_sync.exceptions",
    "APIError": "tinker_sync.exceptions",
    "APIStatusError": "tinker_sync.exceptions",
    "BadRequestError": "tinker_sync.exceptions",
    "AuthenticationError": "tinker_sync.exceptions",
    "BillingError": "tinker_sync.exceptions",
    "PermissionDeniedError": "tinker_sync.exceptions",
    "NotFoundError": "tinker_sync.exceptions",
    "ConflictError": "tinker_sync.exceptions",
    "UnprocessableEntityError": "tinker_sync.exceptions",
    "RateLimitError": "tinker_sync.exceptions",
    "InternalServerError": "tinker_sync.exceptions",
    "PersistentServerError": "tinker_sync.exceptions",
    "APIConnectionError": "tinker_sync.exceptions",
    "APIConnectError": "tinker_sync.exceptions",
    "APITimeoutError": "tinker_sync.exceptions",
    "APIConnectTimeoutError": "tinker_sync.exceptions",
    "SamplingStuckError": "tinker_sync.exceptions",
    "StalledError": "tinker_sync.exceptions",
    "APIResponseValidationError": "tinker_sync.exceptions",
    "RequestFailedError": "tinker_sync.exceptions",
    "FutureExpiredError": "tinker_sync.exceptions",
    "FuturePollError": "tinker_sync.exceptions",
    "RequestLostError": "tinker_sync.exceptions",
    "CircuitOpenError": "tinker_sync.exceptions",
    "ClientClosedError": "tinker_sync.exceptions",
    "ForkedProcessError": "tinker_sync.exceptions",
    "MissingCredentialsError": "tinker_sync.exceptions",
    "TokenizerLoadError": "tinker_sync.exceptions",
    "DownloadError": "tinker_sync.exceptions",
    "DownloadVerificationError": "tinker_sync.exceptions",
    "RequestOutcome": "tinker_sync.exceptions",
    "RequestErrorCategory": "tinker_sync.exceptions",
    "ExperimentalWarning": "tinker_sync.exceptions",
}
_SUBMODULES = ("types", "auth")

__all__ = [
    "APIConnectError",
    "APIConnectTimeoutError",
    "APIConnectionError",
    "APIError",
    "APIFuture",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AdamOptimizerConfig",
    "AdamParams",
    "AuthenticationError",
    "BackcompatSamplingClientFuture",
    "BackcompatTrainingClientFuture",
    "BadRequestError",
    "BillingError",
    "Checkpoint",
    "CheckpointType",
    "CircuitOpenError",
    "ClientClosedError",
    "ConflictError",
    "Datum",
    "DimuonOptimizerConfig",
    "DimuonParams",
    "DmelChunk",
    "DownloadError",
    "DownloadVerificationError",
    "EncodedTextChunk",
    "ExperimentalWarning",
    "ForkedProcessError",
    "ForwardBackwardOutput",
    "FutureExpiredError",
    "FuturePollError",
    "HealthPolicy",
    "InternalServerError",
    "LoraConfig",
    "LossHandle",
    "MissingCredentialsError",
    "ModelID",
    "ModelInput",
    "ModelInputChunk",
    "NotFoundError",
    "OptimParams",
    "OptimStepRequest",
    "OptimStepResponse",
    "ParsedCheckpointTinkerPath",
    "PendingFuture",
    "PerDatumLossFn",
    "PermissionDeniedError",
    "PersistentServerError",
    "PromptProvenanceSpan",
    "RateLimitError",
    "RequestErrorCategory",
    "RequestFailedError",
    "RequestLostError",
    "RequestOptions",
    "RequestOutcome",
    "RestClient",
    "RetryConfig",
    "SampleRequest",
    "SampleResponse",
    "SampledProvenanceSpan",
    "SampledSequence",
    "SamplingClient",
    "SamplingParams",
    "SamplingStuckError",
    "ServiceClient",
    "StalledError",
    "StopReason",
    "TenantState",
    "TensorData",
    "TensorDtype",
    "Timeout",
    "TinkerError",
    "TinkerTokenizer",
    "TokenizerLoadError",
    "TrainingClient",
    "TrainingRun",
    "UnprocessableEntityError",
    "__protocol_version__",
    "__title__",
    "__version__",
    "auth",
    "types",
]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is not None:
        value = getattr(load(module_name), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = load(f"tinker_sync.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'tinker_sync' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - static view of the lazy names
    from tinker_sync import auth as auth
    from tinker_sync import types as types
    from tinker_sync._config import HealthPolicy as HealthPolicy
    from tinker_sync._config import RequestOptions as RequestOptions
    from tinker_sync._config import Timeout as Timeout
    from tinker_sync._flow.health import PendingFuture as PendingFuture
    from tinker_sync._flow.health import TenantState as TenantState
    from tinker_sync._futures import (
        APIFuture as APIFuture,
    )
    from tinker_sync._sampling.retry import RetryConfig as RetryConfig
    from tinker_sync.exceptions import (
        APIConnectError as APIConnectError,
    )
    from tinker_sync.exceptions import (
        APIConnectionError as APIConnectionError,
    )
    from tinker_sync.exceptions import (
        APIConnectTimeoutError as APIConnectTimeoutError,
    )
    from tinker_sync.exceptions import (
        APIError as APIError,
    )
    from tinker_sync.exceptions import (
        APIResponseValidationError as APIResponseValidationError,
    )
    from tinker_sync.exceptions import (
        APIStatusError as APIStatusError,
    )
    from tinker_sync.exceptions import (
        APITimeoutError as APITimeoutError,
    )
    from tinker_sync.exceptions import (
        AuthenticationError as AuthenticationError,
    )
    from tinker_sync.exceptions import (
        BadRequestError as BadRequestError,
    )
    from tinker_sync.exceptions import (
        BillingError as BillingError,
    )
    from tinker_sync.exceptions import (
        CircuitOpenError as CircuitOpenError,
    )
    from tinker_sync.exceptions import (
        ClientClosedError as ClientClosedError,
    )
    from tinker_sync.exceptions import (
        ConflictError as ConflictError,
    )
    from tinker_sync.exceptions import (
        DownloadError as DownloadError,
    )
    from tinker_sync.exceptions import (
        DownloadVerificationError as DownloadVerificationError,
    )
    from tinker_sync.exceptions import (
        ExperimentalWarning as ExperimentalWarning,
    )
    from tinker_sync.exceptions import (
        ForkedProcessError as ForkedProcessError,
    )
    from tinker_sync.exceptions import (
        FutureExpiredError as FutureExpiredError,
    )
    from tinker_sync.exceptions import (
        FuturePollError as FuturePollError,
    )
    from tinker_sync.exceptions import (
        InternalServerError as InternalServerError,
    )
    from tinker_sync.exceptions import (
        MissingCredentialsError as MissingCredentialsError,
    )
    from tinker_sync.exceptions import (
        NotFoundError as NotFoundError,
    )
    from tinker_sync.exceptions import (
        PermissionDeniedError as PermissionDeniedError,
    )
    from tinker_sync.exceptions import (
        PersistentServerError as PersistentServerError,
    )
    from tinker_sync.exceptions import (
        RateLimitError as RateLimitError,
    )
    from tinker_sync.exceptions import (
        RequestErrorCategory as RequestErrorCategory,
    )
    from tinker_sync.exceptions import (
        RequestFailedError as RequestFailedError,
    )
    from tinker_sync.exceptions import (
        RequestLostError as RequestLostError,
    )
    from tinker_sync.exceptions import (
        RequestOutcome as RequestOutcome,
    )
    from tinker_sync.exceptions import (
        SamplingStuckError as SamplingStuckError,
    )
    from tinker_sync.exceptions import (
        StalledError as StalledError,
    )
    from tinker_sync.exceptions import (
        TinkerError as TinkerError,
    )
    from tinker_sync.exceptions import (
        TokenizerLoadError as TokenizerLoadError,
    )
    from tinker_sync.exceptions import (
        UnprocessableEntityError as UnprocessableEntityError,
    )
    from tinker_sync.rest_client import (
        RestClient as RestClient,
    )
    from tinker_sync.sampling_client import (
        BackcompatSamplingClientFuture as BackcompatSamplingClientFuture,
    )
    from tinker_sync.sampling_client import SamplingClient as SamplingClient
    from tinker_sync.service_client import (
        ServiceClient as ServiceClient,
    )
    from tinker_sync.tokenizer import (
        TinkerTokenizer as TinkerTokenizer,
    )
    from tinker_sync.training_client import (
        BackcompatTrainingClientFuture as BackcompatTrainingClientFuture,
    )
    from tinker_sync.training_client import (
        LossHandle as LossHandle,
    )
    from tinker_sync.training_client import (
        PerDatumLossFn as PerDatumLossFn,
    )
    from tinker_sync.training_client import (
        TrainingClient as TrainingClient,
    )
    from tinker_sync.types import (
        AdamOptimizerConfig as AdamOptimizerConfig,
    )
    from tinker_sync.types import (
        AdamParams as AdamParams,
    )
    from tinker_sync.types import (
        Checkpoint as Checkpoint,
    )
    from tinker_sync.types import (
        CheckpointType as CheckpointType,
    )
    from tinker_sync.types import (
        Datum as Datum,
    )
    from tinker_sync.types import (
        DimuonOptimizerConfig as DimuonOptimizerConfig,
    )
    from tinker_sync.types import (
        DimuonParams as DimuonParams,
    )
    from tinker_sync.types import (
        DmelChunk as DmelChunk,
    )
    from tinker_sync.types import (
        EncodedTextChunk as EncodedTextChunk,
    )
    from tinker_sync.types import (
        ForwardBackwardOutput as ForwardBackwardOutput,
    )
    from tinker_sync.types import (
        LoraConfig as LoraConfig,
    )
    from tinker_sync.types import (
        ModelID as ModelID,
    )
    from tinker_sync.types import (
        ModelInput as ModelInput,
    )
    from tinker_sync.types import (
        ModelInputChunk as ModelInputChunk,
    )
    from tinker_sync.types import (
        OptimParams as OptimParams,
    )
    from tinker_sync.types import (
        OptimStepRequest as OptimStepRequest,
    )
    from tinker_sync.types import (
        OptimStepResponse as OptimStepResponse,
    )
    from tinker_sync.types import (
        ParsedCheckpointTinkerPath as ParsedCheckpointTinkerPath,
    )
    from tinker_sync.types import (
        PromptProvenanceSpan as PromptProvenanceSpan,
    )
    from tinker_sync.types import (
        SampledProvenanceSpan as SampledProvenanceSpan,
    )
    from tinker_sync.types import (
        SampledSequence as SampledSequence,
    )
    from tinker_sync.types import (
        SampleRequest as SampleRequest,
    )
    from tinker_sync.types import (
        SampleResponse as SampleResponse,
    )
    from tinker_sync.types import (
        SamplingParams as SamplingParams,
    )
    from tinker_sync.types import (
        StopReason as StopReason,
    )
    from tinker_sync.types import (
        TensorData as TensorData,
    )
    from tinker_sync.types import (
        TensorDtype as TensorDtype,
    )
    from tinker_sync.types import (
        TrainingRun as TrainingRun,
    )
