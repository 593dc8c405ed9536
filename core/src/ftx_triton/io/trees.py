"""Measuring and removing directory trees of any depth (the one helper for both), and finding links that leave a tree.

Python 3.11's ``shutil.rmtree`` and ``os.walk`` recurse once per directory level, so a tree a few
thousand levels deep (an archive built to do it, left by an older ftx) raises ``RecursionError``,
which ``ignore_errors=True`` does not catch, and paths that deep are longer than the system takes.
These walk with an explicit stack of directory file descriptors instead: no recursion, no long
paths, and a symlink is removed or counted as itself, never followed. (Python 3.12's ``rmtree`` is
iterative; ftx supports 3.11.)
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk_bottom_up(root: Path) -> Iterator[tuple[int, os.DirEntry[str]]]:
    """(parent fd, entry) for every entry under ``root``, a directory's entries before the directory
    itself; the fds stay open while yielded."""
    stack: list[tuple[int, os.DirEntry[str] | None, Iterator[os.DirEntry[str]]]] = []
    fd = os.open(root, _DIR_FLAGS)
    stack.append((fd, None, iter(list(os.scandir(fd)))))
    try:
        while stack:
            fd, own, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                os.close(fd)
                if own is not None and stack:
                    yield stack[-1][0], own
                continue
            if entry.is_dir(follow_symlinks=False):
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    yield fd, entry  # vanished or unreadable: reported as itself
                    continue
                stack.append((child, entry, iter(list(os.scandir(child)))))
            else:
                yield fd, entry
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def tree_size(root: Path) -> int:
    """Bytes of the regular files under ``root`` (0 when it is gone); links are not followed."""
    total = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for _, entry in _walk_bottom_up(Path(root)):
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
    return total


def remove_tree(root: Path) -> None:
    """Remove ``root`` and everything under it, however deep (a link is unlinked, never followed);
    what cannot be removed is left in place, as ``shutil.rmtree(ignore_errors=True)`` does."""
    root = Path(root)
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        with contextlib.suppress(OSError):
            root.unlink()
        return
    with contextlib.suppress(OSError):
        for parent, entry in _walk_bottom_up(root):
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    os.rmdir(entry.name, dir_fd=parent)
                else:
                    os.unlink(entry.name, dir_fd=parent)
    with contextlib.suppress(OSError):
        root.rmdir()


def link_leaving(root: Path) -> str | None:
    """The first symlink under ``root`` (its name relative to ``root``) that resolves outside it, if any;
    links may chain. Used where a folder from a stranger (an extracted archive, an adapter) must stay shut."""
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
                return os.path.relpath(path, root)
    return None
