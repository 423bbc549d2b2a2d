"""Download checkpoints to a local directory (the library side of ``tinker-sync checkpoint download``).

Usage::

    from tinker_sync.checkpoints import download, download_checkpoint

    path = download("tinker://run-1/weights/final", "./models")
    # -> ./models/run-1_weights_final/ with the checkpoint's files
    result = download_checkpoint("tinker://run-1/external_weights/final", "./models",
                                 progress=lambda done, total: print(done, "/", total))
    print(result.bytes_transferred, result.digests, result.attempts)

A training checkpoint (``weights/...``) is fetched as the server's archive: the archive
endpoint is polled with short requests while the server creates it (``503`` + ``Retry-After``,
shown through ``on_event``), then the tar at the signed URL it returns is downloaded and
unpacked. Only REST calls are made: no session, no training run. A server without the archive
endpoint gets the older route: the checkpoint is exported through a temporary training run
(``save_weights_external``), downloaded and deleted. An ``external_weights`` checkpoint is
fetched file by file through its signed URLs. Sampler checkpoints cannot be downloaded.

Every transfer resumes where it was cut (``Range`` with ``If-Range`` on the server's ETag),
signs the URL again when it has expired (403), and is verified before anything is moved into
place: against the server's ``Repr-Digest: sha-256=...`` when it sends one, else its length
(and, for an archive, the tar's own structure). Everything is assembled in a hidden staging
directory next to the target, which appears only once complete. The state machine and its
invariants are in docs/downloads.md.

Thread safety: ``download`` may run in several threads at once (different targets).
Fork safety: not applicable (no state kept between calls).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as _dt
import errno
import functools
import hashlib
import logging
import os
import re
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl, quote, urlsplit

from tinker_sync._paths import CheckpointPath, parse_checkpoint_path
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock
from tinker_sync._runtime.imports import imported
from tinker_sync._runtime.redact import url_without_query
from tinker_sync.exceptions import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    DownloadError,
    DownloadVerificationError,
    NotFoundError,
    RequestSnapshot,
    ResponseSnapshot,
    status_error_class,
)

if TYPE_CHECKING:
    import requests

    from tinker_sync.rest_client import RestClient
    from tinker_sync.service_client import ServiceClient

__all__ = [
    "DownloadResult",
    "Event",
    "Progress",
    "download",
    "download_checkpoint",
    "target_dir_name",
]

log = logging.getLogger("tinker_sync.checkpoints")

Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``; ``bytes_total`` is 0 while the size is unknown."""
Event = Callable[[str], None]
"""``on_event(text)``: a state change worth showing (archive being created, resumed at N bytes,
URL signed again, range ignored)."""

EXPORT_TTL_SECONDS = 3600
"""Lifetime of the temporary export of the fallback route (servers without archives)."""
DOWNLOAD_ATTEMPTS = 8
"""GET requests per file (or archive) before giving up; a re-signed URL does not count."""
RESIGN_LIMIT = 3
"""How many times one file's URL is signed again after a 403 (an expired signed URL)."""
ARCHIVE_DEADLINE_S = 1800.0
"""How long the archive endpoint may answer "still creating" (503) before DownloadError."""
ARCHIVE_POLL_S = 2.0
"""Poll interval while the archive is created, when the server sends no ``Retry-After``."""
ARCHIVE_POLL_MIN_S = 0.05
ARCHIVE_POLL_MAX_S = 30.0
"""The bounds of one wait for the archive (the server's ``Retry-After`` is clamped to them)."""
RESIGN_MARGIN_S = 300.0
CHUNK_BYTES = 1 << 20
TIMEOUT = (5.0, 60.0)
ARCHIVE_NAME = "archive.tar"

# Characters Windows refuses in a file name (plus control characters).
_UNPORTABLE = re.compile(r'[<>:"/\\|?*\x00-\x1f]')


def target_dir_name(tinker_path: str) -> str:
    """``<run>_<kind>_<name>`` for ``tinker://<run>/<kind>/<name>``, ``<run>_<name>`` for
    ``tinker://<run>/<name>`` (ValueError if malformed); characters Windows refuses in a name
    (``: < > " | ? * \\``) become ``-``, so ``tinker://a:train:0/weights/x`` gives
    ``a-train-0_weights_x``."""
    parsed = parse_checkpoint_path(tinker_path)
    name = f"{parsed.training_run_id}_{parsed.checkpoint_id.replace('/', '_', 1)}"
    name = _UNPORTABLE.sub("-", name).rstrip(" .")
    return name or "checkpoint"


