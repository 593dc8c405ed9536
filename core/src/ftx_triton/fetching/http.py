"""Resumable, retried, verified downloads of ``http(s)://`` and ``file://`` URLs (stdlib only).

Bytes go to ``DEST.part``; an interrupted transfer resumes from there with an HTTP Range
request (guarded by ``If-Range`` so a file that changed upstream restarts instead of being
spliced). The checksum, when given, is checked before the final rename, so ``DEST`` only ever
holds a complete, verified file. A ``DEST.lock`` file lock makes concurrent calls for one
``DEST`` download it once.

A body that fills the disk is no partial download worth keeping: on ENOSPC the part is removed, and a
body whose server declared no size stops (part removed) once the disk would keep less than
the reserve archive extraction keeps (``FREE_SPACE_RESERVE``), before it fills the disk for everything else.
"""

from __future__ import annotations

import errno
import http.client
import os
import re
import shutil
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit
from urllib.request import Request, url2pathname, urlopen

import structlog
from filelock import FileLock, Timeout

from ftx_triton.errors import SourceError
from ftx_triton.fetching.archive import FREE_SPACE_RESERVE
from ftx_triton.fetching.integrity import normalize_sha256
from ftx_triton.interrupt import keeping
from ftx_triton.io.hashing import sha256_file
from ftx_triton.terminal.console import say
from ftx_triton.terminal.progress import ByteProgress, byte_progress
from ftx_triton.terminal.redact import redact_url

log = structlog.get_logger(__name__)

CHUNK_BYTES = 1 << 20
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_USER_AGENT = "ftx (+https://github.com/triton-inference-server/fastertransformer_backend)"


class _Transient(Exception):
    """A failure worth retrying: connection error, 5xx, stall, truncated body."""


@dataclass(frozen=True)
class _Plan:
    """How to write a response: from which offset, towards which total size."""

    start: int
    total: int | None


def part_path(dest: Path) -> Path:
    """Where the bytes of ``dest`` accumulate until they are complete and verified."""
    return dest.with_suffix(dest.suffix + ".part")


def download(
    url: str, dest: Path, *, sha256: str | None = None, retries: int = 5, progress: bool = True, timeout_s: float = 30
) -> Path:
    """Download ``url`` to ``dest`` (resumable, retried, checksum-verified) and return ``dest``.

    An existing ``dest`` counts as done (re-verified when ``sha256`` is given).
    Raises :class:`SourceError` for a bad URL, an HTTP error, retries exhausted, or a
    checksum mismatch (then neither ``dest`` nor a partial file is left).
    """
    dest = Path(dest)
    expected = normalize_sha256(sha256)
    scheme = _check_scheme(url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest, url):
        if _reuse_existing(dest, expected, progress):
            return dest
        part = part_path(dest)
        started = time.monotonic()
        log.info("download.started", url=redact_url(url), dest=str(dest))
        if scheme == "file":
            _copy_local(url, part, progress)
        else:
            with keeping(
                lambda: (
                    f"{_size(part)} bytes of {dest.name} in {part} (the next run resumes the download)"
                    if _size(part)
                    else None
                )
            ):
                _fetch_with_retries(url, part, retries=retries, timeout_s=timeout_s, progress=progress)
        _verify(part, expected, url, progress)
        os.replace(part, dest)
        _validator_path(part).unlink(missing_ok=True)
        log.info(
            "download.finished",
            url=redact_url(url),
            dest=str(dest),
            bytes=dest.stat().st_size,
            seconds=round(time.monotonic() - started, 3),
            sha256=expected,
        )
    return dest


