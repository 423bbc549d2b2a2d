"""``python -m tinker_sync``: the ``tinker-sync`` command line (see :mod:`tinker_sync.cli`).

Usage: ``python -m tinker_sync run list --json``.
"""

from __future__ import annotations

import sys

from tinker_sync.cli import main

if __name__ == "__main__":
    sys.exit(main())
