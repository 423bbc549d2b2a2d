"""Walk an exception and everything it wraps: the one chain walker of the SDK.

Usage::

    for exc in related(error):          # error first, then what it wraps, depth first
        if isinstance(exc, OSError): ...

Followed links: exceptions among ``args``, a ``reason`` attribute (urllib3 wraps that way),
``__cause__`` and ``__context__``, in that order. Each exception is yielded once, and at most 32
are visited, so cyclic or very deep chains stay cheap.

:func:`signal_exception` finds, in that chain, an exception raised by a Python signal handler
(a ``signal.alarm`` timeout, a soft time limit): code that catches broad exceptions re-raises
it as itself, never retries it or reports it as a protocol error (docs/guarantees.md).

Thread and fork safety: pure functions.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import CodeType
from typing import Any

__all__ = ["related", "signal_exception"]

_MAX_VISITED = 32


def related(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it wraps (see the module docstring)."""
    seen: set[int] = set()
    stack = [exc]
    while stack and len(seen) < _MAX_VISITED:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        nested = [a for a in getattr(cur, "args", ()) if isinstance(a, BaseException)]
        reason = getattr(cur, "reason", None)
        if isinstance(reason, BaseException):
            nested.append(reason)
        for link in (cur.__cause__, cur.__context__):
            if link is not None:
                nested.append(link)
        stack.extend(reversed(nested))


def _handler_code(handler: Any) -> CodeType | None:
    for candidate in (handler, getattr(handler, "__func__", None), getattr(handler, "func", None)):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, CodeType):
            return code
    code = getattr(type(handler).__call__, "__code__", None)  # a callable object
    return code if isinstance(code, CodeType) else None


def _signal_handler_codes() -> set[CodeType]:
    signal = sys.modules.get("signal")  # a Python handler can only be installed through it
    if signal is None:
        return set()
    codes: set[CodeType] = set()
    for signum in signal.valid_signals():
        # No try/except here: it would also catch the handler's own exception (an OSError
        # such as TimeoutError) raised meanwhile. valid_signals() never makes getsignal raise.
        handler = signal.getsignal(signum)
        if callable(handler):
            code = _handler_code(handler)
            if code is not None:
                codes.add(code)
    return codes


def signal_exception(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain that a Python signal handler raised, else None.

    An exception counts as the handler's when its traceback runs through the code of a handler
    installed now with ``signal.signal``. Meant for error paths only (it lists the handlers).
    """
    codes: set[CodeType] | None = None
    for cur in related(exc):
        tb = cur.__traceback__
        if tb is None:
            continue
        if codes is None:
            codes = _signal_handler_codes()
            if not codes:
                return None
        while tb is not None:
            if tb.tb_frame.f_code in codes:
                return cur
            tb = tb.tb_next
    return None
