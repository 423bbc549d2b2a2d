"""The one set of coercion rules of the public types: pydantic v2 lax mode, and its error type.

Usage::

    to_int(512 / 2)           # 256
    to_float("3e-4")          # 0.0003
    to_int(512.5)             # raises Invalid("int_from_float", ...)

The rules are pydantic v2's lax mode (docs/migration.md#coercion): ``int`` takes ints, bools,
integral floats and Decimals, numeric strings (``" 8 "``, ``"8.0"``, ``"1_000"``) and bytes,
numpy and 0-d torch scalars; ``float`` also takes any numeric string (``"3e-4"``, ``"nan"``);
``bool`` takes 0/1 and ``"true"``/``"no"``/``"on"``/...; ``str`` takes str, str enums and UTF-8
bytes, never numbers. One deliberate difference: a numpy or torch integer is taken exactly
(pydantic goes through a float and rounds above 2**53).

The functions are the slow path: the field checks in ``_base`` return a value that already has
the exact type before calling them, so a well-typed value costs one ``type()`` test.

:class:`ValidationError` is what the constructors raise: a ``ValueError`` (like pydantic's) that
is also a ``TypeError`` (what earlier versions raised), with pydantic's ``errors()``.

Thread safety: pure functions. Fork safety: no state.
"""

from __future__ import annotations

import enum
import math
import operator
import re
from typing import Any

from tinker_sync._lazynp import is_ndarray, loaded_isinstance, np_isinstance

__all__ = [
    "Invalid",
    "ValidationError",
    "to_bool",
    "to_float",
    "to_int",
    "to_str",
    "to_timestamp",
]

_MESSAGES = {
    "int_type": "Input should be a valid integer",
    "int_parsing": "Input should be a valid integer, unable to parse string as an integer",
    "int_from_float": "Input should be a valid integer, got a number with a fractional part",
    "int_parsing_size": "Unable to parse input string as an integer, exceeded maximum size",
    "finite_number": "Input should be a finite number",
    "float_type": "Input should be a valid number",
    "float_parsing": "Input should be a valid number, unable to parse string as a number",
    "bool_type": "Input should be a valid boolean",
    "bool_parsing": "Input should be a valid boolean, unable to interpret input",
    "string_type": "Input should be a valid string",
    "string_unicode": "Input should be a valid string, unable to parse raw data as a unicode string",
    "datetime_type": "Input should be a valid datetime",
    "datetime_parsing": "Input should be a valid datetime",
}


class Invalid(Exception):
    """A value the rules reject: ``kind`` is pydantic's error type, ``msg`` its message."""

    def __init__(self, kind: str, msg: str | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.msg = msg if msg is not None else _MESSAGES.get(kind, kind)

    def at(self, path: str, value: Any) -> ValidationError:
        """This rejection as the :class:`ValidationError` of the field at ``path``."""
        return ValidationError.single(path, self.kind, self.msg, value)


def _picklable(value: Any) -> Any:
    """``value``, or its short repr when it cannot be pickled (a generator, a lock)."""
    import pickle  # a rejected value only (docs/scale-out.md#start-up)

    try:
        pickle.dumps(value)
    except Exception:
        return short_repr(value)
    return value


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 60 characters for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class ValidationError(ValueError, TypeError):
    """A constructor argument that does not fit its field (pydantic's ``ValidationError`` shape).

    Usage::

        try:
            SamplingParams(max_tokens=512.5)
        except ValueError as exc:
            exc.errors()  # [{"type": "int_from_float", "loc": ("max_tokens",), ...}]

    ``str(exc)`` names the field path (``SamplingParams.max_tokens: ...``). It is also a
    ``TypeError``, so code written for earlier versions keeps catching it.

    Attributes:
        title: the class whose construction failed.
    """

    def __init__(
        self, title: str, errors: list[dict[str, Any]], notes: list[str] | None = None
    ) -> None:
        self.title = title
        self._errors = errors
        self._notes = notes or [""] * len(errors)
        lines = []
        for e, note in zip(errors, self._notes, strict=True):
            where = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in e["loc"])
            lines.append(f"{title}{where if title else where.lstrip('.')}: {e['msg']}{note}")
        super().__init__("; ".join(lines))

    def errors(self) -> list[dict[str, Any]]:
        """One dict per bad field: ``type``, ``loc`` (the field path), ``msg``, ``input``."""
        return [dict(e) for e in self._errors]

    def error_count(self) -> int:
        """Number of errors (as pydantic's ``error_count()``)."""
        return len(self._errors)

    def __reduce__(self) -> tuple[Any, ...]:
        errors = [dict(e, input=_picklable(e["input"])) for e in self._errors]
        return (ValidationError, (self.title, errors, self._notes))

    @classmethod
    def single(
        cls, path: str, kind: str, msg: str, value: Any, *, got: bool = True
    ) -> ValidationError:
        """The error of one field, from a dotted path such as ``ModelInput.chunks[0].tokens``."""
        title, loc = split_path(path)
        note = f" (got {type(value).__name__} {short_repr(value)})" if got else ""
        return cls(title, [{"type": kind, "loc": loc, "msg": msg, "input": value}], [note])

    def under(self, path: str) -> ValidationError:
        """This error re-rooted below ``path`` (a nested model's field)."""
        title, loc = split_path(path)
        errors = [dict(e, loc=loc + tuple(e["loc"])) for e in self._errors]
        return ValidationError(title, errors, self._notes)


_PATH_PART = re.compile(r"\.([^.\[]+)|\[(-?\d+)\]|\[('(?:[^'\\]|\\.)*'|\"[^\"]*\")\]")


