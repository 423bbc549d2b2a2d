"""tinker_sync: a sync-first, thread-pool Python SDK for the Tinker fine-tuning API."""

from tinker_sync._version import __version__

__title__ = "tinker_sync"
__protocol_version__ = "0.38.0"
