"""Shared machinery of the public types: field checks, dumping, pydantic-style helpers.

Every public type is a frozen, keyword-only attrs class built with ``field_transformer=checked``
(or a stdlib dataclass checked in ``__post_init__``), which derives a check for each field from
its annotation. Values follow pydantic v2's lax rules (``_coerce``, docs/migration.md#coercion):
``512 / 2`` becomes the int 256, ``"3e-4"`` a float, ``1.5`` for an int is rejected; nested
models accept a mapping, and an object of the official ``tinker`` package is converted
(:func:`from_official`). Errors are :class:`ValidationError` naming the field path:
``SamplingParams.top_k: Input should be a valid integer, ...``.

Dumping (``model_dump`` / ``to_json``) is done by :func:`dump`, a small recursive engine that
knows numpy arrays, bytes (base64 in JSON), datetimes (ISO 8601) and enums.

Thread safety: instances are immutable and safe to share. Fork safety: plain data.
"""

import base64
import binascii
import dataclasses
import datetime as _dt
import enum
import json as _json
import re
import types as _types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar, Union

import attrs

from tinker_sync._lazynp import is_ndarray, np_isinstance
from tinker_sync._runtime.imports import load
from tinker_sync.types._coerce import (
    Invalid,
    ValidationError,
    short_repr,
    to_bool,
    to_float,
    to_int,
    to_str,
    to_timestamp,
)

__all__ = [
    "FieldInfo",
    "TinkerDataclass",
    "TinkerModel",
    "TinkerRequest",
    "checked",
    "dump",
    "is_model_class",
    "tag_of",
    "to_utc",
]

_M = TypeVar("_M", bound="TinkerModel")
_MISSING: Any = object()
_UTC = _dt.timezone.utc
_NONE_TYPE = type(None)

DumpMode = Literal["python", "json"]
_SCALARS = frozenset({int, float, str, bool})


class FieldInfo:
    """What ``Model.model_fields[name]`` describes (the subset of pydantic's ``FieldInfo``).

    Attributes:
        annotation: the field's type.
        default: the default value, or ``...`` when the field is required or has a factory.
        default_factory: the zero-argument factory of the default, or None.
    """

    __slots__ = ("annotation", "default", "default_factory")

    def __init__(
        self, annotation: Any, default: Any, default_factory: Callable[[], Any] | None
    ) -> None:
        self.annotation = annotation
        self.default = default
        self.default_factory = default_factory

    def is_required(self) -> bool:
        """Whether the constructor needs a value for this field."""
        return self.default is ... and self.default_factory is None

    def __repr__(self) -> str:
        default = "required" if self.is_required() else f"default={self.default!r}"
        return f"FieldInfo(annotation={self.annotation!r}, {default})"


_MODEL_FIELDS: dict[type, dict[str, FieldInfo]] = {}


