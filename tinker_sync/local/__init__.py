"""A local, protocol-faithful Tinker server (docs/design/local-server.md).

Usage::

    from tinker_sync.local import LocalServer

    with LocalServer(backend="tiny", faults=["asample 429 x2"]) as server:
        os.environ.update(server.env)
        ...

Exports: :class:`LocalServer`, :class:`Fault`, :class:`FaultPlan`, :class:`RequestLog`,
:class:`RecordedRequest`. Importing this package is cheap: the names load on first access and
the protocol app (numpy backends, SQLite) only when a server starts.

Thread safety and fork safety: see each class.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Fault", "FaultPlan", "FaultRule", "LocalServer", "RecordedRequest", "RequestLog"]

_EXPORTS = {
    "LocalServer": "tinker_sync.local.server",
    "Fault": "tinker_sync.local._faults",
    "FaultPlan": "tinker_sync.local._faults",
    "FaultRule": "tinker_sync.local._faults",
    "RequestLog": "tinker_sync.local._log",
    "RecordedRequest": "tinker_sync.local._log",
}

if TYPE_CHECKING:
    from tinker_sync.local._faults import Fault, FaultPlan, FaultRule
    from tinker_sync.local._log import RecordedRequest, RequestLog
    from tinker_sync.local.server import LocalServer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tinker_sync.local' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
