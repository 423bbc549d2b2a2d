"""Secret hygiene: one place that decides what a secret looks like and hides it.

Usage::

    from tinker_sync._runtime.redact import redact_headers, scrub, register_secret

    register_secret(api_key)            # every later scrub() hides this value
    safe = redact_headers(headers)      # secret-looking header values -> "<redacted>"
    text = scrub(f"server said: {body}")

Thread safety: the registry is guarded by a lock; all functions may be called from any thread.
Fork safety: the registry is plain data and stays valid in a forked child.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

_SECRET_NAME = re.compile(r"(key|token|secret|authorization|cookie|password|^cf-access-)", re.I)
# Things that look like credentials even when we were never told about them.
_SECRET_VALUE = re.compile(
    r"(tml-[A-Za-z0-9_\-]{20,}|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*)"
)

_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_in_child)
_known: set[str] = set()
_known_pattern: re.Pattern[str] | None = None


#: Protocol headers whose names look secret but carry no credential.
_NOT_SECRET = frozenset({"x-idempotency-key"})


def is_secret_header(name: str) -> bool:
    """Return True when a header with this name must never be shown or pickled."""
    return name.lower() not in _NOT_SECRET and bool(_SECRET_NAME.search(name))


def register_secret(value: str | None) -> None:
    """Remember ``value`` so that :func:`scrub` hides it wherever it appears.

    Values shorter than 6 characters are ignored (they would redact ordinary words).
    """
    global _known_pattern
    if not value or len(value) < 6:
        return
    with _lock:
        if value in _known:
            return
        _known.add(value)
        ordered = sorted(_known, key=len, reverse=True)
        _known_pattern = re.compile("|".join(re.escape(v) for v in ordered))


def scrub(text: str) -> str:
    """Return ``text`` with every registered secret and credential-looking token hidden."""
    pattern = _known_pattern
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    return _SECRET_VALUE.sub(REDACTED, text)


def redact_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Copy ``headers`` with the values of secret-looking names replaced by ``<redacted>``."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {k: (REDACTED if is_secret_header(k) else scrub(str(v))) for k, v in items}
