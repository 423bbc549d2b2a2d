"""Object-level conformance, generated from the official ``tinker`` package installed here.

Nothing below is a hand-copied list of official names: modules, names, kinds, dataclass fields,
method signatures, creation methods and sample values are all read from the official package.
Deliberate differences live in ``allowlist.py`` (each with its reason; mirrored in
docs/migration.md). Without the official package these tests fail in CI and skip elsewhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib
import inspect
import os
import pickle
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import allowlist
import numpy as np
import pytest
from _oracle import NoSample as _NoSample
from _oracle import kind, public_modules, public_names, require
from _oracle import model_sample as _model_sample

tinker = require("tinker")
official_types = require("tinker.types")
pydantic = require("pydantic")

import tinker_sync  # noqa: E402
from tinker_sync import types as T  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ours_path(official: str) -> str:
    return "tinker_sync" + official[len("tinker") :]


MODULES = [m for m in public_modules(tinker) if allowlist.module_reason(m) is None]
"""Official module paths tinker_sync mirrors."""


def _names(module_name: str) -> list[str]:
    return public_names(importlib.import_module(module_name))


NAME_CASES = [
    pytest.param(m, n, id=f"{m}:{n}")
    for m in MODULES
    for n in _names(m)
    if allowlist.name_reason(m, n) is None
]


# -- module paths and names ------------------------------------------------------------------


@pytest.mark.parametrize("official", MODULES)
def test_every_public_module_path_exists(official: str) -> None:
    module = importlib.import_module(ours_path(official))
    assert module.__name__ == ours_path(official)


@pytest.mark.parametrize("official,name", NAME_CASES)
def test_every_public_name_exists_as_the_same_object(official: str, name: str) -> None:
    ours = importlib.import_module(ours_path(official))
    assert hasattr(ours, name), f"{ours.__name__} has no {name!r} (official {official})"
    value = getattr(ours, name)
    # one object per fact: a type module re-exports tinker_sync.types' object, a client module
    # the top-level one
    for home in (T, tinker_sync):
        if name in getattr(home, "__all__", ()) and not isinstance(value, types.ModuleType):
            assert value is getattr(home, name), f"{ours.__name__}.{name} is a different object"
            break


def test_type_modules_import_as_attributes_and_statements() -> None:
    code = (
        "import tinker_sync.types.datum\n"
        "from tinker_sync.types.tensor_data import TensorData\n"
        "from tinker_sync.lib.public_interfaces import APIFuture\n"
        "from tinker_sync.lib.public_interfaces.rest_client import RestClient\n"
        "import tinker_sync, tinker_sync.types as t\n"
        "assert t.datum.Datum is t.Datum and TensorData is t.TensorData\n"
        "assert t.sampling_params.SamplingParams is t.SamplingParams\n"
        "assert APIFuture is tinker_sync.APIFuture and RestClient is tinker_sync.RestClient\n"
    )
    exec(compile(code, "<imports>", "exec"), {})


def test_generated_modules_are_current() -> None:
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        gen = importlib.import_module("gen_official_paths")
    finally:
        sys.path.remove(os.path.join(REPO, "scripts"))
    stale = []
    for path, content in gen.targets().items():
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current is None or (gen.MARKER in current and current != content):
            stale.append(os.path.relpath(path, REPO))
    assert not stale, f"run python scripts/gen_official_paths.py: {stale}"


def test_every_allowlist_entry_is_still_needed() -> None:
    every = public_modules(tinker)
    for key in allowlist.MODULES:
        assert any(allowlist.module_reason(m) == allowlist.MODULES[key] for m in every), key
    for key in allowlist.NAMES:
        official, name = key.split(":")
        assert name in _names(official), f"{key}: the official SDK has no such name any more"
        ours_name = ours_path(official)
        try:
            ours = importlib.import_module(ours_name)
        except ImportError:
            continue
        assert not hasattr(ours, name), f"{key}: tinker_sync has it now; drop the entry"
    for table in (allowlist.KINDS, allowlist.FIELDS, allowlist.SIGNATURES):
        assert all(reason.strip() for reason in table.values())


def test_allowlist_is_mirrored_in_the_migration_guide() -> None:
    with open(os.path.join(REPO, "docs", "migration.md"), encoding="utf-8") as fh:
        guide = fh.read()
    missing = [
        key.split(" ", 1)[1]
        for key in allowlist.every_entry()
        if f"`{key.split(' ', 1)[1]}`" not in guide
    ]
    assert not missing, f"docs/migration.md does not list: {missing}"


# -- kinds, fields ------------------------------------------------------------------------------

TYPE_NAMES = [
    n for n in public_names(official_types) if allowlist.name_reason("tinker.types", n) is None
]


@pytest.mark.parametrize("name", [n for n in TYPE_NAMES if n not in allowlist.KINDS])
def test_each_type_has_the_official_kind(name: str) -> None:
    official = getattr(official_types, name)
    ours = getattr(T, name)
    assert kind(ours) == kind(official), f"{name}: {kind(ours)} here, {kind(official)} officially"
    if kind(official) == "dataclass":
        assert ours.__dataclass_params__.frozen == official.__dataclass_params__.frozen
        assert ours.__dataclass_params__.eq == official.__dataclass_params__.eq
    if typing.get_origin(official) is typing.Literal:
        assert set(typing.get_args(ours)) == set(typing.get_args(official)), name
    if isinstance(official, type) and issubclass(official, enum.Enum):
        assert {m.value for m in ours} == {m.value for m in official}, name


DATACLASSES = [n for n in TYPE_NAMES if kind(getattr(official_types, n)) == "dataclass"]


@pytest.mark.parametrize("name", DATACLASSES)
def test_dataclass_fields_match(name: str) -> None:
    official = list(dataclasses.fields(getattr(official_types, name)))
    ours = dataclasses.fields(getattr(T, name))
    extra = {k.split(".", 1)[1] for k in allowlist.FIELDS if k.startswith(f"{name}.")}
    public = [f.name for f in official if not f.name.startswith("_")]
    assert [f.name for f in ours if not f.name.startswith("_") and f.name not in extra] == public
    ours_by_name = {f.name: f for f in ours}
    for f in official:
        if f.name.startswith("_"):
            continue
        mine = ours_by_name[f.name]
        assert (mine.kw_only, mine.default is dataclasses.MISSING) == (
            f.kw_only,
            f.default is dataclasses.MISSING,
        ), f"{name}.{f.name}"
        if f.default is not dataclasses.MISSING:
            assert mine.default == f.default, f"{name}.{f.name}"


# -- signatures ---------------------------------------------------------------------------------


def _classes() -> list[tuple[str, type, type]]:
    """(label, official class, our class) for every public class of a mirrored module."""
    seen: dict[int, tuple[str, type, type]] = {}
    for official in MODULES:
        module = importlib.import_module(official)
        ours = importlib.import_module(ours_path(official))
        for name in public_names(module):
            obj = getattr(module, name, None)
            if not inspect.isclass(obj) or allowlist.name_reason(official, name) is not None:
                continue
            if issubclass(obj, BaseException) or id(obj) in seen:
                continue
            seen[id(obj)] = (name, obj, getattr(ours, name))
    return sorted(seen.values(), key=lambda t: t[0])


def _allowed(label: str, member: str) -> str | None:
    """The allowlist's reason for a class member (or the whole class), if any."""
    return allowlist.SIGNATURES.get(f"{label}.{member}") or allowlist.SIGNATURES.get(f"{label}.*")


