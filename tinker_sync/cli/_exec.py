"""``tinker-sync exec``: run a command with ``import tinker`` resolved to tinker_sync.

Usage::

    tinker-sync exec -- python train.py --lr 1e-4
    eval "$(tinker-sync exec --print-env)"      # for launchers you cannot wrap (POSIX shells)

On POSIX the command replaces this process (``exec``, as ``env`` does), so it keeps the pid, and
every signal (SIGTERM from ``timeout``, systemd, docker or Kubernetes, Ctrl-C, SIGHUP, SIGUSR1)
and the exit status are the command's own. Its environment turns the alias on at every Python
start-up (``TINKER_SYNC_ALIAS=1`` plus the hook directory first on ``PYTHONPATH``), so worker
processes started with spawn or forkserver get it too. Exit status: the command's own, 127 when
the command is not found, 126 when it cannot be run, 2 for usage errors. Elsewhere (Windows) the
command runs as a child process and its exit status is passed through.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

USAGE = "usage: tinker-sync exec [--print-env] [--] COMMAND [ARG ...]"


def run(argv: Sequence[str]) -> int:
    """Run ``argv`` (after an optional ``--``) with the alias on; returns its exit status."""
    from tinker_sync._alias import ENV_VAR, child_env

    args = list(argv)
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(f"{USAGE}\n\n{__doc__}")
        return 0
    if args[:1] == ["--print-env"]:
        env = child_env()
        for name in (ENV_VAR, "PYTHONPATH"):
            sys.stdout.write(f"export {name}={shlex.quote(env[name])}\n")
        return 0
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write(f"{USAGE}\nError: no command given\n")
        return 2
    env = child_env()
    if os.name == "posix":
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvpe(args[0], args, env)  # returns only when the command could not start
        except FileNotFoundError:
            sys.stderr.write(f"Error: command not found: {args[0]}\n")
            return 127
        except OSError as exc:
            sys.stderr.write(f"Error: cannot run {args[0]}: {exc.strerror or exc}\n")
            return 126
    try:
        proc = subprocess.Popen(args, env=env)
    except FileNotFoundError:
        sys.stderr.write(f"Error: command not found: {args[0]}\n")
        return 127
    while True:
        try:
            status = proc.wait()
            break
        except KeyboardInterrupt:
            continue  # the child got the same Ctrl-C (same console); wait for it
    return status
