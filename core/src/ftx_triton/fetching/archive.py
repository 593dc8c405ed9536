"""Safe extraction of checkpoint archives: ``.tar.zst(d)``, ``.tar.gz``, ``.tar``, ``.zip``.

Every member is checked before it is written: no absolute path, no ``..`` component, no
symlink or hard link pointing outside the target, no device, fifo or other special file, no
name given twice (directories excepted), no name a file system or a terminal cannot take (a
component over 255 bytes, a path over 4095 bytes or :data:`MAX_DEPTH` directories deep, control
or bidi-override characters), no encrypted zip member. Members are written by :class:`_Writer`, which opens
every path one component at a time from the root with ``O_NOFOLLOW``: nothing is ever written
through a symlink, including one the archive itself created a moment before. Written bytes are
capped (a multiple of the archive's size, and the free space), so a decompression bomb stops
early. Extraction goes to a temporary directory next to ``dest`` (:func:`ftx_triton.io.atomic.publish_dir`)
that is renamed onto ``dest`` only when everything succeeded, so a refused or broken archive leaves nothing at
``dest``.

The stdlib's ``tarfile`` filters and ``zipfile.extract`` are not used for writing: both open the
destination by path and so follow links already on disk.
"""

from __future__ import annotations

import errno
import gzip
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import time
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Self, TypeVar, cast

import structlog
import zstandard

from ftx_triton.errors import OutputError, SourceError
from ftx_triton.io.atomic import publish_dir
from ftx_triton.terminal.progress import ByteProgress, byte_progress

log = structlog.get_logger(__name__)
T = TypeVar("T")

