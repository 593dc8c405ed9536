"""Core's default ``ftx_fetch``: local directories, local or remote archives, the Hugging Face Hub."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import structlog

from ftx import hookimpl
from ftx.artifacts import Source, SourceRef
from ftx.context import RunSettings, StageContext
from ftx.errors import SourceError
from ftx.family import Family
from ftx.plugins import PluginHost

log = structlog.get_logger(__name__)

WEIGHT_FALLBACK = ("pytorch_model*.bin", "pytorch_model.bin.index.json")


BUILTIN = "builtin:"


def preset_refs(host: PluginHost) -> dict[str, SourceRef]:
    """Every preset of every family as a SourceRef (built-in models are built on first use)."""
    from ftx.fetching.refs import parse_ref

    refs = {}
    for name, (_family, preset) in host.presets().items():
        if preset.source.startswith(BUILTIN):
            refs[name] = SourceRef("builtin", preset.source, preset=name)
            continue
        base = parse_ref(preset.source, revision=preset.revision)
        refs[name] = SourceRef(base.kind, base.uri, preset.revision or base.revision, preset.sha256, preset=name)
    return refs


def resolve_source(settings: RunSettings, host: PluginHost) -> tuple[SourceRef, str | None]:
    """The SourceRef for ``settings.model`` (or ``--source``) and the family a preset implies."""
    from ftx.fetching.refs import parse_ref

    presets = preset_refs(host)
    preset_family = None
    if settings.model in presets:
        family, preset = host.presets()[settings.model]
        preset_family = family.name
        if family.license or preset.license:
            log.info("license.notice", model=settings.model, license=preset.license or family.license)
    text = settings.source or settings.model
    ref = parse_ref(text, presets=presets, revision=settings.revision)
    if settings.sha256:
        ref = dataclasses.replace(ref, sha256=settings.sha256)
    if ref.kind == "builtin":
        ref = SourceRef("local", str(build_builtin(ref.uri.removeprefix(BUILTIN))), preset=ref.preset)
    return ref, preset_family


def build_builtin(name: str) -> Path:
    """Build (once, offline, deterministically) a model that ships with ftx."""
    from ftx.demo import ensure_demo_checkpoint
    from ftx.paths import ftx_home

    if name != "tiny-gptj":
        raise SourceError(f"unknown built-in model {name!r}", hint="the built-in model is tiny-gptj")
    return ensure_demo_checkpoint(ftx_home())


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
    from ftx.fetching.archive import is_archive, safe_extract
    from ftx.fetching.http import download

    local = _local_file(ref)
    if local is not None and not ref.sha256:
        downloaded = local  # extract in place: no copy of a multi-GB archive
    else:
        name = urlsplit(ref.uri).path.rstrip("/").rsplit("/", 1)[-1] or "download"
        downloads = ctx.home / "downloads" / revision
        downloads.mkdir(parents=True, exist_ok=True)
        downloaded = download(ref.uri, downloads / name, sha256=ref.sha256, progress=ctx.show_progress)
    if not is_archive(downloaded):
        raise SourceError(f"{ref.uri} is neither a checkpoint directory nor an archive",
                          hint="point at a directory with config.json, or a .tar.zstd/.tar.gz/.tar/.zip archive")
    root = safe_extract(downloaded, dest / "extracted", progress=ctx.show_progress)
    return Source(ref=ref, path=root, revision=revision, origin={"kind": ref.kind, "uri": ref.uri, "sha256": ref.sha256})


def _local_file(ref: SourceRef) -> Path | None:
    if ref.kind == "local":
        return Path(ref.uri)
    if ref.uri.startswith("file:"):
        return Path(url2pathname(urlsplit(ref.uri).path))
    return None


def _fetch_hub(ref: SourceRef, revision: str, family: Family, dest: Path, ctx: StageContext) -> Source:
    from ftx.fetching.hub import download_snapshot, list_repo_files

    repo_id = ref.uri.removeprefix("hf://")
    token = os.environ.get("HF_TOKEN") or None
    patterns = list(family.fetch_patterns)
    files = list_repo_files(repo_id, revision, token=token)
    if not any(fnmatch.fnmatch(f, "*.safetensors") for f in files):
        patterns += list(WEIGHT_FALLBACK)
    download_snapshot(repo_id, revision, dest, patterns, token=token, progress=ctx.show_progress)
    return Source(ref=ref, path=dest, revision=revision, origin={"kind": "hf", "repo": repo_id, "commit": revision})
