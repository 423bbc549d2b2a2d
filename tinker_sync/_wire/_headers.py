"""HTTP header names of the protocol that both the client and the local server use.

Usage::

    from tinker_sync._wire._headers import ADVERT_HEADER, HOLD_HEADER

``ADVERT_HEADER`` (``X-Tinker-Poll-Hold-Max: <s>``, on ``client/config`` and poll replies): the
server honours a requested long-poll hold up to ``<s>`` seconds. ``HOLD_HEADER``
(``X-Tinker-Poll-Hold: <s>``, on ``retrieve_future``): the hold the client asks for
(docs/polling.md).

Thread and fork safety: constants only.
"""

from __future__ import annotations

__all__ = ["ADVERT_HEADER", "HOLD_HEADER"]

ADVERT_HEADER = "x-tinker-poll-hold-max"
HOLD_HEADER = "X-Tinker-Poll-Hold"
