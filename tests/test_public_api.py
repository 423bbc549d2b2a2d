"""The public surface: ``__all__`` (docs/design/surface.md#top-level-exports), lazy cheap import
(docs/design/surface.md#package-layout), official names
(docs/design/surface.md#running-official-scripts)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

import tinker_sync

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLIENTS = {
    "ServiceClient",
    "TrainingClient",
    "SamplingClient",
    "RestClient",
    "APIFuture",
    "PendingFuture",
    "TenantState",
}
COMPAT = {"BackcompatTrainingClientFuture", "BackcompatSamplingClientFuture"}
CONFIG = {"RetryConfig", "Timeout", "RequestOptions", "HealthPolicy"}
CUSTOM_LOSS = {"LossHandle", "PerDatumLossFn"}
TOKENIZER = {"TinkerTokenizer"}
MODULES = {"types", "auth"}
COMMON_TYPES = {
    "AdamParams",
    "AdamOptimizerConfig",
    "DimuonParams",
    "DimuonOptimizerConfig",
    "OptimParams",
    "Checkpoint",
    "CheckpointType",
    "Datum",
    "DmelChunk",
    "EncodedTextChunk",
    "ForwardBackwardOutput",
    "LoraConfig",
    "ModelID",
    "ModelInput",
    "ModelInputChunk",
    "OptimStepRequest",
    "OptimStepResponse",
    "ParsedCheckpointTinkerPath",
    "PromptProvenanceSpan",
    "SampledProvenanceSpan",
    "SampledSequence",
    "SampleRequest",
    "SampleResponse",
    "SamplingParams",
    "StopReason",
    "TensorData",
    "TensorDtype",
    "TrainingRun",
}
EXCEPTIONS = {  # docs/design/surface.md#exceptions
    "TinkerError",
    "APIError",
    "APIStatusError",
    "BadRequestError",
    "AuthenticationError",
    "BillingError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "UnprocessableEntityError",
    "RateLimitError",
    "InternalServerError",
    "PersistentServerError",
    "APIConnectionError",
    "APIConnectError",
    "APITimeoutError",
    "APIConnectTimeoutError",
    "SamplingStuckError",
    "StalledError",
    "CircuitOpenError",
    "APIResponseValidationError",
    "RequestFailedError",
    "FutureExpiredError",
    "FuturePollError",
    "RequestLostError",
    "ClientClosedError",
    "ForkedProcessError",
    "MissingCredentialsError",
    "TokenizerLoadError",
    "DownloadError",
    "DownloadVerificationError",
}
ENUMS = {"RequestOutcome", "RequestErrorCategory"}
WARNINGS = {"ExperimentalWarning"}
METADATA = {"__version__", "__title__", "__protocol_version__"}
EXPECTED = (
    CLIENTS
    | COMPAT
    | CONFIG
    | CUSTOM_LOSS
    | TOKENIZER
    | MODULES
    | COMMON_TYPES
    | EXCEPTIONS
    | ENUMS
    | WARNINGS
    | METADATA
)


def test_all_is_pinned_to_surface_1_1() -> None:
    assert sorted(tinker_sync.__all__) == sorted(EXPECTED)
    assert len(tinker_sync.__all__) == len(set(tinker_sync.__all__))


def test_every_name_resolves_to_the_right_kind() -> None:
    for name in tinker_sync.__all__:
        assert getattr(tinker_sync, name) is not None, name
    for name in CLIENTS | CONFIG - {"RequestOptions"} | {"LossHandle", "TinkerTokenizer"}:
        assert inspect.isclass(getattr(tinker_sync, name)), name
    assert tinker_sync.BackcompatTrainingClientFuture is tinker_sync.TrainingClient
    assert tinker_sync.BackcompatSamplingClientFuture is tinker_sync.SamplingClient
    for name in EXCEPTIONS:
        assert issubclass(getattr(tinker_sync, name), tinker_sync.TinkerError), name
    assert issubclass(tinker_sync.ExperimentalWarning, FutureWarning)
    for name in COMMON_TYPES:
        assert getattr(tinker_sync, name) is getattr(tinker_sync.types, name), name
    assert inspect.ismodule(tinker_sync.types) and inspect.ismodule(tinker_sync.auth)
    for fn in ("get_tinker_token", "tinker_has_credentials", "raise_if_tinker_not_accessible"):
        assert callable(getattr(tinker_sync.auth, fn)), fn
    assert tinker_sync.__title__ == "tinker_sync"
    assert tinker_sync.__protocol_version__ == "0.38.0"
    assert isinstance(tinker_sync.__version__, str) and tinker_sync.__version__
    assert set(tinker_sync.__all__) <= set(dir(tinker_sync))
    with pytest.raises(AttributeError):
        tinker_sync.NoSuchName  # noqa: B018


def test_import_is_cheap_and_starts_no_thread() -> None:
    """``import tinker_sync`` imports no numpy/requests/torch/attrs and starts no thread
    (docs/design/surface.md#package-layout)."""
    code = textwrap.dedent(
        """
        import json, sys, threading
        before = set(sys.modules)
        threads = threading.active_count()
        import tinker_sync
        new = sorted(set(sys.modules) - before)
        print(json.dumps({"new": new, "threads": threading.active_count() - threads}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    heavy = {"numpy", "requests", "torch", "attrs", "attr", "cattrs", "urllib3", "tokenizers"}
    loaded = {name.split(".")[0] for name in out["new"]}
    assert not heavy & loaded, sorted(heavy & loaded)
    assert out["threads"] == 0
    assert not any(m.startswith("tinker_sync.local") for m in out["new"])


def _official(cls_name: str) -> type:
    tinker = pytest.importorskip("tinker")
    return getattr(tinker, cls_name)  # type: ignore[no-any-return]


# Documented differences (docs/design/surface.md#documented-differences,
# docs/design/surface.md#out-of-scope).
_SIGNATURE_EXCEPTIONS = {("ServiceClient", "close")}  # status defaults to "success"
_OUT_OF_SCOPE = {"get_telemetry"}


@pytest.mark.parametrize("cls_name", ["ServiceClient", "TrainingClient"])
def test_official_method_names_and_signatures_are_kept(cls_name: str) -> None:
    """Every public method of the official client exists with the same parameter
    names, order, kinds and defaults (so ``import tinker_sync as tinker`` scripts run).

    See docs/design/surface.md#running-official-scripts.
    """
    official = _official(cls_name)
    ours = getattr(tinker_sync, cls_name)
    checked = 0
    for name, fn in inspect.getmembers(official, predicate=callable):
        if name.startswith("_") or name in _OUT_OF_SCOPE:
            continue
        assert hasattr(ours, name), f"{cls_name}.{name} is missing"
        try:
            theirs = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        mine = inspect.signature(getattr(ours, name))
        want = [(p.name, p.kind, p.default) for p in theirs.parameters.values()]
        got = [(p.name, p.kind, p.default) for p in mine.parameters.values()]
        if (cls_name, name) in _SIGNATURE_EXCEPTIONS:
            assert [w[0] for w in want] == [g[0] for g in got], name
        else:
            assert got == want, f"{cls_name}.{name}: {mine} != {theirs}"
        if name.endswith("_async"):
            assert inspect.iscoroutinefunction(getattr(ours, name)), name
        checked += 1
    assert checked > 10


def test_contrib_ray_exports_the_executor_and_imports_ray_only_on_use() -> None:
    code = textwrap.dedent(
        """
        import sys
        import tinker_sync.contrib.ray as contrib_ray
        print(contrib_ray.__all__, "ray" in sys.modules)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['RayExecutor']", "False"]
