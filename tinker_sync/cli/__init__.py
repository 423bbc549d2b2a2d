"""``tinker-sync``: the command-line interface (also ``python -m tinker_sync``).

Usage::

    tinker-sync run list --limit 0 -c id,model,checkpoint
    tinker-sync --json checkpoint list --run-id RUN          # one JSON document on stdout
    tinker-sync checkpoint download tinker://RUN/weights/final -o ./models
    tinker-sync checkpoint delete --run-id RUN --type weights --before 2024-06-01 -y
    tinker-sync model list qwen
    tinker-sync health --probe               # the tenant's circuit (docs/health.md) and one request
    tinker-sync serve --backend tiny --port 8000
    tinker-sync demo
    tinker-sync exec -- python train.py      # `import tinker` gives tinker_sync (child processes too)

Global options (before or after the command): ``-f/--format table|json``, ``--json``,
``--base-url URL``, ``--api-key KEY`` (else ``TINKER_BASE_URL`` / ``TINKER_API_KEY``),
``-q/--quiet``, ``--version``. Requests are retried at the HTTP level only (4 times, honouring
Retry-After), not in the SDK's submission loop, so failures surface within seconds. Errors go
to stderr as ``Error: <message>`` with details (the server's own words, never a raw dict); with
``--json`` as one JSON document ``{"error": {"message", "details", "type", "status_code",
"request_id"}}``. Exit status: 0 ok, 1 error, 2 usage, 130 interrupted (Ctrl-C).

From Python: ``tinker_sync.cli.main(["run", "list", "--json"]) -> int``.

Thread safety: ``main`` runs in the calling thread; do not run two at once in one process
(they share stdout). Fork safety: not applicable.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]

_DEMO_MODULE = "tinker_sync.cli.demo"
_SHARED_DESTS = frozenset({"format", "json", "base_url", "api_key", "quiet"})


def _add_global_options(parser: argparse.ArgumentParser, *, leaf: bool) -> None:
    """The global options; on sub-commands they default to SUPPRESS so the top level wins."""

    def add(*flags: str, **kwargs: Any) -> None:
        if leaf:
            kwargs["default"] = argparse.SUPPRESS
        try:
            parser.add_argument(*flags, **kwargs)
        except argparse.ArgumentError:
            pass  # the sub-command defines this flag itself (serve --json, demo --base-url)

    add(
        "-f",
        "--format",
        choices=("table", "json"),
        default="table",
        help="output format (default table)",
    )
    add("--json", action="store_true", default=False, help="shorthand for --format json")
    add(
        "--base-url",
        default=None,
        metavar="URL",
        help="Tinker API URL (default: TINKER_BASE_URL, then the hosted service)",
    )
    add("--api-key", default=None, metavar="KEY", help="API key (default: TINKER_API_KEY)")
    add(
        "-q",
        "--quiet",
        action="store_true",
        default=False,
        help="no progress bars or informational messages",
    )


def _add_leaf_options(parser: argparse.ArgumentParser) -> None:
    _add_global_options(parser, leaf=True)


def _register_serve(subparsers: Any) -> None:
    from tinker_sync.cli import serve

    parser = serve.add_parser(subparsers)
    parser.set_defaults(handler=None, command_name="serve")
    _add_leaf_options(parser)


def _register_demo(subparsers: Any, *, full: bool) -> None:
    """``demo`` delegates to ``tinker_sync.cli.demo`` (``add_arguments``, ``run``) when present.

    The module is imported only when the command line names ``demo`` (keeps start-up cheap).
    """
    help_text = "run the quickstart against a local or given server"
    if not full:
        subparsers.add_parser("demo", help=help_text, add_help=False)
        return
    try:
        found = importlib.util.find_spec(_DEMO_MODULE) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        parser = subparsers.add_parser("demo", help=help_text, add_help=False)
        parser.add_argument("rest", nargs=argparse.REMAINDER)
        parser.set_defaults(
            demo_error="the demo is not available in this installation "
            f"(module {_DEMO_MODULE} is missing)"
        )
        return
    demo = importlib.import_module(_DEMO_MODULE)
    parser = subparsers.add_parser("demo", help=help_text, description=help_text)
    demo.add_arguments(parser)
    for action in parser._actions:  # let the global --json/--base-url/--api-key reach the demo
        if action.dest in _SHARED_DESTS:
            action.default = argparse.SUPPRESS
    parser.set_defaults(handler=None, command_name="demo", demo_run=demo.run)
    _add_leaf_options(parser)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser. ``argv`` only decides whether the ``demo`` module is imported."""
    from tinker_sync.cli._commands import register

    parser = argparse.ArgumentParser(
        prog="tinker-sync",
        description="Command-line tools for the Tinker API and the local tinker_sync server.",
    )
    _add_global_options(parser, leaf=False)
    parser.add_argument(
        "--version", action="version", version=_version_text(), help="print the version and exit"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(subparsers, _add_leaf_options)
    _register_serve(subparsers)
    subparsers.add_parser(
        "exec",
        help="run a command with `import tinker` resolved to tinker_sync",
        add_help=False,
    )
    _register_demo(subparsers, full="demo" in argv)
    return parser


def _version_text() -> str:
    from tinker_sync import __protocol_version__, __version__

    return f"tinker-sync {__version__} (protocol {__protocol_version__})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 error, 2 usage, 130 interrupted)."""
    from tinker_sync.cli._commands import Context
    from tinker_sync.cli._output import Output, describe_error

    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["exec"]:  # the child command's own flags are not ours to parse
        from tinker_sync.cli._exec import run

        return run(args_list[1:])
    parser = build_parser(args_list)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    fmt = "json" if getattr(args, "json", False) else getattr(args, "format", "table")
    args.format = fmt
    args.json = fmt == "json"
    out = Output(fmt, quiet=bool(getattr(args, "quiet", False)))
    demo_error = getattr(args, "demo_error", None)
    if demo_error:
        out.error(demo_error)
        return 1
    ctx = Context(args, out)
    try:
        try:
            if args.command == "serve":
                from tinker_sync.cli import serve

                return int(serve.run(args))
            if args.command == "demo":
                return int(args.demo_run(args))
            status: int = args.handler(args, ctx)
            return status
        except KeyboardInterrupt:
            ctx.failed = True
            raise
        except Exception as exc:
            ctx.failed = True
            problem = describe_error(exc, base_url=_safe_base_url(ctx))
            out.error(problem.message, problem.details, exc)
            return problem.exit_code
        finally:
            _close_quietly(ctx, out)
    except KeyboardInterrupt:
        sys.stderr.write("\nInterrupted.\n")
        return 130


def _safe_base_url(ctx: Any) -> str | None:
    try:
        url: str = ctx.resolved_base_url()
    except Exception:
        return None
    return url


def _close_quietly(ctx: Any, out: Any) -> None:
    try:
        ctx.close()
    except Exception as exc:  # closing must not hide the command's own outcome
        from tinker_sync.cli._output import describe_error

        if not out.quiet:
            out.stderr.write(f"Warning: {describe_error(exc).message}\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
