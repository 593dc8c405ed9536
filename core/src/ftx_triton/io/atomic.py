"""Build a directory beside its final place and publish it with one rename: the one helper for it.

Every directory ftx makes beside a target is a *holder*: a hidden ``.<name>.tmp-*`` (the build, in its
``tree``) or ``.<name>.old-*`` (the replaced target, moved into its ``tree``) that carries the marker file
:data:`MARKER` from the moment it exists. A killed build leaves only such a holder, which the next build of
the same target removes (under the target's lock, so never while another process still writes it); if a kill
lands between the two renames of a replacement, the next build (or :func:`recover`) puts the old one back, so
a target is never lost without its successor in place. The one rule: a sibling without the marker is not
ftx's, whatever its name, and is never removed, renamed or restored (``ftx plugin new --dir`` and
``ftx convert -o`` write into the user's own folders). Written here rather than taken from a library: none
of the kept ones (``atomicwrites`` is for files and unmaintained) publishes directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import filelock  # imported where a lock is taken: a cached command takes none

from ftx_triton.interrupt import check
from ftx_triton.io.trees import remove_tree

MARKER = ".ftx-holder"
"""The file inside every directory ftx makes beside a target; without it a sibling is the user's."""
_TREE = "tree"


def is_holder(path: Path) -> bool:
    """Whether ``path`` is a directory ftx made (a real directory, not a link, holding :data:`MARKER`)."""
    try:
        return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()
    except OSError:
        return False


def holders(final: Path, kind: str) -> list[Path]:
    """The ``tmp`` or ``old`` holders ftx left beside ``final``, oldest name first; other siblings are ignored."""
    try:
        return sorted(p for p in final.parent.glob(f".{final.name}.{kind}-*") if is_holder(p))
    except OSError:
        return []


def new_holder(final: Path, kind: str) -> Path:
    """A fresh, marked ``.<name>.<kind>-*`` directory beside ``final`` (its payload goes in ``tree``)."""
    holder = final.parent / f".{final.name}.{kind}-{uuid.uuid4().hex[:8]}"
    holder.mkdir()
    (holder / MARKER).write_text("made by ftx beside the target it builds; removed by its next build\n")
    return holder


def lock_for(final: Path, lock_dir: Path | None = None) -> filelock.FileLock:
    """The lock that serialises builders of ``final``: a hidden file beside it, or, for a directory of
    the user's (``ftx convert -o``), a file in ``lock_dir`` named by the target's absolute path, so
    nothing is left beside what the user asked for."""
    import filelock

    final.parent.mkdir(parents=True, exist_ok=True)
    if lock_dir is None:
        return filelock.FileLock(str(final.parent / f".{final.name}.lock"))
    target = str(final.parent.resolve() / final.name).encode(errors="surrogateescape")
    lock_dir.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(lock_dir / f"publish-{hashlib.sha256(target).hexdigest()[:24]}.lock"))


@contextlib.contextmanager
def announced(lock: filelock.BaseFileLock, what: str, timeout_s: float = -1) -> Iterator[None]:
    """Hold ``lock``; if another process holds it, say so (``what`` it is doing) before waiting."""
    import filelock

    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        from ftx_triton.terminal.console import say

        say(f"waiting for another ftx process that is {what} (lock {lock.lock_file}) …")
        lock.acquire(timeout=timeout_s)
    try:
        yield
    finally:
        lock.release()


def recover(final: Path) -> None:
    """Undo what a killed build left: restore a moved-aside original, drop stale temp and old copies.

    Call with the target's lock held.
    """
    olds = holders(final, "old")
    if olds and not final.exists() and not final.is_symlink() and (olds[-1] / _TREE).exists():
        os.replace(olds[-1] / _TREE, final)
    for stale in [*olds, *holders(final, "tmp")]:
        remove_tree(stale)


@contextlib.contextmanager
def publish_dir(
    final: Path, *, replace: bool = False, locked: bool = True, lock_dir: Path | None = None
) -> Iterator[Path]:
    """Yield an empty temp directory beside ``final``; on success publish it as ``final``.

    ``final`` may be absent or an empty directory; with ``replace`` an existing one is swapped
    out (moved aside, the new one renamed in, the old one removed). On any exception the temp
    directory is removed and ``final`` is untouched.
    """
    final = Path(final)
    guard = announced(lock_for(final, lock_dir), f"building {final}") if locked else contextlib.nullcontext()
    with guard:
        recover(final)
        holder = new_holder(final, "tmp")
        tmp = holder / _TREE
        try:
            tmp.mkdir()
            yield tmp
            swap_in(tmp, final, replace)
        finally:
            remove_tree(holder)


def swap_in(tmp: Path, final: Path, replace: bool) -> None:
    """Rename ``tmp`` onto ``final``; with ``replace`` an existing ``final`` is moved aside first, then removed.

    A build the user interrupted is never published, even when Python swallowed the Ctrl-C (see
    :func:`ftx_triton.interrupt.check`): the ``KeyboardInterrupt`` is raised here, before any rename."""
    check()
    if final.is_dir() and not any(final.iterdir()):
        final.rmdir()
    if final.exists() or final.is_symlink():
        if not replace:
            raise FileExistsError(f"{final} appeared while it was being built")
        old = new_holder(final, "old")
        os.replace(final, old / _TREE)
        os.replace(tmp, final)
        remove_tree(old)
    else:
        os.replace(tmp, final)


__all__ = ["MARKER", "announced", "holders", "is_holder", "lock_for", "new_holder", "publish_dir", "recover"]
