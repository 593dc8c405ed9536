"""Content hashes of files: the one ``sha256_file``, many files hashed in parallel, and the digests of files
ftx just wrote, taken while their bytes were in memory.

``hashlib`` releases the GIL while it digests large blocks, so threads hash several files at
once at close to the disk's (or the page cache's) speed.

A writer that hashes what it writes (:func:`remember_written`) spares the store a second read of every output
(2.4 GB for a GPT-J-shaped conversion): :func:`written_digest` hands the digest over only while the file's
identity (:class:`~ftx_triton.io.identity.FileIdentity`) is still the one it had when its writer closed it, the
same test the store applies to its own records; a file written again since is hashed from disk.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ftx_triton.io.identity import FileIdentity

_CHUNK = 4 << 20


def sha256_file(path: Path, *, progress: bool = False, stop: threading.Event | None = None) -> str:
    """The hex sha256 of a file, with a ``verifying sha256`` bar on a terminal when asked; ``stop``: give up
    (raise :class:`HashStopped`) at the next chunk once it is set."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        if not progress:
            buffer = bytearray(_CHUNK)  # one buffer for the whole file: no fresh (zeroed) memory per chunk
            view = memoryview(buffer)
            while size := fh.readinto(buffer):
                digest.update(view[:size])
                if stop is not None and stop.is_set():
                    raise HashStopped(path)
            return digest.hexdigest()
        from ftx_triton.terminal.progress import byte_progress

        with byte_progress("verifying sha256", os.fstat(fh.fileno()).st_size, enabled=True) as bar:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                bar.advance(len(chunk))
    return digest.hexdigest()


class HashStopped(Exception):
    """A hash given up on request (its run failed)."""


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="ftx-hash")


def sha256_files(paths: Iterable[Path]) -> dict[Path, str]:
    """The sha256 of each file, several at a time."""
    paths = list(paths)
    return dict(zip(paths, _pool().map(sha256_file, paths), strict=True))


_written: dict[str, tuple[str, FileIdentity]] = {}
_WRITTEN_MAX = 100_000
"""Digests remembered at most (a conversion writes tens to a few thousand files; forgetting costs only a read)."""
_written_lock = threading.Lock()


def remember_written(path: Path, sha256: str, st: os.stat_result) -> None:
    """Remember the sha256 of the bytes just written to ``path``, whose ``fstat`` after the last write is ``st``."""
    with _written_lock:
        if len(_written) >= _WRITTEN_MAX:  # files written outside any store build are never asked for
            _written.clear()
        _written[os.path.abspath(path)] = (sha256, FileIdentity.of(st))


def written_digest(path: Path, st: os.stat_result) -> str | None:
    """The remembered sha256 of ``path`` (forgotten once asked) when ``st`` (its ``lstat`` now) is the identity
    it had when written; None when it was not remembered or has changed since."""
    with _written_lock:
        found = _written.pop(os.path.abspath(path), None)
    if found is None or found[1] != FileIdentity.of(st):
        return None
    return found[0]