def moved_names(module: str, target: str, names: Iterable[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``names`` that moved from ``module`` to ``target``: read
    from ``target`` (imported on first access), so old imports and pickles that name
    ``module`` still resolve (docs/scale-out.md#start-up).

    Usage, at the end of the old module: ``__getattr__ = moved_names(__name__, target, names)``.
    """
    moved = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in moved:
            return getattr(load(target), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def model_fields_of(cls: type) -> dict[str, FieldInfo]:
    """The ``model_fields`` mapping of a model class (public fields, in declaration order)."""
    cached = _MODEL_FIELDS.get(cls)
    if cached is not None:
        return cached
    out: dict[str, FieldInfo] = {}
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name.startswith("_"):
                continue
            factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
            default = ... if f.default is dataclasses.MISSING else f.default
            out[f.name] = FieldInfo(f.type, default, factory)
    elif attrs.has(cls):
        for a in attrs.fields(cls):
            if a.name.startswith("_"):
                continue
            if isinstance(a.default, attrs.Factory):  # type: ignore[arg-type]
                out[a.name] = FieldInfo(a.type, ..., a.default.factory)
            else:
                out[a.name] = FieldInfo(
                    a.type, ... if a.default is attrs.NOTHING else a.default, None
                )
    _MODEL_FIELDS[cls] = out
    return out


class _ModelFields:
    """Descriptor: ``Model.model_fields`` (class or instance access), like pydantic's."""

    def __get__(self, obj: object, owner: type) -> dict[str, FieldInfo]:
        return model_fields_of(owner)


class TinkerModel:
    """Base of every response-side type: pydantic-style conveniences on an attrs class."""

    __slots__ = ()

    _tinker_request: ClassVar[bool] = False
    """Request types reject unknown keys when parsed; response types ignore them."""
    _tinker_keep_null: ClassVar[frozenset[str]] = frozenset()
    """Fields sent as JSON ``null`` on the wire when None (the null allowlist)."""
    _tinker_extra_init: ClassVar[frozenset[str]] = frozenset()
    """Constructor keywords that are not fields (e.g. list forms of numpy fields)."""
    _tinker_ignore_unknown: ClassVar[bool | None] = None
    """An unknown constructor keyword is dropped with a warning (True) or is a ValidationError
    ``extra_forbidden`` (False); None: rejected by request types, dropped by response types, as
    the official types do (docs/migration.md#coercion)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        built = "__attrs_attrs__" in cls.__dict__  # the class attrs built (not the draft)
        if init is not None and built and not getattr(init, "_tinker_guarded", False):
            cls.__init__ = _guard_keywords(cls, init)  # type: ignore[method-assign]

    model_fields = _ModelFields()
    """``{name: FieldInfo}`` of the public fields, in order (like pydantic's ``model_fields``)."""

    def model_dump(
        self, *, mode: DumpMode = "python", exclude_none: bool = False
    ) -> dict[str, Any]:
        """Return the fields as a dict (``mode="json"``: JSON-compatible values only).

        Args:
            mode: ``"python"`` keeps bytes, datetimes and enums; ``"json"`` converts them.
            exclude_none: drop keys whose value is None, at every depth.
        """
        if mode not in ("python", "json"):
            raise ValueError(f"mode must be 'python' or 'json', got {mode!r}")
        return self._tinker_dump(mode == "json", exclude_none, False)

    def model_dump_json(self, *, exclude_none: bool = False, indent: int | None = None) -> str:
        """Return the JSON text of ``model_dump(mode="json", exclude_none=...)``."""
        data = self._tinker_dump(True, exclude_none, False)
        if indent is None:
            return _json.dumps(data, separators=(",", ":"))
        return _json.dumps(data, indent=indent)

    @classmethod
    def model_validate(cls: type[_M], obj: Any) -> _M:
        """Build an instance from a mapping (or return ``obj`` if it is one), like pydantic's.

        The mapping may hold nested instances, and its values follow the constructor's
        coercion rules (docs/migration.md#coercion). Raises ``ValidationError`` (a
        ``ValueError``) whose ``errors()`` name each bad field path.
        """
        if isinstance(obj, cls):
            return obj
        from tinker_sync._wire._converter import WireValidationError, from_json

        try:
            return from_json(cls, obj)  # JSON forms: model_dump output, server replies
        except WireValidationError:
            pass
        checked_value: _M = _model_check(cls)(obj, cls.__name__)
        return checked_value

    @classmethod
    def model_validate_json(cls: type[_M], json_data: str | bytes) -> _M:
        """Parse JSON text into an instance (see ``model_validate``)."""
        try:
            data = _json.loads(json_data)
        except ValueError as exc:
            raise ValueError(f"{cls.__name__}: invalid JSON: {exc}") from None
        return cls.model_validate(data)

    def model_copy(self: _M, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> _M:
        """Return a copy with ``update`` applied (validated like the constructor)."""
        if deep:
            import copy

            base = copy.deepcopy(self)
        else:
            base = self
        if dataclasses.is_dataclass(base):
            return dataclasses.replace(base, **dict(update or {}))
        if not update:
            return base if deep else attrs.evolve(self)  # type: ignore[misc]
        return attrs.evolve(base, **dict(update))  # type: ignore[misc]

    # -- dumping ----------------------------------------------------------------------------
    def _tinker_dump(self, json: bool, drop_none: bool, wire: bool) -> dict[str, Any]:
        keep_null = self._tinker_keep_null if wire else frozenset()
        out: dict[str, Any] = {}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if value is None:
                if drop_none and name not in keep_null:
                    continue
                out[name] = None
            else:
                out[name] = dump(value, json, drop_none, wire)
        return out


def _guard_keywords(cls: type, init: Callable[..., None]) -> Callable[..., None]:
    """``init`` with unknown keywords as the official types treat them (see
    ``TinkerModel._tinker_ignore_unknown``); costs nothing until the call fails."""
    import functools

    known: frozenset[str] | None = None  # the keywords ``init`` takes: read on first failure

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal known
        try:
            init(self, *args, **kwargs)
        except TypeError as exc:
            if known is None:
                import inspect

                params = inspect.signature(init).parameters.values()
                known = frozenset(p.name for p in params if p.kind is not p.VAR_KEYWORD)
            unknown = [k for k in kwargs if k not in known]
            if isinstance(exc, ValidationError) or not unknown:
                raise
            ignore = cls._tinker_ignore_unknown  # type: ignore[attr-defined]
            if ignore is None:
                ignore = not cls._tinker_request  # type: ignore[attr-defined]
            if not ignore:
                raise ValidationError(
                    cls.__name__,
                    [
                        {
                            "type": "extra_forbidden",
                            "loc": (k,),
                            "msg": "Extra inputs are not permitted",
                            "input": kwargs[k],
                        }
                        for k in unknown
                    ],
                ) from None
            import warnings

            warnings.warn(
                f"{cls.__name__}() ignores unknown keyword argument(s) "
                f"{', '.join(map(repr, unknown))} (as the official SDK does)",
                UserWarning,
                stacklevel=2,
            )
            init(self, *args, **{k: v for k, v in kwargs.items() if k in known})

    __init__._tinker_guarded = True  # type: ignore[attr-defined]
    return __init__


class TinkerRequest(TinkerModel):
    """Base of request types: parsing rejects unknown keys."""

    __slots__ = ()
    _tinker_request: ClassVar[bool] = True


class TinkerDataclass(TinkerModel):
    """Base of the types that are frozen stdlib dataclasses (as in the official SDK).

    ``dataclasses.replace`` / ``fields`` / ``is_dataclass`` work on them. Construction runs the
    same strict checks as the attrs types (derived from each field's annotation, or the
    ``convert`` function in the field's metadata), then the class's ``_tinker_validate``.
    """

    __slots__ = ()

    def __post_init__(self) -> None:
        checks = _DC_CHECKS.get(type(self))
        if checks is None:
            checks = _dataclass_checks(type(self))
        for name, check, path in checks:
            value = getattr(self, name)
            new = check(value, path)
            if new is not value:
                object.__setattr__(self, name, new)
        self._tinker_validate()

    def _tinker_validate(self) -> None:
        """Cross-field checks of a subclass (runs after the field checks)."""


_DC_CHECKS: dict[type, tuple[tuple[str, "Check", str], ...]] = {}


def _dataclass_checks(cls: type) -> tuple[tuple[str, "Check", str], ...]:
    out: list[tuple[str, Check, str]] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("check") is False:
            continue
        convert = f.metadata.get("convert")
        check: Check
        if convert is not None:
            check = _own_converter(convert, f"{cls.__name__}.{f.name}")
        else:
            check = check_for(f.type)
            if check is _any:
                continue
        out.append((f.name, check, f"{cls.__name__}.{f.name}"))
    checks = tuple(out)
    _DC_CHECKS[cls] = checks
    return checks


_NAMED = re.compile(r"([A-Za-z_]\w*\.[^\s:]+): (.*)", re.S)


def is_model_class(cls: Any) -> bool:
    """Whether ``cls`` is a public type class (attrs-based or stdlib dataclass)."""
    return (
        isinstance(cls, type)
        and issubclass(cls, TinkerModel)
        and (attrs.has(cls) or dataclasses.is_dataclass(cls))
    )


def field_specs(cls: type) -> list[tuple[str, Any, Any, bool]]:
    """``(name, annotation, default, init)`` of every field of a model class."""
    if dataclasses.is_dataclass(cls):
        return [
            (f.name, f.type, f.default, f.init)
            for f in dataclasses.fields(cls)
            if not f.name.startswith("_")
        ]
    return [(a.name, a.type, a.default, a.init) for a in attrs.fields(cls)]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if dataclasses.is_dataclass(cls):
            names = tuple(
                f.name
                for f in dataclasses.fields(cls)
                if f.metadata.get("dump", True) and not f.name.startswith("_")
            )
        else:
            names = tuple(a.name for a in attrs.fields(cls) if a.metadata.get("dump", True))
        _FIELD_NAMES[cls] = names
    return names


def _dt_json(value: _dt.datetime) -> str:
    off = value.utcoffset()
    if off is not None and not off:
        text = value.replace(tzinfo=None).isoformat()
        return text + "Z"
    return value.isoformat()


def dump(value: Any, json: bool, drop_none: bool, wire: bool) -> Any:
    """Convert ``value`` (a model, container or scalar) to plain Python / JSON data.

    Args:
        json: JSON-compatible output (bytes base64, datetimes ISO 8601, enums by value).
        drop_none: drop None values from dicts and models.
        wire: keep the null allowlist of each model (``to_json`` semantics).
    """
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None:
        return value
    if isinstance(value, TinkerModel):
        return value._tinker_dump(json, drop_none, wire)
    if t is list or t is tuple:
        # fast path for flat number / string lists
        if value and type(value[0]) in _SCALARS and set(map(type, value)) <= _SCALARS:
            return list(value)
        return [dump(v, json, drop_none, wire) for v in value]
    if isinstance(value, Mapping):
        return {
            (k.value if isinstance(k, enum.Enum) else k): dump(v, json, drop_none, wire)
            for k, v in value.items()
            if not (drop_none and v is None)
        }
    if is_ndarray(value):
        return value.tolist()
    if np_isinstance(value, "generic"):
        return value.item()
    if isinstance(value, enum.Enum):
        return value.value if json else value
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return base64.b64encode(raw).decode("ascii") if json else raw
    if isinstance(value, _dt.datetime):
        return _dt_json(value) if json else value
    if isinstance(value, (_dt.date, _dt.timedelta)):
        return str(value) if json else value
    if isinstance(value, Sequence):
        return [dump(v, json, drop_none, wire) for v in value]
    if hasattr(value, "_tinker_dump"):
        return value._tinker_dump(json, drop_none, wire)
    raise TypeError(f"cannot dump value of type {t.__name__}")


# -- strict field checks ----------------------------------------------------------------------

Check = Callable[[Any, str], Any]
"""A strict check: ``check(value, path) -> converted value`` or raise TypeError / ValueError."""


def _bad_type(path: str, expected: str, value: Any, kind: str = "type_error") -> ValidationError:
    t = type(value)
    got = describe_type(value) if t.__name__ == expected or is_official(value) else t.__name__
    text = f"expected {expected}, got {got} {short_repr(value)}"
    return ValidationError.single(path, kind, text, value, got=False)


def _check_int(value: Any, path: str) -> int:
    if type(value) is int:
        return value
    try:
        return to_int(value)
    except Invalid as exc:
        raise exc.at(path, value) from None


def _check_float(value: Any, path: str) -> float:
    if type(value) is float:
        return value
    try:
        return to_float(value)
    except Invalid as exc:
        raise exc.at(path, value) from None


def _check_str(value: Any, path: str) -> str:
    if type(value) is str:
        return value
    try:
        return to_str(value)
    except Invalid as exc:
        raise exc.at(path, value) from None


def _check_bool(value: Any, path: str) -> bool:
    if type(value) is bool:
        return value
    try:
        return to_bool(value)
    except Invalid as exc:
        raise exc.at(path, value) from None


def check_bytes(value: Any, path: str, strict: bool = False) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=strict)  # the official types: lenient
        except (binascii.Error, ValueError) as exc:
            raise ValidationError.single(
                path, "value_error", f"invalid base64 string: {exc}", value, got=False
            ) from None
    raise _bad_type(path, "bytes (or a base64 str)", value, "bytes_type")


def to_utc(value: _dt.datetime) -> _dt.datetime:
    """Return ``value`` as an aware UTC datetime (naive values are taken as UTC)."""
    tz = value.tzinfo
    if tz is _UTC:
        return value
    if tz is None:
        return value.replace(tzinfo=_UTC)
    return value.astimezone(_UTC)


def parse_datetime(value: str, path: str) -> _dt.datetime:
    """Parse an ISO 8601 string (``Z`` suffix accepted) into an aware UTC datetime."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError.single(
            path,
            "datetime_from_date_parsing",
            f"invalid ISO 8601 datetime {short_repr(value)}",
            value,
            got=False,
        ) from None
    return to_utc(parsed)


def _check_datetime(value: Any, path: str) -> _dt.datetime:
    if isinstance(value, _dt.datetime):
        return to_utc(value)
    try:
        stamp = to_timestamp(value)  # pydantic's rule: a number is a Unix time
    except Invalid as exc:
        raise exc.at(path, value) from None
    if stamp is None:
        return parse_datetime(value, path)
    try:
        return _dt.datetime.fromtimestamp(stamp, _UTC)
    except (OverflowError, OSError, ValueError):
        raise ValidationError.single(
            path, "datetime_parsing", "Input should be a valid datetime", value
        ) from None


def _any(value: Any, path: str) -> Any:
    return value


def _literal_check(values: tuple[Any, ...]) -> Check:
    """Pydantic's literal rule: a str literal takes an equal str (str enums and numpy strs
    too); other literals take a value that hashes and compares equal (``1.0``, ``True`` and
    numpy ints for ``1``; never ``"1"``)."""
    strs = frozenset(v for v in values if type(v) is str)
    lookup = {v: v for v in values if type(v) is not str}

    def check(value: Any, path: str) -> Any:
        for allowed in values:
            if type(value) is type(allowed) and value == allowed:
                return allowed
        if isinstance(value, str):
            text = str(value.value) if isinstance(value, enum.Enum) else str.__str__(value)
            if text in strs:
                return text
        elif lookup:
            try:
                hit = lookup.get(value, _MISSING)
            except TypeError:  # unhashable
                hit = _MISSING
            if hit is not _MISSING:
                return hit
        raise ValidationError.single(
            path,
            "literal_error",
            f"expected one of {list(values)!r}, got {short_repr(value)}",
            value,
            got=False,
        )

    return check


def _optional(inner: Check) -> Check:
    def check(value: Any, path: str) -> Any:
        if value is None:
            return None
        return inner(value, path)

    return check


def _list_check(inner: Check, sequence: bool = False) -> Check:
    """Pydantic's list rule: a ``list[X]`` takes any iterable but a str, bytes or mapping (a
    set, a generator, a numpy array); a ``Sequence[X]`` takes sequences only."""

    def check(value: Any, path: str) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(
                value, Sequence if sequence else Iterable
            ):
                raise _bad_type(path, "list", value, "list_type")
            try:
                value = list(value)
            except TypeError:  # a 0-d array or tensor
                raise _bad_type(path, "list", value, "list_type") from None
        if inner is _any:
            return list(value)
        return [inner(v, f"{path}[{i}]") for i, v in enumerate(value)]

    return check


def _dict_check(key: Check, val: Check) -> Check:
    def check(value: Any, path: str) -> dict[Any, Any]:
        if not isinstance(value, Mapping):
            raise _bad_type(path, "dict", value)
        if key is _any and val is _any:
            return dict(value)
        return {key(k, f"{path} key"): val(v, f"{path}[{k!r}]") for k, v in value.items()}

    return check


def _model_from_mapping(cls: type[_M], value: Mapping[str, Any], path: str) -> _M:
    kwargs = dict(value)
    if not cls._tinker_request:
        if dataclasses.is_dataclass(cls):
            names = {f.name for f in dataclasses.fields(cls) if f.init}
        else:
            names = {a.alias for a in attrs.fields(cls) if a.init}  # type: ignore[arg-type]
        extra_ok = cls._tinker_extra_init
        kwargs = {k: v for k, v in kwargs.items() if k in names or k in extra_ok}
    try:
        return cls(**kwargs)
    except ValidationError as exc:
        raise exc.under(path) from None
    except (TypeError, ValueError) as exc:
        kind = "value_error" if isinstance(exc, ValueError) else "type_error"
        raise ValidationError.single(path, kind, str(exc), value, got=False) from None


def _model_check(cls: type[TinkerModel]) -> Check:
    def check(value: Any, path: str) -> Any:
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return _model_from_mapping(cls, value, path)
        converted = from_official(value, (cls,), path)
        if converted is not _MISSING:
            return converted
        raise _bad_type(path, cls.__name__, value)

    return check


# -- objects of the official ``tinker`` package ---------------------------------------------

_OFFICIAL = "tinker"


def is_official(value: Any) -> bool:
    """Whether ``value`` is an object of the official ``tinker`` package's types."""
    module = type(value).__module__
    return module == _OFFICIAL or module.startswith(_OFFICIAL + ".")


def _official_name(value: Any) -> str:
    t = type(value)
    return f"{t.__module__}.{t.__qualname__}"


def from_official(value: Any, classes: tuple[type, ...], path: str) -> Any:
    """An official ``tinker`` object converted to the one of ``classes`` with its class name.

    Pydantic models go through their public ``model_dump()``, stdlib dataclasses through their
    public fields (docs/migration.md#mixed-packages). Returns ``_MISSING`` for any other value;
    raises ValidationError, naming both packages, when the object cannot be converted.
    """
    if not is_official(value):
        return _MISSING
    name = type(value).__name__
    cls = next((c for c in classes if c.__name__ == name), None)
    if cls is None:
        return _MISSING
    try:
        if hasattr(value, "model_dump") and not dataclasses.is_dataclass(value):
            data = value.model_dump()
        elif dataclasses.is_dataclass(value):
            data = {
                f.name: getattr(value, f.name)
                for f in dataclasses.fields(value)
                if f.init and not f.name.startswith("_")
            }
            if name == "TensorData":  # its values are a property, not a field
                data["data"] = getattr(value, "data")  # noqa: B009  (mypy narrows value)
        else:
            return _MISSING
        return cls.model_validate(data)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as exc:
        raise ValidationError.single(
            path,
            "official_object",
            f"got {_official_name(value)} from the official `tinker` package, which could not be "
            f"converted to tinker_sync.types.{name} ({exc}); build it with tinker_sync.types "
            "instead (or run the program under `tinker-sync exec` so `tinker` is tinker_sync)",
            value,
            got=False,
        ) from None


def accept(value: Any, classes: "type[_M] | tuple[type[_M], ...]", what: str) -> _M:
    """``value`` if it is one of ``classes``, an official ``tinker`` object converted, or a
    ``TypeError`` (a ValidationError) saying what was expected, naming the package if foreign.

    Usage: ``datum = accept(datum, Datum, "data[0]")`` at a client's entry point.
    """
    wanted = classes if isinstance(classes, tuple) else (classes,)
    if isinstance(value, wanted):
        return value
    converted = from_official(value, wanted, "." + what)
    if converted is not _MISSING:
        return converted  # type: ignore[no-any-return]
    names = " or ".join(c.__name__ for c in wanted)
    raise ValidationError.single(
        "." + what, "model_type", f"expected {names}, got {describe_type(value)}", value, got=False
    )


def describe_type(value: Any) -> str:
    """The type of ``value`` for a message; module-qualified when it is not a builtin, so an
    official ``tinker.Datum`` never reads like ``Datum``."""
    t = type(value)
    if t.__module__ == "builtins":
        return t.__name__
    if is_official(value):
        return f"{_official_name(value)} (from the official `tinker` package)"
    return f"{t.__module__}.{t.__qualname__}"


def tag_of(cls: type) -> tuple[str, Any] | None:
    """The (field, value) constant discriminator of a model class, if it has one."""
    if not is_model_class(cls):
        return None
    for name, tp, default, _ in field_specs(cls):
        if (
            name in ("type", "state", "event")
            and typing.get_origin(tp) is Literal
            and default in typing.get_args(tp)
        ):
            return name, default
    return None


def _union_check(members: tuple[Any, ...]) -> Check:
    classes: list[type[TinkerModel]] = [m for m in members if is_model_class(m)]
    others = [m for m in members if m not in classes]
    other_checks = [check_for(m) for m in others]
    exact = frozenset(m for m in others if m in (int, float, str, bool, bytes))
    tags: dict[Any, type[TinkerModel]] = {}
    tag_field: str | None = None
    for c in classes:
        tag = tag_of(c)
        if tag is not None:
            tag_field = tag[0]
            tags[tag[1]] = c
    names = " | ".join(getattr(m, "__name__", repr(m)) for m in members)

    def check(value: Any, path: str) -> Any:
        for c in classes:
            if isinstance(value, c):
                return value
        if classes and not isinstance(value, Mapping):
            converted = from_official(value, tuple(classes), path)
            if converted is not _MISSING:
                return converted
        if isinstance(value, Mapping) and classes:
            if tag_field is not None and value.get(tag_field) in tags:
                return _model_from_mapping(tags[value[tag_field]], value, path)
            errors: list[str] = []
            for c in classes:
                try:
                    return _model_from_mapping(c, value, path)
                except (TypeError, ValueError) as exc:
                    errors.append(str(exc))
            raise ValidationError.single(
                path,
                "union_error",
                f"value matches none of {names}: {'; '.join(errors)}",
                value,
                got=False,
            )
        if type(value) in exact:  # pydantic's smart union: an exact type match wins
            return value
        for oc in other_checks:
            try:
                return oc(value, path)
            except (TypeError, ValueError):
                continue
        raise _bad_type(path, names, value)

    return check


_SIMPLE: dict[Any, Check] = {
    int: _check_int,
    float: _check_float,
    str: _check_str,
    bool: _check_bool,
    bytes: check_bytes,
    _dt.datetime: _check_datetime,
    Any: _any,
    object: _any,
}


def check_for(tp: Any) -> Check:
    """Return the strict check for the annotation ``tp``."""
    simple = _SIMPLE.get(tp)
    if simple is not None:
        return simple
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return _literal_check(args)
    if origin is Union or origin is _types.UnionType:
        non_none = tuple(a for a in args if a is not _NONE_TYPE)
        inner = check_for(non_none[0]) if len(non_none) == 1 else _union_check(non_none)
        return _optional(inner) if len(non_none) != len(args) else inner
    if origin in (list, Sequence) and args:
        return _list_check(check_for(args[0]), sequence=origin is Sequence)
    if origin in (dict, Mapping) and len(args) == 2:
        return _dict_check(check_for(args[0]), check_for(args[1]))
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            enum_cls = tp

            def check_enum(value: Any, path: str) -> Any:
                try:
                    return enum_cls(value)
                except ValueError:
                    raise ValidationError.single(
                        path,
                        "enum",
                        f"invalid {enum_cls.__name__} {short_repr(value)}",
                        value,
                        got=False,
                    ) from None

            return check_enum
        if issubclass(tp, TinkerModel):
            return _model_check(tp)
        cls = tp

        def check_instance(value: Any, path: str) -> Any:
            if isinstance(value, cls):
                return value
            raise _bad_type(path, cls.__name__, value)

        return check_instance
    return _any


def checked(cls: type, fields: "list[attrs.Attribute[Any]]") -> "list[attrs.Attribute[Any]]":
    """attrs ``field_transformer``: every field gets its check (from its annotation, or its own
    converter), the constraints in its metadata (``ge``, ``gt``, ``le``, ``lt``,
    ``min_length``, ``max_length``) and errors as :class:`ValidationError`."""
    out: list[attrs.Attribute[Any]] = []
    for a in fields:
        if a.metadata.get("check") is False:
            out.append(a)
            continue
        path = f"{cls.__name__}.{a.name}"
        changes: dict[str, Any] = {}
        if a.converter is not None and not _has_constraints(a.metadata):
            changes["converter"] = _own_converter(a.converter, path)  # type: ignore[arg-type]
        else:
            if a.converter is not None:
                check = _own_converter(a.converter, path)  # type: ignore[arg-type]
            else:
                check = _any if a.type is None else check_for(a.type)
            check = _constrained(check, a.metadata)
            if check is not _any:

                def convert(value: Any, _check: Check = check, _path: str = path) -> Any:
                    return _check(value, _path)

                changes["converter"] = convert
        if a.validator is not None:
            changes["validator"] = _validator_check(a.validator, path)
        out.append(a.evolve(**changes) if changes else a)
    return out


def _as_validation_error(path: str, exc: Exception, value: Any) -> ValidationError:
    """A check's plain ``TypeError`` / ``ValueError`` as a ValidationError of ``path``."""
    kind = "value_error" if isinstance(exc, ValueError) else "type_error"
    text = str(exc)
    named = _NAMED.match(text)  # "Cls.field[3]: message": keep the finer path
    if named is not None and named.group(1).startswith(path):
        path, text = named.group(1), named.group(2)
    elif text.startswith(path):
        text = text[len(path) :].lstrip(" :")
    return ValidationError.single(path, kind, text, value, got=False)


def _own_converter(fn: Callable[[Any], Any], path: str) -> Callable[..., Any]:
    """A field's own converter with its plain TypeError / ValueError turned into a
    ValidationError of ``path``, in one frame: ``convert(value)`` serves as an attrs
    converter, ``convert(value, path)`` as a :data:`Check`."""

    def convert(value: Any, path: str = path) -> Any:
        try:
            return fn(value)
        except ValidationError:
            raise
        except (TypeError, ValueError) as exc:
            raise _as_validation_error(path, exc, value) from None

    return convert


def _has_constraints(meta: Mapping[str, Any]) -> bool:
    return any(key in meta for key in (*_BOUNDS, "min_length", "max_length"))


def _validator_check(validator: Any, path: str) -> Any:
    def validate(inst: Any, attribute: Any, value: Any) -> None:
        try:
            validator(inst, attribute, value)
        except ValidationError:
            raise
        except (TypeError, ValueError) as exc:
            raise _as_validation_error(path, exc, value) from None

    return validate


_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str, str]] = {
    "ge": (lambda v, b: v >= b, "greater_than_equal", "greater than or equal to"),
    "gt": (lambda v, b: v > b, "greater_than", "greater than"),
    "le": (lambda v, b: v <= b, "less_than_equal", "less than or equal to"),
    "lt": (lambda v, b: v < b, "less_than", "less than"),
}


def _constrained(check: Check, meta: Mapping[str, Any]) -> Check:
    """``check`` plus pydantic's ``Field`` constraints named in a field's metadata."""
    bounds = [(key, meta[key]) for key in _BOUNDS if key in meta]
    min_len, max_len = meta.get("min_length"), meta.get("max_length")
    if not bounds and min_len is None and max_len is None:
        return check

    def constrained(value: Any, path: str) -> Any:
        value = check(value, path)
        if value is None:
            return None
        for key, bound in bounds:
            ok, kind, words = _BOUNDS[key]
            if not ok(value, bound):
                raise ValidationError.single(path, kind, f"Input should be {words} {bound}", value)
        if min_len is not None and len(value) < min_len:
            raise ValidationError.single(
                path, "too_short", f"Value should have at least {min_len} item(s)", value
            )
        if max_len is not None and len(value) > max_len:
            raise ValidationError.single(
                path, "too_long", f"Value should have at most {max_len} item(s)", value
            )
        return value

    return constrained
