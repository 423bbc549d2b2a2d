"""The one list of deliberate differences from the official SDK's objects.

Read by tests/conformance/test_object_conformance.py and scripts/gen_official_paths.py and
mirrored in docs/migration.md ("Object-level differences"). Every entry says why. Keys:

* ``MODULES``: official module paths tinker_sync does not mirror (an entry ending in ``.``
  covers the whole subtree).
* ``NAMES``: ``"official.module:Name"`` names that are absent from the mirrored module.
* ``KINDS``: ``"Name"`` of ``tinker.types`` whose kind (dataclass / model / enum / alias) differs.
* ``FIELDS``: ``"Type.field"`` dataclass fields tinker_sync adds.
* ``SIGNATURES``: ``"Class.method"`` whose parameters differ from the official ones beyond the
  general rule below.
* ``COERCIONS``: ``"Type.field"`` of a pydantic model whose accepted values differ.

General rule (not entries): a tinker_sync callable may add parameters *after* all the official
ones, if each has a default (or is ``*args`` / ``**kwargs``), because every official call still
binds the same way. Methods a type inherits from pydantic's ``BaseModel`` are not compared:
tinker_sync types offer the subset ``model_dump(mode, exclude_none)``, ``model_dump_json``,
``model_validate``, ``model_validate_json``, ``model_copy(update, deep)`` and ``model_fields``.
"""

from __future__ import annotations

_INTERNAL = (
    "an implementation module of the official client (not exported by `tinker`, not "
    "documented); tinker_sync is built differently and has no such module"
)

MODULES: dict[str, str] = {
    "tinker.cli.": "the official `tinker` command line (click); tinker_sync ships its own "
    "`tinker-sync` command (tinker_sync.cli) with different subcommands",
    "tinker.proto.": "the official protobuf converters; tinker_sync encodes and decodes in its "
    "private wire layer (tinker_sync._wire)",
    "tinker.resources.": "the official generated async HTTP resource classes; tinker_sync's "
    "clients make their requests without a resource layer",
    "tinker.lib.api_future_impl": _INTERNAL,
    "tinker.lib.async_tinker_provider": _INTERNAL,
    "tinker.lib.backcompat_concurrent_future": _INTERNAL,
    "tinker.lib.base_url": _INTERNAL,
    "tinker.lib.chunked_fwdbwd_helpers": _INTERNAL,
    "tinker.lib.client_connection_pool_type": _INTERNAL,
    "tinker.lib.console_urls": _INTERNAL,
    "tinker.lib.credentials": _INTERNAL,
    "tinker.lib.experimental": _INTERNAL,
    "tinker.lib.internal_client_holder": _INTERNAL,
    "tinker.lib.queue_state_logger": _INTERNAL,
    "tinker.lib.retryable_exception": _INTERNAL,
    "tinker.lib.sdk_method": _INTERNAL,
    "tinker.lib.session_futures_poller": _INTERNAL,
    "tinker.lib.sync_only": _INTERNAL,
    "tinker.lib.telemetry": _INTERNAL,
    "tinker.lib.telemetry_provider": _INTERNAL,
    "tinker.lib.public_interfaces.rest_client_common": _INTERNAL,
    "tinker.lib.public_interfaces.admin_client": "`AdminClient` (organisation admin API: billing, "
    "audit log, session search) is not offered yet; its request/reply types are",
}

_ADMIN = MODULES["tinker.lib.public_interfaces.admin_client"]

NAMES: dict[str, str] = {
    "tinker:AdminClient": _ADMIN,
    "tinker.lib.public_interfaces:AdminClient": _ADMIN,
    "tinker.lib.retry_handler:RetryHandler": "the official client's internal retry loop; "
    "tinker_sync retries inside its own transport and honours `RetryConfig`",
    "tinker.lib.retry_handler:is_retryable_status_code": "helper of the official retry loop "
    "(see RetryHandler)",
    "tinker.lib.public_interfaces.training_client:fetch_training_info": "internal helper of the "
    "official training client; use `TrainingClient.get_info()`",
    "tinker.lib.public_interfaces.training_client:MODEL_ID_NOT_SET_ERROR": "an error message "
    "constant of the official client; tinker_sync's clients always have a model id",
    "tinker.types.optimizer:OptimParamsBase": "pydantic base class of the official optimizer "
    "params; tinker_sync's `OptimParams` is a plain union of the concrete types",
    "tinker.types.optimizer:OptimizerConfigBase": "pydantic base class of the official optimizer "
    "configs; tinker_sync's `OptimizerConfig` is a plain union of the concrete types",
}

KINDS: dict[str, str] = {}

_SPAN_TAG = (
    "an extra trailing keyword field with a default: the span kind's JSON tag, so a Datum's "
    "provenance round-trips through JSON (model_dump / model_validate)"
)

FIELDS: dict[str, str] = {
    "PromptProvenanceSpan.type": _SPAN_TAG,
    "SampledProvenanceSpan.type": _SPAN_TAG,
}

