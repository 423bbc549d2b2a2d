"""``from tinker_sync.lib.retry_handler import RetryConfig`` (the official SDK's import path)."""

from tinker_sync._sampling.retry import RetryConfig

__all__ = ["RetryConfig"]
