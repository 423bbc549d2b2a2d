"""The ``run``, ``checkpoint``, ``model``, ``health`` and ``version`` commands of ``tinker-sync``.

Usage: registered by :func:`tinker_sync.cli.build_parser`; each handler takes the parsed
arguments and a :class:`Context` and returns the exit status.

Thread safety: main thread only. Fork safety: not applicable.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinker_sync.cli._output import (
    CliError,
    Output,
    UsageError,
    describe_error,
    format_bool,
    format_size,
    format_time,
)

if TYPE_CHECKING:
    from tinker_sync._paths import CheckpointPath
    from tinker_sync.rest_client import RestClient
    from tinker_sync.service_client import ServiceClient
    from tinker_sync.types import Checkpoint, TrainingRun

__all__ = ["Context", "register"]

PAGE_SIZE = 100
CLI_MAX_RETRIES = 4
"""HTTP-level retries per CLI request (about 7 s of backoff at most, Retry-After aside)."""
PATH_HINT = "Checkpoint paths look like tinker://<run-id>/weights/<name>"


class Context:
    """Per-invocation state: output settings and lazily built clients (closed by ``close``).

    Thread safety: main thread only. Fork safety: not applicable.
    """

    def __init__(self, args: argparse.Namespace, out: Output) -> None:
        self.args = args
        self.out = out
        self.base_url: str | None = getattr(args, "base_url", None)
        self.api_key: str | None = getattr(args, "api_key", None)
        self._rest: RestClient | None = None
        self._service: ServiceClient | None = None
        self.failed = False

    def rest(self) -> RestClient:
        if self._rest is None:
            from tinker_sync.rest_client import RestClient

            # Fail fast: HTTP-level retries only, not the submission loop.
            self._rest = RestClient(
                base_url=self.base_url,
                api_key=self.api_key,
                max_retries=CLI_MAX_RETRIES,
                _submission_loop=False,
            )
        return self._rest

    def service(self) -> ServiceClient:
        if self._service is None:
            from tinker_sync.service_client import ServiceClient

            self._service = ServiceClient(base_url=self.base_url, api_key=self.api_key)
        return self._service

    def resolved_base_url(self) -> str:
        from tinker_sync._config import resolve_base_url

        return resolve_base_url(self.base_url)

    def close(self) -> None:
        if self._rest is not None:
            self._rest.close()
        if self._service is not None:
            self._service.close("errored" if self.failed else "success")


Handler = Callable[[argparse.Namespace, Context], int]


def _parse_path(path: str) -> CheckpointPath:
    from tinker_sync._paths import parse_checkpoint_path

    try:
        return parse_checkpoint_path(path)
    except ValueError as exc:
        raise UsageError(f"Invalid checkpoint path: {exc}", PATH_HINT) from None


def _dump(obj: Any) -> dict[str, Any]:
    data: dict[str, Any] = obj.model_dump(mode="json")
    return data


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (0 = all)")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def parse_when(text: str) -> _dt.datetime:
    """ISO 8601 date or datetime; naive values and bare dates are UTC."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        when = _dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid date {text!r}; use ISO 8601, e.g. 2024-01-01 or 2024-01-01T08:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when


def _more(title: str, total: int | None, shown: int) -> str:
    if total is not None and total > shown:
        return f"{title} ({total - shown} more not shown, use --limit to see more)"
    return title


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


def _lora(run: TrainingRun) -> str:
    if not run.is_lora:
        return "No"
    return f"Rank {run.lora_rank}" if run.lora_rank else "Yes"


RUN_COLUMNS: dict[str, tuple[str, Callable[[TrainingRun], str]]] = {
    "id": ("Run ID", lambda r: r.training_run_id),
    "model": ("Base Model", lambda r: r.base_model),
    "owner": ("Owner", lambda r: r.model_owner),
    "lora": ("LoRA", _lora),
    "updated": ("Last Update", lambda r: format_time(r.last_request_time)),
    "status": ("Status", lambda r: "Failed" if r.corrupted else "OK"),
    "checkpoint": (
        "Last Checkpoint",
        lambda r: r.last_checkpoint.checkpoint_id if r.last_checkpoint else "None",
    ),
    "checkpoint_time": (
        "Checkpoint Time",
        lambda r: format_time(r.last_checkpoint.time) if r.last_checkpoint else "N/A",
    ),
}
DEFAULT_RUN_COLUMNS = ("id", "model", "lora", "updated", "status")