COERCIONS: dict[str, str] = {
    "EncodedTextChunk.tokens": "also takes a 1-D integer numpy array (kept as a read-only "
    "array, no per-token work); the official type rejects arrays",
    "SampleRequest.sampling_params": "a mapping with an unknown key is rejected (`SamplingParams` "
    "rejects unknown keys, so a typo such as `max_token` fails at once); the official "
    "`SamplingParams` ignores them",
    "SaveWeightsForSamplerResponse.path": "one class serves the official "
    "`SaveWeightsForSamplerResponse` and its `...Internal` reply, whose `path` may be None (an "
    "ephemeral sampler has none)",
    "RequestFailedResponse.category": "an unknown category becomes "
    "`RequestErrorCategory.Unknown`, so a newer server's category never breaks the reply",
    "SessionSearchCursor.last_created_at": "a naive datetime (or a date) is taken as UTC, as in "
    "every tinker_sync datetime field; the official field is pydantic's `AwareDatetime`, which "
    "rejects one",
    "SaveWeightsExternalResponseInternal.path": "one class serves the official "
    "`SaveWeightsExternalResponse` and its `...Internal` reply; `path` is required, as in the "
    "public one",
}
"""``"Type.field"`` whose accepted values differ from the official pydantic field's
(tests/conformance/test_coercion_conformance.py)."""

UNKNOWN_KEYWORDS: dict[str, str] = {
    "SamplingParams": "an unknown keyword is a `ValidationError` (`extra_forbidden`), so a typo "
    "such as `max_token` fails at once; the official `SamplingParams` ignores it",
    "TelemetryBatch": "the same class as `TelemetrySendRequest` here, whose official model "
    "forbids unknown keywords; the official `TelemetryBatch` ignores them",
}
"""Types whose constructor treats an unknown keyword unlike the official type's
(tests/conformance/test_coercion_conformance.py)."""

_HOLDER = (
    "the official constructor takes the client's internal `InternalClientHolder`; tinker_sync's "
    "clients are made by `ServiceClient` (the documented way in both SDKs)"
)
_BACKCOMPAT = (
    "creation methods return the client itself (awaitable, and `.result()` gives it back), so "
    "this name is the client class: its methods are checked under the client's own name"
)
_TELEMETRY = (
    "the official client's telemetry handle; tinker_sync's telemetry is internal "
    "(`TINKER_TELEMETRY` is honoured) and has no public handle"
)
_ADMIN_REST = (
    "organisation admin endpoints (audit log, billing, storage usage, session search) are not "
    "offered yet; their request/reply types are"
)

SIGNATURES: dict[str, str] = {
    "BackcompatSamplingClientFuture.*": _BACKCOMPAT,
    "BackcompatTrainingClientFuture.*": _BACKCOMPAT,
    "LossHandle.*": "server-side custom losses run client-side in tinker_sync "
    "(`forward_backward_custom`); `LossHandle(fn, input_ranks)` wraps the loss function instead "
    "of naming a registered server graph (`name`, `inputs`, `session_id`, `graph`, `loss_id`)",
    "RestClient.__init__": "the official constructor takes the client's internal holder; "
    "tinker_sync's is `RestClient(base_url=..., api_key=..., timeout=...)` or "
    "`ServiceClient.create_rest_client()`",
    "RestClient.get_audit_log": _ADMIN_REST,
    "RestClient.get_audit_log_async": _ADMIN_REST,
    "RestClient.get_billing_usage": _ADMIN_REST,
    "RestClient.get_billing_usage_async": _ADMIN_REST,
    "RestClient.get_current_checkpoint_storage_usage": _ADMIN_REST,
    "RestClient.get_current_checkpoint_storage_usage_async": _ADMIN_REST,
    "RestClient.search_sessions": _ADMIN_REST,
    "RestClient.get_telemetry": _TELEMETRY,
    "SamplingClient.get_telemetry": _TELEMETRY,
    "ServiceClient.get_telemetry": _TELEMETRY,
    "TrainingClient.get_telemetry": _TELEMETRY,
    "SamplingClient.__init__": _HOLDER,
    "TrainingClient.__init__": _HOLDER,
    "ServiceClient.holder": "the official client's internal `InternalClientHolder`",
    "SamplingClient.create": "takes the official client's internal `InternalClientHolder`; use "
    "`ServiceClient.create_sampling_client` (or `TrainingClient.create_sampling_client`)",
    "ServiceClient.close": '`status` defaults to `"success"` (the official one must be given)',
    "SampledSequence.__init__": "`sequence_id` defaults to None: sequences decoded from a reply "
    "get their id stamped by the sampling client afterwards; the other parameters match",
    "Timeout.__init__": "the official defaults are httpx's UNSET sentinel (tinker_sync does not "
    "use httpx); the parameters have the same names and meaning, with plain-float defaults",
    "RetryConfig.__init__": "same parameters in the same order; `max_connections` defaults to "
    "None (use the server's advertised limit) and `retryable_exceptions` lists tinker_sync's "
    "own exception classes",
}


def module_reason(official_module: str) -> str | None:
    """Why ``official_module`` is not mirrored, or None if it must be."""
    for key, reason in MODULES.items():
        if official_module == key or (
            key.endswith(".") and (official_module + ".").startswith(key)
        ):
            return reason
    return None


def name_reason(official_module: str, name: str) -> str | None:
    """Why ``name`` of ``official_module`` is absent from tinker_sync, or None."""
    return NAMES.get(f"{official_module}:{name}")


def every_entry() -> dict[str, str]:
    """All entries, keyed ``kind key`` (for docs/migration.md and the mirror test)."""
    out: dict[str, str] = {}
    for title, table in (
        ("module", MODULES),
        ("name", NAMES),
        ("kind", KINDS),
        ("field", FIELDS),
        ("signature", SIGNATURES),
        ("coercion", COERCIONS),
    ):
        for key, reason in table.items():
            out[f"{title} {key}"] = reason
    return out
