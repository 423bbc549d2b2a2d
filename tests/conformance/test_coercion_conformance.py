"""Field coercion, generated from the official ``tinker`` package installed here.

For every public pydantic model of ``tinker.types`` and every one of its fields, the same
candidate values (integral and fractional floats, numeric and other strings, bytes, bools,
numpy and torch scalars, None, small lists and dicts) are given to the official type and to
ours, on top of a valid sample built from the official fields. The official type is the
oracle: ours must accept what it accepts, coerce to the same value (same Python types), and
reject what it rejects with a ``ValueError`` whose ``errors()`` name the field. Nothing here
lists a type, a field or an expected value by hand. The official dataclass types
(``Datum``, ``TensorData``, ...) do no coercion at all, so they are not compared here
(docs/migration.md#coercion). Without the official package this fails in CI and skips
elsewhere.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from typing import Any

import allowlist
import numpy as np
import pytest
from _oracle import NoSample, kind, model_sample, public_names, require

official_types = require("tinker.types")
pydantic = require("pydantic")

from tinker_sync import types as T  # noqa: E402

try:
    import torch
except ImportError:  # torch is optional: its candidates are left out
    torch = None


def _scalars() -> list[Any]:
    out: list[Any] = [
        0, 1, 2, -1, 3, 2**40,
        0.0, 1.0, 256.0, 512.5, -0.5, float("nan"), float("inf"), 1e30,
        True, False,
        "8", " 8 ", "8.0", "-3", "3e-4", "1_000", "abc", "", "true", "No", "on", "nan",
        "png", "encoded_text", "2024-05-06T07:08:09Z", "2024-05-06", "aGk=",
        b"8", b"abc", bytearray(b"8"),
        np.int64(3), np.int32(1), np.float64(2.0), np.float32(0.5), np.float32(1.5),
        np.bool_(True), np.array(4), np.array(2.5), np.array([1, 2]),
        None,
    ]  # fmt: skip
    if torch is not None:
        out += [torch.tensor(3), torch.tensor(0.25), torch.tensor(2.0), torch.tensor(True)]
    return out


SCALARS = _scalars()
CONTAINERS: list[Any] = [
    [], [1], [1.0], ["8"], [True], ["a"], [1.5], [None], (2, 3), [[1, 2]], [{}],
    {}, {"a": 1}, {"a": "1.5"}, {"a": None}, {"a": [1]},
]  # fmt: skip
"""Lists and dicts: the element rules of list / dict fields (and rejections elsewhere)."""


def _models() -> list[str]:
    return [
        name
        for name in public_names(official_types)
        if allowlist.name_reason("tinker.types", name) is None
        and kind(getattr(official_types, name)) == "model"
        and isinstance(getattr(official_types, name), type)
        and issubclass(getattr(official_types, name), pydantic.BaseModel)
    ]


MODELS = _models()


def _leaf(annotation: Any) -> Any:
    """Samples of the leaves the object-level sampler leaves out."""
    if isinstance(annotation, type) and (
        issubclass(annotation, dt.datetime) or annotation is pydantic.AwareDatetime
    ):
        return "2024-05-06T07:08:09Z"
    if annotation is bytes:
        return b"\x01\x01\x02"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(iter(annotation)).value
    if annotation is Any:
        return 1
    raise NoSample(annotation)


def _base(official: type) -> dict[str, Any] | None:
    try:
        data = model_sample(official, leaf=_leaf)
        official(**data)
    except (NoSample, pydantic.ValidationError):
        return None
    return data


class _Rejected:
    def __repr__(self) -> str:
        return "<rejected>"


REJECTED = _Rejected()


def normalize(value: Any, nested: bool = False) -> Any:
    """A comparable form: Python types kept (1 != 1.0 != True), models as their dumps.

    Inside a nested model, ints and floats compare by value: the official defaults are not
    validated (``SamplingParams.temperature`` defaults to the int ``1``).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):
        return normalize(value.value, nested)
    if nested and isinstance(value, (int, float)):
        return ("number", "nan" if math.isnan(value) else float(value))
    if isinstance(value, (int, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value)
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return ("datetime", aware.timestamp())
    if isinstance(value, (list, tuple)):
        return [normalize(v, nested) for v in value]
    if isinstance(value, np.ndarray):
        return normalize(value.tolist(), nested)
    if isinstance(value, dict):
        return {normalize(k, nested): normalize(v, nested) for k, v in value.items()}
    if hasattr(value, "model_dump"):
        return {k: normalize(v, True) for k, v in value.model_dump().items()}
    return ("other", repr(value))


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:60]


