"""Core's default ``ftx_fetch``: local directories, local or remote archives, the Hugging Face Hub."""

from __future__ import annotations

import contextlib
import fnmatch
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ftx_triton import hookimpl
from ftx_triton.errors import SourceError
from ftx_triton.plan.artifacts import Source, SourceRef
from ftx_triton.plan.context import StageContext
from ftx_triton.terminal import lazylog

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family

log = lazylog.get_logger(__name__)

WEIGHT_FALLBACK = ("pytorch_model*.bin", "pytorch_model.bin.index.json")


@hookimpl(trylast=True)
def ftx_fetch(ref: SourceRef, revision: str, family: Family, dest: Path, ctx: StageContext) -> Source | None:
    if ref.kind == "local" and Path(ref.uri).is_dir():
        return Source(ref=ref, path=Path(ref.uri), revision=revision, origin={"kind": "local", "path": ref.uri})
    if ref.kind in ("local", "url"):
        return _fetch_archive_or_file(ref, revision, dest, ctx)
    if ref.kind == "hf":
        return _fetch_hub(ref, revision, family, dest, ctx)
    return None


def _fetch_archive_or_file(ref: SourceRef, revision: str, dest: Path, ctx: StageContext) -> Source:
    from ftx_triton.fetching.archive import is_archive, safe_extract
    from ftx_triton.fetching.http import download
    from ftx_triton.fetching.refs import download_name
    from ftx_triton.io.hashing import sha256_file

    local = _local_file(ref)
    temporary = local is None or bool(ref.sha256)
    if local is not None and not is_archive(local):
        raise SourceError(
            f"{ref.uri} is neither a checkpoint directory nor an archive",
            hint="point at a directory with config.json, or a .tar.zstd/.tar.gz/.tar/.zip archive",
        )
    if local is not None and not temporary:
        downloaded = local  # extract in place: no copy of a multi-GB archive
    else:
        name = local.name if local is not None else download_name(ref.uri)  # refused before downloading
        downloads = ctx.home / "downloads" / revision
        downloads.mkdir(parents=True, exist_ok=True)
        downloaded = download(ref.uri, downloads / name, sha256=ref.sha256, progress=ctx.show_progress)
    try:
        sha256 = ref.sha256 or sha256_file(downloaded, progress=ctx.show_progress)  # recorded: `ftx lock` pins it
        root = safe_extract(downloaded, dest / "extracted", progress=ctx.show_progress)
    except SourceError:
        if temporary:  # a refused archive is not worth keeping for a week
            _remove_download(downloaded, "refused")
        raise
    if temporary:  # the extracted tree is the artifact; the archive would only double the disk used
        _remove_download(downloaded, "extracted into the store")
    return Source(ref=ref, path=root, revision=revision, origin={"kind": ref.kind, "uri": ref.uri, "sha256": sha256})


def _remove_download(downloaded: Path, reason: str) -> None:
    """Remove a downloaded archive, its lock file and its directory once that is empty."""
    downloaded.unlink(missing_ok=True)
    Path(f"{downloaded}.lock").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        downloaded.parent.rmdir()
    log.info("download.removed", path=str(downloaded), reason=reason)


def _local_file(ref: SourceRef) -> Path | None:
    if ref.kind == "local":
        return Path(ref.uri)
    if ref.uri.startswith("file:"):
        from urllib.request import url2pathname  # http.client, email: not for a local directory

        return Path(url2pathname(urlsplit(ref.uri).path))
    return None


def _fetch_hub(ref: SourceRef, revision: str, family: Family, dest: Path, ctx: StageContext) -> Source:
    from ftx_triton.fetching.hub import download_snapshot, list_repo_files

    repo_id = ref.uri.removeprefix("hf://")
    token = os.environ.get("HF_TOKEN") or None
    patterns = list(family.fetch_patterns)
    files = list_repo_files(repo_id, revision, token=token)
    if not any(fnmatch.fnmatch(f, "*.safetensors") for f in files):
        patterns += list(WEIGHT_FALLBACK)
    download_snapshot(repo_id, revision, dest, patterns, token=token, progress=ctx.show_progress)
    return Source(ref=ref, path=dest, revision=revision, origin={"kind": "hf", "repo": repo_id, "commit": revision})
