"""Hugging Face Hub sources: revision → commit, filtered snapshot downloads, offline use.

``HF_ENDPOINT``, ``HF_HUB_OFFLINE``, ``HF_HOME`` / ``HF_HUB_CACHE`` are read at call time
(huggingface_hub itself reads them once, at import). The token (``token=`` or ``HF_TOKEN``)
is passed to huggingface_hub and never logged or put in an error message.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import structlog
from huggingface_hub import HfApi, constants, get_token, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
    filter_repo_objects,
)

from ftx_triton.errors import ConfigError, SourceError
from ftx_triton.paths import ftx_home
from ftx_triton.terminal.progress import progress_enabled

log = structlog.get_logger(__name__)

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_REVISION = "main"
_TRUE = {"1", "true", "yes", "on"}


# --- environment, read at call time -------------------------------------------------------


def hf_endpoint() -> str:
    """``HF_ENDPOINT`` or huggingface.co; an endpoint that is no http(s) URL is a ConfigError (huggingface_hub
    would fail on it with a traceback)."""
    from urllib.parse import urlsplit

    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    try:
        parts = urlsplit(endpoint)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        usable = False
    if not usable:
        raise ConfigError(
            f"HF_ENDPOINT={endpoint[:200]!r} is not an http(s) URL of a Hugging Face Hub",
            hint="unset HF_ENDPOINT to use huggingface.co, or set it to a mirror such as https://hf-mirror.example",
        )
    return endpoint


def hf_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: ``HF_HUB_CACHE``, ``$HF_HOME/hub`` or the default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def repo_page(repo_id: str) -> str:
    """The web page of a repository, where its licence is accepted."""
    return f"{hf_endpoint()}/{repo_id}"


_REVISION_RE = re.compile(r"^[A-Za-z0-9._+\-]+(?:/[A-Za-z0-9._+\-]+)*$")


def check_revision(revision: str) -> str:
    """``revision`` if it is a branch, tag or commit name that is safe as a path under the cache's ``refs/``.

    Git's own rules, narrowed: ASCII letters, digits, ``. _ + -`` and ``/`` between parts; no part
    starting with ``.`` (so no ``..``) or ending in ``.lock``. ``refs/pr/1`` is fine.
    """
    parts = revision.split("/")
    if not _REVISION_RE.match(revision) or any(p.startswith(".") or p.endswith(".lock") for p in parts):
        raise SourceError(
            f"invalid revision {revision!r}",
            hint="give a branch, tag or 40-hex commit: letters, digits, '.', '_', '+', '-' and '/' between "
            "parts, no part starting with '.' (e.g. main, v1.0, refs/pr/1)",
        )
    return revision


def _ref_file(repo_id: str, revision: str) -> Path:
    """Where ftx remembers the commit ``revision`` pointed to when it last asked the Hub (its own record under
    FTX_HOME; the Hugging Face cache belongs to huggingface_hub, which ftx reads only through its API)."""
    return ftx_home() / "hub" / "refs" / repo_id.replace("/", "--") / check_revision(revision)


# --- revision → commit --------------------------------------------------------------------


def resolve_commit(repo_id: str, revision: str | None, *, token: str | None = None) -> str:
    """The 40-hex commit a branch, tag or commit of ``repo_id`` points to.

    Offline (``HF_HUB_OFFLINE``), or when the Hub cannot be reached, the commit recorded in
    the local Hugging Face cache is used; without one, :class:`SourceError`.
    """
    rev = check_revision(revision or DEFAULT_REVISION)
    if COMMIT_RE.fullmatch(rev.lower()):
        return rev.lower()
    if hf_offline():
        return _cached_commit_or_fail(repo_id, rev, "HF_HUB_OFFLINE is set")
    try:
        with hub_errors(repo_id, rev, token):
            info = HfApi(endpoint=hf_endpoint(), token=token).model_info(repo_id, revision=rev)
    except _HubUnreachable as exc:
        commit = _cached_commit_or_fail(repo_id, rev, f"the Hub cannot be reached ({exc})")
        log.warning("hub.offline_fallback", repo=repo_id, revision=rev, commit=commit)
        return commit
    if not info.sha:
        raise SourceError(
            f"the Hub did not return a commit for {repo_id}@{rev}", hint="pass a 40-hex commit as revision"
        )
    _remember_ref(repo_id, rev, info.sha)
    log.info("hub.resolved", repo=repo_id, revision=rev, commit=info.sha)
    return info.sha


def _cached_commit(repo_id: str, rev: str) -> str | None:
    """The commit ``rev`` points to without asking the Hub: the Hugging Face cache's (a snapshot downloaded by
    any tool), else the one ftx remembered (a damaged record of its own is ignored)."""
    try:
        return Path(snapshot_download(repo_id, revision=rev, cache_dir=hf_cache_dir(), local_files_only=True)).name
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    try:
        commit = _ref_file(repo_id, rev).read_text().strip()
    except OSError:
        return None
    return commit if COMMIT_RE.fullmatch(commit) else None


def _cached_commit_or_fail(repo_id: str, rev: str, why: str) -> str:
    commit = _cached_commit(repo_id, rev)
    if commit is not None:
        log.info("hub.resolved", repo=repo_id, revision=rev, commit=commit, offline=True)
        return commit
    raise SourceError(
        f"cannot resolve {repo_id}@{rev}: {why} and the local Hugging Face cache ({hf_cache_dir()}) "
        "has no record of it",
        hint="connect and unset HF_HUB_OFFLINE to download it once, or pass a 40-hex commit as the revision",
    )


def _remember_ref(repo_id: str, rev: str, commit: str) -> None:
    """Remember branch → commit under FTX_HOME, so that an offline run resolves it to the commit it fetched."""
    ref = _ref_file(repo_id, rev)
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    except OSError as exc:
        log.debug("hub.ref_not_recorded", repo=repo_id, revision=rev, error=str(exc))


# --- snapshot download --------------------------------------------------------------------


def list_repo_files(repo_id: str, commit: str, *, token: str | None = None) -> list[str]:
    """The file names of ``repo_id`` at ``commit``: from the Hub, or offline from the cached snapshot.

    Lets a caller choose patterns (e.g. fall back to ``pytorch_model*.bin`` when a repo has
    no safetensors) with the same endpoint, token and error handling as the download.
    """
    _check_commit(commit)
    if hf_offline():
        snapshot = _cached_snapshot(repo_id, commit)
        return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    with _online(repo_id, commit, token):
        info = HfApi(endpoint=hf_endpoint(), token=token).model_info(repo_id, revision=commit)
    return sorted(s.rfilename for s in info.siblings or [])


def download_snapshot(
    repo_id: str,
    commit: str,
    dest: Path,
    allow_patterns: Sequence[str],
    *,
    token: str | None = None,
    progress: bool = True,
) -> list[Path]:
    """Download the files of ``repo_id`` at ``commit`` matching ``allow_patterns`` into ``dest``.

    Returns the downloaded files. Offline, they are hard-linked (or copied) from the local
    Hugging Face cache. Raises :class:`SourceError` with the fix for gated, private or missing
    repos, and when no file matches.
    """
    dest = Path(dest)
    patterns = list(allow_patterns)
    wanted = _select(repo_id, commit, list_repo_files(repo_id, commit, token=token), patterns)
    dest.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    offline = hf_offline()
    log.info("download.started", source="hf-cache" if offline else "hf", repo=repo_id, commit=commit, files=wanted)
    if offline:
        snapshot = _cached_snapshot(repo_id, commit)
        for name in wanted:
            _link_or_copy(snapshot / name, dest / name)
    else:
        with _online(repo_id, commit, token), _hf_progress_bars(progress):
            snapshot_download(
                repo_id,
                revision=commit,
                local_dir=dest,
                allow_patterns=patterns,
                cache_dir=hf_cache_dir(),
                endpoint=hf_endpoint(),
                token=token,
            )
        _drop_download_metadata(dest)
    files = [dest / name for name in wanted]
    log.info(
        "download.finished",
        source="hf",
        repo=repo_id,
        commit=commit,
        files=len(files),
        bytes=sum(f.stat().st_size for f in files),
        seconds=round(time.monotonic() - started, 3),
    )
    return files


def _check_commit(commit: str) -> None:
    if not COMMIT_RE.fullmatch(commit):
        raise SourceError(
            f"a 40-hex commit is needed here, got {commit!r}",
            hint="resolve the branch or tag first with resolve_revision()",
        )


@contextmanager
def _online(repo_id: str, commit: str, token: str | None) -> Iterator[None]:
    """:func:`hub_errors`, with an unreachable Hub as a SourceError too (no cache fallback here)."""
    try:
        with hub_errors(repo_id, commit, token):
            yield
    except _HubUnreachable as exc:
        raise SourceError(
            f"cannot download {repo_id}@{commit[:12]}: the Hub cannot be reached ({exc})",
            hint="check the network and HF_ENDPOINT (a proxy goes in HTTPS_PROXY), or set HF_HUB_OFFLINE=1 "
            "to use the local Hugging Face cache",
        ) from exc


def _select(repo_id: str, commit: str, names: list[str], patterns: list[str]) -> list[str]:
    wanted = sorted(filter_repo_objects(names, allow_patterns=patterns))
    if bad := [n for n in wanted if n.startswith("/") or ".." in n.replace("\\", "/").split("/")]:
        raise SourceError(
            f"{repo_id}@{commit[:12]} lists a file outside the repository: {bad[0]!r}",
            hint="the Hub (or HF_ENDPOINT) answered with a hostile file list; check HF_ENDPOINT",
        )
    if not wanted:
        listing = ", ".join(sorted(names)[:20]) or "nothing"
        raise SourceError(
            f"no file of {repo_id}@{commit[:12]} matches {patterns}; it has: {listing}",
            hint="check the revision; the model family decides which files are needed",
        )
    return wanted


def _cached_snapshot(repo_id: str, commit: str) -> Path:
    try:
        return Path(snapshot_download(repo_id, revision=commit, cache_dir=hf_cache_dir(), local_files_only=True))
    except LocalEntryNotFoundError:
        raise SourceError(
            f"{repo_id}@{commit[:12]} is not in the local Hugging Face cache ({hf_cache_dir()}) "
            "and HF_HUB_OFFLINE is set",
            hint="unset HF_HUB_OFFLINE to download it, or set HF_HOME / HF_HUB_CACHE to the cache that holds it",
        ) from None


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    real = os.path.realpath(src)  # cache snapshots are symlinks into blobs/
    try:
        os.link(real, dst)
    except OSError:
        shutil.copyfile(real, dst)


def _drop_download_metadata(dest: Path) -> None:
    """Remove the ``.cache/huggingface`` bookkeeping that local_dir downloads leave behind."""
    shutil.rmtree(dest / ".cache" / "huggingface", ignore_errors=True)
    with suppress(OSError):
        (dest / ".cache").rmdir()


@contextmanager
def _hf_progress_bars(requested: bool) -> Iterator[None]:
    """huggingface_hub's own bars on a terminal; none otherwise (JSON logs, CI)."""
    if progress_enabled(requested) or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


