"""Walk an exception and everything it wraps: the one chain walker of the SDK.

Usage::

    for exc in related(error):          # error first, then what it wraps, depth first
        if isinstance(exc, OSError): ...

Followed links: exceptions among ``args``, a ``reason`` attribute (urllib3 wraps that way),
``__cause__`` and ``__context__``, in that order. Each exception is yielded once, and at most 32
are visited, so cyclic or very deep chains stay cheap.

Thread and fork safety: a pure function.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["related"]

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
