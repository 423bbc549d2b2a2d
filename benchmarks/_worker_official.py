"""Benchmark worker for the official SDK: ``python _worker_official.py BENCH --url U ...``.

Prints one JSON line ``{"bench", "sdk": "official", "metrics": {...}}``. Imports only ``tinker``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tinker  # noqa: E402
from _common import parse_worker_args  # noqa: E402
from _sdk_rows import main  # noqa: E402

warnings.simplefilter("ignore", FutureWarning)

if __name__ == "__main__":
    main(tinker, "official", parse_worker_args())
