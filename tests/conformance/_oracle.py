"""The official ``tinker`` package as an oracle: its public module paths, names and kinds.

Everything here is read from the installed official package (never a hand-copied list), so the
conformance tests follow whatever version is installed. ``require`` imports the oracle and makes
its absence a failure in CI (``CI=true``) and a skip elsewhere.

Rules:

* A public module is a module file (or package directory) of the official package whose dotted
  path has no component starting with ``_`` and that is not a test file (``*_test``).
* A module's public names are its ``__all__``; without one, a package's non-module, non-private
  names; for a plain module without one, the non-private names its own source binds at the top
  level (``class``, ``def``, ``=``), leaving out type variables and loggers.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import logging
import os
import types
import typing
from typing import Any

import pytest


def require(name: str) -> Any:
    """Import the official module ``name``: a skip locally when missing, a failure in CI."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(
                f"the official SDK oracle {name!r} is not importable in CI ({exc}); "
                "install the test extra (pip install -e '.[test]')",
                pytrace=False,
            )
        pytest.skip(f"official SDK oracle {name!r} not installed: {exc}", allow_module_level=True)


def public_modules(package: types.ModuleType) -> list[str]:
    """Every public module path of ``package`` (namespace directories included), sorted."""
    root = os.path.dirname(package.__file__ or "")
    base = package.__name__
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, root)
        pkg = base if rel == "." else f"{base}." + rel.replace(os.sep, ".")
        found.add(pkg)
        for filename in filenames:
            if filename.endswith(".py") and filename != "__init__.py":
                found.add(f"{pkg}.{filename[:-3]}")
    return sorted(
        m
        for m in found
        if not any(part.startswith("_") for part in m.split(".")) and not m.endswith("_test")
    )


def _assigned_names(module: types.ModuleType) -> set[str]:
    """Names bound at the top level of the module's source by ``class``, ``def`` or ``=``."""
    with open(module.__file__ or "", encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def _is_plumbing(obj: Any) -> bool:
    """Type variables and loggers: module plumbing, not API."""
    return isinstance(obj, (typing.TypeVar, typing.ParamSpec, logging.Logger))


def public_names(module: types.ModuleType) -> list[str]:
    """The public names of one official module (see the module docstring for the rule)."""
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted(declared)
    if hasattr(module, "__path__"):
        candidates = set(vars(module))
    else:
        candidates = _assigned_names(module)
    return sorted(
        name
        for name in candidates
        if not name.startswith("_")
        and name not in ("annotations", "TYPE_CHECKING")
        and not isinstance(getattr(module, name, None), types.ModuleType)
        and not _is_plumbing(getattr(module, name, None))
    )


def kind(obj: Any) -> str:
    """``dataclass``, ``model`` (pydantic-like), ``enum``, ``alias`` (a typing construct or a
    builtin such as ``str``), ``class``, ``function``, ``module`` or ``value``."""
    if isinstance(obj, types.ModuleType):
        return "module"
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj):
            return "dataclass"
        if issubclass(obj, enum.Enum):
            return "enum"
        if hasattr(obj, "model_validate") and hasattr(obj, "model_dump"):
            return "model"
        if obj.__module__ == "builtins":
            return "alias"
        return "class"
    if typing.get_origin(obj) is not None or type(obj).__module__ == "typing":
        return "alias"
    if inspect.isroutine(obj):
        return "function"
    return "value"


def _pydantic() -> Any:
    import pydantic

    return pydantic


class NoSample(Exception):
    """No plain sample value can be made for this annotation."""


Leaf = typing.Callable[[Any], Any]
"""Extra leaf samples: ``leaf(annotation)`` returns a value or raises :class:`NoSample`."""


def _no_leaf(annotation: Any) -> Any:
    raise NoSample(annotation)


def sample_value(annotation: Any, depth: int = 0, leaf: Leaf = _no_leaf) -> Any:
    """A plain (JSON-like) value the official type accepts for ``annotation``."""
    if depth > 4:
        raise NoSample(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return sample_value(args[0], depth, leaf)
    if annotation in (int,):
        return 3
    if annotation is float:
        return 0.5
    if annotation is str:
        return "abc"
    if annotation is bool:
        return True
    if origin is typing.Literal:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is not type(None):
                try:
                    return sample_value(arg, depth + 1, leaf)
                except NoSample:
                    continue
        raise NoSample(annotation)
    if origin in (list, typing.List, typing.Sequence, __import__("collections.abc").abc.Sequence):  # noqa: UP006
        return [
            sample_value(args[0], depth + 1, leaf) if args else 1,
            sample_value(args[0], depth + 1, leaf) if args else 2,
        ]
    if origin in (dict, typing.Dict, typing.Mapping, __import__("collections.abc").abc.Mapping):  # noqa: UP006
        return {"k": sample_value(args[1], depth + 1, leaf) if args else 1}
    if isinstance(annotation, type) and issubclass(annotation, _pydantic().BaseModel):
        if annotation.__name__ == "TensorData":  # its sparse fields must agree with the data
            return {"data": [1, 2], "dtype": "int64", "shape": [2]}
        return model_sample(annotation, depth + 1, leaf=leaf)
    return leaf(annotation)


def model_sample(
    cls: type, depth: int = 0, *, optional: bool = True, leaf: Leaf = _no_leaf
) -> dict[str, Any]:
    """Sample data for every field of an official model (optional ones too when possible)."""
    out = {}
    for name, info in cls.model_fields.items():  # type: ignore[attr-defined]
        try:
            out[info.alias or name] = sample_value(info.annotation, depth, leaf)
        except NoSample:
            if info.is_required() or not optional:
                raise
    if optional and depth == 0:
        try:
            cls.model_validate(out)  # type: ignore[attr-defined]
        except _pydantic().ValidationError:
            return model_sample(cls, depth, optional=False, leaf=leaf)
    return out
