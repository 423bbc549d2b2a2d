"""zstd ``Content-Encoding`` of forward_backward request bodies (the local server inflates them
in ``tinker_sync.local._wirecodec``).

Usage::

    body, extra_headers = maybe_compress(body, server_config.proto_compress_fwdbwd)

``zstandard`` is optional: without it the client sends plain bodies (the server asked for zstd
only as an option).

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

__all__ = ["maybe_compress"]


def maybe_compress(body: bytes, enabled: bool) -> tuple[bytes, dict[str, str]]:
    """zstd-compress a forward_backward body when the server asked for it and zstd imports.

    Usage: ``body, extra_headers = maybe_compress(body, cfg.proto_compress_fwdbwd)``.

    :returns: the (possibly compressed) body and the headers to add
        (``{"Content-Encoding": "zstd"}`` or ``{}``).
    """
    if not enabled:
        return body, {}
    try:
        import zstandard
    except ImportError:
        return body, {}
    return zstandard.ZstdCompressor().compress(body), {"Content-Encoding": "zstd"}
