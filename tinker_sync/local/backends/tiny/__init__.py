"""The ``tiny`` local backend: a small numpy causal transformer trained through LoRA.

Usage::

    from tinker_sync.local.backends.tiny import TinyBackend
    backend = TinyBackend(seed=0)

Modules: ``model`` (architecture, forward/backward), ``optimizer`` (AdamW), ``sampling``
(KV-cached sampler), ``backend`` (the :class:`TinyBackend` / :class:`TinyModel` pair).
"""

from __future__ import annotations

from tinker_sync.local.backends.tiny.backend import TINY_LOSSES, TinyBackend, TinyModel
from tinker_sync.local.backends.tiny.model import TinyConfig
from tinker_sync.local.backends.tiny.sampling import TinySampler

__all__ = ["TINY_LOSSES", "TinyBackend", "TinyConfig", "TinyModel", "TinySampler"]