def _check_scheme(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in {"http", "https", "file"}:
        raise SourceError(
            f"cannot download {redact_url(url)!r}: unsupported URL scheme {scheme!r}",
            hint="use an http://, https:// or file:// URL",
        )
    return scheme


class _locked:
    """Hold ``DEST.lock``; say so when another process is already downloading."""

    def __init__(self, dest: Path, url: str) -> None:
        self._lock = FileLock(str(dest) + ".lock")
        self._url = url

    def __enter__(self) -> None:
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            log.info("download.waiting", url=redact_url(self._url), reason="another download of it is running")
            say(f"waiting for another process that is downloading {redact_url(self._url)} …")
            self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _reuse_existing(dest: Path, expected: str | None, progress: bool) -> bool:
    if not dest.is_file():
        return False
    if expected is None or sha256_file(dest, progress=progress) == expected:
        log.info("download.cached", dest=str(dest))
        return True
    log.warning("download.stale", dest=str(dest), reason="checksum differs; downloading again")
    dest.unlink()
    return False


def _verify(part: Path, expected: str | None, url: str, progress: bool) -> None:
    if expected is None:
        return
    actual = sha256_file(part, progress=progress)
    if actual == expected:
        return
    part.unlink(missing_ok=True)
    _validator_path(part).unlink(missing_ok=True)
    raise SourceError(
        f"checksum mismatch for {redact_url(url)}: expected sha256 {expected}, got {actual}",
        hint="the download was corrupt or the file changed upstream; nothing was kept. "
        "Check the --sha256 value, then run the command again.",
    )


def _copy_local(url: str, part: Path, progress: bool) -> None:
    source = Path(url2pathname(urlsplit(url).path))
    if not source.is_file():
        raise SourceError(f"{url} is not a file", hint="check the path in the file:// URL")
    with (
        open(source, "rb") as src,
        open(part, "wb") as out,
        byte_progress(source.name, source.stat().st_size, enabled=progress) as bar,
    ):
        while chunk := src.read(CHUNK_BYTES):
            out.write(chunk)
            bar.advance(len(chunk))


def _fetch_with_retries(url: str, part: Path, *, retries: int, timeout_s: float, progress: bool) -> None:
    """Call :func:`_fetch_once` until the file is complete; attempts that made progress are free."""
    failures = 0
    with byte_progress(Path(urlsplit(url).path).name or "download", enabled=progress) as bar:
        while True:
            before = _size(part)
            try:
                _fetch_once(url, part, timeout_s=timeout_s, bar=bar)
                return
            except _Transient as exc:
                progressed = _size(part) > before
                failures += 0 if progressed else 1
                if failures > retries:
                    raise SourceError(
                        f"could not download {redact_url(url)} after {retries + 1} attempts: {exc}",
                        hint=f"check the network and the URL; {_size(part)} bytes are kept in {part} "
                        "and the next run resumes from there",
                    ) from exc
                delay = 0.0 if progressed else min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (failures - 1))
                log.warning(
                    "download.retrying",
                    url=redact_url(url),
                    error=str(exc),
                    have_bytes=_size(part),
                    attempt=failures,
                    delay_s=delay,
                )
                time.sleep(delay)


def _fetch_once(url: str, part: Path, *, timeout_s: float, bar: ByteProgress) -> None:
    """One GET, resuming from the bytes already in ``part``; raises _Transient to retry."""
    offset = _size(part)
    request = Request(url, headers=_request_headers(offset, _read_validator(part)))
    try:
        response = urlopen(request, timeout=timeout_s)  # noqa: S310 - scheme checked above
    except HTTPError as exc:
        if exc.code == 416 and offset:
            _handle_unsatisfiable_range(exc, part, offset)
            return
        raise _http_error(url, exc) from exc
    except (URLError, OSError, http.client.HTTPException) as exc:
        _raise_if_tls_untrusted(url, exc)
        raise _Transient(_describe(exc, timeout_s)) from exc
    with response:
        plan = _plan(response, offset, part)
        if plan.start:
            log.info("download.resumed", url=redact_url(url), offset=plan.start, total=plan.total)
        elif offset:
            log.warning("download.restarted", url=redact_url(url), reason="server ignored the Range request")
        _write_validator(part, response.headers, plan)
        bar.reset(completed=plan.start, total=plan.total)
        try:
            with open(part, "ab" if plan.start else "wb") as out:
                _copy_body(response, out, bar, timeout_s, bounded=plan.total is not None)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            got = _size(part)
            part.unlink(missing_ok=True)
            _validator_path(part).unlink(missing_ok=True)
            declared = f"of {plan.total} declared" if plan.total is not None else "(its server declared no size)"
            raise SourceError(
                f"no space left for {redact_url(url)} in {part.parent} after {got} bytes {declared}; "
                "the partial download was removed",
                hint="free space on that disk, or point FTX_HOME at a larger one",
            ) from None
    if plan.total is not None and _size(part) < plan.total:
        raise _Transient(f"connection closed after {_size(part)} of {plan.total} bytes")


