"""zstd ``Content-Encoding`` of request bodies, both directions.

Usage::

    body, extra_headers = maybe_compress(body, server_config.proto_compress_fwdbwd)   # client
    body = decompress_body(raw, headers.get("Content-Encoding"))                       # server

``zstandard`` is optional: without it the client sends plain bodies (the server asked for zstd
only as an option) and a server refuses zstd bodies with :class:`ValueError`.

Thread and fork safety: pure functions without shared state.
"""

from __future__ import annotations

__all__ = ["decompress_body", "maybe_compress"]


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


def decompress_body(body: bytes, content_encoding: str | None, max_size: int = 1 << 31) -> bytes:
    """Undo a request ``Content-Encoding`` (``zstd`` or none / ``identity``); server side.

    Usage: ``body = decompress_body(raw, headers.get("Content-Encoding"))``.

    :param max_size: refuse to inflate beyond this many bytes (a decompression bomb).
    :raises ValueError: an unsupported encoding, a corrupt zstd frame, or an oversized body.
    """
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "zstd":
        raise ValueError(f"unsupported Content-Encoding {content_encoding!r}")
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - zstandard is a test dependency
        raise ValueError("Content-Encoding zstd needs the zstandard package") from exc
    pieces: list[bytes] = []
    total = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            while True:
                piece = reader.read(1 << 20)
                if not piece:
                    break
                total += len(piece)
                if total > max_size:
                    raise ValueError(f"zstd body inflates beyond {max_size} bytes")
                pieces.append(piece)
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupt zstd body: {exc}") from exc
    return b"".join(pieces)
