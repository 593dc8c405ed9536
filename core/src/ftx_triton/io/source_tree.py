"""The files of a local checkpoint directory, as its readers reach them: through links to files and to
directories.

The readers open ``shard_0/0.npz``, ``model-00001-of-00002.safetensors`` or ``sub/x.safetensors`` by path, and
the system follows every link on the way, so whatever keys a local source must list the same files: a
directory link is walked into (shards kept on another disk are linked in as folders), a file link gives
its target's bytes. What cannot be listed that way is refused, never left out: a link back to a folder
above it (a cycle), a broken link, a folder that cannot be read, a tree of more than ``MAX_ENTRIES``
entries. Version-control and cache folders (:data:`SKIPPED_DIRS`) are left out; the checkpoint readers
refuse to read from them.

Files come in ``os.walk`` order (a folder's files by name, then its folders by name, depth first), so a
tree without links lists as ``os.walk`` listed it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ftx_triton.errors import SourceError
from ftx_triton.io.identity import FileIdentity

SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__"})
"""Folders never keyed, and never read: a clone's history, not the checkpoint."""

MAX_ENTRIES = 100_000
"""Files and folders one local source may hold (a checkpoint has tens to a few thousand)."""

_FIX_HINT = "fix or remove it, then run again"


@dataclass(frozen=True)
class TreeFile:
    """One file reached under the root: its name there, the path to open and its target's stat."""

    rel: PurePosixPath
    path: Path
    st: os.stat_result

    @property
    def identity(self) -> FileIdentity:
        """What identifies the bytes without reading them."""
        return FileIdentity.of(self.st)


def tree_files(root: Path, *, skip: frozenset[str] = SKIPPED_DIRS) -> list[TreeFile]:
    """Every file under ``root``, links followed, in ``os.walk`` order, folders named in ``skip`` left out;
    SourceError for what cannot be keyed."""
    root = Path(root)
    try:
        top = root.stat()
    except OSError as exc:
        raise SourceError(f"local source {root} cannot be read: {exc.strerror or exc}", hint="check the path") from exc
    if not stat.S_ISDIR(top.st_mode):
        raise SourceError(
            f"local source {root} is not a directory", hint="give a directory holding config.json and weights"
        )
    files: list[TreeFile] = []
    entries = 0
    # (folder, its name under root, the (device, inode) of it and of every folder above it)
    stack: list[tuple[Path, PurePosixPath, frozenset[tuple[int, int]]]] = [
        (root, PurePosixPath(), frozenset({(top.st_dev, top.st_ino)}))
    ]
    while stack:
        folder, rel, above = stack.pop()
        names, folders = _scan(folder, skip)
        entries += len(names) + len(folders)
        if entries > MAX_ENTRIES:
            raise SourceError(
                f"local source {root} holds more than {MAX_ENTRIES} files and folders (links followed)",
                hint="point at the checkpoint's own folder (config.json, weights, tokenizer), not a folder above it",
            )
        for name in names:
            path = folder / name
            files.append(TreeFile(rel / name, path, _stat(path)))
        children = []
        for name in folders:
            path = folder / name
            st = _stat(path)
            ident = (st.st_dev, st.st_ino)
            if ident in above:
                raise SourceError(
                    f"{path} links back to a folder above it (a cycle): the source cannot be read to its end",
                    hint=f"replace the link by the folder it should hold; {_FIX_HINT}",
                )
            children.append((path, rel / name, above | {ident}))
        stack.extend(reversed(children))
    return files


def _scan(folder: Path, skip: frozenset[str]) -> tuple[list[str], list[str]]:
    """The sorted file names and folder names (links followed, ``skip`` left out) in ``folder``."""
    names, folders = [], []
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                try:
                    is_dir = entry.is_dir()  # follows links, as the readers do
                except OSError:
                    is_dir = False  # reported by _stat with its cause
                if not is_dir:
                    names.append(entry.name)
                elif entry.name not in skip:
                    folders.append(entry.name)
    except OSError as exc:
        raise SourceError(
            f"{folder} in the local source cannot be read: {exc.strerror or exc}",
            hint="give ftx read access to every folder of the checkpoint (or remove the folder)",
        ) from exc
    return sorted(names), sorted(folders)


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()  # follows links: HF cache snapshots link into blobs/, shards into other disks
    except FileNotFoundError as exc:
        raise SourceError(f"{path} is a broken symlink", hint=_FIX_HINT) from exc
    except OSError as exc:  # a link loop (ELOOP), a name too long, permission denied
        raise SourceError(f"{path} in the local source cannot be read: {exc.strerror or exc}", hint=_FIX_HINT) from exc