def _columns(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in RUN_COLUMNS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown column(s): {', '.join(unknown) or '(none given)'}; "
            f"available: {','.join(RUN_COLUMNS)}"
        )
    return names


def cmd_run_list(args: argparse.Namespace, ctx: Context) -> int:
    rest = ctx.rest()
    limit: int = args.limit
    runs: list[TrainingRun] = []
    total: int | None = None
    while limit == 0 or len(runs) < limit:
        want = PAGE_SIZE if limit == 0 else min(PAGE_SIZE, limit - len(runs))
        page = rest.list_training_runs(limit=want, offset=len(runs)).result()
        runs.extend(page.training_runs)
        total = page.cursor.total_count
        if len(page.training_runs) < want or len(runs) >= total:
            break
    ctx.out.document({"runs": [_dump(r) for r in runs], "total_count": total})
    columns: list[str] = args.columns or list(DEFAULT_RUN_COLUMNS)
    title = (
        "No training runs found"
        if not runs
        else _more(_plural(len(runs), "training run"), total, len(runs))
    )
    ctx.out.table(
        [RUN_COLUMNS[c][0] for c in columns],
        [[RUN_COLUMNS[c][1](r) for c in columns] for r in runs],
        title=title,
    )
    return 0


def _run_rows(run: TrainingRun) -> list[list[str]]:
    rows = [
        ["Run ID", run.training_run_id],
        ["Base Model", run.base_model],
        ["Owner", run.model_owner],
        ["LoRA", f"Yes (Rank {run.lora_rank})" if run.is_lora and run.lora_rank else _lora(run)],
        ["Last Update", format_time(run.last_request_time)],
        ["Status", "Failed" if run.corrupted else "OK"],
    ]
    for label, ckpt in (
        ("Last Training Checkpoint", run.last_checkpoint),
        ("Last Sampler Checkpoint", run.last_sampler_checkpoint),
    ):
        if ckpt is None:
            rows.append([label, "None"])
            continue
        rows.append([label, ckpt.checkpoint_id])
        rows.append(["  - Time", format_time(ckpt.time)])
        rows.append(["  - Path", ckpt.tinker_path])
    for key, value in (run.user_metadata or {}).items():
        rows.append([f"Metadata: {key}", value])
    return rows


def cmd_run_info(args: argparse.Namespace, ctx: Context) -> int:
    run = ctx.rest().get_training_run(args.run_id).result()
    ctx.out.document(_dump(run))
    ctx.out.table(
        ["Property", "Value"], _run_rows(run), title=f"Training run: {run.training_run_id}"
    )
    return 0


# --------------------------------------------------------------------------------------------
# checkpoint
# --------------------------------------------------------------------------------------------

CHECKPOINT_COLUMNS = ["Checkpoint ID", "Type", "Size", "Public", "Created", "Expires", "Path"]


def _checkpoint_row(c: Checkpoint) -> list[str]:
    return [
        c.checkpoint_id,
        c.checkpoint_type,
        format_size(c.size_bytes),
        format_bool(c.public),
        format_time(c.time),
        format_time(c.expires_at, empty="Never"),
        c.tinker_path,
    ]


def cmd_checkpoint_list(args: argparse.Namespace, ctx: Context) -> int:
    rest = ctx.rest()
    limit: int = args.limit
    total: int | None
    if args.run_id:
        checkpoints = list(rest.list_checkpoints(args.run_id).result().checkpoints)
        total = len(checkpoints)
        if limit:
            checkpoints = checkpoints[:limit]
        doc: dict[str, Any] = {"run_id": args.run_id}
        title = (
            f"No checkpoints found for run {args.run_id}"
            if not checkpoints
            else _more(
                f"{_plural(len(checkpoints), 'checkpoint')} for run {args.run_id}",
                total,
                len(checkpoints),
            )
        )
    else:
        checkpoints = []
        total = None
        while limit == 0 or len(checkpoints) < limit:
            want = PAGE_SIZE if limit == 0 else min(PAGE_SIZE, limit - len(checkpoints))
            page = rest.list_user_checkpoints(limit=want, offset=len(checkpoints)).result()
            checkpoints.extend(page.checkpoints)
            total = page.cursor.total_count if page.cursor is not None else None
            if len(page.checkpoints) < want or (total is not None and len(checkpoints) >= total):
                break
        doc = {}
        title = (
            "No checkpoints found"
            if not checkpoints
            else _more(_plural(len(checkpoints), "checkpoint"), total, len(checkpoints))
        )
    doc["checkpoints"] = [_dump(c) for c in checkpoints]
    doc["total_count"] = total
    ctx.out.document(doc)
    ctx.out.table(CHECKPOINT_COLUMNS, [_checkpoint_row(c) for c in checkpoints], title=title)
    return 0