def _pydantic_hooks(cls: type) -> set[str]:
    """Names of a model's pydantic validators / serializers (pydantic plumbing, not API)."""
    decorators = getattr(cls, "__pydantic_decorators__", None)
    if decorators is None:
        return set()
    out: set[str] = set()
    for field in dataclasses.fields(decorators):
        group = getattr(decorators, field.name)
        if isinstance(group, dict):
            out.update(group)
    return out


def _own_methods(cls: type) -> Iterator[str]:
    """Public methods (and ``__init__``) that the official SDK itself defines on ``cls``."""
    for name in ["__init__", *sorted(n for n in dir(cls) if not n.startswith("_"))]:
        for klass in cls.__mro__:
            if name in vars(klass):
                owner = klass
                break
        else:
            continue
        if not owner.__module__.startswith("tinker"):
            continue  # object / pydantic.BaseModel / typing machinery
        if name in _pydantic_hooks(cls):
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if inspect.isfunction(raw):
            yield name


ALL_METHODS = [
    (label, official, ours, method)
    for label, official, ours in _classes()
    for method in _own_methods(official)
]
METHOD_CASES = [
    pytest.param(*case, id=f"{case[0]}.{case[3]}")
    for case in ALL_METHODS
    if not _allowed(case[0], case[3])
]