@dataclasses.dataclass(frozen=True)
class DownloadResult:
    """What :func:`download_checkpoint` did.

    * ``path``: the directory written.
    * ``source``: ``"archive"`` (REST only), ``"external_weights"`` or ``"export"`` (the
      fallback through a temporary training run).
    * ``files`` / ``bytes_written``: the files placed in ``path`` and their total size (what
      ``size_bytes`` of ``checkpoint list`` counts).
    * ``fetched_bytes``: the size of what was fetched (the archive with its tar headers, or
      the files).
    * ``bytes_transferred``: body bytes received over every attempt (at most ``fetched_bytes``
      plus what cut attempts delivered twice); ``resumed_bytes``: bytes not fetched again
      thanks to ``Range`` resumes.
    * ``digests``: ``{name: "sha256:<hex>"}`` of what was fetched (the archive, or each file).
    * ``verified_by``: ``"repr-digest"`` (the server's sha-256) or ``"length"`` (no digest
      sent: length, plus the tar structure for an archive).
    * ``attempts``: GET requests of files or archives; ``archive_polls``: archive-endpoint
      answers "still creating"; ``resigns``: URLs signed again.
    """

    path: Path
    source: Literal["archive", "external_weights", "export"]
    files: tuple[str, ...]
    bytes_written: int
    fetched_bytes: int
    bytes_transferred: int
    resumed_bytes: int
    digests: dict[str, str]
    verified_by: Literal["repr-digest", "length"]
    attempts: int
    archive_polls: int
    resigns: int
    elapsed_s: float


def download(
    tinker_path: str,
    output_dir: str | os.PathLike[str] = ".",
    *,
    force: bool = False,
    progress: Progress | None = None,
    service_client: ServiceClient | None = None,
    rest_client: RestClient | None = None,
    on_event: Event | None = None,
    archive_deadline: float = ARCHIVE_DEADLINE_S,
    _clock: Clock = SYSTEM_CLOCK,
) -> Path:
    """Download a training or external-weights checkpoint; return the directory written.

    :param tinker_path: ``tinker://<run>/weights/<name>`` or ``.../external_weights/<name>``
        (or ``tinker://<run>/<name>`` from servers that name no kind).
    :param output_dir: parent directory (created if missing); the files land in
        ``<output_dir>/<target_dir_name(tinker_path)>/``.
    :param force: replace that directory if it exists (else ``FileExistsError``, before any
        request is made).
    :param progress: called with ``(bytes_done, bytes_total)`` as data arrives.
    :param service_client: client whose URL, key and knobs to use (only its REST client is
        used, except on the export fallback). Without one, a RestClient is built from the
        environment and closed before returning.
    :param rest_client: the RestClient to use instead (kept open); the export fallback then
        builds a ServiceClient from the environment, unless ``service_client`` is given too.
    :param on_event: called with a short text on each state change (see :data:`Event`).
    :param archive_deadline: seconds the server may take to create the archive.
    """
    return download_checkpoint(
        tinker_path,
        output_dir,
        force=force,
        progress=progress,
        service_client=service_client,
        rest_client=rest_client,
        on_event=on_event,
        archive_deadline=archive_deadline,
        _clock=_clock,
    ).path


