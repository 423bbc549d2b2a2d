"""The opt-in ``tinker`` alias, in real subprocesses (start-up hooks only run there).

``tinker-sync exec -- python ...`` must make ``tinker.X`` *be* ``tinker_sync.X`` in the program
and in its spawn / forkserver workers, with the official package installed side by side, and
must leave every other process alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120


def run_python(
    code: str, *, alias: bool, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), base.get("PYTHONPATH", "")] if p)
    cmd = [sys.executable, str(script)]
    if alias:
        cmd = [sys.executable, "-m", "tinker_sync", "exec", "--", *cmd]
    return subprocess.run(
        cmd, env=base, capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path
    )


def official_installed() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("tinker")
    except PackageNotFoundError:
        return False
    return True


def test_off_by_default_import_tinker_is_not_tinker_sync(tmp_path: Path) -> None:
    proc = run_python(
        """
        import sys
        try:
            import tinker
        except ModuleNotFoundError:
            print("absent")
        else:
            print("same" if tinker is sys.modules.get("tinker_sync") else "other")
        print("tinker_sync" in sys.modules)
        """,
        alias=False,
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split()
    assert first == ("other" if official_installed() else "absent")
    assert second == "False"  # nothing was imported behind the program's back


def test_every_tinker_sync_module_is_the_same_object_under_the_tinker_name(
    tmp_path: Path,
) -> None:
    proc = run_python(
        """
        import importlib, pickle, pkgutil, sys
        import tinker
        import tinker_sync
        from tinker import types
        from tinker_sync import types as sync_types
        assert tinker is tinker_sync
        names = [m.name for m in pkgutil.walk_packages(tinker_sync.__path__, "tinker_sync.")
                 if "._" not in m.name and ".local" not in m.name and ".cli" not in m.name]
        for name in names:
            real = importlib.import_module(name)
            alias = importlib.import_module("tinker" + name[len("tinker_sync"):])
            assert alias is real, name
            assert real.__name__ == name and real.__spec__.name == name, name
        datum = types.Datum(
            model_input=types.ModelInput.from_ints([1, 2, 3]),
            loss_fn_inputs={"target_tokens": [2, 3, 4]},
        )
        assert isinstance(datum, sync_types.Datum)
        assert isinstance(pickle.loads(pickle.dumps(datum)), types.Datum)
        assert tinker.ServiceClient is tinker_sync.ServiceClient
        try:
            import tinker.no_such_module
        except ModuleNotFoundError as exc:
            assert "tinker_sync.no_such_module" in str(exc), exc
        else:
            raise AssertionError("tinker.no_such_module imported")
        import importlib.metadata as md
        print(len(names), md.version("tinker") if md.packages_distributions().get("tinker")
              else "no-official")
        """,
        alias=True,
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    count, official = proc.stdout.split()
    assert int(count) >= 5
    if official_installed():
        # side by side with the official package, the alias still wins
        assert official == "0.38.0"


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_started_with_spawn_or_forkserver_get_the_alias(
    tmp_path: Path, method: str
) -> None:
    proc = run_python(
        f"""
        import multiprocessing as mp
        import sys

        def worker(datum):
            import tinker
            import tinker_sync
            same = tinker is tinker_sync and type(datum) is tinker.types.Datum
            return same, tinker.types.ModelInput.from_ints([7, 8]).to_ints()

        if __name__ == "__main__":
            import tinker
            datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([1]),
                                       loss_fn_inputs={{}})
            with mp.get_context("{method}").Pool(1) as pool:
                same, ints = pool.apply(worker, (datum,))
            print(same, ints)
        """,
        alias=True,
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True [7, 8]"


def test_a_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site_dir)
    proc = run_python(
        """
        import os, sys
        import tinker
        print(os.environ.get("CHAINED"), tinker is sys.modules["tinker_sync"])
        """,
        alias=True,
        tmp_path=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "True"]


def test_installing_after_the_official_package_was_imported_is_refused(tmp_path: Path) -> None:
    if not official_installed():
        pytest.skip("needs the official tinker package")
    proc = run_python(
        """
        import tinker
        from tinker_sync._alias import install
        install()
        """,
        alias=False,
        tmp_path=tmp_path,
    )
    assert proc.returncode == 1
    assert "RuntimeError: cannot alias tinker to tinker_sync: 'tinker' is already imported" in (
        proc.stderr
    )


def test_exec_passes_the_exit_status_and_reports_a_missing_command(tmp_path: Path) -> None:
    proc = run_python("raise SystemExit(7)", alias=True, tmp_path=tmp_path)
    assert proc.returncode == 7
    env = dict(os.environ, PYTHONPATH=str(REPO))
    missing = subprocess.run(
        [sys.executable, "-m", "tinker_sync", "exec", "--", "no-such-command-xyz"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert missing.returncode == 127
    assert "command not found: no-such-command-xyz" in missing.stderr
    printed = subprocess.run(
        [sys.executable, "-m", "tinker_sync", "exec", "--print-env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert printed.returncode == 0
    assert "export TINKER_SYNC_ALIAS=1\n" in printed.stdout
    assert "_alias_boot" in printed.stdout
