"""numpy (and urllib3) on demand: the path to a first sample imports neither unless the caller's
data (or the request path) needs it (docs/scale-out.md#start-up).

Usage::

    from tinker_sync._lazynp import AnyArray, is_ndarray, loaded_isinstance, np_isinstance

    if is_ndarray(value):          # False without importing numpy when nobody has imported it
        ...
    def f(arr: AnyArray) -> None:  # numpy's NDArray for type checkers, ``Any`` at run time
        ...
    if loaded_isinstance(exc, "urllib3.exceptions", "ProtocolError"):  # never imports urllib3
        ...

An object can only be a numpy array or scalar (or a urllib3 exception) once its module is
imported, so these checks look at ``sys.modules`` and never import anything themselves. Code
that computes with numpy, or raises urllib3's exceptions, imports it in the function that
needs it (``TYPE_CHECKING`` imports keep the annotations).

Thread and fork safety: no state of its own.
"""

import sys
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard

__all__ = ["AnyArray", "is_ndarray", "is_np_integer", "loaded_isinstance", "np_isinstance"]

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    AnyArray: TypeAlias = npt.NDArray[Any]
else:
    AnyArray = Any


def is_ndarray(value: object) -> "TypeGuard[npt.NDArray[Any]]":
    """Whether ``value`` is a numpy array (without importing numpy)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, getattr(numpy, "ndarray", ()))


def is_np_integer(value: object) -> "TypeGuard[np.integer[Any]]":
    """Whether ``value`` is a numpy integer scalar (without importing numpy)."""
    return np_isinstance(value, "integer")


def np_isinstance(value: Any, *names: str) -> bool:
    """Whether ``value`` is an instance of one of numpy's classes ``names`` (e.g. ``"bool_"``,
    ``"integer"``), without importing numpy."""
    return loaded_isinstance(value, "numpy", *names)


def loaded_isinstance(value: object, module: str, *names: str) -> bool:
    """Whether ``value`` is an instance of one of the classes ``names`` of ``module`` (e.g.
    ``"urllib3.exceptions"``), False when nobody imported ``module`` (never imports it)."""
    found = sys.modules.get(module)
    if found is None:
        return False
    return isinstance(value, tuple(getattr(found, name, ()) for name in names))