def download_checkpoint(
    tinker_path: str,
    output_dir: str | os.PathLike[str] = ".",
    *,
    force: bool = False,
    progress: Progress | None = None,
    service_client: ServiceClient | None = None,
    rest_client: RestClient | None = None,
    on_event: Event | None = None,
    archive_deadline: float = ARCHIVE_DEADLINE_S,
    _clock: Clock = SYSTEM_CLOCK,
    _service_factory: Callable[[], ServiceClient] | None = None,
) -> DownloadResult:
    """:func:`download`, returning a :class:`DownloadResult` (bytes, digests, attempts)."""
    parsed = parse_checkpoint_path(tinker_path)
    if parsed.checkpoint_type == "sampler":
        raise ValueError(
            f"sampler checkpoints cannot be downloaded: {tinker_path!r} (download the training "
            "checkpoint tinker://<run>/weights/<name> or an external_weights export instead)"
        )
    if progress is not None and not callable(progress):
        raise TypeError("progress must be a callable (bytes_done, bytes_total) or None")
    if on_event is not None and not callable(on_event):
        raise TypeError("on_event must be a callable (text) or None")
    out = Path(output_dir).absolute()
    target = out / target_dir_name(tinker_path)
    _refuse_existing(target, force)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".{target.name}.{uuid.uuid4().hex[:12]}.partial"
    staging.mkdir()  # honours the umask, unlike tempfile.mkdtemp
    started = _clock.monotonic()
    fetcher = _Fetcher(progress, on_event, _clock)
    try:
        factory = _service_factory
        if service_client is not None:
            given = service_client
            factory = lambda: given  # noqa: E731
            if rest_client is None:
                rest_client = service_client.create_rest_client()
        if rest_client is not None:
            source = _fetch(fetcher, rest_client, parsed, staging, factory, archive_deadline)
        else:
            imported("tinker_sync.rest_client")  # a first import a signal cannot cut
            from tinker_sync.rest_client import RestClient

            with RestClient(_clock=_clock) as rest:
                source = _fetch(fetcher, rest, parsed, staging, factory, archive_deadline)
        files = tuple(
            sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        )
        written = sum((staging / f).stat().st_size for f in files)
        _refuse_existing(target, force)  # again: it may have appeared meanwhile
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return DownloadResult(
        path=target,
        source=source,
        files=files,
        bytes_written=written,
        fetched_bytes=fetcher.fetched,
        bytes_transferred=fetcher.transferred,
        resumed_bytes=fetcher.resumed,
        digests=dict(fetcher.digests),
        verified_by="repr-digest" if fetcher.all_digested else "length",
        attempts=fetcher.attempts,
        archive_polls=fetcher.polls,
        resigns=fetcher.resigns,
        elapsed_s=_clock.monotonic() - started,
    )


def _refuse_existing(target: Path, force: bool) -> None:
    if not force and (target.exists() or target.is_symlink()):
        raise FileExistsError(
            errno.EEXIST, f"{target} already exists (pass force=True to replace it)", str(target)
        )


def _fetch(
    fetcher: _Fetcher,
    rest: RestClient,
    parsed: CheckpointPath,
    staging: Path,
    service_factory: Callable[[], ServiceClient] | None,
    archive_deadline: float,
) -> Literal["archive", "external_weights", "export"]:
    if parsed.checkpoint_type == "external":
        fetcher.fetch_external(rest, parsed.tinker_path, staging)
        return "external_weights"
    archive = _Archive(rest, parsed, fetcher, archive_deadline)
    try:
        url = archive.url()
    except NotFoundError:
        if not archive.checkpoint_exists():
            raise
        log.warning("the server has no archive endpoint: exporting %s instead", parsed.tinker_path)
        fetcher.event("this server has no checkpoint archives: exporting through a training run")
        service = None if service_factory is None else service_factory()
        _fetch_by_export(fetcher, parsed.tinker_path, staging, service, fetcher.clock)
        return "export"
    part = staging / f".{ARCHIVE_NAME}.part"
    fetcher.transfer(url, ARCHIVE_NAME, part, archive.url)
    try:
        _extract(part, staging)
    finally:
        part.unlink(missing_ok=True)
    return "archive"