def _find_checkpoint(ctx: Context, path: str) -> tuple[Checkpoint, CheckpointPath]:
    parsed = _parse_path(path)
    listing = ctx.rest().list_checkpoints(parsed.training_run_id).result()
    for ckpt in listing.checkpoints:
        if ckpt.tinker_path == path:
            return ckpt, parsed
    raise CliError(f"Checkpoint not found: {path}")


def cmd_checkpoint_info(args: argparse.Namespace, ctx: Context) -> int:
    ckpt, parsed = _find_checkpoint(ctx, args.checkpoint_path)
    run = ctx.rest().get_training_run(parsed.training_run_id).result()
    doc = _dump(ckpt)
    doc["training_run"] = _dump(run)
    ctx.out.document(doc)
    rows = [
        ["Checkpoint ID", ckpt.checkpoint_id],
        ["Type", ckpt.checkpoint_type],
        ["Tinker Path", ckpt.tinker_path],
        ["Size", format_size(ckpt.size_bytes)],
        ["Public", format_bool(ckpt.public)],
        ["Created", format_time(ckpt.time)],
        ["Expires", format_time(ckpt.expires_at, empty="Never")],
        ["Training Run ID", run.training_run_id],
        ["Base Model", run.base_model],
        ["LoRA", f"Yes (Rank {run.lora_rank})" if run.is_lora and run.lora_rank else _lora(run)],
    ]
    for key, value in (ckpt.user_metadata or {}).items():
        rows.append([f"Metadata: {key}", value])
    ctx.out.table(["Property", "Value"], rows, title=f"Checkpoint: {ckpt.checkpoint_id}")
    return 0


def cmd_checkpoint_publish(args: argparse.Namespace, ctx: Context) -> int:
    path: str = args.checkpoint_path
    publish = args.command_name == "publish"
    ckpt, _ = _find_checkpoint(ctx, path)
    state = "public" if publish else "private"
    changed = ckpt.public != publish
    if changed:
        rest = ctx.rest()
        if publish:
            rest.publish_checkpoint_from_tinker_path(path).result()
        else:
            rest.unpublish_checkpoint_from_tinker_path(path).result()
    ctx.out.document({"tinker_path": path, "public": publish, "changed": changed})
    if changed:
        ctx.out.line(f"{'Published' if publish else 'Unpublished'} {path}")
    else:
        ctx.out.line(f"{path} is already {state}")
    return 0


def cmd_checkpoint_set_ttl(args: argparse.Namespace, ctx: Context) -> int:
    path: str = args.checkpoint_path
    _parse_path(path)
    ttl: int | None = None if args.remove else args.ttl
    ctx.rest().set_checkpoint_ttl_from_tinker_path(path, ttl).result()
    ctx.out.document({"tinker_path": path, "ttl_seconds": ttl})
    if ttl is None:
        ctx.out.line(f"Removed the expiry of {path}")
    else:
        ctx.out.line(f"{path} now expires in {ttl} seconds")
    return 0


_TYPE_OF = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}


