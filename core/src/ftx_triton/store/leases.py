"""Use leases on store artifacts, so that `ftx rm` and `ftx prune` leave alone what a running ftx uses.

A process that resolves an artifact holds a shared lock on ``locks/<stage>-<key>.use`` until the store
object that resolved it is closed (a CLI command closes its store when it ends) or collected; the kernel
drops it when the process dies, however it dies. Removing an artifact needs the exclusive lock, taken
without waiting. A process never blocks on its own leases: it gives its own up before it removes.

Written on ``fcntl.flock`` directly because filelock, which the build locks use, has no shared mode.
A lease file is unlinked by the remover while it holds the exclusive lock, so every taker checks,
once locked, that the path still names the file it locked, and tries again if not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["exclusive", "hold", "held_elsewhere", "held_here", "lease_path", "release", "release_all"]

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_held: dict[Path, tuple[int, int]] = {}  # lease file -> (locked fd, owners counting on it)


def lease_path(lock_root: Path, stage: str, key: str) -> Path:
    return lock_root / f"{stage}-{key}.use"


def _locked(path: Path, operation: int) -> int | None:
    """An fd of ``path`` locked with ``operation``, or None when a non-blocking lock is refused."""
    while True:
        fd = os.open(path, _OPEN_FLAGS, 0o644)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the remover unlinked it after we opened it: lock the new one


def hold(path: Path) -> bool:
    """Take (or count once more) this process's shared lease on ``path``; waits while a removal runs.

    Best effort: where the lease file cannot be made (a read-only home, a planted link), the artifact
    is used without one and False is returned. Each True is matched by one :func:`release`.
    """
    if path in _held:
        fd, count = _held[path]
        _held[path] = (fd, count + 1)
        return True
    try:
        locked = _locked(path, fcntl.LOCK_SH)
    except OSError:
        return False
    assert locked is not None  # a blocking lock is never refused
    _held[path] = (locked, 1)
    return True


def release(path: Path) -> None:
    """Give back one count of this process's lease on ``path``; the lock goes with the last."""
    if path not in _held:
        return
    fd, count = _held[path]
    if count > 1:
        _held[path] = (fd, count - 1)
        return
    del _held[path]
    os.close(fd)


def release_all(paths: list[Path]) -> None:
    """Give back one count for each of ``paths`` (an owner's leases, when the owner goes)."""
    for path in paths:
        release(path)


def held_here() -> list[Path]:
    """The lease files this process holds now."""
    return list(_held)


def held_elsewhere(path: Path) -> bool:
    """Whether another process holds a lease on ``path`` (creates nothing)."""
    if path in _held or not path.is_file():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Yield whether the exclusive lease was had at once (True: no other process uses the artifact).

    On True the lease file is removed on leaving, while still locked, so no lease outlives its artifact.
    """
    if path in _held:  # our own lease: the remover is this process
        os.close(_held.pop(path)[0])
    try:
        fd = _locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # no lease file can exist there (a planted link, a read-only home): none to respect
        yield True
        return
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)