# --- errors -------------------------------------------------------------------------------


class _HubUnreachable(Exception):
    """The Hub could not be reached (network down, offline mode, timeouts)."""


def _network_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [OfflineModeIsEnabled, ConnectionError, TimeoutError]
    try:
        import requests

        types += [requests.ConnectionError, requests.Timeout]
    except ImportError:  # huggingface_hub >= 1.0 uses httpx
        pass
    try:
        import httpx

        types.append(httpx.TransportError)
    except ImportError:
        pass
    return tuple(types)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


@contextmanager
def hub_errors(repo_id: str, revision: str, token: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub failures into SourceErrors that say how to fix them.

    Network failures become :class:`_HubUnreachable` so callers can fall back to the cache.
    """
    try:
        yield
    except SourceError:
        raise
    except Exception as exc:
        mapped = _map_hub_error(exc, repo_id, revision, has_token=bool(token or get_token()))
        if mapped is None:
            raise
        raise mapped from exc


def _map_hub_error(exc: BaseException, repo_id: str, revision: str, *, has_token: bool) -> Exception | None:
    page = repo_page(repo_id)
    fix = (
        f"accept the model's licence at {page} while logged in, create a read token at "
        f"{hf_endpoint()}/settings/tokens and set HF_TOKEN=<token> (ftx never prints it)"
    )
    network = _network_error_types()
    for cause in _causes(exc):
        if isinstance(cause, GatedRepoError) or _status(cause) in (401, 403):
            return _access_error(repo_id, page, fix, gated=isinstance(cause, GatedRepoError), has_token=has_token)
        if isinstance(cause, RepositoryNotFoundError):
            return SourceError(
                f"Hugging Face repository {repo_id} was not found"
                + (
                    ", or the token has no access to it"
                    if has_token
                    else ", or it is private or gated and no token was found"
                ),
                hint=f"check the name at {page}; for a private or gated model, {fix}",
            )
        if isinstance(cause, RevisionNotFoundError):
            return SourceError(
                f"revision {revision!r} does not exist in {repo_id}",
                hint=f"use a branch, tag or 40-hex commit listed at {page}/tree/main",
            )
        if isinstance(cause, EntryNotFoundError) and not isinstance(cause, FileNotFoundError):
            return SourceError(
                f"a file of {repo_id}@{revision} disappeared from the Hub", hint="run again, or pin another commit"
            )
        if isinstance(cause, network):
            return _HubUnreachable(type(cause).__name__)
    if isinstance(exc, HfHubHTTPError):
        return SourceError(f"the Hub refused {repo_id}@{revision} (HTTP {_status(exc)})", hint="try again later")
    return None


def _access_error(repo_id: str, page: str, fix: str, *, gated: bool, has_token: bool) -> SourceError:
    what = "gated" if gated else "private or gated"
    if has_token:
        message = f"{repo_id} is {what} and the Hugging Face token was refused or has not been granted access"
    else:
        message = f"{repo_id} is {what} and no Hugging Face token was found"
    return SourceError(message, hint=fix)