def _confirm(ctx: Context, prompt: str) -> bool:
    ctx.out.stderr.write(prompt)
    ctx.out.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def cmd_checkpoint_delete(args: argparse.Namespace, ctx: Context) -> int:
    paths: list[str] = list(args.paths)
    has_filters = args.type is not None or args.before is not None or args.after is not None
    if has_filters and not args.run_id:
        raise UsageError("--type, --before and --after need --run-id")
    if paths and args.run_id:
        raise UsageError("Checkpoint paths and --run-id are mutually exclusive")
    if not paths and not args.run_id:
        raise UsageError(
            "Specify checkpoint paths or --run-id",
            "Examples:\n  tinker-sync checkpoint delete tinker://<run-id>/weights/<name>\n"
            "  tinker-sync checkpoint delete --run-id <run-id> --type weights --before 2024-06-01",
        )
    rest = ctx.rest()
    selected: list[Checkpoint] | None = None
    if args.run_id:
        checkpoints = rest.list_checkpoints(args.run_id).result().checkpoints
        selected = [
            c
            for c in checkpoints
            if (args.type is None or c.checkpoint_type == _TYPE_OF[args.type])
            and (args.before is None or c.time < args.before)
            and (args.after is None or c.time > args.after)
        ]
        paths = [c.tinker_path for c in selected]
        if not paths:
            ctx.out.document({"deleted_count": 0, "deleted": [], "failed": []})
            ctx.out.line(f"No checkpoints of run {args.run_id} match the filters")
            return 0
    else:
        for path in paths:
            _parse_path(path)
        paths = list(dict.fromkeys(paths))
    if not args.yes:
        err = ctx.out.stderr
        err.write(f"Will delete {_plural(len(paths), 'checkpoint')}:\n")
        if selected is not None:
            for c in selected:
                err.write(
                    f"  - {c.tinker_path} ({format_size(c.size_bytes)}, created "
                    f"{format_time(c.time)})\n"
                )
            total_size = sum(c.size_bytes or 0 for c in selected)
            err.write(f"Total size: {format_size(total_size)}\n")
        else:
            for path in paths:
                err.write(f"  - {path}\n")
        err.write("WARNING: this cannot be undone.\n")
        if not _confirm(ctx, f"Delete {_plural(len(paths), 'checkpoint')}? [y/N] "):
            raise CliError("Deletion cancelled.")
    futures = [(p, rest.delete_checkpoint_from_tinker_path(p)) for p in paths]
    deleted: list[str] = []
    failed: list[dict[str, str]] = []
    for path, fut in futures:
        try:
            fut.result()
        except Exception as exc:
            problem = describe_error(exc)
            failed.append({"tinker_path": path, "error": problem.message})
        else:
            deleted.append(path)
    ctx.out.document({"deleted_count": len(deleted), "deleted": deleted, "failed": failed})
    ctx.out.line(f"Deleted {_plural(len(deleted), 'checkpoint')}")
    for item in failed:
        ctx.out.error(f"could not delete {item['tinker_path']}: {item['error']}")
    return 1 if failed else 0


class _Bar:
    """A tqdm byte progress bar (with speed) driven by ``(done, total)`` callbacks; download
    events (archive being created, resumed at N bytes) show after the numbers."""

    def __init__(self, stream: Any, label: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=None,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=label,
            file=stream,
            dynamic_ncols=True,
            leave=False,
        )

    def __call__(self, done: int, total: int) -> None:
        bar = self._bar
        if total and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def event(self, text: str) -> None:
        self._bar.set_postfix_str(text)

    def close(self) -> None:
        self._bar.close()


def _speed(nbytes: int, seconds: float) -> str:
    return f"{format_size(int(nbytes / seconds))}/s" if seconds > 0 else "N/A"


def cmd_checkpoint_download(args: argparse.Namespace, ctx: Context) -> int:
    from tinker_sync.checkpoints import download_checkpoint, target_dir_name

    path: str = args.checkpoint_path
    parsed = _parse_path(path)
    if parsed.checkpoint_type == "sampler":
        raise UsageError(
            f"Sampler checkpoints cannot be downloaded: {path}",
            "Download a training checkpoint (tinker://<run-id>/weights/<name>) or an external "
            "weights export (tinker://<run-id>/external_weights/<name>).",
        )
    out = ctx.out
    target = Path(args.output) / target_dir_name(path)
    if (target.exists() or target.is_symlink()) and not args.force:
        raise CliError(
            f"Target directory already exists: {target}",
            "Use --force to overwrite or choose a different output directory.",
        )
    show_bar = not args.no_progress and not out.quiet and not out.json and out.stderr.isatty()
    bar = _Bar(out.stderr, parsed.checkpoint_id) if show_bar else None

    def on_event(text: str) -> None:
        if bar is not None:
            bar.event(text)
        else:
            out.info(text)

    try:
        # REST only: a ServiceClient (a session) is built only for the export fallback of a
        # server without checkpoint archives.
        result = download_checkpoint(
            path,
            args.output,
            force=args.force,
            progress=bar,
            rest_client=ctx.rest(),
            on_event=on_event,
            _service_factory=ctx.service,
        )
    finally:
        if bar is not None:
            bar.close()
    digest = next(iter(result.digests.values())) if len(result.digests) == 1 else None
    out.document(
        {
            "checkpoint_path": path,
            "path": str(result.path),
            "destination": str(result.path),
            "source": result.source,
            "files": list(result.files),
            "size_bytes": result.bytes_written,
            "bytes": result.bytes_written,
            "fetched_bytes": result.fetched_bytes,
            "bytes_transferred": result.bytes_transferred,
            "resumed_bytes": result.resumed_bytes,
            "digest": digest,
            "digests": result.digests,
            "verified_by": result.verified_by,
            "attempts": result.attempts,
            "archive_polls": result.archive_polls,
            "resigns": result.resigns,
            "elapsed_s": round(result.elapsed_s, 3),
        }
    )
    fetched = "archive (tar)" if result.source == "archive" else "files"
    rows = [
        ["Checkpoint Path", path],
        ["Files", str(len(result.files))],
        ["Size on disk", f"{format_size(result.bytes_written)} (what checkpoint list counts)"],
        ["Fetched", f"{format_size(result.fetched_bytes)} ({fetched})"],
        [
            "Transferred",
            f"{format_size(result.bytes_transferred)} in {result.attempts} "
            f"{'request' if result.attempts == 1 else 'requests'}, "
            f"{_speed(result.bytes_transferred, result.elapsed_s)}",
        ],
    ]
    if result.resumed_bytes:
        rows.append(["Resumed", f"{format_size(result.resumed_bytes)} not fetched again"])
    rows.append(["Verified", f"{result.verified_by}" + (f" {digest}" if digest else "")])
    rows.append(["Downloaded to", str(result.path)])
    out.table(["Property", "Value"], rows, title=f"Checkpoint download: {path}")
    return 0