_FORMATS: dict[str, tuple[str, ...]] = {
    "tar.zst": (".tar.zstd", ".tar.zst", ".tzst"),
    "tar": (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz"),
    "zip": (".zip",),
}
_CHUNK_BYTES = 1 << 20
_ZSTD_MAX_WINDOW = 1 << 31  # archives made with `zstd --long=31`
MAX_RATIO = 50
"""Extracted bytes may be at most this multiple of the archive's size (weights barely compress)."""
RATIO_FLOOR_BYTES = 32 << 20
"""Below this many extracted bytes the ratio is not checked (small, compressible config files)."""
MAX_MEMBERS = 100_000
MAX_DEPTH = 64
"""Path components a member may have (a checkpoint needs a handful; thousands break removal)."""
MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4095
FREE_SPACE_RESERVE = 64 << 20
"""Left free on the destination's file system."""
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
_BOMB_HINT = (
    "nothing was extracted; an archive that expands this much is probably a decompression bomb. If you trust it, "
    "extract it yourself and pass the directory as the model source"
)
_DIR_MODE = 0o755
_FILE_MODE = 0o644


class _Unsafe(Exception):
    """A member that must not be extracted."""

    def __init__(self, member: str, reason: str, hint: str | None = None) -> None:
        super().__init__(f"member {member!r} {reason}")
        self.hint = hint


class _TooBig(Exception):
    """The archive expands past a limit."""


def archive_format(path: Path) -> str | None:
    """``tar.zst``, ``tar`` or ``zip`` from the file name, None for anything else."""
    name = Path(path).name.lower()
    for fmt, suffixes in _FORMATS.items():
        if name.endswith(suffixes):
            return fmt
    return None


def supported_suffixes() -> list[str]:
    """Every archive file-name suffix :func:`safe_extract` accepts."""
    return [s for suffixes in _FORMATS.values() for s in suffixes]


def is_archive(path: Path) -> bool:
    """True when the file name says it is an archive :func:`safe_extract` can open.

    Decided by name only: ``pytorch_model.bin`` and ``.npz`` files are zips inside.
    """
    return archive_format(path) is not None


def safe_extract(
    archive: Path, dest: Path, *, progress: bool = True, max_bytes: int | None = None, max_ratio: float = MAX_RATIO
) -> Path:
    """Extract ``archive`` into ``dest`` (which must not exist, or be empty) and return the root.

    The root is ``dest``, or its only entry when the archive holds one top-level directory.
    At most ``max_bytes`` (default: the free space less a reserve) and ``max_ratio`` times the
    archive's size (above :data:`RATIO_FLOOR_BYTES`) are written.
    Raises :class:`SourceError` naming the member for an unsafe, oversized or corrupt archive,
    and :class:`OutputError` when ``dest`` cannot be written.
    """
    archive, dest = Path(archive), Path(dest)
    fmt = _check_inputs(archive, dest)
    _make_parent(dest)
    started = time.monotonic()
    log.info("extract.started", archive=str(archive), dest=str(dest))
    try:
        with publish_dir(dest, locked=False) as tmp:  # dest is a fresh directory of the caller's
            budget = _Budget(archive, tmp, max_bytes, max_ratio)
            try:
                with (
                    byte_progress(f"extracting {archive.name}", archive.stat().st_size, enabled=progress) as bar,
                    _Writer(tmp, budget) as writer,
                ):
                    if fmt == "zip":
                        _extract_zip(archive, writer, bar)
                    else:
                        _extract_tar(archive, writer, bar, zstd=fmt == "tar.zst")
                _check_links_inside(tmp)
            except _Unsafe as exc:
                raise SourceError(f"refusing to extract {archive.name}: {exc}", hint=exc.hint or _UNSAFE_HINT) from exc
            except _TooBig as exc:
                raise SourceError(f"refusing to extract {archive.name}: {exc}", hint=_BOMB_HINT) from exc
            except _CORRUPT_ERRORS as exc:
                raise SourceError(
                    f"cannot extract {archive.name}: the archive is corrupt or truncated ({exc})",
                    hint="delete it and fetch it again; pass --sha256 to check the download",
                ) from exc
    except OSError as exc:
        raise _output_error(exc, dest) from exc
    root = _single_top_dir(dest)
    log.info("extract.finished", archive=str(archive), root=str(root), seconds=round(time.monotonic() - started, 3))
    return root


def _check_inputs(archive: Path, dest: Path) -> str:
    fmt = archive_format(archive)
    if fmt is None:
        accepted = ", ".join(supported_suffixes())
        raise SourceError(f"{archive.name} is not a supported archive", hint=f"accepted: {accepted}")
    if not archive.is_file():
        raise SourceError(f"archive {archive} does not exist", hint="check the path")
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise OutputError(
            f"cannot extract into {dest}: it already exists", hint="remove it or choose another directory"
        )
    return fmt


def _make_parent(dest: Path) -> None:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _output_error(exc, dest) from exc


def _output_error(exc: OSError, dest: Path) -> OutputError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(
            f"no space left to extract into {dest} ({exc.strerror})",
            hint=f"free space on the file system of {dest.parent} (or set FTX_HOME elsewhere)",
        )
    return OutputError(
        f"cannot extract into {dest}: {exc.strerror or exc}",
        hint=f"make {dest.parent} writable (or set FTX_HOME elsewhere)",
    )


# --- member checks ------------------------------------------------------------------------


def _member_parts(name: str) -> tuple[str, ...]:
    """The path components of a member name; raises _Unsafe for absolute paths and ``..``."""
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[0].isalpha() and norm[1] == ":"):
        raise _Unsafe(name, "has an absolute path")
    parts = tuple(p for p in norm.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _Unsafe(name, "has a '..' path component")
    if any("\0" in p for p in parts):
        raise _Unsafe(name, "has a NUL byte in its name")
    if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in name):
        raise _Unsafe(name, "has a control or bidi-override character in its name (shown escaped here)")
    if len(parts) > MAX_DEPTH:
        raise _Unsafe(name, f"is {len(parts)} directories deep (at most {MAX_DEPTH})")
    if len(os.fsencode(norm)) > MAX_PATH_BYTES:
        raise _Unsafe(name, f"has a path longer than {MAX_PATH_BYTES} bytes")
    if long := next((p for p in parts if len(os.fsencode(p)) > MAX_COMPONENT_BYTES), None):
        raise _Unsafe(
            name,
            f"has a path component of {len(os.fsencode(long))} bytes (file systems take at most {MAX_COMPONENT_BYTES})",
        )
    return parts


def _check_link(name: str, parts: tuple[str, ...], kind: str, link: str) -> tuple[str, ...]:
    """Check a link's target as text; return the hard link target's components."""
    link = link.replace("\\", "/")
    if not link or link.startswith("/"):
        raise _Unsafe(name, f"is a {kind} to an absolute path {link!r}")
    # A symlink resolves from its own directory, a tar hard link from the archive root.
    base = "/".join(parts[:-1]) if kind == "symlink" else ""
    target = posixpath.normpath(posixpath.join(base, link))
    if target == ".." or target.startswith("../"):
        raise _Unsafe(name, f"is a {kind} pointing outside the target ({link!r})")
    return _member_parts(target)


