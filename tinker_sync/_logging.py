"""``TINKER_LOG``: the SDK's opt-in log output (docs/design/behavior.md#logging).

Usage::

    configure_logging_from_env()      # when a Session is built, never at import
    parse_log_level("DEBUG")          # -> "debug"; anything but debug / info -> None

``TINKER_LOG=debug|info`` attaches one stderr handler to the ``tinker_sync`` and ``urllib3``
loggers (records carrying ``session_id`` / ``model_id`` / ``request_id`` show them). Unset or
another value changes nothing; no other logger (the root included) is touched.

Thread safety: idempotent; a handler is added at most once per logger. Fork safety: no state.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["LEVELS", "configure_logging_from_env", "parse_log_level"]

#: ``TINKER_LOG`` values and their logging levels.
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO}
_HANDLER_NAME = "tinker_sync-TINKER_LOG"


def parse_log_level(value: str | None) -> str | None:
    """``"debug"`` or ``"info"`` (any case, surrounding blanks ignored); None for anything else."""
    level = (value or "").strip().lower()
    return level if level in LEVELS else None


class _ContextFormatter(logging.Formatter):
    """Appends ``session_id`` / ``model_id`` / ``request_id`` when a record carries them."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = [
            f"{key}={value}"
            for key in ("session_id", "model_id", "request_id")
            if (value := getattr(record, key, None))
        ]
        return f"{text} [{' '.join(ids)}]" if ids else text


def configure_logging_from_env() -> None:
    """Honour ``TINKER_LOG=debug|info``: one stderr handler on ``tinker_sync`` and ``urllib3``.

    Repeated calls add no second handler.
    """
    name = parse_log_level(os.environ.get("TINKER_LOG"))
    if name is None:
        return
    level = LEVELS[name]
    formatter = _ContextFormatter("[%(asctime)s - %(name)s:%(lineno)d - %(levelname)s] %(message)s")
    for logger_name in ("tinker_sync", "urllib3"):
        logger = logging.getLogger(logger_name)
        if not any(h.get_name() == _HANDLER_NAME for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.set_name(_HANDLER_NAME)
            handler.setFormatter(formatter)
            logger.addHandler(handler)
        logger.setLevel(level)
