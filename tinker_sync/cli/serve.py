"""``tinker-sync serve``: run the local Tinker server until Ctrl-C (docs/design/surface.md#cli).

Usage::

    tinker-sync serve --port 8000 --backend tiny --fault "asample 429 x2"
    tinker-sync serve --port 0 --json          # one line {"url", "api_key", "pid"} once listening
    python -m tinker_sync.cli.serve --port 0   # the same without the main CLI

Exit codes: 0 after SIGTERM, 130 after Ctrl-C (SIGINT), 1 when the server cannot start,
2 for bad options.

Thread safety: runs in the main thread (signal handlers). Fork safety: not applicable.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

__all__ = ["add_parser", "main", "run"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default 8000; 0 = any free port)"
    )
    parser.add_argument(
        "--backend",
        choices=("instant", "tiny"),
        default="tiny",
        help="model backend (default tiny: a small real numpy LM)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="where checkpoints and the database live (default: a temporary directory, deleted on exit)",
    )
    parser.add_argument(
        "--api-key",
        default=argparse.SUPPRESS,
        metavar="KEY",
        help="the key clients must send (default tml-local)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help='fault rule in compact form, e.g. "asample 429 x2 retry_after=0.5" (repeatable)',
    )
    parser.add_argument(
        "--faults-file",
        default=None,
        metavar="FILE",
        help="JSON list of fault rules (dicts or strings)",
    )
    parser.add_argument(
        "--long-poll",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="how long retrieve_future holds a poll (default 20)",
    )
    parser.add_argument(
        "--client-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a /client/config flag, e.g. sample_use_retrieve_futures=true (repeatable)",
    )
    parser.add_argument(
        "--reject-unknown-models",
        action="store_true",
        help="answer 400 to base model names this server does not know, like the hosted "
        "service (default: serve them with the local model and log a warning)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help='print one JSON line {"url", "api_key", "pid"} once listening',
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve`` on the main CLI's subparsers; ``run`` is set as ``func``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the local Tinker server",
        description="Run the local Tinker server (tinker_sync.local) until Ctrl-C.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def parse_value(text: str) -> Any:
    """JSON-ish value of a ``KEY=VALUE`` option: ``true`` / ``10`` / ``0.5`` / ``[1]``, else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _client_config(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--client-config expects KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_value(value.strip())
    return out


def _faults(specs: Sequence[str], faults_file: str | None) -> list[Any]:
    from tinker_sync.local._faults import parse_fault

    raw: list[Any] = list(specs)
    if faults_file:
        with open(faults_file, encoding="utf-8") as fh:
            data = json.load(fh)
        if isinstance(data, dict) and "faults" in data:
            data = data["faults"]
        if not isinstance(data, list):
            raise ValueError(f"{faults_file}: expected a JSON list of fault rules")
        raw.extend(data)
    return [parse_fault(spec) for spec in raw]


def _wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False)) or getattr(args, "format", None) == "json"


def run(args: argparse.Namespace) -> int:
    """Run the server until SIGINT (exit 130) or SIGTERM (exit 0)."""
    try:
        faults = _faults(args.fault or [], args.faults_file)
        client_config = _client_config(args.client_config or [])
    except (OSError, ValueError, TypeError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"Error: bad port {args.port}", file=sys.stderr)
        return 2

    from tinker_sync.local.server import LocalServer

    api_key = getattr(args, "api_key", None) or "tml-local"
    server = LocalServer(
        args.backend,
        host=args.host,
        port=args.port,
        api_key=api_key,
        data_dir=args.data_dir,
        faults=faults,
        client_config=client_config,
        long_poll_s=args.long_poll,
        accept_any_model=not args.reject_unknown_models,
    )
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        try:
            server.start()
        except OSError as exc:
            print(f"Error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        if _wants_json(args):
            print(json.dumps({"url": server.url, "api_key": api_key, "pid": os.getpid()}))
        else:
            where = (
                str(server.data_dir)
                if args.data_dir
                else f"{server.data_dir} (temporary, deleted on exit)"
            )
            print(f"tinker-sync local server ({args.backend} backend) listening on {server.url}")
            print(f"data dir: {where}")
            if faults:
                print(f"fault rules: {', '.join(f.name for f in faults)}")
            print("Point a client at it with:")
            print(
                f"  export TINKER_BASE_URL={shlex.quote(server.url)}"
                f" TINKER_API_KEY={shlex.quote(api_key)}"
            )
            print("Press Ctrl-C to stop.")
        sys.stdout.flush()
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 130 if received and received[0] == signal.SIGINT else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tinker_sync.cli.serve [options]``."""
    parser = argparse.ArgumentParser(
        prog="tinker-sync serve",
        description="Run the local Tinker server (tinker_sync.local) until Ctrl-C.",
    )
    _add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
