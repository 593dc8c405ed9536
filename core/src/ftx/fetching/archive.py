"""Safe extraction of checkpoint archives: ``.tar.zst(d)``, ``.tar.gz``, ``.tar``, ``.zip``.

Every member is checked before it is written: no absolute path, no ``..`` component, no
symlink or hard link pointing outside the target, no device, fifo or other special file.
Extraction goes to a temporary directory next to ``dest`` that is renamed onto ``dest`` only
when everything succeeded, so a refused or broken archive leaves nothing at ``dest``.
"""

from __future__ import annotations

import gzip
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

import structlog
import zstandard

from ftx.errors import OutputError, SourceError
from ftx.progress import ByteProgress, byte_progress

log = structlog.get_logger(__name__)

_FORMATS: dict[str, tuple[str, ...]] = {
    "tar.zst": (".tar.zstd", ".tar.zst", ".tzst"),
    "tar": (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz"),
    "zip": (".zip",),
}
_CHUNK_BYTES = 1 << 20
_ZSTD_MAX_WINDOW = 1 << 31  # archives made with `zstd --long=31`
_CORRUPT_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zstandard.ZstdError,
    gzip.BadGzipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
)
_UNSAFE_HINT = (
    "the archive is unsafe or corrupt; nothing was extracted. Get it from a trusted source and pass its --sha256"
)


class _Unsafe(Exception):
    """A member that must not be extracted."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"member {member!r} {reason}")


def archive_format(path: Path) -> str | None:
    """``tar.zst``, ``tar`` or ``zip`` from the file name, None for anything else."""
    name = Path(path).name.lower()
    for fmt, suffixes in _FORMATS.items():
        if name.endswith(suffixes):
            return fmt
    return None


def is_archive(path: Path) -> bool:
    """True when the file name says it is an archive :func:`safe_extract` can open.

    Decided by name only: ``pytorch_model.bin`` and ``.npz`` files are zips inside.
    """
    return archive_format(path) is not None


def safe_extract(archive: Path, dest: Path, *, progress: bool = True) -> Path:
    """Extract ``archive`` into ``dest`` (which must not exist, or be empty) and return the root.

    The root is ``dest``, or its only entry when the archive holds one top-level directory.
    Raises :class:`SourceError` naming the member for an unsafe archive and for a corrupt one.
    """
    archive, dest = Path(archive), Path(dest)
    fmt = _check_inputs(archive, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log.info("extract.started", archive=str(archive), dest=str(dest))
    with _staging(dest) as tmp:
        try:
            with byte_progress(f"extracting {archive.name}", archive.stat().st_size, enabled=progress) as bar:
                if fmt == "zip":
                    _extract_zip(archive, tmp, bar)
                else:
                    _extract_tar(archive, tmp, bar, zstd=fmt == "tar.zst")
            _check_links_inside(tmp)
        except _Unsafe as exc:
            raise SourceError(f"refusing to extract {archive.name}: {exc}", hint=_UNSAFE_HINT) from exc
        except _CORRUPT_ERRORS as exc:
            raise SourceError(
                f"cannot extract {archive.name}: the archive is corrupt or truncated ({exc})",
                hint="delete it and fetch it again; pass --sha256 to check the download",
            ) from exc
    root = _single_top_dir(dest)
    log.info("extract.finished", archive=str(archive), root=str(root), seconds=round(time.monotonic() - started, 3))
    return root


def _check_inputs(archive: Path, dest: Path) -> str:
    fmt = archive_format(archive)
    if fmt is None:
        accepted = ", ".join(s for suffixes in _FORMATS.values() for s in suffixes)
        raise SourceError(f"{archive.name} is not a supported archive", hint=f"accepted: {accepted}")
    if not archive.is_file():
        raise SourceError(f"archive {archive} does not exist", hint="check the path")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise OutputError(
            f"cannot extract into {dest}: it already exists", hint="remove it or choose another directory"
        )
    return fmt


@contextmanager
def _staging(dest: Path) -> Iterator[Path]:
    """A temp dir next to ``dest``, renamed onto it on success and removed on any failure."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".extracting", dir=dest.parent))
    try:
        yield tmp
        if dest.is_dir():
            dest.rmdir()  # empty: checked before
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_member(name: str, kind: str, link: str | None = None) -> None:
    """Raise _Unsafe unless the member stays inside the target. ``kind``: file/dir/symlink/hardlink/special."""
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[0].isalpha() and norm[1] == ":"):
        raise _Unsafe(name, "has an absolute path")
    if ".." in norm.split("/"):
        raise _Unsafe(name, "has a '..' path component")
    if kind == "special":
        raise _Unsafe(name, "is a device, fifo or other special file")
    if kind in ("symlink", "hardlink"):
        _check_link(name, norm, kind, (link or "").replace("\\", "/"))


