"""Request headers: the SDK's own, the platform's, and validated-once header lines.

Thread safety: module data is written at import and by ``prepare_headers`` under the GIL.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Mapping
from typing import Any

from urllib3.connection import HTTPConnection
from urllib3.util import make_headers

from tinker_sync._config import PROTOCOL_VERSION
from tinker_sync._version import __version__

USER_AGENT = f"tinker-sync/{__version__} (protocol {PROTOCOL_VERSION})"


_PREPARED_LIMIT = 4096
_prepared: dict[tuple[str, str], bytes] = {}
_LEGAL_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_LEGAL_VALUE = re.compile(r"[\x20-\x7e\t]*")


def prepare_headers(headers: Mapping[str, str]) -> None:
    """Validate and encode header lines sent on many requests, once (see ``_PreparedHeaders``).

    Only plain printable-ASCII names and values are prepared; anything else keeps taking the
    normal path, which validates it (and rejects CR/LF) on every request. Bounded: past 4,096
    distinct lines nothing more is prepared.
    """
    for name, value in headers.items():
        key = (name, value)
        if key in _prepared or len(_prepared) >= _PREPARED_LIMIT:
            continue
        if _LEGAL_NAME.fullmatch(name) and _LEGAL_VALUE.fullmatch(value):
            _prepared[key] = f"{name}: {value}".encode("ascii")


_COALESCE_LIMIT = 64 * 1024
"""Bodies up to this size leave in the same write as their headers."""


class _PreparedHeaders(HTTPConnection):
    """A urllib3 connection that writes requests with fewer checks and fewer writes.

    ``http.client`` validates and encodes every header of every request (and urllib3 adds its
    own pass); a request here carries about 20, most of them the same on every request, which
    made header writing the largest client-side cost of a small request after the socket
    calls. Lines registered with :func:`prepare_headers` were checked once and are appended
    as they are; every other header goes through the normal, validating ``putheader``. After
    :meth:`hold_head`, the header block and a small body leave in one write.
    Thread safety: like any connection, used by one thread at a time (the pool hands it out).
    """

    _head: bytes | None = None
    _hold_head = False

    def putheader(self, header: str, *values: str) -> None:  # type: ignore[override]  # as urllib3
        if len(values) == 1:
            line = _prepared.get((header, values[0]))
            if line is not None:
                self._output(line)  # type: ignore[attr-defined]
                return
        super().putheader(header, *values)

    def hold_head(self) -> None:
        """Send the next request's header block together with its (small) body, in one write.

        ``http.client`` writes them separately, which costs a system call here and, on the
        server, a second read before the request is complete. Call it only when a body follows.
        """
        self._hold_head = True
        self._head = None

    def send(self, data: Any) -> None:
        if self._hold_head:
            self._hold_head = False
            self._head = bytes(data)  # the header block; the body comes next
            return
        head = self._head
        if head is not None:
            self._head = None
            data = head + bytes(data)
        super().send(data)


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
_ACCEPT_ENCODING = ", ".join(
    part.strip() for part in make_headers(accept_encoding=True)["accept-encoding"].split(",")
)
_BASE_HEADERS = {"Accept-Encoding": _ACCEPT_ENCODING, "User-Agent": USER_AGENT, **_PLATFORM_HEADERS}
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


prepare_headers(_BASE_HEADERS)
prepare_headers({"x-sdk-version": PROTOCOL_VERSION})
for _mime in (_PROTO, _JSON):
    prepare_headers({"Accept": _mime, "Content-Type": _mime})
for _n in range(4):
    prepare_headers({"x-stainless-retry-count": str(_n)})


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