def split_path(path: str) -> tuple[str, tuple[str | int, ...]]:
    """``"Datum.loss_fn_inputs['w'][2]"`` -> ``("Datum", ("loss_fn_inputs", "w", 2))``."""
    head = re.match(r"[^.\[]*", path)
    title = head.group(0) if head else ""
    loc: list[str | int] = []
    pos = len(title)
    while pos < len(path):
        m = _PATH_PART.match(path, pos)
        if m is None:  # not a path we built: keep the rest as one name
            loc.append(path[pos:].lstrip("."))
            break
        if m.group(1) is not None:
            loc.append(m.group(1))
        elif m.group(2) is not None:
            loc.append(int(m.group(2)))
        else:
            loc.append(m.group(3)[1:-1])
        pos = m.end()
    return title, tuple(loc)


# -- the rules ------------------------------------------------------------------------------

_INT_TEXT = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?")
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_MAX_INT_DIGITS = 4300
_I64_BOUND = 2.0**63


def _is_array(value: Any) -> bool:
    """A numpy array with at least one dimension (pydantic rejects those as scalars)."""
    return is_ndarray(value) and value.ndim > 0


def _decode(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid("string_unicode") from None


def _int_from_text(text: str) -> int:
    text = text.strip()
    if not _INT_TEXT.fullmatch(text):
        raise Invalid("int_parsing")
    if len(text) > _MAX_INT_DIGITS:
        raise Invalid("int_parsing_size")
    return int(text.split(".", 1)[0])


def _int_from_float(value: float) -> int:
    if not math.isfinite(value):
        raise Invalid("finite_number")
    if not value.is_integer():
        raise Invalid("int_from_float")
    if not -_I64_BOUND < value < _I64_BOUND:
        raise Invalid("int_parsing_size")
    return int(value)


def _as_number(value: Any) -> int | float | None:
    """A foreign scalar (numpy, torch, ``__index__`` / ``__float__``) as an int or float; None
    for anything else (an array, a bytearray, a complex)."""
    if isinstance(value, (bytearray, complex)) or _is_array(value):
        return None
    if np_isinstance(value, "bool_"):  # numpy < 2 warns when one is used as an index
        return int(value)
    try:
        return operator.index(value)
    except (TypeError, ValueError, RuntimeError):
        pass
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


def to_int(value: Any) -> int:
    """``value`` as an int under pydantic's lax rules; raises :class:`Invalid`."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _int_from_float(value)
    if isinstance(value, str):
        return _int_from_text(value)
    if isinstance(value, bytes):
        return _int_from_text(_decode(value))
    if loaded_isinstance(value, "decimal", "Decimal"):  # never imports decimal
        if not value.is_finite():
            raise Invalid("finite_number")
        if value != value.to_integral_value():
            raise Invalid("int_from_float")
        return int(value)
    number = _as_number(value)
    if number is None:
        raise Invalid("int_type")
    return number if isinstance(number, int) else _int_from_float(number)


def _float_from_text(text: str) -> float:
    text = text.strip()
    if not text.isascii():
        raise Invalid("float_parsing")
    try:
        return float(text)
    except ValueError:
        raise Invalid("float_parsing") from None


def to_float(value: Any) -> float:
    """``value`` as a float under pydantic's lax rules; raises :class:`Invalid`."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            raise Invalid("float_parsing") from None
    if isinstance(value, str):
        return _float_from_text(value)
    if isinstance(value, bytes):
        return _float_from_text(_decode(value))
    number = _as_number(value)
    if number is None:
        raise Invalid("float_type")
    return float(number)


def _bool_from_number(number: float) -> bool:
    if number == 0:
        return False
    if number == 1:
        return True
    if math.isfinite(number) and float(number).is_integer():
        raise Invalid("bool_parsing")
    raise Invalid("bool_type")


def to_bool(value: Any) -> bool:
    """``value`` as a bool under pydantic's lax rules; raises :class:`Invalid`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, bytes)):
        text = (_decode(value) if isinstance(value, bytes) else value).lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise Invalid("bool_parsing")
    if isinstance(value, int):
        if value in (0, 1):
            return value == 1
        raise Invalid("bool_parsing")
    if isinstance(value, float) or loaded_isinstance(value, "decimal", "Decimal"):
        if not isinstance(value, float) and not value.is_finite():
            raise Invalid("bool_type")
        return _bool_from_number(float(value))
    number = _as_number(value)
    if number is None:
        raise Invalid("bool_type")
    return _bool_from_number(number)


def to_str(value: Any) -> str:
    """``value`` as a str under pydantic's lax rules (never from a number); raises :class:`Invalid`."""
    if isinstance(value, str):
        if isinstance(value, enum.Enum):
            return str(value.value)
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return _decode(bytes(value))
    raise Invalid("string_type")


_TIMESTAMP_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_MS_THRESHOLD = 2e10
"""A larger number is a Unix time in milliseconds, as in pydantic."""


def to_timestamp(value: Any) -> float | None:
    """The Unix time a number (or numeric str / bytes) stands for, as pydantic reads one; None
    for a str that is not a number (parse it as ISO 8601). Raises :class:`Invalid`."""
    if isinstance(value, bool):
        raise Invalid("datetime_type")
    if isinstance(value, (str, bytes)):
        text = _decode(value) if isinstance(value, bytes) else value
        if not _TIMESTAMP_TEXT.fullmatch(text):
            if isinstance(value, bytes):
                raise Invalid("datetime_parsing")
            return None
        number = float(text)
    elif isinstance(value, (int, float)):
        number = float(value)
    else:
        found = _as_number(value)
        if found is None:
            raise Invalid("datetime_type")
        number = float(found)
    if not math.isfinite(number):
        raise Invalid("datetime_parsing")
    return number / 1000 if abs(number) > _MS_THRESHOLD else number
