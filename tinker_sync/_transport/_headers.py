"""Request headers: the SDK's own and the platform's, and the case-insensitive merge.

Holds no secret: credentials and user headers live in the objects that own them (the
Transport's config and auth) and are merged into each request's own dict.
Thread safety: module data is written once, at import.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping

from tinker_sync._config import PROTOCOL_VERSION
from tinker_sync._transport._replies import ACCEPT_ENCODING
from tinker_sync._version import __version__

USER_AGENT = f"tinker-sync/{__version__} (protocol {PROTOCOL_VERSION})"


def _platform_headers() -> dict[str, str]:
    system = platform.system()
    os_name = {"Linux": "Linux", "Darwin": "MacOS", "Windows": "Windows"}.get(
        system, f"Other:{system}"
    )
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "arm64": "arm64", "aarch64": "arm64"}.get(
        machine, "x32" if machine in ("i386", "i686", "x86") else f"other:{machine}"
    )
    return {
        "X-Stainless-Lang": "python",
        "X-Stainless-Package-Version": __version__,
        "X-Stainless-OS": os_name,
        "X-Stainless-Arch": arch,
        "X-Stainless-Runtime": platform.python_implementation(),
        "X-Stainless-Runtime-Version": platform.python_version(),
        "X-Stainless-Async": "false",
    }


_PLATFORM_HEADERS = _platform_headers()
_BASE_HEADERS = {"Accept-Encoding": ACCEPT_ENCODING, "User-Agent": USER_AGENT, **_PLATFORM_HEADERS}
"""Headers every request carries, in order, after ``Accept``."""
_PROTO = "application/x-protobuf"
_JSON = "application/json"
_SDK_HEADER_NAMES = frozenset(
    name.lower()
    for name in (
        *_BASE_HEADERS,
        "Accept",
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "Content-Type",
        "X-Idempotency-Key",
        "x-sdk-version",
        "x-sdk-method",
    )
)
"""Lower-cased names :meth:`Transport.build_headers` writes before the overrides."""


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _merge(headers: dict[str, str], *overrides: Mapping[str, str]) -> dict[str, str]:
    """``headers`` updated in place by each of ``overrides`` in turn, case-insensitively.

    A replaced header keeps its position and takes the overriding spelling. Only names that can
    collide (the SDK's own, or one added by an earlier override) pay for a case-folded lookup.
    """
    added: set[str] = set()
    for override in overrides:
        for name, value in override.items():
            if name in headers:  # same spelling: a plain update keeps the position
                headers[name] = value
                continue
            low = name.lower()
            old = None
            if low in _SDK_HEADER_NAMES or low in added:
                old = next((n for n in headers if n.lower() == low), None)
            if old is None:
                headers[name] = value
                added.add(low)
            else:  # another spelling of a header already there: same position, new spelling
                headers = {
                    (name if n == old else n): (value if n == old else v)
                    for n, v in headers.items()
                }
    return headers