# --- writing without following links ------------------------------------------------------


class _Budget:
    """How many bytes (and members) may still be written."""

    def __init__(self, archive: Path, tmp: Path, max_bytes: int | None, max_ratio: float) -> None:
        size = archive.stat().st_size
        self.ratio_limit = max(int(size * max_ratio), RATIO_FLOOR_BYTES)
        self.ratio = max_ratio
        if max_bytes is None:
            free = shutil.disk_usage(tmp).free
            self.space_limit, self.explicit = max(free - FREE_SPACE_RESERVE, 0), False
        else:
            self.space_limit, self.explicit = max_bytes, True
        self.written = 0
        self.members = 0

    def member(self, name: str, declared: int = 0) -> None:
        """Count one member; refuse it up front when its declared size is already too much."""
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise _TooBig(f"it holds more than {MAX_MEMBERS} members")
        self.check(name, self.written + max(declared, 0))

    def add(self, name: str, nbytes: int) -> None:
        """Count bytes as they are written (declared sizes may lie)."""
        self.written += nbytes
        self.check(name, self.written)

    def check(self, name: str, total: int) -> None:
        """Raise when ``total`` extracted bytes (reached at member ``name``) is over a limit."""
        if total > self.ratio_limit:
            raise _TooBig(
                f"it expands to more than {self.ratio_limit} bytes ({self.ratio:g}x its size) at member {name!r}"
            )
        if total > self.space_limit:
            if self.explicit:
                raise _TooBig(f"it expands to more than {self.space_limit} bytes at member {name!r}")
            raise OSError(
                errno.ENOSPC, f"member {name!r} would leave less than ftx's reserve of {FREE_SPACE_RESERVE} bytes free"
            )


class _Writer:
    """Creates members under ``root`` by directory fds, one component at a time, never following a symlink."""

    def __init__(self, root: Path, budget: _Budget) -> None:
        self.budget = budget
        self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._root_fd)

    @contextmanager
    def _parent(self, name: str, parts: tuple[str, ...], create: bool = True) -> Iterator[int]:
        """A fd of the member's parent directory, creating missing directories on the way if asked."""
        fd = os.dup(self._root_fd)
        try:
            for i, part in enumerate(parts[:-1]):
                child = self._open_dir(fd, part, name, "/".join(parts[: i + 1]), create)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _open_dir(fd: int, part: str, name: str, so_far: str, create: bool = True) -> int:
        if create:
            try:
                os.mkdir(part, _DIR_MODE, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            return os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                what = (
                    "a symlink" if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode) else "a file"
                )
                raise _Unsafe(name, f"would be written through {so_far!r}, which is {what}") from exc
            raise

    def directory(self, name: str, parts: tuple[str, ...]) -> None:
        self.budget.member(name)
        if not parts:
            return
        with self._parent(name, parts) as parent:
            os.close(self._open_dir(parent, parts[-1], name, "/".join(parts)))

    def file(self, name: str, parts: tuple[str, ...], src: IO[bytes], bar: ByteProgress, declared: int) -> None:
        self.budget.member(name, declared)
        with self._parent(name, parts) as parent:
            fd = self._create(
                parent,
                name,
                parts,
                lambda: os.open(
                    parts[-1],
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    _FILE_MODE,
                    dir_fd=parent,
                ),
            )
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(_CHUNK_BYTES):
                self.budget.add(name, len(chunk))
                out.write(chunk)
                bar.advance(len(chunk))

    def symlink(self, name: str, parts: tuple[str, ...], link: str) -> None:
        _check_link(name, parts, "symlink", link)
        self.budget.member(name)
        with self._parent(name, parts) as parent:
            self._create(parent, name, parts, lambda: os.symlink(link, parts[-1], dir_fd=parent))

    def hardlink(self, name: str, parts: tuple[str, ...], link: str) -> None:
        target = _check_link(name, parts, "hardlink", link)
        self.budget.member(name)
        if not target:
            raise _Unsafe(name, "is a hardlink to the archive root")
        try:
            with self._parent(link, target, create=False) as src_parent, self._parent(name, parts) as parent:
                if not stat.S_ISREG(os.stat(target[-1], dir_fd=src_parent, follow_symlinks=False).st_mode):
                    raise _Unsafe(name, f"is a hardlink to {link!r}, which is not a regular file")
                self._create(
                    parent,
                    name,
                    parts,
                    lambda: os.link(
                        target[-1], parts[-1], src_dir_fd=src_parent, dst_dir_fd=parent, follow_symlinks=False
                    ),
                )
        except FileNotFoundError as exc:
            raise _Unsafe(name, f"is a hardlink to {link!r}, which comes later or not at all") from exc

    @staticmethod
    def _create(parent: int, name: str, parts: tuple[str, ...], make: Callable[[], T]) -> T:
        if not parts:
            raise _Unsafe(name, "names the archive root")
        try:
            return make()
        except FileExistsError as exc:
            raise _Unsafe(name, "appears twice in the archive") from exc


