from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_STOP: _ClassVar[StopReason]
    STOP_REASON_LENGTH: _ClassVar[StopReason]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
STOP_REASON_STOP: StopReason
STOP_REASON_LENGTH: StopReason
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_INT64: DType
DTYPE_INT32: DType
DTYPE_BFLOAT16: DType

class LossConfigValue(_message.Message):
    __slots__ = ("number", "text")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    number: float
    text: str
    def __init__(self, number: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class ForwardBackwardRequest(_message.Message):
    __slots__ = ("model_id", "seq_id", "data", "loss_fn", "loss_fn_config", "forward_only", "loss_fn_config_v2")
    class LossFnConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LossFnConfigV2Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: LossConfigValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[LossConfigValue, _Mapping]] = ...) -> None: ...
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ONLY_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_CONFIG_V2_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    seq_id: int
    data: _containers.RepeatedCompositeFieldContainer[Datum]
    loss_fn: str
    loss_fn_config: _containers.ScalarMap[str, float]
    forward_only: bool
    loss_fn_config_v2: _containers.MessageMap[str, LossConfigValue]
    def __init__(self, model_id: _Optional[str] = ..., seq_id: _Optional[int] = ..., data: _Optional[_Iterable[_Union[Datum, _Mapping]]] = ..., loss_fn: _Optional[str] = ..., loss_fn_config: _Optional[_Mapping[str, float]] = ..., forward_only: _Optional[bool] = ..., loss_fn_config_v2: _Optional[_Mapping[str, LossConfigValue]] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ("model_input", "loss_fn_inputs", "model_input_spans", "loss_fn_input_spans")
    class LossFnInputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    MODEL_INPUT_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_INPUT_SPANS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_INPUT_SPANS_FIELD_NUMBER: _ClassVar[int]
    model_input: _containers.RepeatedCompositeFieldContainer[Chunk]
    loss_fn_inputs: _containers.MessageMap[str, Tensor]
    model_input_spans: _containers.RepeatedCompositeFieldContainer[ProvenanceSpan]
    loss_fn_input_spans: _containers.RepeatedCompositeFieldContainer[ProvenanceSpan]
    def __init__(self, model_input: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., loss_fn_inputs: _Optional[_Mapping[str, Tensor]] = ..., model_input_spans: _Optional[_Iterable[_Union[ProvenanceSpan, _Mapping]]] = ..., loss_fn_input_spans: _Optional[_Iterable[_Union[ProvenanceSpan, _Mapping]]] = ...) -> None: ...

class PromptProvenanceSpan(_message.Message):
    __slots__ = ("sequence_id", "offset", "length")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    sequence_id: str
    offset: int
    length: int
    def __init__(self, sequence_id: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class SampledProvenanceSpan(_message.Message):
    __slots__ = ("sequence_id", "offset", "length")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    sequence_id: str
    offset: int
    length: int
    def __init__(self, sequence_id: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ProvenanceSpan(_message.Message):
    __slots__ = ("prompt_tokens", "sampled_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: PromptProvenanceSpan
    sampled_tokens: SampledProvenanceSpan
    def __init__(self, prompt_tokens: _Optional[_Union[PromptProvenanceSpan, _Mapping]] = ..., sampled_tokens: _Optional[_Union[SampledProvenanceSpan, _Mapping]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("encoded_text", "image", "dmel")
    ENCODED_TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    DMEL_FIELD_NUMBER: _ClassVar[int]
    encoded_text: EncodedTextChunk
    image: ImageChunk
    dmel: DmelChunk
    def __init__(self, encoded_text: _Optional[_Union[EncodedTextChunk, _Mapping]] = ..., image: _Optional[_Union[ImageChunk, _Mapping]] = ..., dmel: _Optional[_Union[DmelChunk, _Mapping]] = ...) -> None: ...

class EncodedTextChunk(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: bytes
    def __init__(self, tokens: _Optional[bytes] = ...) -> None: ...

class ImageDimensions(_message.Message):
    __slots__ = ("width", "height")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    width: int
    height: int
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class ImageChunk(_message.Message):
    __slots__ = ("data", "format", "expected_tokens", "override_dimensions")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    format: str
    expected_tokens: int
    override_dimensions: ImageDimensions
    def __init__(self, data: _Optional[bytes] = ..., format: _Optional[str] = ..., expected_tokens: _Optional[int] = ..., override_dimensions: _Optional[_Union[ImageDimensions, _Mapping]] = ...) -> None: ...

class DmelChunk(_message.Message):
    __slots__ = ("dmel",)
    DMEL_FIELD_NUMBER: _ClassVar[int]
    dmel: bytes
    def __init__(self, dmel: _Optional[bytes] = ...) -> None: ...

class SparseCsr(_message.Message):
    __slots__ = ("values", "crow_indices", "col_indices")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CROW_INDICES_FIELD_NUMBER: _ClassVar[int]
    COL_INDICES_FIELD_NUMBER: _ClassVar[int]
    values: bytes
    crow_indices: bytes
    col_indices: bytes
    def __init__(self, values: _Optional[bytes] = ..., crow_indices: _Optional[bytes] = ..., col_indices: _Optional[bytes] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dense", "sparse_csr", "dtype", "shape")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_CSR_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    dense: bytes
    sparse_csr: SparseCsr
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dense: _Optional[bytes] = ..., sparse_csr: _Optional[_Union[SparseCsr, _Mapping]] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class StopStrings(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class StopTokens(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "seed", "temperature", "top_k", "top_p", "stop_strs", "stop_tokens")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    STOP_STRS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    seed: int
    temperature: float
    top_k: int
    top_p: float
    stop_strs: StopStrings
    stop_tokens: StopTokens
    def __init__(self, max_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., stop_strs: _Optional[_Union[StopStrings, _Mapping]] = ..., stop_tokens: _Optional[_Union[StopTokens, _Mapping]] = ...) -> None: ...

class TopkLogprobs(_message.Message):
    __slots__ = ("token_ids", "logprobs", "k", "length")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    logprobs: bytes
    k: int
    length: int
    def __init__(self, token_ids: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ..., k: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class PromptAltTokens(_message.Message):
    __slots__ = ("tokens", "logprobs")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    tokens: Tensor
    logprobs: Tensor
    def __init__(self, tokens: _Optional[_Union[Tensor, _Mapping]] = ..., logprobs: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class SampledSequence(_message.Message):
    __slots__ = ("stop_reason", "tokens", "logprobs", "topk_sampled_logprobs")
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOPK_SAMPLED_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    stop_reason: StopReason
    tokens: bytes
    logprobs: bytes
    topk_sampled_logprobs: TopkLogprobs
    def __init__(self, stop_reason: _Optional[_Union[StopReason, str]] = ..., tokens: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ..., topk_sampled_logprobs: _Optional[_Union[TopkLogprobs, _Mapping]] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("sequences", "prompt_logprobs", "topk_prompt_logprobs", "prompt_cache_hit_tokens", "target_prompt_logprobs", "prompt_alt_tokens")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOPK_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ALT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[SampledSequence]
    prompt_logprobs: bytes
    topk_prompt_logprobs: TopkLogprobs
    prompt_cache_hit_tokens: int
    target_prompt_logprobs: Tensor
    prompt_alt_tokens: PromptAltTokens
    def __init__(self, sequences: _Optional[_Iterable[_Union[SampledSequence, _Mapping]]] = ..., prompt_logprobs: _Optional[bytes] = ..., topk_prompt_logprobs: _Optional[_Union[TopkLogprobs, _Mapping]] = ..., prompt_cache_hit_tokens: _Optional[int] = ..., target_prompt_logprobs: _Optional[_Union[Tensor, _Mapping]] = ..., prompt_alt_tokens: _Optional[_Union[PromptAltTokens, _Mapping]] = ...) -> None: ...

class BatchedTensor(_message.Message):
    __slots__ = ("data", "offsets", "dtype", "trailing_shape")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TRAILING_SHAPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offsets: bytes
    dtype: DType
    trailing_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, data: _Optional[bytes] = ..., offsets: _Optional[bytes] = ..., dtype: _Optional[_Union[DType, str]] = ..., trailing_shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ArrayRecord(_message.Message):
    __slots__ = ("type_tag", "fields", "num_datums")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: BatchedTensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[BatchedTensor, _Mapping]] = ...) -> None: ...
    TYPE_TAG_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    NUM_DATUMS_FIELD_NUMBER: _ClassVar[int]
    type_tag: str
    fields: _containers.MessageMap[str, BatchedTensor]
    num_datums: int
    def __init__(self, type_tag: _Optional[str] = ..., fields: _Optional[_Mapping[str, BatchedTensor]] = ..., num_datums: _Optional[int] = ...) -> None: ...

class ForwardBackwardOutput(_message.Message):
    __slots__ = ("loss_fn_output_type", "loss_fn_outputs", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    LOSS_FN_OUTPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    loss_fn_output_type: str
    loss_fn_outputs: _containers.RepeatedCompositeFieldContainer[ArrayRecord]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, loss_fn_output_type: _Optional[str] = ..., loss_fn_outputs: _Optional[_Iterable[_Union[ArrayRecord, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...