def _check_link(name: str, norm: str, kind: str, link: str) -> None:
    if not link or link.startswith("/"):
        raise _Unsafe(name, f"is a {kind} to an absolute path {link!r}")
    # A symlink resolves from its own directory, a tar hard link from the archive root.
    base = posixpath.dirname(norm) if kind == "symlink" else ""
    target = posixpath.normpath(posixpath.join(base, link))
    if target == ".." or target.startswith("../"):
        raise _Unsafe(name, f"is a {kind} pointing outside the target ({link!r})")


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    return "special"


def _extract_tar(archive: Path, tmp: Path, bar: ByteProgress, *, zstd: bool) -> None:
    """Stream the tar (no seeking, so .tar.zst works), checking each member before writing it."""
    with (
        open(archive, "rb") as raw,
        _decompressed(cast(IO[bytes], _CountingReader(raw, bar)), zstd) as stream,
        tarfile.open(fileobj=stream, mode="r|" if zstd else "r|*") as tar,
    ):
        for member in tar:
            _check_member(member.name, _tar_kind(member), member.linkname or None)
            _extract_member(tar, member, tmp)


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, tmp: Path) -> None:
    """Extract with the stdlib's ``data`` filter (3.11.4+) as a second line of defence."""
    try:
        if hasattr(tarfile, "data_filter"):
            tar.extract(member, tmp, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tar.extract(member, tmp)
    except tarfile.FilterError as exc:
        raise _Unsafe(member.name, str(exc)) from exc


@contextmanager
def _decompressed(raw: IO[bytes], zstd: bool) -> Iterator[IO[bytes]]:
    if not zstd:
        yield raw
        return
    decompressor = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    with decompressor.stream_reader(raw, read_across_frames=True, closefd=False) as reader:
        yield reader


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if info.is_dir() or stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_IFMT(mode) and not stat.S_ISREG(mode):
        return "special"
    return "file"


def _extract_zip(archive: Path, tmp: Path, bar: ByteProgress) -> None:
    """Check every member first (the directory is at the end), then write them."""
    with zipfile.ZipFile(archive) as zf:
        members = [(info, _zip_kind(info)) for info in zf.infolist()]
        links = {info.filename: zf.read(info).decode() for info, kind in members if kind == "symlink"}
        for info, kind in members:
            _check_member(info.filename, kind, links.get(info.filename))
        bar.reset(total=sum(info.file_size for info, _ in members))
        for info, kind in members:
            _write_zip_member(zf, info, kind, tmp / info.filename, links.get(info.filename), bar)


def _write_zip_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, kind: str, target: Path, link: str | None, bar: ByteProgress
) -> None:
    if kind == "dir":
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        os.symlink(link or "", target)
        return
    with zf.open(info) as src, open(target, "wb") as out:
        while chunk := src.read(_CHUNK_BYTES):
            out.write(chunk)
            bar.advance(len(chunk))


def _check_links_inside(root: Path) -> None:
    """After extraction: every symlink must still resolve inside ``root`` (defence in depth)."""
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                real = os.path.realpath(path)
                if os.path.commonpath([real_root, real]) != real_root:
                    raise _Unsafe(os.path.relpath(path, root), "resolves outside the target")


def _single_top_dir(dest: Path) -> Path:
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return dest


class _CountingReader:
    """A read-only file object that reports the bytes read to a progress bar."""

    def __init__(self, raw: IO[bytes], bar: ByteProgress) -> None:
        self._raw = raw
        self._bar = bar

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._bar.advance(len(data))
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """The underlying file is closed by its owner."""