def _params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return params


def _same_default(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # pragma: no cover - exotic defaults
        return False


def check_signature(official: Callable[..., Any], ours: Callable[..., Any]) -> list[str]:
    """Differences between two signatures under the allowlist's general rule (empty: same).

    The official parameters (but ``**kwargs``) must come first, in order, with the same names,
    kinds and defaults; ours may add parameters after them if each has a default; if the
    official callable takes ``**kwargs``, ours must too.
    """
    var_kw = inspect.Parameter.VAR_KEYWORD
    theirs_all, mine_all = _params(official), _params(ours)
    theirs = [p for p in theirs_all if p.kind is not var_kw]
    mine = [p for p in mine_all if p.kind is not var_kw]
    problems = []
    if len(theirs) != len(theirs_all) and len(mine) == len(mine_all):
        problems.append("no **kwargs here")
    for i, p in enumerate(theirs):
        if i >= len(mine):
            problems.append(f"missing parameter {p.name!r}")
            continue
        q = mine[i]
        if (q.name, q.kind) != (p.name, p.kind):
            problems.append(f"parameter {i}: {q.name} ({q.kind}) here, {p.name} ({p.kind})")
        elif (p.default is inspect.Parameter.empty) != (q.default is inspect.Parameter.empty):
            problems.append(f"{p.name}: required here={q.default is inspect.Parameter.empty}")
        elif p.default is not inspect.Parameter.empty and not _same_default(p.default, q.default):
            problems.append(f"{p.name}: default {q.default!r} here, {p.default!r} officially")
    for q in mine[len(theirs) :]:
        if q.default is inspect.Parameter.empty and q.kind is not inspect.Parameter.VAR_POSITIONAL:
            problems.append(f"extra required parameter {q.name!r}")
    return problems


@pytest.mark.parametrize("label,official,ours,method", METHOD_CASES)
def test_public_methods_have_the_official_parameters(
    label: str, official: type, ours: type, method: str
) -> None:
    key = f"{label}.{method}"
    if method != "__init__" or "__init__" in vars(ours) or dataclasses.is_dataclass(ours):
        assert hasattr(ours, method), f"{key} is missing"
        problems = check_signature(getattr(official, method), getattr(ours, method))
    else:  # an inherited constructor: compare the class call signature
        problems = check_signature(official, ours)
    assert not problems, f"{key}: " + "; ".join(problems)


FUNCTION_CASES = [
    pytest.param(official, name, id=f"{official}:{name}")
    for official in MODULES
    for name in _names(official)
    if allowlist.name_reason(official, name) is None
    and inspect.isfunction(getattr(importlib.import_module(official), name, None))
]


@pytest.mark.parametrize("official,name", FUNCTION_CASES)
def test_public_functions_have_the_official_parameters(official: str, name: str) -> None:
    theirs = getattr(importlib.import_module(official), name)
    ours = getattr(importlib.import_module(ours_path(official)), name)
    problems = check_signature(theirs, ours)
    assert not problems, f"{official}.{name}: " + "; ".join(problems)


def _differs(label: str, official: type, ours: type, member: str) -> bool:
    if not hasattr(ours, member):
        return True
    if member == "__init__" and "__init__" not in vars(ours) and not dataclasses.is_dataclass(ours):
        return bool(check_signature(official, ours))
    return bool(check_signature(getattr(official, member), getattr(ours, member)))


def test_every_signature_allowlist_entry_is_still_needed() -> None:
    classes = {label: (official, ours) for label, official, ours in _classes()}
    for key in allowlist.SIGNATURES:
        label, member = key.split(".", 1)
        assert label in classes, f"{key}: no such official class any more"
        official, ours = classes[label]
        if member == "*":
            continue  # a whole class (see its reason)
        assert hasattr(official, member), f"{key}: the official class has no {member!r}"
        if inspect.isroutine(getattr(official, member)):
            assert _differs(label, official, ours, member), f"{key}: same now; drop the entry"
        else:
            assert not hasattr(ours, member), f"{key}: tinker_sync has it now; drop the entry"


@pytest.mark.parametrize("label,official,ours", [pytest.param(*c, id=c[0]) for c in _classes()])
def test_public_attributes_of_classes_exist(label: str, official: type, ours: type) -> None:
    missing = [
        name
        for name in dir(official)
        if not name.startswith("_")
        and not hasattr(ours, name)
        and not _allowed(label, name)
        and not name.startswith("model_")  # pydantic's own API: see the allowlist docstring
        and name not in vars(pydantic.BaseModel)
        and name not in _pydantic_hooks(official)
    ]
    assert not missing, f"{label} lacks {missing}"


def test_the_signature_rule_can_fail() -> None:
    def official(a: int, b: int = 1, *, c: str = "x") -> None: ...

    def renamed(a: int, bb: int = 1, *, c: str = "x") -> None: ...

    def other_default(a: int, b: int = 2, *, c: str = "x") -> None: ...

    def positional_c(a: int, b: int = 1, c: str = "x") -> None: ...

    def extra_required(a: int, b: int = 1, *, c: str = "x", d: int) -> None: ...

    def extra_optional(a: int, b: int = 1, *, c: str = "x", d: int = 0) -> None: ...

    def official_kw(a: int, **kwargs: Any) -> None: ...

    def kw_before_kwargs(a: int, *, d: int = 0, **kwargs: Any) -> None: ...

    def no_kwargs(a: int, *, d: int = 0) -> None: ...

    assert check_signature(official, official) == []
    assert check_signature(official, extra_optional) == []
    assert check_signature(official_kw, kw_before_kwargs) == []
    for bad in (renamed, other_default, positional_c, extra_required):
        assert check_signature(official, bad), bad.__name__
    assert check_signature(official_kw, no_kwargs)


# -- creation results are awaitable ---------------------------------------------------------------

CREATION_METHODS = sorted(
    (cls_name, name)
    for cls_name in ("ServiceClient", "TrainingClient", "SamplingClient")
    for name, fn in inspect.getmembers(getattr(tinker, cls_name), inspect.isfunction)
    if not name.startswith("_")
    and not name.endswith("_async")
    and f"{cls_name}.{name}" not in allowlist.SIGNATURES
    and any(
        marker in str(inspect.signature(fn).return_annotation)
        for marker in ("ClientFuture", "AwaitableConcurrentFuture")
    )
)
"""Methods whose official result is awaitable and gives a client (read from the annotations)."""


def _creation_calls(service: Any, training: Any, state_path: str, sampler_path: str) -> dict:
    """How to call each creation method against the local server (the method list itself is
    generated above; a new official creation method fails the test until it is added here)."""
    return {
        ("ServiceClient", "create_lora_training_client"): lambda: (
            service.create_lora_training_client("base", rank=4)
        ),
        ("ServiceClient", "create_sampling_client"): lambda: service.create_sampling_client(
            base_model="base"
        ),
        ("ServiceClient", "create_training_client_from_state"): lambda: (
            service.create_training_client_from_state(state_path)
        ),
        ("ServiceClient", "create_training_client_from_state_with_optimizer"): lambda: (
            service.create_training_client_from_state_with_optimizer(state_path)
        ),
        ("TrainingClient", "create_sampling_client"): lambda: training.create_sampling_client(
            sampler_path
        ),
        ("TrainingClient", "save_weights_and_get_sampling_client"): lambda: (
            training.save_weights_and_get_sampling_client()
        ),
    }


def test_creation_methods_list_is_generated_from_the_official_sdk() -> None:
    assert ("ServiceClient", "create_lora_training_client") in CREATION_METHODS
    assert len(CREATION_METHODS) >= 6


@pytest.mark.parametrize("cls_name,method", CREATION_METHODS, ids=lambda v: str(v))
def test_objects_returned_by_creation_methods_are_awaitable(
    service: Any, cls_name: str, method: str
) -> None:
    training = service.create_lora_training_client("base", rank=4)
    state_path = training.save_state("conformance").result().path
    sampler_path = training.save_weights_for_sampler("conformance").result().path
    calls = _creation_calls(service, training, state_path, sampler_path)
    assert (cls_name, method) in calls, f"no call recipe for official {cls_name}.{method}"
    official_result = inspect.signature(getattr(getattr(tinker, cls_name), method))
    expected_cls = (
        tinker_sync.SamplingClient
        if "Sampling" in str(official_result.return_annotation)
        else tinker_sync.TrainingClient
    )

    async def main() -> Any:
        result = calls[(cls_name, method)]()
        assert inspect.isawaitable(result), f"{cls_name}.{method} result is not awaitable"
        return await result

    client = asyncio.run(main())
    assert isinstance(client, expected_cls)


# -- constructors copy lists, pickling round-trips (samples built from official fields) ----------


def _clear_containers(value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            _clear_containers(item)
        value.clear()
    elif isinstance(value, dict):
        for item in value.values():
            _clear_containers(item)
        value.clear()


def _model_samples() -> list[Any]:
    out = []
    for name in TYPE_NAMES:
        official = getattr(official_types, name)
        if kind(official) != "model":
            continue
        try:
            data = _model_sample(official)
            official.model_validate(data)
        except (_NoSample, pydantic.ValidationError):
            continue
        out.append(pytest.param(name, id=name))
    return out


MODEL_SAMPLES = _model_samples()


def _build(name: str) -> tuple[Any, Any, dict[str, Any]]:
    official = getattr(official_types, name)
    data = _model_sample(official)
    ours = getattr(T, name)(**data)
    return official.model_validate(_model_sample(official)), ours, data


def test_samples_cover_most_models() -> None:
    models = [n for n in TYPE_NAMES if kind(getattr(official_types, n)) == "model"]
    assert len(MODEL_SAMPLES) >= 0.8 * len(models), len(MODEL_SAMPLES)


@pytest.mark.parametrize("name", MODEL_SAMPLES)
def test_model_constructors_copy_lists_and_dump_like_the_official(name: str) -> None:
    official, ours, data = _build(name)
    before = ours.model_dump(mode="json")
    theirs = official.model_dump(mode="json")
    assert set(theirs) <= set(before)  # same field names (tinker_sync may add some)
    _clear_containers(data)  # the caller reuses its lists: our object must not change
    assert ours.model_dump(mode="json") == before


@pytest.mark.parametrize("name", MODEL_SAMPLES)
def test_model_protocol_matches_the_official(name: str) -> None:
    official, ours, _ = _build(name)
    cls = type(ours)
    theirs = list(type(official).model_fields)
    assert set(theirs) <= set(cls.model_fields)
    assert [f for f in cls.model_fields if f in theirs] == theirs  # same order
    again = pickle.loads(pickle.dumps(ours))
    assert again == ours and again.model_dump() == ours.model_dump()
    assert cls.model_validate(ours.model_dump(mode="json")) == ours
    assert cls.model_validate_json(ours.model_dump_json()) == ours
    assert ours.model_copy() == ours and ours.model_copy(update={}) is not ours
    if _hashable(official):
        assert _hashable(ours) and hash(ours) == hash(pickle.loads(pickle.dumps(ours)))


def _dataclass_samples() -> dict[str, Callable[[Any], Any]]:
    """Builders taking a types module (official or ours): the same calls build both objects."""

    def td(m: Any) -> Any:
        return m.TensorData(data=[1, 2, 3], dtype="int64", shape=[3])

    def datum(m: Any) -> Any:
        return m.Datum(
            model_input=m.ModelInput.from_ints([1, 2, 3]),
            loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 0.0, 1.0]},
        )

    def seq(m: Any) -> Any:
        return m.SampledSequence(
            stop_reason="stop", sequence_id="s", tokens_np=np.array([1, 2], dtype=np.int32)
        )

    return {
        "TensorData": td,
        "Datum": datum,
        "ForwardBackwardInput": lambda m: m.ForwardBackwardInput(
            data=[datum(m)], loss_fn="cross_entropy"
        ),
        "ForwardBackwardOutput": lambda m: m.ForwardBackwardOutput(
            loss_fn_output_type="x", loss_fn_outputs=[{"logprobs": td(m)}], metrics={"a:sum": 1.0}
        ),
        "ForwardBackwardRequest": lambda m: m.ForwardBackwardRequest(
            forward_backward_input=m.ForwardBackwardInput(data=[datum(m)], loss_fn="ppo"),
            model_id="m",
            seq_id=1,
        ),
        "ForwardRequest": lambda m: m.ForwardRequest(
            forward_input=m.ForwardBackwardInput(data=[datum(m)], loss_fn="ppo"), model_id="m"
        ),
        "PromptAltTokens": lambda m: m.PromptAltTokens(tokens=td(m), logprobs=td(m)),
        "PromptProvenanceSpan": lambda m: m.PromptProvenanceSpan(sequence_id="s", length=2),
        "SampledProvenanceSpan": lambda m: m.SampledProvenanceSpan(
            sequence_id="s", offset=1, length=2
        ),
        "SampledSequence": seq,
        "SampleResponse": lambda m: m.SampleResponse(sequences=[seq(m)], prompt_cache_hit_tokens=1),
    }