# --------------------------------------------------------------------------------------------
# health
# --------------------------------------------------------------------------------------------

HEALTH_PROBE_TIMEOUT_S = 5.0
"""Default bound of ``health --probe`` (one request, no retry)."""


def _wall_time(wall: float | None) -> _dt.datetime | None:
    if wall is None or wall <= 0:
        return None
    return _dt.datetime.fromtimestamp(wall, tz=_dt.timezone.utc)


def tenant_health(base_url: str, identity: str, now: float) -> dict[str, Any]:
    """The shared circuit of one tenant as the CLI shows it (docs/health.md#across-processes):
    ``state`` closed / open / half_open, ``since``, ``reason``, ``failed_probes``,
    ``next_probe_in_s``, ``probe_out_until``, ``shared`` (False: sharing is off here)."""
    from tinker_sync._flow import sharedbackoff
    from tinker_sync._flow.sharedcircuit import open_shared_circuit

    doc: dict[str, Any] = {
        "state": "closed",
        "since": None,
        "reason": None,
        "failed_probes": 0,
        "next_probe_in_s": None,
        "probe_out_until": None,
        "shared": sharedbackoff.enabled(),
    }
    shared = open_shared_circuit(base_url, identity, create=False) if doc["shared"] else None
    record = None
    if shared is not None:
        try:
            record = shared.read()
        finally:
            shared.close()
    if record is None:
        return doc  # no process of this tenant has opened its circuit (or sharing is off)
    doc["reason"] = record.reason or None
    if record.state == "closed":
        doc["since"] = _wall_time(record.changed_wall)
        return doc
    doc["since"] = _wall_time(record.opened_wall)
    doc["failed_probes"] = record.failed_probes
    doc["state"] = record.state_at(now)
    if record.probe_out(now):
        doc["probe_out_until"] = _wall_time(record.lease_wall)
    else:
        doc["next_probe_in_s"] = round(max(0.0, record.probe_wall - now), 3)
    return doc


def _probe(ctx: Context, timeout: float) -> dict[str, Any]:
    """One bounded request (no retry, outside the tenant's circuit: it neither waits for the
    circuit nor changes it)."""
    import time

    from tinker_sync._config import ClientConfig, HealthPolicy
    from tinker_sync._flow.health import describe_failure
    from tinker_sync.rest_client import RestClient

    config = ClientConfig.from_env(
        base_url=ctx.base_url,
        api_key=ctx.api_key,
        timeout=timeout,
        max_retries=0,
        stall_timeout=timeout,
        health=HealthPolicy(enabled=False),
    )
    start = time.monotonic()
    client = RestClient._from_config(config, loop=False)
    try:
        client.get_server_capabilities().result(timeout)
    except Exception as exc:
        return {
            "ok": False,
            "error": describe_failure(exc),  # "HTTP 503: <the server's words>", scrubbed
            "elapsed_s": round(time.monotonic() - start, 3),
        }
    finally:
        client.close()
    return {"ok": True, "error": None, "elapsed_s": round(time.monotonic() - start, 3)}