def _compare(name: str, field: str, base: dict[str, Any], candidate: Any) -> str | None:
    """None when ours behaves like the official type for ``field=candidate``, else why not."""
    official_cls, ours_cls = getattr(official_types, name), getattr(T, name)
    data = dict(base, **{field: candidate})
    try:
        theirs = normalize(getattr(official_cls(**data), field))
    except pydantic.ValidationError:
        theirs = REJECTED
    try:
        ours_obj = ours_cls(**data)
    except ValueError as exc:
        if theirs is not REJECTED:
            return f"{_describe(candidate)}: rejected here ({exc}), official gives {theirs!r}"
        errors = exc.errors() if hasattr(exc, "errors") else None
        if not errors or not errors[0]["loc"] or errors[0]["loc"][0] != field:
            return f"{_describe(candidate)}: error does not name the field: {errors!r}"
        return None
    except Exception as exc:
        return f"{_describe(candidate)}: raised {type(exc).__name__} ({exc}), not a ValueError"
    ours = normalize(getattr(ours_obj, field))
    if theirs is REJECTED:
        return f"{_describe(candidate)}: accepted here as {ours!r}, official rejects"
    if ours != theirs:
        return f"{_describe(candidate)}: {ours!r} here, {theirs!r} officially"
    return None


def test_the_oracle_covers_most_models() -> None:
    assert len(MODELS) >= 80, len(MODELS)
    covered = [n for n in MODELS if _base(getattr(official_types, n)) is not None]
    assert len(covered) >= 0.8 * len(MODELS), sorted(set(MODELS) - set(covered))


def test_the_comparison_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    assert normalize(1) != normalize(1.0) != normalize(True)
    assert _compare("LoraConfig", "rank", {"rank": 4}, 8.0) is None

    class Strict(T.LoraConfig):  # a stand-in that accepts too little, then too much
        def __init__(self, **kwargs: Any) -> None:
            if type(kwargs["rank"]) is not int:
                raise TypeError("rank")
            super().__init__(**kwargs)

    monkeypatch.setattr(T, "LoraConfig", Strict)
    assert "not a ValueError" in (_compare("LoraConfig", "rank", {"rank": 4}, 8.0) or "")
    monkeypatch.setattr(T, "LoraConfig", lambda **kw: type("L", (), {"rank": kw["rank"]})())
    assert "official rejects" in (_compare("LoraConfig", "rank", {"rank": 4}, "abc") or "")
    assert "officially" in (_compare("LoraConfig", "rank", {"rank": 4}, 8.0) or "")


def _problems(name: str) -> list[str]:
    official = getattr(official_types, name)
    base = _base(official)
    if base is None:
        return []
    return [
        f"{name}.{field}: {why}"
        for field in official.model_fields
        if field in base or not official.model_fields[field].is_required()
        for candidate in [*SCALARS, *CONTAINERS, base.get(field)]
        if (why := _compare(name, field, base, candidate)) is not None
    ]


@pytest.mark.parametrize("name", MODELS)
def test_fields_coerce_like_the_official_type(name: str) -> None:
    if _base(getattr(official_types, name)) is None:
        pytest.skip(f"no valid sample of official {name} can be generated")
    problems = [p for p in _problems(name) if p.split(":", 1)[0] not in allowlist.COERCIONS]
    assert not problems, f"{len(problems)} differences:\n" + "\n".join(problems[:40])


def test_every_coercion_allowlist_entry_is_still_needed() -> None:
    for key in allowlist.COERCIONS:
        name = key.split(".", 1)[0]
        assert name in MODELS, f"{key}: no such official model"
        assert any(p.startswith(key + ":") for p in _problems(name)), f"{key}: same now; drop it"


UNKNOWN = "zz_not_a_field"


@pytest.mark.parametrize("name", MODELS)
def test_an_unknown_keyword_is_treated_like_the_official_type(name: str) -> None:
    """The official type rejects it (``extra_forbidden``) or drops it: ours does the same, with
    a ``ValueError`` naming the keyword, or dropping it (and warning)."""
    import warnings

    official = getattr(official_types, name)
    base = _base(official)
    if base is None:
        pytest.skip(f"no valid sample of official {name} can be generated")
    try:
        official(**base, **{UNKNOWN: 1})
        forbidden = False
    except pydantic.ValidationError as exc:
        forbidden = any(e["type"] == "extra_forbidden" for e in exc.errors())
        assert forbidden, exc.errors()
    ours_cls = getattr(T, name)
    if name in allowlist.UNKNOWN_KEYWORDS:
        forbidden = not forbidden  # the documented difference, checked as such
    if forbidden:
        with pytest.raises(ValueError) as raised:
            ours_cls(**base, **{UNKNOWN: 1})
        errors = raised.value.errors()  # type: ignore[attr-defined]
        expected = {"type": "extra_forbidden", "loc": (UNKNOWN,), "input": 1}
        assert expected.items() <= errors[0].items(), errors
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = ours_cls(**base, **{UNKNOWN: 1})
    assert normalize(ours) == normalize(ours_cls(**base))
    assert [str(w.message) for w in caught if UNKNOWN in str(w.message)]


def test_every_unknown_keyword_allowlist_entry_is_still_needed() -> None:
    for name in allowlist.UNKNOWN_KEYWORDS:
        assert name in MODELS, f"{name}: no such official model"
        official, ours = getattr(official_types, name), getattr(T, name)
        base = _base(official)
        assert base is not None, name
        try:
            official(**base, **{UNKNOWN: 1})
            official_rejects = False
        except pydantic.ValidationError:
            official_rejects = True
        try:
            ours(**base, **{UNKNOWN: 1})
            ours_rejects = False
        except ValueError:
            ours_rejects = True
        assert official_rejects != ours_rejects, f"{name}: same now; drop it"