def test_every_official_dataclass_has_a_sample() -> None:
    assert set(DATACLASSES) <= set(_dataclass_samples())


@pytest.mark.parametrize("name", DATACLASSES)
def test_dataclass_replace_pickle_and_fields_behave_like_the_official(name: str) -> None:
    build = _dataclass_samples()[name]
    official, ours = build(official_types), build(T)
    public = [f.name for f in dataclasses.fields(official) if not f.name.startswith("_")]
    for field in public:
        assert _plain(getattr(ours, field)) == _plain(getattr(official, field)), field
    again = pickle.loads(pickle.dumps(ours))
    for field in public:
        assert _plain(getattr(again, field)) == _plain(getattr(ours, field)), field
    assert _hashable(ours) == _hashable(official), "hashability differs from the official"
    if name != "TensorData":  # the official TensorData cannot be replaced (its _numpy field)
        copy = dataclasses.replace(ours)
        assert copy is not ours
        for field in public:
            assert _plain(getattr(copy, field)) == _plain(getattr(ours, field)), field


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _plain(value: Any) -> Any:
    """A comparable form of a field value (tensors by content, models by their fields)."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return ("array", value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_") and f.name in _official_field_names(value)
        }
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def _official_field_names(value: Any) -> set[str]:
    official = getattr(official_types, type(value).__name__, None)
    if official is None or not dataclasses.is_dataclass(official):
        return {f.name for f in dataclasses.fields(value)}
    return {f.name for f in dataclasses.fields(official)}


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda m, xs: m.ModelInput.from_ints(xs), id="ModelInput.from_ints"),
        pytest.param(lambda m, xs: m.EncodedTextChunk(tokens=xs), id="EncodedTextChunk"),
        pytest.param(
            lambda m, xs: m.Datum(
                model_input=m.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": xs}
            ),
            id="Datum.loss_fn_inputs",
        ),
        pytest.param(
            lambda m, xs: m.TensorData(data=xs, dtype="int64", shape=[len(xs)]), id="TensorData"
        ),
    ],
)
def test_constructors_copy_token_lists_like_the_official(build: Callable[..., Any]) -> None:
    official_tokens, our_tokens = [5, 6, 7], [5, 6, 7]
    official, ours = build(official_types, official_tokens), build(T, our_tokens)
    official_tokens.clear()
    our_tokens.clear()
    assert _plain(ours) == _plain(official)
    assert "5" in repr(_plain(ours))