def cmd_health(args: argparse.Namespace, ctx: Context) -> int:
    import time

    from tinker_sync._config import ClientConfig
    from tinker_sync._runtime.redact import scrub

    config = ClientConfig.from_env(base_url=ctx.base_url, api_key=ctx.api_key)
    url = config.normalized_base_url
    doc: dict[str, Any] = {
        "base_url": scrub(url),
        "credential": config.credential_identity[:12],  # a hash's prefix, never the key
        **tenant_health(url, config.credential_identity, time.time()),
    }
    if args.probe:
        doc["probe"] = _probe(ctx, args.timeout)
    out = ctx.out
    out.document(doc)
    rows = [
        ["Base URL", doc["base_url"]],
        ["Credential", f"sha256:{doc['credential']}..."],
        ["Circuit", doc["state"].replace("_", "-")],
        ["Since", format_time(doc["since"])],
    ]
    if doc["reason"]:
        rows.append(["Why" if doc["state"] != "closed" else "Last opened for", doc["reason"]])
    if doc["state"] != "closed":
        rows.append(["Failed probes", str(doc["failed_probes"])])
        if doc["probe_out_until"] is not None:
            rows.append(["Probe out until", format_time(doc["probe_out_until"])])
        else:
            rows.append(["Next probe", f"in {doc['next_probe_in_s']:g} s"])
    if not doc["shared"]:
        rows.append(["Shared", "no (TINKER_SYNC_SHARED_BACKOFF=0): each process has its own"])
    probe = doc.get("probe")
    if probe is not None:
        answer = "answers" if probe["ok"] else f"no answer: {probe['error']}"
        rows.append(["Probe", f"{answer} ({probe['elapsed_s']:g} s)"])
    out.table(["Property", "Value"], rows, title="Tenant health")
    return 0 if probe is None or probe["ok"] else 1


# --------------------------------------------------------------------------------------------
# model, version
# --------------------------------------------------------------------------------------------


def cmd_model_list(args: argparse.Namespace, ctx: Context) -> int:
    models = ctx.rest().get_server_capabilities().result().supported_models
    needle: str | None = args.substring
    if needle is not None:
        models = [
            m for m in models if m.model_name is not None and needle.lower() in m.model_name.lower()
        ]
        if not models:
            raise CliError(
                f"No model name contains {needle!r}",
                "Run 'tinker-sync model list' to see every model you can use.",
            )
    ctx.out.document({"models": [_dump(m) for m in models]})
    ctx.out.table(
        ["Model", "Max Context", "Trainable", "Sampleable"],
        [
            [
                m.model_name or "N/A",
                "N/A" if m.max_context_length is None else str(m.max_context_length),
                format_bool(m.trainable),
                format_bool(m.sampleable),
            ]
            for m in models
        ],
        title=_plural(len(models), "model"),
    )
    return 0


def cmd_version(args: argparse.Namespace, ctx: Context) -> int:
    from tinker_sync import __protocol_version__, __version__

    ctx.out.document(
        {
            "tinker_sync": __version__,
            "protocol": __protocol_version__,
            "python": platform.python_version(),
        }
    )
    if not ctx.out.json:
        ctx.out.stdout.write(f"tinker-sync {__version__} (protocol {__protocol_version__})\n")
    return 0


# --------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------

AddCommon = Callable[[argparse.ArgumentParser], None]


def _leaf(
    subparsers: Any,
    name: str,
    handler: Handler,
    add_common: AddCommon,
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description or help
    )
    parser.set_defaults(handler=handler, command_name=name)
    add_common(parser)
    return parser


