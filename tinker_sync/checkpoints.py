"""Download checkpoints to a local directory (the library side of ``tinker-sync checkpoint download``).

Usage::

    from tinker_sync.checkpoints import download

    path = download("tinker://run-1/external_weights/final", "./models")
    # -> ./models/run-1_external_weights_final/ with the checkpoint's files
    path = download("tinker://run-1/weights/step100", force=True,
                    progress=lambda done, total: print(done, "/", total))

An ``external_weights`` checkpoint is fetched file by file through its signed URLs. A training
checkpoint (``weights/...``) is first exported: a temporary training client is created from
the state, ``save_weights_external`` writes an export, the export is downloaded and then
deleted. Sampler checkpoints cannot be downloaded. Files of an age-encrypted export keep their
``.age`` suffix (decrypt them with ``age -d``).

Each file is streamed to a temporary file and renamed into place; its size is checked against
``Content-Length`` when the server sends one, and a failed or short transfer is restarted from
the beginning (never resumed). Everything is assembled in a hidden staging directory next to the
target, which appears only once complete; with ``force=True`` an existing target is replaced at
that moment, never earlier.

Thread safety: ``download`` may run in several threads at once (different targets).
Fork safety: not applicable (no state kept between calls).
"""

from __future__ import annotations

import datetime as _dt
import errno
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

from tinker_sync._paths import parse_checkpoint_path
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync.exceptions import (
    APIConnectionError,
    APITimeoutError,
    RequestSnapshot,
    ResponseSnapshot,
    status_error_class,
)

if TYPE_CHECKING:
    import requests

    from tinker_sync.rest_client import RestClient
    from tinker_sync.service_client import ServiceClient
    from tinker_sync.types import ExternalWeightsUrlsResponse

__all__ = ["Progress", "download", "target_dir_name"]

log = logging.getLogger("tinker_sync.checkpoints")

Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``; ``bytes_total`` is 0 while the size is unknown."""

EXPORT_TTL_SECONDS = 3600
"""Lifetime of the temporary export a training checkpoint is downloaded through."""
DOWNLOAD_ATTEMPTS = 4
RESIGN_MARGIN_S = 300.0
CHUNK_BYTES = 1 << 16
TIMEOUT = (5.0, 60.0)


def target_dir_name(tinker_path: str) -> str:
    """``<run>_<kind>_<name>`` for ``tinker://<run>/<kind>/<name>``, ``<run>_<name>`` for
    ``tinker://<run>/<name>`` (ValueError if malformed)."""
    parsed = parse_checkpoint_path(tinker_path)
    return f"{parsed.training_run_id}_{parsed.checkpoint_id.replace('/', '_', 1)}"


