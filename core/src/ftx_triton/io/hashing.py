"""Content hashes of files: the one ``sha256_file``, many files hashed in parallel, chunked digests that one
large file spreads over every CPU (:func:`chunked_digests`; :class:`ChunkedHasher` and :func:`combine_chunks` give
the same value from bytes in memory), and the digests of files ftx just wrote, taken while their bytes were in
memory.

``hashlib`` releases the GIL while it digests large blocks, so threads hash several files at
once at close to the disk's (or the page cache's) speed. One pool of threads (:func:`_pool`) does all of it.

A writer that hashes what it writes (:func:`remember_written`: the chunked digest, whose chunks its threads hash
side by side) spares the store a second read of every output (2.4 GB for a GPT-J-shaped conversion):
:func:`written_digest` hands the digest over only while the file's identity
(:class:`~ftx_triton.io.identity.FileIdentity`) is still the one it had when its writer closed it, the same test
the store applies to its own records; a file written again since is hashed from disk.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ftx_triton.io.cores import usable_cpus
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
def _pool(workers: int) -> ThreadPoolExecutor:
    """The hashing threads: one pool of :func:`hash_threads` for whole files and chunks alike (another size only
    where a caller asks for it)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ftx-hash")


def sha256_files(paths: Iterable[Path]) -> dict[Path, str]:
    """The sha256 of each file, several at a time."""
    paths = list(paths)
    return dict(zip(paths, _pool(hash_threads()).map(sha256_file, paths), strict=True))


CHUNKED_BYTES = 16 << 20
"""The chunk of :func:`chunked_digests`: part of the digest's definition (never the thread count), so it is fixed."""
CHUNKED_VERSION = b"ftx-chunked-sha256-v1"
"""Domain of the chunked digest: no plain sha256 of some file's bytes can equal a chunked digest of other bytes."""
_PIECE = 1 << 20
"""Bytes read at a time inside a chunk: each piece is hashed while it is in cache."""
MAX_HASH_THREADS = 16


def hash_threads() -> int:
    """Threads that hash one source's chunks: one per usable CPU, at most :data:`MAX_HASH_THREADS` (the page cache
    and memory give out past that)."""
    return min(MAX_HASH_THREADS, usable_cpus())


def chunked_digests(
    files: list[tuple[Path, int]], *, stop: threading.Event | None = None, threads: int | None = None
) -> dict[Path, str]:
    """For each (path, size): the hex sha256 of :data:`CHUNKED_VERSION`, the size and the sha256 of each
    :data:`CHUNKED_BYTES` chunk of the file's first ``size`` bytes in order. The chunks of every file are hashed
    by ``threads`` threads at once (hashlib and ``preadv`` release the GIL), so a single multi-GB file takes a
    fraction of one sequential pass on a many-core host; the result does not depend on the thread count.

    A file shorter than ``size`` now is hashed as far as it goes (the caller compares the files' identity after
    hashing: a file that changed is refused there). ``stop``: give up (:class:`HashStopped`) at the next piece."""
    chunks = [
        (path, start, min(size, start + CHUNKED_BYTES))
        for path, size in files
        for start in range(0, size, CHUNKED_BYTES)
    ]
    workers = threads or hash_threads()  # the pool's size, whatever the chunk count: one pool, not one per count

    def chunk_digest(chunk: tuple[Path, int, int]) -> bytes:
        """One chunk's sha256, its file opened for it alone (a source of thousands of files never holds as many
        descriptors; a pipe put in a file's place never blocks)."""
        path, start, end = chunk
        buffer = getattr(_local, "buffer", None)
        if buffer is None or len(buffer) != _PIECE:
            buffer = _local.buffer = memoryview(bytearray(_PIECE))
        digest = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            at = start
            while at < end:
                if stop is not None and stop.is_set():
                    raise HashStopped(path)
                got = os.preadv(fd, [buffer[: min(_PIECE, end - at)]], at)
                if got == 0:  # shorter than listed: changed meanwhile, which the caller's identity check refuses
                    break
                digest.update(buffer[:got])
                at += got
        finally:
            os.close(fd)
        return digest.digest()

    if workers == 1 or len(chunks) <= 1:
        parts = [chunk_digest(chunk) for chunk in chunks]
    else:
        futures = [_pool(workers).submit(chunk_digest, chunk) for chunk in chunks]
        try:
            parts = [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    by_file: dict[Path, list[bytes]] = {path: [] for path, _size in files}
    for (path, _start, _end), part in zip(chunks, parts, strict=True):
        by_file[path].append(part)
    return {path: combine_chunks(size, by_file[path]) for path, size in files}


_local = threading.local()
"""Each hashing thread's read buffer (one :data:`_PIECE`, made once per thread)."""


def combine_chunks(size: int, chunks: Iterable[bytes]) -> str:
    """The chunked digest (:func:`chunked_digests`' definition) of ``size`` bytes whose :data:`CHUNKED_BYTES`
    chunks have, in order, the sha256 digests (raw, not hex) ``chunks``."""
    return hashlib.sha256(CHUNKED_VERSION + f"\0{size}\0".encode() + b"".join(chunks)).hexdigest()


class ChunkedHasher:
    """The chunked digest of bytes fed in order, in pieces of any size (a writer that writes a file in one pass
    hashes it so): the same value as :func:`chunked_digests` of the file they make."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._chunk = hashlib.sha256()
        self._filled = 0
        self._size = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._size += len(view)
        while view:
            take = min(len(view), CHUNKED_BYTES - self._filled)
            self._chunk.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == CHUNKED_BYTES:
                self._chunks.append(self._chunk.digest())
                self._chunk, self._filled = hashlib.sha256(), 0

    def hexdigest(self) -> str:
        tail = [self._chunk.digest()] if self._filled else []
        return combine_chunks(self._size, [*self._chunks, *tail])


_written: dict[str, tuple[str, FileIdentity]] = {}
_WRITTEN_MAX = 100_000
"""Digests remembered at most (a conversion writes tens to a few thousand files; forgetting costs only a read)."""
_written_lock = threading.Lock()


def remember_written(path: Path, chunked: str, st: os.stat_result) -> None:
    """Remember the chunked digest (:func:`chunked_digests`' definition) of the bytes just written to ``path``,
    whose ``fstat`` after the last write is ``st``."""
    with _written_lock:
        if len(_written) >= _WRITTEN_MAX:  # files written outside any store build are never asked for
            _written.clear()
        _written[os.path.abspath(path)] = (chunked, FileIdentity.of(st))


def written_digest(path: Path, st: os.stat_result) -> str | None:
    """The remembered chunked digest of ``path`` (forgotten once asked) when ``st`` (its ``lstat`` now) is the
    identity it had when written; None when it was not remembered or has changed since."""
    with _written_lock:
        found = _written.pop(os.path.abspath(path), None)
    if found is None or found[1] != FileIdentity.of(st):
        return None
    return found[0]