def register(subparsers: Any, add_common: AddCommon) -> None:
    """Add ``run``, ``checkpoint``, ``model``, ``health`` and ``version`` to the main parser."""
    run = subparsers.add_parser("run", help="inspect training runs", description="Training runs.")
    run_sub = run.add_subparsers(dest="subcommand", metavar="COMMAND")
    run_sub.required = True
    p = _leaf(run_sub, "list", cmd_run_list, add_common, "list training runs")
    p.add_argument(
        "--limit",
        type=_limit,
        default=20,
        metavar="N",
        help="how many runs to show (default 20, 0 = all)",
    )
    p.add_argument(
        "-c",
        "--columns",
        type=_columns,
        default=None,
        metavar="COLS",
        help=f"comma-separated columns from {','.join(RUN_COLUMNS)} "
        f"(default {','.join(DEFAULT_RUN_COLUMNS)})",
    )
    p = _leaf(run_sub, "info", cmd_run_info, add_common, "show one training run")
    p.add_argument("run_id", metavar="RUN_ID")

    ck = subparsers.add_parser("checkpoint", help="manage checkpoints", description="Checkpoints.")
    ck_sub = ck.add_subparsers(dest="subcommand", metavar="COMMAND")
    ck_sub.required = True
    p = _leaf(
        ck_sub,
        "list",
        cmd_checkpoint_list,
        add_common,
        "list one run's checkpoints, or your recent ones",
    )
    p.add_argument("--run-id", default=None, metavar="ID", help="only this training run")
    p.add_argument(
        "--limit",
        type=_limit,
        default=20,
        metavar="N",
        help="how many checkpoints to show (default 20, 0 = all)",
    )
    p = _leaf(ck_sub, "info", cmd_checkpoint_info, add_common, "show one checkpoint")
    p.add_argument("checkpoint_path", metavar="CHECKPOINT_PATH")
    for name, text in (
        ("publish", "make a checkpoint public"),
        ("unpublish", "make a checkpoint private"),
    ):
        p = _leaf(ck_sub, name, cmd_checkpoint_publish, add_common, text)
        p.add_argument("checkpoint_path", metavar="CHECKPOINT_PATH")
    p = _leaf(
        ck_sub, "set-ttl", cmd_checkpoint_set_ttl, add_common, "set or remove a checkpoint's expiry"
    )
    p.add_argument("checkpoint_path", metavar="CHECKPOINT_PATH")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--ttl", type=_positive, metavar="SECONDS", help="expire this many seconds from now"
    )
    group.add_argument("--remove", action="store_true", help="remove the expiry")
    p = _leaf(
        ck_sub,
        "delete",
        cmd_checkpoint_delete,
        add_common,
        "delete checkpoints (asks for confirmation)",
    )
    p.add_argument("paths", nargs="*", metavar="PATHS", help="tinker:// paths to delete")
    p.add_argument(
        "--run-id",
        default=None,
        metavar="ID",
        help="delete this run's checkpoints (matching the filters)",
    )
    p.add_argument(
        "--type",
        choices=("weights", "sampler_weights"),
        default=None,
        help="only this kind (needs --run-id)",
    )
    p.add_argument(
        "--before",
        type=parse_when,
        default=None,
        metavar="WHEN",
        help="only created before (ISO 8601, UTC; needs --run-id)",
    )
    p.add_argument(
        "--after",
        type=parse_when,
        default=None,
        metavar="WHEN",
        help="only created after (ISO 8601, UTC; needs --run-id)",
    )
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p = _leaf(
        ck_sub,
        "download",
        cmd_checkpoint_download,
        add_common,
        "download a training or external-weights checkpoint",
    )
    p.add_argument("checkpoint_path", metavar="CHECKPOINT_PATH")
    p.add_argument(
        "-o",
        "--output",
        default=".",
        metavar="DIR",
        help="parent directory (default .); files go to DIR/<run>_<kind>_<name>/ (characters "
        "Windows refuses, such as ':', become '-')",
    )
    p.add_argument("--force", action="store_true", help="replace an existing directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    model = subparsers.add_parser("model", help="list models", description="Models.")
    model_sub = model.add_subparsers(dest="subcommand", metavar="COMMAND")
    model_sub.required = True
    p = _leaf(model_sub, "list", cmd_model_list, add_common, "list the models you can use")
    p.add_argument(
        "substring",
        nargs="?",
        default=None,
        metavar="SUBSTRING",
        help="only names containing this (case-insensitive)",
    )

    p = _leaf(
        subparsers,
        "health",
        cmd_health,
        add_common,
        "show the tenant's circuit (closed, open, half-open) shared by your processes",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="also send one bounded request (no retry) and say whether the server answers",
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=HEALTH_PROBE_TIMEOUT_S,
        metavar="S",
        help=f"bound of --probe in seconds (default {HEALTH_PROBE_TIMEOUT_S:g})",
    )
    _leaf(subparsers, "version", cmd_version, add_common, "print the version")
