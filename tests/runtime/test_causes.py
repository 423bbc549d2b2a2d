"""The one exception-chain walker (``tinker_sync._runtime.causes.related``)."""

from __future__ import annotations

from tinker_sync._runtime.causes import related


class _Wrapped(Exception):
    def __init__(self, message: str, reason: BaseException | None = None) -> None:
        super().__init__(message)
        self.reason = reason


def test_order_is_self_then_args_reason_cause_context_depth_first() -> None:
    in_args = ValueError("in args")
    reason = OSError("reason")
    cause = KeyError("cause")
    context = IndexError("context")
    deep = RuntimeError("under the cause")
    cause.__cause__ = deep
    top = _Wrapped("top", reason)
    top.args = ("top", in_args)
    top.__cause__ = cause
    top.__context__ = context
    assert list(related(top)) == [top, in_args, reason, cause, deep, context]


def test_each_exception_once_even_in_a_cycle() -> None:
    a = ValueError("a")
    b = KeyError("b")
    a.__cause__ = b
    b.__context__ = a
    assert list(related(a)) == [a, b]


def test_a_very_long_chain_is_cut_at_32() -> None:
    errors = [ValueError(str(i)) for i in range(100)]
    for outer, inner in zip(errors, errors[1:], strict=False):
        outer.__cause__ = inner
    assert list(related(errors[0])) == errors[:32]


def test_non_exception_reason_and_args_are_ignored() -> None:
    exc = _Wrapped("x")
    exc.reason = "not an exception"  # type: ignore[assignment]
    assert list(related(exc)) == [exc]
