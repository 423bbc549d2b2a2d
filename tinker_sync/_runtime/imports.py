"""First imports on the caller's thread that a signal handler cannot turn into a missing module.

Usage::

    imported("tinker_sync.rest_client")           # before a function-level import
    from tinker_sync.rest_client import RestClient  # finds it loaded
    module = load("tinker_sync.types._rest")      # in a module-level ``__getattr__``

CPython's path finders take an ``OSError`` raised while they look at a file as "no such file".
A signal handler that raises an ``OSError`` subclass (a ``TimeoutError`` from ``signal.alarm``
or ``setitimer``) at that moment makes an import of a module that exists fail with
``ModuleNotFoundError``, and the handler's own exception is lost inside importlib.
:func:`load` and :func:`imported` import each named module of this package (at once when it
is loaded already, waiting when another thread is running it) and import again, up to
:data:`IMPORT_ATTEMPTS` times in all, when one of this package's modules is reported missing:
the package is installed, so that report can only be such a lost exception. A missing
third-party module (an optional extra) is raised at once, and an exception the handler raises
outside importlib's own lookups reaches the caller as itself
(docs/guarantees.md#signals-and-exit).

Thread and fork safety: stateless; the import system's own locks apply.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["IMPORT_ATTEMPTS", "imported", "load"]

#: Attempts per module (the first one included) while this package's modules are reported
#: missing; a signal handler would have to land in importlib's lookup this many times in a row.
IMPORT_ATTEMPTS = 5

_PACKAGE = __name__.partition(".")[0]


def _ours(name: str | None) -> bool:
    return name is not None and (name == _PACKAGE or name.startswith(_PACKAGE + "."))


def load(name: str) -> ModuleType:
    """The module ``name`` (a dotted name of this package's modules), imported if need be.

    Always through ``importlib.import_module``, never a bare ``sys.modules`` lookup: a module
    another thread is still running is in ``sys.modules`` half made, and only the import
    system waits for it to finish (its module lock).
    """
    for _ in range(IMPORT_ATTEMPTS - 1):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not _ours(exc.name):
                raise
    return importlib.import_module(name)  # the last attempt: its error is the caller's


def imported(*names: str) -> None:
    """Load ``names`` (dotted names of this package's modules), as :func:`load` does."""
    for name in names:
        load(name)