def download(
    tinker_path: str,
    output_dir: str | os.PathLike[str] = ".",
    *,
    force: bool = False,
    progress: Progress | None = None,
    service_client: ServiceClient | None = None,
    _clock: Clock = SYSTEM_CLOCK,
) -> Path:
    """Download a training or external-weights checkpoint; return the directory written.

    :param tinker_path: ``tinker://<run>/weights/<name>`` or ``.../external_weights/<name>``
        (or ``tinker://<run>/<name>`` from servers that name no kind: exported like a
        training checkpoint, by the server that issued the path).
    :param output_dir: parent directory (created if missing); the files land in
        ``<output_dir>/<run>_<kind>_<name>/``.
    :param force: replace that directory if it exists (else ``FileExistsError``, before any
        request is made).
    :param progress: called with ``(bytes_done, bytes_total)`` as data arrives.
    :param service_client: client to use (its URL, key and knobs). A training checkpoint's
        temporary training run then lives in its session. Without one, clients are built from
        the environment and closed before returning.
    """
    parsed = parse_checkpoint_path(tinker_path)
    if parsed.checkpoint_type == "sampler":
        raise ValueError(
            f"sampler checkpoints cannot be downloaded: {tinker_path!r} (download the training "
            "checkpoint tinker://<run>/weights/<name> or an external_weights export instead)"
        )
    if progress is not None and not callable(progress):
        raise TypeError("progress must be a callable (bytes_done, bytes_total) or None")
    out = Path(output_dir).absolute()
    target = out / target_dir_name(tinker_path)
    if (target.exists() or target.is_symlink()) and not force:
        raise FileExistsError(
            errno.EEXIST, f"{target} already exists (pass force=True to replace it)", str(target)
        )
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".{target.name}.{uuid.uuid4().hex[:12]}.partial"
    staging.mkdir()  # honours the umask, unlike tempfile.mkdtemp
    try:
        fetcher = _Fetcher(progress, _clock)
        if parsed.checkpoint_type == "external":
            if service_client is not None:
                fetcher.fetch_external(service_client.create_rest_client(), tinker_path, staging)
            else:
                from tinker_sync.rest_client import RestClient

                with RestClient(_clock=_clock) as rest:
                    fetcher.fetch_external(rest, tinker_path, staging)
        else:
            _fetch_training(fetcher, tinker_path, staging, service_client, _clock)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _fetch_training(
    fetcher: _Fetcher,
    tinker_path: str,
    dest: Path,
    service_client: ServiceClient | None,
    clock: Clock,
) -> None:
    """Export a training checkpoint as external weights, download it, delete the export."""
    from tinker_sync.service_client import ServiceClient

    own = service_client is None
    service = service_client if service_client is not None else ServiceClient(_clock=clock)
    status: Literal["success", "errored", "interrupted"] = "interrupted"
    try:
        rest = service.create_rest_client()
        log.info("exporting %s as external weights for download", tinker_path)
        training = service.create_training_client_from_state(
            tinker_path, user_metadata={"created_by": "tinker-sync checkpoint download"}
        )
        export = training.save_weights_external(
            f"download-{uuid.uuid4().hex[:12]}", ttl_seconds=EXPORT_TTL_SECONDS
        ).result()
        try:
            fetcher.fetch_external(rest, export.path, dest)
        finally:
            try:
                rest.delete_checkpoint_from_tinker_path(export.path).result()
            except Exception as exc:
                log.warning(
                    "could not delete the temporary export %s (%s); it expires in %d s",
                    export.path,
                    exc,
                    EXPORT_TTL_SECONDS,
                )
        status = "success"
    except Exception:
        status = "errored"
        raise
    finally:
        if own:
            service.close(status)


