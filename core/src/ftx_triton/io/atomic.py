"""Build a directory beside its final place and publish it with one rename: the one helper for it.

A killed build leaves only a hidden ``.<name>.tmp-*`` sibling, which the next build of the same
target removes (under the target's lock, so never while another process still writes it). A
replacement moves the old directory aside to ``.<name>.old-*`` first; if a kill lands between the
two renames, the next build (or :func:`recover`) puts the old one back, so a target is never lost
without its successor in place. Written here rather than taken from a library: none of the kept
ones (``atomicwrites`` is for files and unmaintained) publishes directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import filelock

from ftx_triton.io.trees import remove_tree


def _siblings(final: Path, kind: str) -> list[Path]:
    return sorted(final.parent.glob(f".{final.name}.{kind}-*"))


def lock_for(final: Path, lock_dir: Path | None = None) -> filelock.FileLock:
    """The lock that serialises builders of ``final``: a hidden file beside it, or, for a directory of
    the user's (``ftx convert -o``), a file in ``lock_dir`` named by the target's absolute path, so
    nothing is left beside what the user asked for."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if lock_dir is None:
        return filelock.FileLock(str(final.parent / f".{final.name}.lock"))
    target = str(final.parent.resolve() / final.name).encode(errors="surrogateescape")
    lock_dir.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(lock_dir / f"publish-{hashlib.sha256(target).hexdigest()[:24]}.lock"))


@contextlib.contextmanager
def announced(lock: filelock.BaseFileLock, what: str, timeout_s: float = -1) -> Iterator[None]:
    """Hold ``lock``; if another process holds it, say so (``what`` it is doing) before waiting."""
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
    olds = _siblings(final, "old")
    if olds and not final.exists():
        os.replace(olds[-1], final)
        olds = olds[:-1]
    for stale in [*olds, *_siblings(final, "tmp")]:
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
        tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
            swap_in(tmp, final, replace)
        except BaseException:
            remove_tree(tmp)
            raise


def swap_in(tmp: Path, final: Path, replace: bool) -> None:
    """Rename ``tmp`` onto ``final``; with ``replace`` an existing ``final`` is moved aside first, then removed."""
    if final.is_dir() and not any(final.iterdir()):
        final.rmdir()
    if final.exists() or final.is_symlink():
        if not replace:
            raise FileExistsError(f"{final} appeared while it was being built")
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
        os.replace(tmp, final)
        remove_tree(old)
    else:
        os.replace(tmp, final)


__all__ = ["announced", "lock_for", "publish_dir", "recover"]
