"""First imports a signal handler cannot turn into a missing module (``_runtime.imports``).

Each case runs in a fresh interpreter, where ``tinker_sync.rest_client`` is not loaded yet. A
finder placed first on ``sys.meta_path`` reports the module missing a given number of times:
what importlib reports after a signal handler's ``OSError`` (an alarm's ``TimeoutError``)
lands in its file lookup and is taken for "no such file".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tinker_sync._runtime.imports import IMPORT_ATTEMPTS

_CHILD = r"""
import json, sys
from tinker_sync._runtime.imports import imported

class LosesLookups:
    def __init__(self, name, times):
        self.name, self.left, self.seen = name, times, 0
    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            self.seen += 1
            if self.left:
                self.left -= 1
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None

how, name, times = sys.argv[1], sys.argv[2], int(sys.argv[3])
finder = LosesLookups(name, times)
sys.meta_path.insert(0, finder)
try:
    if how == "plain":
        __import__(name)
    else:
        imported(name)
    outcome = "loaded" if name in sys.modules else "not loaded"
except ModuleNotFoundError as exc:
    outcome = f"ModuleNotFoundError: {exc.name}"
print(json.dumps({"outcome": outcome, "lookups": finder.seen}))
"""


def child(script: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """What a fresh interpreter running ``script`` printed (one JSON value)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return json.loads(proc.stdout)


def run(how: str, name: str, times: int) -> dict[str, object]:
    result: dict[str, object] = child(_CHILD, how, name, str(times))
    return result


REST = "tinker_sync.rest_client"


def test_a_lost_lookup_fails_a_plain_import_of_a_module_that_exists() -> None:
    # the failure imported() exists for (the alarm storm of tests/test_signals.py saw it once)
    assert run("plain", REST, 1) == {"outcome": f"ModuleNotFoundError: {REST}", "lookups": 1}


@pytest.mark.parametrize("lost", [1, IMPORT_ATTEMPTS - 1])
def test_imported_loads_a_module_of_the_package_after_lost_lookups(lost: int) -> None:
    assert run("imported", REST, lost) == {"outcome": "loaded", "lookups": lost + 1}


def test_imported_gives_up_after_its_attempts() -> None:
    assert run("imported", REST, IMPORT_ATTEMPTS) == {
        "outcome": f"ModuleNotFoundError: {REST}",
        "lookups": IMPORT_ATTEMPTS,
    }


def test_a_missing_module_of_another_package_is_raised_at_once() -> None:
    # an optional extra that is not installed: no second look
    name = "tinker_sync_tests_absent_extra"
    assert run("imported", name, 0) == {"outcome": f"ModuleNotFoundError: {name}", "lookups": 1}


def test_a_loaded_module_is_not_looked_up_again() -> None:
    assert run("imported", "tinker_sync", IMPORT_ATTEMPTS) == {"outcome": "loaded", "lookups": 0}


_RACE_CHILD = r"""
import json, sys, threading
sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
from tinker_sync import types
barrier, errors = threading.Barrier(16), []
def first_use():
    barrier.wait()
    try:
        types.CreateModelResponse  # its module loads on first use
    except BaseException as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
threads = [threading.Thread(target=first_use) for _ in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(errors))
"""


def test_threads_racing_on_a_first_use_wait_for_the_module_to_finish(tmp_path: Path) -> None:
    """16 threads reach a lazily loaded type at once in a fresh interpreter that must compile
    its modules: none sees the module half made (a bare ``sys.modules`` lookup returned it while
    another thread was still running it: "partially initialized module")."""
    for run in range(3):
        env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path / str(run))}  # nothing compiled
        errors = child(_RACE_CHILD, env=env)
        assert errors == [], errors
