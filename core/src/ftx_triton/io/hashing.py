"""Content hashes of files: the one ``sha256_file``, and many files hashed in parallel.

``hashlib`` releases the GIL while it digests large blocks, so threads hash several files at
once at close to the disk's (or the page cache's) speed.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_CHUNK = 4 << 20


def sha256_file(path: Path, *, progress: bool = False) -> str:
    """The hex sha256 of a file, with a ``verifying sha256`` bar on a terminal when asked."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if not progress:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
            return digest.hexdigest()
        from ftx_triton.terminal.progress import byte_progress

        with byte_progress("verifying sha256", os.fstat(fh.fileno()).st_size, enabled=True) as bar:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                bar.advance(len(chunk))
    return digest.hexdigest()


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="ftx-hash")


def sha256_files(paths: Iterable[Path]) -> dict[Path, str]:
    """The sha256 of each file, several at a time."""
    paths = list(paths)
    return dict(zip(paths, _pool().map(sha256_file, paths), strict=True))
