"""Get the pinned upstream sources and prove they are the pinned ones.

``--sources DIR|ARCHIVE`` takes a directory (or an archive of one) in the source layout of
:mod:`ftx_triton.runtime.fastertransformer.pins`, for machines without network; without it each component's public archive is
downloaded (:func:`ftx_triton.fetching.http.download`) and extracted into that layout. Either way every
component's used files are hashed into a tree digest and compared with the pin before anything is
built: a mismatch is a :class:`~ftx_triton.errors.SourceError` naming the component.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import structlog

from ftx_triton.errors import SourceError
from ftx_triton.io.atomic import publish_dir
from ftx_triton.io.hashing import sha256_file
from ftx_triton.runtime.fastertransformer.pins import COMPONENTS, Component, pins_fingerprint
from ftx_triton.store.artifact_store import make_key

log = structlog.get_logger(__name__)

READY_MARK = ".ftx-sources.json"
"""Written into an extracted source tree once it is complete and verified."""


def used_files(root: Path, comp: Component) -> list[str]:
    """The files of ``comp`` under ``root`` that the build reads, as sorted posix paths inside its folder."""
    base = Path(root) / comp.folder
    found = []
    for path in base.rglob("*"):
        if path.is_file() or path.is_symlink():
            rel = path.relative_to(base).as_posix()
            if comp.uses(rel):
                found.append(rel)
    return sorted(found)


def tree_digest(base: Path, files: Iterable[str]) -> str:
    """sha256 over ``path NUL sha256(content) LF`` of each file, in sorted order."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        path = Path(base) / rel
        if path.is_symlink():
            content = f"symlink:{os.readlink(path)}"
        else:
            content = sha256_file(path)
        digest.update(f"{rel}\0{content}\n".encode())
    return digest.hexdigest()


def component_digest(root: Path, comp: Component) -> str:
    return tree_digest(Path(root) / comp.folder, used_files(root, comp))


def verify_sources(root: Path, components: Sequence[Component] = COMPONENTS) -> None:
    """Raise SourceError for the first component that is missing or whose tree digest differs."""
    root = Path(root)
    for comp in components:
        base = root / comp.folder
        if not base.is_dir():
            raise SourceError(
                f"the sources have no {comp.folder}/ ({comp.display})",
                hint=f"{root} must hold the source layout: FasterTransformer/, "
                "fastertransformer_backend/, triton/{common,core,backend}/, rapidjson/",
            )
        files = used_files(root, comp)
        if not files:
            raise SourceError(
                f"{comp.folder}/ holds none of the files the build uses ({comp.display})",
                hint=f"expected {', '.join(comp.used)} inside {base}",
            )
        got = tree_digest(base, files)
        if got != comp.tree_sha256:
            raise SourceError(
                f"the sources of {comp.name} differ from the pinned {comp.display}: tree sha256 {got[:16]}… "
                f"over {len(files)} files, expected {comp.tree_sha256[:16]}…",
                hint=f"use {comp.display} unmodified (its {', '.join(comp.used)}); ftx applies its own patches "
                "to a copy, so pass the upstream files, or leave out --sources to download them",
            )
    log.info("sources.verified", root=str(root), components=len(components))


def _layout_root(directory: Path) -> Path:
    """``directory`` or its only subdirectory, whichever holds FasterTransformer/."""
    if (directory / "FasterTransformer").is_dir():
        return directory
    entries = [p for p in directory.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and (entries[0] / "FasterTransformer").is_dir():
        return entries[0]
    raise SourceError(
        f"{directory} is not a source tree: it has no FasterTransformer/ folder",
        hint="--sources takes a directory (or archive) holding FasterTransformer/, "
        "fastertransformer_backend/, triton/ and rapidjson/",
    )


def _ready(directory: Path, key: str) -> bool:
    try:
        return json.loads((directory / READY_MARK).read_text()).get("key") == key
    except (OSError, ValueError):
        return False


def sources_from(spec: Path, cache: Path, *, progress: bool = True) -> Path:
    """The verified source root for ``--sources DIR|ARCHIVE`` (an archive is extracted once into ``cache``)."""
    spec = Path(spec).expanduser()
    if spec.is_dir():
        root = _layout_root(spec.resolve())
        verify_sources(root)
        return root
    if not spec.is_file():
        raise SourceError(f"--sources {spec} does not exist", hint="pass a source directory or archive")
    from ftx_triton.fetching.archive import is_archive, safe_extract

    if not is_archive(spec):
        raise SourceError(
            f"--sources {spec} is neither a directory nor an archive ftx can open",
            hint="use a directory, .tar.gz, .tar.xz, .tar.zst or .zip",
        )
    key = make_key({"archive": sha256_file(spec), "pins": pins_fingerprint()})
    target = Path(cache) / f"archive-{key}"
    if _ready(target, key):
        return _layout_root(target)
    with publish_dir(target, replace=True) as tmp:
        extracted = tmp / "x"
        safe_extract(spec, extracted, progress=progress)
        root = _layout_root(extracted)
        verify_sources(root)
        (tmp / READY_MARK).write_text(json.dumps({"key": key, "archive": str(spec)}))
    return _layout_root(target)


def download_sources(cache: Path, *, progress: bool = True, components: Sequence[Component] = COMPONENTS) -> Path:
    """Download each component's public archive at its pin into one source layout; verified."""
    from ftx_triton.fetching.archive import safe_extract
    from ftx_triton.fetching.http import download

    key = make_key({"pins": pins_fingerprint(tuple(components))})
    target = Path(cache) / f"online-{key}"
    if _ready(target, key):
        return target
    downloads = Path(cache) / "downloads"
    with publish_dir(target, replace=True) as tmp:
        for comp in components:
            archive = download(comp.archive_url, downloads / f"{comp.name}-{comp.ref}.tar.gz", progress=progress)
            extracted = safe_extract(archive, tmp / f".x-{comp.name}", progress=progress)
            dest = tmp / comp.folder
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.exists():  # cutlass goes inside FasterTransformer/3rdparty, an empty submodule folder
                shutil.rmtree(dest)
            os.rename(extracted, dest)
            shutil.rmtree(tmp / f".x-{comp.name}", ignore_errors=True)
        verify_sources(tmp, components)
        (tmp / READY_MARK).write_text(json.dumps({"key": key}))
    return target


def acquire_sources(spec: Path | None, cache: Path, *, progress: bool = True) -> Path:
    """``--sources`` when given, else the public archives; returns the verified source root."""
    return (
        sources_from(spec, cache, progress=progress) if spec is not None else download_sources(cache, progress=progress)
    )


__all__ = [
    "acquire_sources",
    "component_digest",
    "download_sources",
    "sources_from",
    "tree_digest",
    "used_files",
    "verify_sources",
]
