"""Output helpers of the ``tinker-sync`` CLI: aligned tables, JSON documents, error text.

Usage::

    out = Output(format="table", quiet=False)
    out.table(["Run ID", "Model"], [["r1", "m"]], title="1 training run")
    out.document({"runs": [...]})          # JSON mode: one JSON document on stdout
    out.info("Exporting ...")              # stderr; silent with --quiet or --json

Thread safety: use from the main thread. Fork safety: not applicable.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = [
    "CliError",
    "Output",
    "UsageError",
    "describe_error",
    "format_bool",
    "format_size",
    "format_time",
    "render_table",
]


class CliError(Exception):
    """A failure to report as ``Error: <message>`` (plus details) with exit status 1.

    Thread safety: immutable after construction. Fork safety: plain data.
    """

    exit_code = 1

    def __init__(self, message: str, details: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class UsageError(CliError):
    """Bad command-line usage: exit status 2. Thread and fork safety: as CliError."""

    exit_code = 2


def format_size(size: int | None) -> str:
    """``1536`` -> ``"1.5 KB"`` (1024-based); None -> ``"N/A"``."""
    if size is None:
        return "N/A"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(value) < 1024.0 or unit == "PB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")  # pragma: no cover


def format_time(value: _dt.datetime | None, *, empty: str = "N/A") -> str:
    """A UTC timestamp for tables: ``2024-05-01 12:00:03 UTC``."""
    if value is None:
        return empty
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_bool(value: bool | None) -> str:
    if value is None:
        return "N/A"
    return "Yes" if value else "No"


def render_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [len(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


class Output:
    """Writes command results in the chosen format.

    Thread safety: main thread only. Fork safety: not applicable.
    """

    def __init__(
        self,
        format: str = "table",
        *,
        quiet: bool = False,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.format = format
        self.quiet = quiet
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr

    @property
    def json(self) -> bool:
        return self.format == "json"

    def document(self, doc: Any) -> None:
        """Print one JSON document (only in JSON mode; a no-op otherwise)."""
        if self.json:
            self.stdout.write(json.dumps(doc, indent=2, default=_json_default) + "\n")
            self.stdout.flush()

    def table(
        self, columns: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None
    ) -> None:
        """Print a titled table (table mode only)."""
        if self.json:
            return
        if title:
            self.stdout.write(title + "\n")
        if rows:
            self.stdout.write(render_table(columns, rows) + "\n")
        self.stdout.flush()

    def line(self, text: str) -> None:
        """A result line on stdout (table mode, unless --quiet)."""
        if not self.json and not self.quiet:
            self.stdout.write(text + "\n")
            self.stdout.flush()

    def info(self, text: str) -> None:
        """An informational line on stderr (silent with --quiet or in JSON mode)."""
        if not self.json and not self.quiet:
            self.stderr.write(text + "\n")
            self.stderr.flush()

    def error(
        self, message: str, details: str | None = None, exc: BaseException | None = None
    ) -> None:
        """``Error: <message>`` and the details on stderr (always shown).

        In JSON mode the same goes to stderr as one JSON document:
        ``{"error": {"message", "details", "type", "status_code", "request_id"}}``.
        """
        if self.json:
            shown = details.removeprefix("Details: ") if details else details
            doc: dict[str, Any] = {"message": message, "details": shown}
            if exc is not None:
                doc["type"] = type(exc).__name__
                doc["status_code"] = getattr(exc, "status_code", None)
                doc["request_id"] = getattr(exc, "request_id", None) or _reply_request_id(exc)
            self.stderr.write(json.dumps({"error": doc}, default=str) + "\n")
        else:
            self.stderr.write(f"Error: {message}\n")
            if details:
                self.stderr.write(details.rstrip("\n") + "\n")
        self.stderr.flush()


def _json_default(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")
    return str(value)


def _reply_request_id(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    request_id: str | None = getattr(response, "request_id", None)
    return request_id


def _status_detail(exc: BaseException) -> str:
    """``HTTP 400: <the server's words> (request id ...)``: readable, never a raw dict."""
    from tinker_sync.exceptions import server_words

    response = getattr(exc, "response", None)
    words = server_words(response.content) if response is not None else ""
    status = getattr(exc, "status_code", None)
    text = f"HTTP {status}: {words}" if words else f"HTTP {status}"
    rid = _reply_request_id(exc)
    return f"{text} (request id {rid})" if rid else text


def describe_error(exc: BaseException, *, base_url: str | None = None) -> CliError:
    """A friendly :class:`CliError` for an SDK or OS exception."""
    from tinker_sync import exceptions as e

    if isinstance(exc, CliError):
        return exc
    detail = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, e.APIStatusError):
        detail = _status_detail(exc)
    where = f" at {base_url}" if base_url else ""
    if isinstance(exc, e.NotFoundError):
        return CliError("Resource not found", f"Details: {detail}")
    if isinstance(exc, e.AuthenticationError):
        return CliError(
            "Authentication failed",
            f"Please check your API key (--api-key or TINKER_API_KEY).\nDetails: {detail}",
        )
    if isinstance(exc, e.BillingError):
        return CliError(
            "Billing issue",
            "There is a billing issue with your account. Please check that billing is set up."
            f"\nDetails: {detail}",
        )
    if isinstance(exc, e.PermissionDeniedError):
        return CliError(
            "Permission denied",
            f"You don't have permission to access this resource.\nDetails: {detail}",
        )
    if isinstance(exc, e.BadRequestError):
        return CliError("Invalid request", f"Details: {detail}")
    if isinstance(exc, e.ConflictError):
        return CliError("Conflict", f"Details: {detail}")
    if isinstance(exc, e.UnprocessableEntityError):
        return CliError("Invalid data provided", f"Details: {detail}")
    if isinstance(exc, e.RateLimitError):
        return CliError(
            "Rate limit exceeded", f"Please wait a moment before trying again.\nDetails: {detail}"
        )
    if isinstance(exc, e.InternalServerError):
        return CliError(
            "Internal server error",
            f"The Tinker API encountered an internal error. Please try again later.\n"
            f"Details: {detail}",
        )
    if isinstance(exc, e.APIStatusError):
        return CliError(f"API error (status {exc.status_code})", f"Details: {detail}")
    if isinstance(exc, e.APITimeoutError):
        return CliError(
            "Request timeout", f"The request to the Tinker API{where} timed out.\nDetails: {detail}"
        )
    if isinstance(exc, e.APIConnectionError):
        return CliError(
            "Connection failed",
            f"Could not connect to the Tinker API{where}. Please check your network connection "
            f"and --base-url / TINKER_BASE_URL.\nDetails: {detail}",
        )
    if isinstance(exc, e.APIResponseValidationError):
        return CliError("Unexpected response from the server", f"Details: {detail}")
    if isinstance(exc, e.MissingCredentialsError):
        return CliError(
            "No credentials",
            f"{detail}\nPass --api-key KEY or set TINKER_API_KEY.",
        )
    if isinstance(exc, e.RequestFailedError):
        return CliError("The request failed on the server", f"Details: {detail}")
    if isinstance(exc, e.TinkerError):
        return CliError(detail or type(exc).__name__)
    if isinstance(exc, FileExistsError):
        return CliError(
            f"Target directory already exists: {exc.filename}",
            "Use --force to overwrite or choose a different output directory.",
        )
    if isinstance(exc, OSError):
        return CliError(str(exc))
    if isinstance(exc, ValueError):
        return CliError(f"Invalid argument: {exc}")
    return CliError(f"{type(exc).__name__}: {exc}")
