"""age encryption of external weight exports (``save_weights_external(age_encryption_recipients)``).

Usage::

    recipients = age_recipients(["age1..."])           # HttpError 400 on a bad key / no pyrage
    files = encrypt_files(model.export_files(), recipients)   # {"adapter.safetensors.age": ...}

Each file is encrypted to every recipient and stored under its name plus ``.age``, the layout
the official service uses (clients decrypt with ``age -d`` or pyrage). Needs ``pyrage``, in the
``server`` extra; without it, an encrypted export is refused with a 400 naming the extra.

Thread safety: pure functions. Fork safety: no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tinker_sync.local._body import HttpError

AGE_SUFFIX = ".age"


def age_recipients(keys: Sequence[str] | None) -> list[Any]:
    """Parse X25519 age public keys (``age1...``); empty for None or []."""
    if not keys:
        return []
    try:
        import pyrage
    except ImportError:
        raise HttpError(
            400,
            "age_encryption_recipients: encrypted exports need pyrage on the local server "
            "(pip install 'tinker-sync[server]')",
        ) from None
    out = []
    for i, key in enumerate(keys):
        try:
            out.append(pyrage.x25519.Recipient.from_str(key))
        except Exception as exc:
            raise HttpError(
                400,
                f"age_encryption_recipients[{i}]: not an X25519 age public key ({exc})",
            ) from None
    return out


def encrypt_files(files: Mapping[str, bytes], recipients: Sequence[Any]) -> dict[str, bytes]:
    """Every file encrypted to ``recipients``, renamed ``<name>.age``."""
    import pyrage

    return {
        name + AGE_SUFFIX: pyrage.encrypt(data, list(recipients)) for name, data in files.items()
    }
