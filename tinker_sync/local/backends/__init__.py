"""Model backends of the local server, chosen by name.

Usage: ``backend = get_backend("tiny", seed=0)``.

``base`` holds the interfaces and plain data every backend shares; ``instant`` and ``tiny`` are
the implementations. They import ``base``; ``base`` imports neither, and this factory loads only
the backend asked for.
"""

from __future__ import annotations

from tinker_sync.local.backends.base import Backend

__all__ = ["get_backend"]


def get_backend(name: str, *, seed: int = 0, accept_any_model: bool = True) -> Backend:
    """Return a backend by name (``"instant"`` or ``"tiny"``)."""
    if name == "instant":
        from tinker_sync.local.backends.instant import InstantBackend

        return InstantBackend(seed=seed, accept_any_model=accept_any_model)
    if name == "tiny":
        from tinker_sync.local.backends.tiny import TinyBackend

        return TinyBackend(seed=seed, accept_any_model=accept_any_model)
    raise ValueError(f"unknown backend {name!r}: expected 'instant' or 'tiny'")
