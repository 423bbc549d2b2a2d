"""Raise an exception where CPython runs signal handlers, at each such point in turn.

Usage::

    points = interrupt_at(None, op)              # count the points op passes
    for point in range(points):
        interrupt_at(point, op)                  # op raised Interrupt there (caught)
        ...check the state op left behind...

Stands for a signal handler's exception (an alarm timeout, Ctrl-C) on the main thread: at a
function's entry, right after a call returns, and on a loop's back edge, in the code objects
``where`` accepts (default: the limiter module). docs/limiter.md#signals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Interrupt(Exception):
    """Stands for a signal handler's exception (an alarm timeout) on the pumping thread."""


def interrupt_at(
    point: int | None, op: Callable[[], object], where: Callable[[Any], bool] | None = None
) -> int:
    """Run ``op`` and raise Interrupt at its ``point``-th signal check inside the limiter module
    (or in the code objects ``where`` accepts): where CPython runs signal handlers (a function's
    entry, right after a call returns, a loop's back edge). Returns how many such points ``op``
    passed (with ``point=None``: none raised)."""
    import dis
    import sys

    from tinker_sync._flow import limiter as limiter_module

    if where is None:
        where = lambda code: code.co_filename == limiter_module.__file__  # noqa: E731
    passed = 0

    def check() -> None:
        nonlocal passed
        passed += 1
        if passed - 1 == point:
            raise Interrupt(point)

    def tracer(frame: Any, event: str, arg: object) -> Any:
        if event != "call" or not where(frame.f_code):
            return None
        frame.f_trace_opcodes = True
        prev = [""]

        def local(frame: Any, event: str, arg: object) -> Any:
            if event == "opcode":
                name = dis.opname[frame.f_code.co_code[frame.f_lasti]]
                if prev[0] == "CALL" or name == "JUMP_BACKWARD":
                    check()
                prev[0] = name
            return local

        check()
        return local

    sys.settrace(tracer)
    try:
        op()
    except Interrupt:
        pass
    finally:
        sys.settrace(None)
    return passed
