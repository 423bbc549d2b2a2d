"""Benchmark worker for tinker_sync: ``python _worker_ours.py BENCH --url U --key K --size JSON``.

Prints one JSON line ``{"bench", "sdk": "ours", "metrics": {...}}``. Imports only tinker_sync.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import parse_worker_args  # noqa: E402
from _sdk_rows import main  # noqa: E402

import tinker_sync  # noqa: E402

if __name__ == "__main__":
    main(tinker_sync, "ours", parse_worker_args())