def _request_headers(offset: int, validator: str | None) -> dict[str, str]:
    headers = {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    return headers


def _plan(response: http.client.HTTPResponse, offset: int, part: Path) -> _Plan:
    """Decide where the body starts: 206 continues ``part``, anything else rewrites it."""
    length = _int_or_none(response.headers.get("Content-Length"))
    if response.status != 206:
        return _Plan(0, length)
    match = _CONTENT_RANGE_RE.fullmatch(response.headers.get("Content-Range", "").strip())
    if not match or int(match.group(1)) != offset:
        part.unlink(missing_ok=True)
        raise _Transient(f"server answered Range bytes={offset}- with {response.headers.get('Content-Range')!r}")
    total = _int_or_none(match.group(3))
    return _Plan(offset, total if total is not None else (offset + length if length is not None else None))


def _copy_body(
    response: http.client.HTTPResponse, out: BinaryIO, bar: ByteProgress, timeout_s: float, *, bounded: bool
) -> None:
    """Copy the body; one of undeclared size (``bounded`` False) stops with ENOSPC while the disk still
    keeps the extraction reserve free."""
    reserve = 0 if bounded else FREE_SPACE_RESERVE
    while True:
        try:
            chunk = response.read1(CHUNK_BYTES)
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(_describe(exc, timeout_s)) from exc
        if not chunk:
            return
        if reserve and shutil.disk_usage(Path(out.name).parent).free - len(chunk) < reserve:
            raise OSError(errno.ENOSPC, "the disk would keep less than its reserve free")
        out.write(chunk)
        bar.advance(len(chunk))


def _handle_unsatisfiable_range(exc: HTTPError, part: Path, offset: int) -> None:
    """416 on resume: the part is already complete, or it is junk to throw away."""
    match = re.fullmatch(r"bytes \*/(\d+)", (exc.headers.get("Content-Range") or "").strip())
    if match and int(match.group(1)) == offset:
        return
    part.unlink(missing_ok=True)
    raise _Transient(f"server cannot resume at byte {offset}; starting over") from exc


def _http_error(url: str, exc: HTTPError) -> Exception:
    where = redact_url(url)
    if exc.code in _TRANSIENT_STATUS:
        return _Transient(f"HTTP {exc.code} {exc.reason}")
    if exc.code == 404:
        return SourceError(
            f"{where} was not found (HTTP 404)", hint="check the URL, or pick a preset with `ftx pull --help`"
        )
    if exc.code in (401, 403):
        return SourceError(
            f"access to {where} was refused (HTTP {exc.code})",
            hint="the URL needs credentials or has expired; download it yourself and pass the local file path instead",
        )
    return SourceError(f"downloading {where} failed: HTTP {exc.code} {exc.reason}", hint="check the URL")


def _raise_if_tls_untrusted(url: str, exc: BaseException) -> None:
    """A certificate problem does not go away by retrying: fail at once, with the fix."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLCertVerificationError):
        raise SourceError(
            f"the TLS certificate of {urlsplit(url).hostname} could not be verified ({reason.verify_message})",
            hint="behind a TLS-intercepting proxy, point SSL_CERT_FILE at your organisation's CA bundle",
        ) from exc


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
        return f"no data for {timeout_s:g}s (stalled); retrying. If this persists, press ctrl-c and try another network"
    return f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"


def _validator_path(part: Path) -> Path:
    return part.with_suffix(part.suffix + ".validator")


def _read_validator(part: Path) -> str | None:
    try:
        return _validator_path(part).read_text().strip() or None
    except FileNotFoundError:
        return None


def _write_validator(part: Path, headers: http.client.HTTPMessage, plan: _Plan) -> None:
    """Remember the strong ETag (or Last-Modified) of a fresh transfer for a later If-Range."""
    if plan.start:
        return
    etag = headers.get("ETag") or ""
    validator = etag if etag and not etag.startswith("W/") else headers.get("Last-Modified")
    path = _validator_path(part)
    if validator:
        path.write_text(validator)
    else:
        path.unlink(missing_ok=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


__all__ = ["download", "part_path"]
