"""The opt-in ``tinker`` alias: ``import tinker`` gives ``tinker_sync``, submodules included.

Usage (the documented switch is the CLI wrapper, which also covers child processes)::

    tinker-sync exec -- python train.py     # train.py and its libraries say `import tinker`

``tinker-sync exec`` sets ``TINKER_SYNC_ALIAS=1`` and puts :data:`BOOT_DIR` first on
``PYTHONPATH``; the ``sitecustomize`` there calls :func:`install` when every Python process in
that environment starts (spawn and forkserver workers included), then runs the
``sitecustomize`` it shadows, if any. Forked children inherit the alias with the parent's
modules.

With the alias on, ``tinker.X`` *is* ``tinker_sync.X`` (the same module objects, so
``isinstance`` holds across both names and pickles name ``tinker_sync`` classes), whether or
not the official ``tinker`` package is installed: the finder runs before every other one. A
``tinker.X`` that tinker_sync lacks raises ModuleNotFoundError naming both modules; the
official package is never mixed in. Distribution metadata is not aliased
(``importlib.metadata.version("tinker")`` still reports the official package, if installed).

Thread safety: :func:`install` is idempotent and takes the import lock. Fork safety: nothing
to do; the finder holds no state.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Sequence
from types import ModuleType

ALIAS = "tinker"
TARGET = "tinker_sync"
#: The environment variable the startup hook honours ("1" turns the alias on).
ENV_VAR = "TINKER_SYNC_ALIAS"
#: The directory holding the startup ``sitecustomize`` (``tinker-sync exec`` puts it on
#: ``PYTHONPATH``).
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_alias_boot")

_lock = threading.Lock()


def target_name(fullname: str) -> str | None:
    """``tinker.types.datum`` -> ``tinker_sync.types.datum``; None for other names."""
    if fullname == ALIAS:
        return TARGET
    if fullname.startswith(ALIAS + "."):
        return TARGET + fullname[len(ALIAS) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands importlib the already-imported ``tinker_sync`` module for a ``tinker`` name."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._target)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # importlib stamped the alias's spec on the module; keep the module's own identity.
        module.__spec__ = self._real_spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: resolves ``tinker`` and ``tinker.*`` to tinker_sync."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        real = target_name(fullname)
        if real is None:
            return None
        if importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: the tinker alias maps it to {real!r}, which "
                "tinker_sync does not provide (see docs/migration.md)",
                name=fullname,
            )
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=True)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {ALIAS} -> {TARGET}>"


def installed() -> bool:
    """True when the alias finder is on ``sys.meta_path``."""
    return any(isinstance(f, AliasFinder) for f in sys.meta_path)


def install() -> None:
    """Make ``import tinker`` (and every ``tinker.X``) resolve to tinker_sync in this process.

    Raises RuntimeError if a different ``tinker`` (the official package) is already imported:
    its objects would not be tinker_sync's, so aliasing now would mix the two.
    """
    with _lock:
        if installed():
            return
        clashing = sorted(
            name
            for name, module in list(sys.modules.items())
            if target_name(name) is not None
            and module is not sys.modules.get(target_name(name) or "")
        )
        if clashing:
            raise RuntimeError(
                f"cannot alias tinker to tinker_sync: {clashing[0]!r} is already imported from "
                "another package; turn the alias on before anything imports tinker "
                f"(tinker-sync exec, or {ENV_VAR}=1 with the startup hook)"
            )
        sys.meta_path.insert(0, AliasFinder())


def install_from_env() -> bool:
    """:func:`install` when ``TINKER_SYNC_ALIAS=1``; returns whether the alias is on."""
    if os.environ.get(ENV_VAR, "") != "1":
        return False
    install()
    return True


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default ``os.environ``) that turns the alias on in child processes."""
    out = dict(os.environ if env is None else env)
    out[ENV_VAR] = "1"
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
    out["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *parts])
    return out