# --- formats ------------------------------------------------------------------------------


def _extract_tar(archive: Path, writer: _Writer, bar: ByteProgress, *, zstd: bool) -> None:
    """Stream the tar (no seeking, so .tar.zst works), checking each member before writing it."""
    with (
        open(archive, "rb") as raw,
        _decompressed(cast(IO[bytes], _CountingReader(raw, bar)), zstd) as stream,
        tarfile.open(fileobj=stream, mode="r|" if zstd else "r|*") as tar,
    ):
        quiet = ByteProgress()  # the bar already counts compressed bytes read
        for member in tar:
            parts = _member_parts(member.name)
            if member.isreg():
                src = tar.extractfile(member)
                assert src is not None
                writer.file(member.name, parts, src, quiet, member.size)
            elif member.isdir():
                writer.directory(member.name, parts)
            elif member.issym():
                writer.symlink(member.name, parts, member.linkname)
            elif member.islnk():
                writer.hardlink(member.name, parts, member.linkname)
            else:
                raise _Unsafe(member.name, "is a device, fifo or other special file")


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


def _extract_zip(archive: Path, writer: _Writer, bar: ByteProgress) -> None:
    """Check every member first (the directory is at the end), then write them."""
    with zipfile.ZipFile(archive) as zf:
        members = [(info, _zip_kind(info), _member_parts(info.filename)) for info in zf.infolist()]
        seen: set[tuple[str, ...]] = set()
        for info, kind, parts in members:
            if info.flag_bits & 0x1:
                raise _Unsafe(
                    info.filename,
                    "is encrypted",
                    hint="ftx does not extract password-protected "
                    "archives: extract it yourself and pass the directory as the model source",
                )
            if kind == "special":
                raise _Unsafe(info.filename, "is a device, fifo or other special file")
            if kind != "dir" and parts in seen:
                raise _Unsafe(info.filename, "appears twice in the archive")
            seen.add(parts)
        links = {info.filename: _zip_link(zf, info) for info, kind, _ in members if kind == "symlink"}
        for info, kind, parts in members:
            if kind == "symlink":
                _check_link(info.filename, parts, "symlink", links[info.filename])
        total = sum(info.file_size for info, kind, _ in members if kind == "file")
        writer.budget.check(next((i.filename for i, k, _ in members if k == "file"), archive.name), total)
        bar.reset(total=total)
        for info, kind, parts in members:
            if kind == "dir":
                writer.directory(info.filename, parts)
            elif kind == "symlink":
                writer.symlink(info.filename, parts, links[info.filename])
            else:
                with zf.open(info) as src:
                    writer.file(info.filename, parts, src, bar, info.file_size)


def _zip_link(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    if info.file_size > 4096:
        raise _Unsafe(info.filename, "is a symlink with a target longer than 4096 bytes")
    try:
        return zf.read(info).decode()
    except UnicodeDecodeError as exc:
        raise _Unsafe(info.filename, "is a symlink whose target is not text") from exc


def _check_links_inside(root: Path) -> None:
    """After extraction: every symlink must still resolve inside ``root`` (links may chain)."""
    from ftx_triton.io.trees import link_leaving

    if (escape := link_leaving(root)) is not None:
        raise _Unsafe(escape, "resolves outside the target")


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