class _Archive:
    """The archive endpoint as a polled operation: short requests until the URL is ready."""

    def __init__(
        self, rest: RestClient, parsed: CheckpointPath, fetcher: _Fetcher, deadline: float
    ) -> None:
        self.rest = rest
        self.parsed = parsed
        self.fetcher = fetcher
        self.deadline = deadline

    def checkpoint_exists(self) -> bool:
        try:
            self.rest.get_weights_info_by_tinker_path(self.parsed.tinker_path).result()
        except NotFoundError:
            return False
        except Exception as exc:  # cannot tell: report the archive's 404
            log.debug("weights_info of %s failed: %s", self.parsed.tinker_path, exc)
            return False
        return True

    def url(self) -> str:
        """The archive's signed URL (polling while the server creates the archive)."""
        from tinker_sync._flow.retry import classify, parse_retry_after, retry_delay
        from tinker_sync._transport import Pool, RequestSpec, error_from_reply, quote_path

        clock = self.fetcher.clock
        where = self.parsed.tinker_path
        spec = RequestSpec(
            method="GET",
            path=(
                f"/api/v1/training_runs/{quote_path(self.parsed.training_run_id)}"
                f"/checkpoints/{quote_path(self.parsed.checkpoint_id)}/archive"
            ),
            pool=Pool.REST,
            headers={"Accept": "application/json"},
            follow_redirects=False,
        )
        start = clock.monotonic()
        failures = 0
        while True:
            headers = None
            try:
                reply = self.rest.send_once(spec)  # starts the REST client: no session
            except Exception as exc:
                failure: Exception = exc
            else:
                if reply.status in (301, 302, 303, 307, 308) and reply.headers.get("location"):
                    return str(reply.headers["location"])
                if 200 <= reply.status < 300 and reply.status != 202:
                    body = reply.json()
                    if isinstance(body, dict) and isinstance(body.get("url"), str):
                        return str(body["url"])
                    raise DownloadError(f"the archive endpoint of {where} sent no url")
                if reply.status in (202, 503):  # still creating the archive
                    self.fetcher.polls += 1
                    wait = parse_retry_after(reply.headers, clock.time()) or ARCHIVE_POLL_S
                    wait = min(max(wait, ARCHIVE_POLL_MIN_S), ARCHIVE_POLL_MAX_S)
                    waited = clock.monotonic() - start
                    if waited + wait > self.deadline:
                        raise DownloadError(
                            f"the archive of {where} was still being created after "
                            f"{waited:.0f} s (archive_deadline={self.deadline:g} s)"
                        )
                    self.fetcher.event(
                        f"server is creating the archive ({waited:.0f} s)",
                        f"the server is creating the archive of {where} ({waited:.0f} s); "
                        f"asking again in {wait:.1f} s",
                    )
                    clock.sleep(wait, "archive-wait")
                    continue
                failure, headers = error_from_reply(reply), reply.headers
            failures += 1
            if failures >= DOWNLOAD_ATTEMPTS or not classify(failure).retryable:
                raise failure
            delay = retry_delay(headers, failures - 1, clock)
            log.info("the archive URL of %s failed (%s); retrying in %.1f s", where, failure, delay)
            clock.sleep(delay, "download-retry")


def _extract(archive: Path, dest: Path) -> None:
    """Unpack regular files and directories of ``archive`` into ``dest`` (names checked)."""
    try:
        with tarfile.open(archive, mode="r:") as tar:
            for member in tar:
                if member.isdir():
                    _safe_relative(member.name.rstrip("/"))
                    continue
                if not member.isfile():
                    raise DownloadVerificationError(
                        f"the archive holds {member.name!r}, which is not a regular file",
                        check="tar",
                    )
                rel = _safe_relative(member.name)
                path = dest.joinpath(*rel.parts)
                path.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                with source, open(path, "wb") as fh:
                    shutil.copyfileobj(source, fh, CHUNK_BYTES)
                if path.stat().st_size != member.size:
                    raise tarfile.ReadError(f"{member.name}: truncated")
    except (tarfile.TarError, ValueError) as exc:  # ValueError: an unsafe member name
        raise DownloadVerificationError(
            f"the downloaded archive is not a valid tar: {exc}", check="tar"
        ) from None


def _fetch_by_export(
    fetcher: _Fetcher,
    tinker_path: str,
    dest: Path,
    service_client: ServiceClient | None,
    clock: Clock,
) -> None:
    """Export a training checkpoint as external weights, download it, delete the export."""
    imported("tinker_sync.service_client")
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