def _safe_relative(name: str) -> PurePosixPath:
    rel = PurePosixPath(name)
    if (
        not name
        or rel.is_absolute()
        or "\\" in name
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise ValueError(f"unsafe file name in checkpoint listing: {name!r}")
    return rel


class _Fetcher:
    """Downloads the files of external-weights checkpoints, reporting cumulative progress."""

    def __init__(self, progress: Progress | None, clock: Clock) -> None:
        self.progress = progress
        self.clock = clock
        self.done = 0
        self.total = 0

    def report(self, done: int) -> None:
        if self.progress is not None:
            self.progress(done, max(self.total, done) if self.total else 0)

    def fetch_external(self, rest: RestClient, tinker_path: str, dest: Path) -> None:
        import requests

        listing = rest.get_external_weights_urls(tinker_path).result()
        if not listing.urls:
            raise RuntimeError(f"external weights checkpoint {tinker_path} has no files")
        names = {name: _safe_relative(name) for name in listing.urls}
        self.total += self._size_of(rest, tinker_path)
        self.report(self.done)
        with requests.Session() as http:
            for name in sorted(names):
                if self._expiring(listing):
                    listing = rest.get_external_weights_urls(tinker_path).result()
                path = dest.joinpath(*names[name].parts)
                path.parent.mkdir(parents=True, exist_ok=True)
                listing = self._fetch_file(http, rest, tinker_path, listing, name, path)

    def _size_of(self, rest: RestClient, tinker_path: str) -> int:
        """The checkpoint's ``size_bytes`` from its run's listing (0 when unknown)."""
        parsed = parse_checkpoint_path(tinker_path)
        try:
            listing = rest.list_checkpoints(parsed.training_run_id).result()
        except Exception as exc:
            log.debug("size of %s unknown: %s", tinker_path, exc)
            return 0
        for ckpt in listing.checkpoints:
            if ckpt.tinker_path == tinker_path:
                return ckpt.size_bytes or 0
        return 0

    def _expiring(self, listing: ExternalWeightsUrlsResponse) -> bool:
        expires = listing.expires
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=_dt.timezone.utc)
        return self.clock.time() >= expires.timestamp() - RESIGN_MARGIN_S

    def _fetch_file(
        self,
        http: requests.Session,
        rest: RestClient,
        tinker_path: str,
        listing: ExternalWeightsUrlsResponse,
        name: str,
        path: Path,
    ) -> ExternalWeightsUrlsResponse:
        """Fetch one file (retrying from scratch); return the listing (re-signed if needed)."""
        resigned = False
        attempt = 0
        while True:
            try:
                self._transfer(http, listing.urls[name], name, path)
                return listing
            except Exception as exc:
                status = getattr(exc, "status_code", None)
                if status == 403 and not resigned:
                    resigned = True  # the signature may have expired: sign again once
                    listing = rest.get_external_weights_urls(tinker_path).result()
                    if name not in listing.urls:
                        raise
                    continue
                retryable = isinstance(exc, APIConnectionError) or (
                    isinstance(status, int) and (status >= 500 or status in (408, 429))
                )
                attempt += 1
                if not retryable or attempt >= DOWNLOAD_ATTEMPTS:
                    raise
                delay = min(0.5 * 2.0 ** (attempt - 1), 10.0)
                log.info("download of %s failed (%s); retrying in %.1f s", name, exc, delay)
                self.clock.sleep(delay, "download-retry")

    def _transfer(self, http: requests.Session, url: str, name: str, path: Path) -> None:
        import requests

        start = self.done
        part = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.part")
        snapshot = RequestSnapshot("GET", f"<signed url of {name}>")
        try:
            try:
                response = http.get(
                    url, stream=True, timeout=TIMEOUT, headers={"Accept-Encoding": "identity"}
                )
            except requests.exceptions.Timeout:
                raise APITimeoutError(f"fetching {name} timed out", snapshot) from None
            except requests.exceptions.RequestException as exc:
                raise APIConnectionError(
                    f"cannot fetch {name}: {type(exc).__name__}", snapshot
                ) from None
            with response:
                if response.status_code >= 400:
                    body = response.content[:2000]
                    cls = status_error_class(response.status_code)
                    raise cls(
                        f"fetching {name}: HTTP {response.status_code}",
                        response=ResponseSnapshot(
                            response.status_code, dict(response.headers), body
                        ),
                        request=snapshot,
                    )
                expected = _content_length(response)
                received = 0
                try:
                    with open(part, "wb") as fh:
                        for chunk in response.iter_content(CHUNK_BYTES):
                            fh.write(chunk)
                            received += len(chunk)
                            self.report(start + received)
                except requests.exceptions.RequestException as exc:
                    raise APIConnectionError(
                        f"fetching {name} failed after {received} bytes: {type(exc).__name__}",
                        snapshot,
                    ) from None
                if expected is not None and received != expected:
                    raise APIConnectionError(
                        f"fetching {name}: got {received} of {expected} bytes", snapshot
                    )
            os.replace(part, path)
        except BaseException:
            self.report(start)
            try:
                part.unlink()
            except FileNotFoundError:
                pass
            raise
        self.done = start + received


def _content_length(response: requests.Response) -> int | None:
    """The body size the server promised, when it can be checked against the bytes read."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    raw = response.headers.get("content-length")
    if raw is None or encoding not in ("", "identity"):
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
