"""Run the tiny model's small matrix products on one BLAS thread.

Usage::

    with single_threaded_blas():
        logits = x @ w

The tiny backend multiplies small matrices (a few hundred rows and columns). A multi-threaded
OpenBLAS spends more time waking and spinning its worker threads than computing, which on a
busy 2-core machine made a training step several times slower and doubled its CPU time. While
at least one block is inside this context manager, numpy's OpenBLAS runs single-threaded; the
previous setting is restored when the last one leaves. Without an OpenBLAS numpy (or off Linux)
this is a no-op.

The setting is process-wide (OpenBLAS offers nothing finer), so other numpy work in the same
process also runs on one BLAS thread while a backend computes.

Thread safety: a fork-safe lock guards the nesting count. Fork safety: a forked child starts
with the count at zero.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tinker_sync._runtime.fork import make_lock, register_after_fork

#: (setter, getter) symbol pairs of the OpenBLAS builds numpy ships or links.
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


@dataclass(frozen=True)
class _Api:
    set_threads: Callable[[int], object]
    get_threads: Callable[[], int]


_lock = make_lock()
_depth = 0
_saved: int | None = None
_api: _Api | None = None
_resolved = False


def _reset_after_fork() -> None:
    global _depth, _saved
    _depth, _saved = 0, None


register_after_fork(_reset_after_fork)


def _find_api() -> _Api | None:
    """Locate the OpenBLAS already loaded by numpy (via ``/proc/self/maps``)."""
    if not sys.platform.startswith("linux"):
        return None
    import numpy  # noqa: F401  (make sure numpy's BLAS is loaded)

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = sorted(
                {
                    line.split()[-1]
                    for line in fh
                    if "openblas" in line.lower() and ".so" in line and line.split()[-1][0] == "/"
                }
            )
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            setter = getattr(lib, set_name, None)
            getter = getattr(lib, get_name, None)
            if setter is None or getter is None:
                continue
            setter.argtypes = [ctypes.c_int]
            setter.restype = None
            getter.argtypes = []
            getter.restype = ctypes.c_int
            return _Api(set_threads=setter, get_threads=getter)
    return None


def _get_api() -> _Api | None:
    global _api, _resolved
    if not _resolved:
        _api = _find_api()
        _resolved = True
    return _api


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the block with OpenBLAS limited to one thread (nesting and threads are fine)."""
    global _depth, _saved
    with _lock:
        api = _get_api()
        if api is not None:
            if _depth == 0:
                current = int(api.get_threads())
                if current != 1:
                    _saved = current
                    api.set_threads(1)
            _depth += 1
    try:
        yield
    finally:
        if api is not None:
            with _lock:
                _depth -= 1
                if _depth == 0 and _saved is not None:
                    api.set_threads(_saved)
                    _saved = None
