"""Startup hook of the ``tinker`` alias, put on ``PYTHONPATH`` by ``tinker-sync exec``.

With ``TINKER_SYNC_ALIAS=1`` it makes ``import tinker`` resolve to tinker_sync in this process
(see ``tinker_sync._alias``). Then it steps aside: it leaves ``sys.path`` and runs the
``sitecustomize`` module it shadows, if there is one, so site hooks keep working.
"""

import importlib
import os
import sys


def _boot() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != here]
    if os.environ.get("TINKER_SYNC_ALIAS", "") == "1":
        try:
            from tinker_sync._alias import install
        except ImportError as exc:
            sys.stderr.write(
                f"tinker-sync: TINKER_SYNC_ALIAS=1 but tinker_sync cannot be imported ({exc}); "
                "`import tinker` is not aliased in this process\n"
            )
        else:
            install()
    me = sys.modules.pop(__name__)
    try:
        importlib.import_module("sitecustomize")  # the module this one shadows
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        sys.modules[__name__] = me


_boot()
