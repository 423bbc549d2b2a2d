"""numpy on demand: the path to a first sample imports no numpy unless the caller's data needs it
(docs/scale-out.md#start-up).

Usage::

    from tinker_sync._lazynp import AnyArray, is_ndarray, np_isinstance

    if is_ndarray(value):          # False without importing numpy when nobody has imported it
        ...
    def f(arr: AnyArray) -> None:  # numpy's NDArray for type checkers, ``Any`` at run time
        ...

An object can only be a numpy array or scalar once numpy is imported, so these checks look at
``sys.modules`` and never import numpy themselves. Code that computes with numpy imports it in
the function that needs it.

Thread and fork safety: no state of its own.
"""

import sys
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard

__all__ = ["AnyArray", "is_ndarray", "is_np_integer", "np_isinstance"]

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
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return False
    return isinstance(value, tuple(getattr(numpy, name, ()) for name in names))