def _repr_digest(headers: requests.structures.CaseInsensitiveDict[str]) -> bytes | None:
    """The sha-256 of the whole file from ``Repr-Digest`` (RFC 9530) or the older
    ``Digest: SHA-256=`` (RFC 3230); None when the server sends neither."""
    for header, pattern in (
        ("repr-digest", r"(?:^|,)\s*sha-256=:([A-Za-z0-9+/=]+):"),
        ("digest", r"(?:^|,)\s*sha-256=([A-Za-z0-9+/=]+)"),
    ):
        value = headers.get(header)
        if not value:
            continue
        match = re.search(pattern, value, re.IGNORECASE)
        if match is None:
            continue
        try:
            digest = base64.b64decode(match.group(1), validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(digest) == 32:
            return digest
    return None


def _hide_query(body: bytes, url: str) -> bytes:
    """``body`` with every query value of ``url`` (a signature, a credential) replaced."""
    for _, value in parse_qsl(urlsplit(url).query):
        if len(value) >= 6:
            for form in {value, quote(value, safe="")}:
                body = body.replace(form.encode(), b"<redacted>")
    return body


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class _Cut(Exception):
    """One attempt ended early; ``progress`` says whether it brought new bytes."""

    def __init__(self, error: BaseException, progress: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.progress = progress


class _Fetcher:
    """Resumable, verified transfers of one download; counts bytes, attempts and digests."""

    def __init__(self, progress: Progress | None, on_event: Event | None, clock: Clock) -> None:
        self.progress = progress
        self.on_event = on_event
        self.clock = clock
        self.done = 0
        self.total = 0
        self.transferred = 0
        self.fetched = 0
        self.resumed = 0
        self.attempts = 0
        self.polls = 0
        self.resigns = 0
        self.digests: dict[str, str] = {}
        self.all_digested = True

    def report(self, done: int) -> None:
        if self.progress is not None:
            self.progress(done, max(self.total, done) if self.total else 0)

    def event(self, text: str, detail: str | None = None) -> None:
        """Show ``text`` through ``on_event``; log ``detail`` (or ``text``) at INFO."""
        log.info("%s", text if detail is None else detail)
        if self.on_event is not None:
            self.on_event(text)

    def fetch_external(self, rest: RestClient, tinker_path: str, dest: Path) -> None:
        listing = rest.get_external_weights_urls(tinker_path).result()
        if not listing.urls:
            raise RuntimeError(f"external weights checkpoint {tinker_path} has no files")
        names = {name: _safe_relative(name) for name in listing.urls}
        self.total += self._size_of(rest, tinker_path)
        self.report(self.done)

        def sign(name: str) -> str:
            """``name``'s URL from a new listing (the old one's links expire)."""
            nonlocal listing
            listing = rest.get_external_weights_urls(tinker_path).result()
            if name not in listing.urls:
                raise RuntimeError(f"{name} is no longer part of {tinker_path}")
            return listing.urls[name]

        for name in sorted(names):
            url = sign(name) if self._expiring(listing.expires) else listing.urls[name]
            path = dest.joinpath(*names[name].parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
            self.transfer(url, name, part, functools.partial(sign, name))
            os.replace(part, path)

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

    def _expiring(self, expires: _dt.datetime) -> bool:
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=_dt.timezone.utc)
        return self.clock.time() >= expires.timestamp() - RESIGN_MARGIN_S

    # -- one file ----------------------------------------------------------------------------

    def transfer(self, url: str, name: str, part: Path, resign: Callable[[], str]) -> None:
        """Fetch ``url`` into ``part`` (resuming, re-signing, verifying; docs/downloads.md)."""
        import requests

        from tinker_sync._flow.retry import classify, http_backoff

        base = self.done
        state = _FileState()
        stalls = 0  # consecutive attempts without new bytes
        resigns = 0
        try:
            with requests.Session() as http:
                while True:
                    state.attempts += 1
                    self.attempts += 1
                    try:
                        self._attempt(http, url, name, part, state, base)
                        break
                    except _Cut as cut:
                        error, progress = cut.error, cut.progress
                    status = getattr(error, "status_code", None)
                    if status in (401, 403) and resigns < RESIGN_LIMIT:
                        resigns += 1
                        self.resigns += 1
                        state.attempts -= 1  # an expired link is not a failed attempt
                        self.event(f"{name}: link expired, signing it again")
                        url = resign()
                        continue
                    if state.attempts >= DOWNLOAD_ATTEMPTS or not classify(error).retryable:
                        raise error  # raised here: no chained exception holds the signed URL
                    if progress:
                        stalls = 0
                        continue  # the network cut a transfer that was moving: resume now
                    delay = http_backoff(stalls, self.clock.random)
                    stalls += 1
                    log.info(
                        "fetching %s from %s failed (%s); retrying in %.1f s",
                        name,
                        url_without_query(url),
                        error,
                        delay,
                    )
                    self.clock.sleep(delay, "download-retry")
            self._verify(part, name, state)
        except BaseException:
            self.report(base)
            part.unlink(missing_ok=True)
            raise
        self.done = base + state.offset

    def _attempt(
        self,
        http: requests.Session,
        url: str,
        name: str,
        part: Path,
        state: _FileState,
        base: int,
    ) -> None:
        """One GET; returns once the file is complete. Raises :class:`_Cut` on any failure."""
        import requests
        import urllib3

        snapshot = RequestSnapshot("GET", f"<signed url of {name}>")
        headers = {"Accept-Encoding": "identity"}
        resuming = state.offset > 0 and state.etag is not None and state.ranges
        if resuming:
            assert state.etag is not None
            headers["Range"] = f"bytes={state.offset}-"
            headers["If-Range"] = state.etag
        best = state.offset
        try:
            response = http.get(url, stream=True, timeout=TIMEOUT, headers=headers)
        except requests.exceptions.Timeout:
            raise _Cut(APITimeoutError(f"fetching {name} timed out", snapshot), False) from None
        except requests.exceptions.RequestException as exc:
            raise _Cut(
                APIConnectionError(f"cannot fetch {name}: {type(exc).__name__}", snapshot), False
            ) from None
        with response:
            status = response.status_code
            if status == 416 and state.total is not None and state.offset == state.total:
                return
            if status == 416:  # our offset is beyond the file: start again
                state.restart(part)
                raise _Cut(APIConnectionError(f"{name}: range not satisfiable", snapshot), False)
            if status not in (200, 206):
                body = _hide_query(response.content[:2000], url)  # storage errors echo it
                cls = status_error_class(status)
                error: APIStatusError = cls(
                    f"fetching {name}: HTTP {status}",
                    response=ResponseSnapshot(status, dict(response.headers), body),
                    request=snapshot,
                )
                raise _Cut(error, False)
            etag = response.headers.get("etag")
            strong = etag if etag and not etag.startswith("W/") else None
            length = _content_length(response)
            if status == 206:
                match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
                if (
                    not resuming
                    or match is None
                    or int(match.group(1)) != state.offset
                    or (strong is not None and strong != state.etag)
                ):
                    state.restart(part)  # not the range we asked for: start again
                    raise _Cut(APIConnectionError(f"{name}: unexpected range", snapshot), False)
                if match.group(3) != "*":
                    state.total = int(match.group(3))
                self.resumed += state.offset
                self.event(f"{name}: resumed at byte {state.offset}")
                mode = "ab"
            else:
                if state.offset > 0:
                    if resuming and strong is not None and strong == state.etag:
                        state.ranges = False  # same file, range ignored: never ask again
                        self.event(f"{name}: the server ignored the range; starting over")
                    state.restart(part)
                state.etag = strong
                state.total = length
                if self.total == 0 and length is not None:
                    self.total = base + length  # an archive: its size is known only now
                mode = "wb"
            digest = _repr_digest(response.headers)
            if digest is not None:
                state.digest = digest
            received = 0
            try:
                with open(part, mode) as fh:
                    for chunk in _body_chunks(response):
                        fh.write(chunk)  # an OSError here (disk full) is not retried
                        received += len(chunk)
                        state.offset += len(chunk)
                        self.transferred += len(chunk)
                        self.report(base + state.offset)
            except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as exc:
                raise _Cut(
                    APIConnectionError(
                        f"fetching {name} failed after {received} bytes: {type(exc).__name__}",
                        snapshot,
                    ),
                    state.offset > best,
                ) from None
            if length is not None and received != length:
                raise _Cut(
                    APIConnectionError(
                        f"fetching {name}: got {received} of {length} bytes", snapshot
                    ),
                    state.offset > best,
                )

    def _verify(self, part: Path, name: str, state: _FileState) -> None:
        sha = hashlib.sha256()
        size = 0
        with open(part, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                sha.update(chunk)
                size += len(chunk)
        if state.total is not None and size != state.total:
            raise DownloadVerificationError(
                f"{name}: {size} bytes on disk, the server announced {state.total}", check="length"
            )
        if state.digest is not None:
            if sha.digest() != state.digest:
                raise DownloadVerificationError(
                    f"{name}: sha-256 {sha.hexdigest()} differs from the server's Repr-Digest "
                    f"{state.digest.hex()}",
                    check="digest",
                )
        else:
            self.all_digested = False
        self.digests[name] = f"sha256:{sha.hexdigest()}"
        self.fetched += size


class _FileState:
    """Per-file transfer state: bytes on disk, the validator and what the server told."""

    def __init__(self) -> None:
        self.offset = 0
        self.etag: str | None = None
        self.total: int | None = None
        self.digest: bytes | None = None
        self.ranges = True
        self.attempts = 0

    def restart(self, part: Path) -> None:
        self.offset = 0
        self.etag = None
        self.total = None
        self.digest = None
        part.unlink(missing_ok=True)


def _body_chunks(response: requests.Response) -> Iterator[bytes]:
    """The body as it arrives. Without a content coding, each read returns what came (the
    bytes before a cut are kept: a buffered read would drop them with the error)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        yield from response.iter_content(CHUNK_BYTES)
        return
    while chunk := response.raw.read(CHUNK_BYTES, decode_content=False):
        yield chunk


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
