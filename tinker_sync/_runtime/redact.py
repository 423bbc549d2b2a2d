"""Secret hygiene: one place that decides what a secret looks like and hides it.

Usage::

    from tinker_sync._runtime.redact import redact_headers, scrub, register_secret

    register_secret(api_key)            # every later scrub() hides this value
    safe = redact_headers(headers)      # secret-looking header values -> "<redacted>"
    text = scrub(f"server said: {body}")

Thread safety: the registry is guarded by a lock; all functions may be called from any thread.
Fork safety: the registry is plain data and stays valid in a forked child. Lifetime: a value
registered with a holder leaves the registry when its last holder is collected.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import urllib.parse
import weakref
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

_SECRET_NAME = re.compile(r"(key|token|secret|authorization|cookie|password|^cf-access-)", re.I)
# Things that look like credentials even when we were never told about them.
_SECRET_VALUE = re.compile(
    r"(tml-[A-Za-z0-9_\-]{20,}|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*)"
)

_lock = threading.RLock()  # re-entrant: a holder's finalizer may run (GC) while it is held


def _reset_lock_in_child() -> None:
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_lock_in_child)
_known: dict[str, int] = {}
"""Registered values -> live holders (-1: kept for the life of the process)."""
_known_pattern: re.Pattern[str] | None = None
_generation = 0
"""Bumped by every change of ``_known`` (a finalizer may change it during a rebuild)."""
_ESCAPED = re.compile(r"\\u([0-9a-fA-F]{4})")


#: Protocol headers whose names look secret but carry no credential.
_NOT_SECRET = frozenset({"x-idempotency-key"})


def is_secret_header(name: str) -> bool:
    """Return True when a header with this name must never be shown or pickled."""
    return name.lower() not in _NOT_SECRET and bool(_SECRET_NAME.search(name))


def register_secret(value: str | None, holder: object | None = None) -> None:
    """Remember ``value`` so that :func:`scrub` hides it wherever it appears, also escaped
    (JSON ``\\u`` escapes, URL-encoding, base64) as a server may echo it.

    With ``holder`` (e.g. a ``Secret``), the value is forgotten once every holder registered
    for it has been garbage-collected, so no module global keeps it after the last client
    holding it is closed and dropped; without one it is kept for the life of the process.
    Values shorter than 6 characters are ignored (they would redact ordinary words).
    """
    if not value or len(value) < 6:
        return
    global _generation
    with _lock:
        count = _known.get(value)
        if count is None:
            _known[value] = -1 if holder is None else 1
            _generation += 1
            _rebuild()
        elif count != -1:
            _known[value] = -1 if holder is None else count + 1
    if holder is not None:
        weakref.finalize(holder, _release, value)


def _release(value: str) -> None:
    global _generation
    with _lock:
        count = _known.get(value)
        if count is None or count == -1:
            return
        if count > 1:
            _known[value] = count - 1
            return
        del _known[value]
        _generation += 1
        _rebuild()


def _rebuild() -> None:
    """The pattern of every registered value and its base64 forms (lock held)."""
    global _known_pattern
    while True:
        generation = _generation
        forms: set[str] = set()
        for value in list(_known):
            forms.add(value)
            forms.update(_base64_cores(value))
        ordered = sorted(forms, key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None
        if generation == _generation:  # else a finalizer changed the registry meanwhile
            _known_pattern = pattern
            return


def _base64_cores(value: str) -> list[str]:
    """The parts of ``value``'s base64 encoding that do not depend on its neighbours, at each
    of the three alignments it may have inside a longer encoded text."""
    raw = value.encode()
    cores = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        start = (offset * 4 + 2) // 3  # characters mixing in the bytes before the value
        end = ((offset + len(raw)) // 3) * 4  # whole groups made of the value's own bytes
        for alphabet in (encoded, encoded.replace("+", "-").replace("/", "_")):
            core = alphabet[start:end]
            if len(core) >= 8:
                cores.append(core)
    return cores


def scrub(text: str) -> str:
    """Return ``text`` with every registered secret and credential-looking token hidden.

    A text that holds a secret only once its JSON ``\\u`` escapes or URL-encoding are undone
    is returned undone, with the secret hidden.
    """
    pattern = _known_pattern
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
        if "\\u" in text or "%" in text:
            plain = urllib.parse.unquote(
                _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), text), errors="replace"
            )
            if plain != text and pattern.search(plain):
                text = pattern.sub(REDACTED, plain)
    return _SECRET_VALUE.sub(REDACTED, text)


#: Headers whose value is a URL: a redirect to a signed link carries its signature in the query.
_URL_HEADERS = frozenset({"location", "content-location"})


def url_without_query(url: str) -> str:
    """``url`` for a log line: no query string (a signed URL's signature) and no user info."""
    parts = urllib.parse.urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}" if parts.netloc else ""
    return origin + parts.path


def redact_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Copy ``headers`` with the values of secret-looking names replaced by ``<redacted>``
    and URL-valued ones (``Location``) without their query."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {k: _redacted_value(k, str(v)) for k, v in items}


def _redacted_value(name: str, value: str) -> str:
    if is_secret_header(name):
        return REDACTED
    if name.lower() in _URL_HEADERS and "?" in value:
        return scrub(url_without_query(value) + "?" + REDACTED)
    return scrub(value)
