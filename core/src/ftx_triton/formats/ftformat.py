"""FasterTransformer checkpoint files: raw ``.bin`` tensors and ``config.ini``.

``config.ini`` is written by one function from a family's sections and parsed back with the
same rules FasterTransformer's INI reader applies (case-insensitive keys, ``;`` comments only
after whitespace).
"""

from __future__ import annotations

import configparser
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, wait
from pathlib import Path

import ml_dtypes
import numpy as np

from ftx_triton.errors import CheckpointError
from ftx_triton.formats.buffers import as_array
from ftx_triton.formats.fastcopy import contiguous
from ftx_triton.formats.layout import gpu_dir_name as gpu_dir_name  # its old home
from ftx_triton.io import hashing
from ftx_triton.io.hashing import ChunkedHasher, combine_chunks, remember_written
from ftx_triton.io.regular import TooLarge, read_regular

IniSections = Mapping[str, Mapping[str, object]]


def format_ini_value(value: object) -> str:
    """Render a value the way FT's reader expects (bools as ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise ValueError("config.ini values must not be None")
    return str(value)


def write_ini(path: Path, sections: IniSections) -> None:
    """Write ``config.ini`` from ``{section: {key: value}}`` in the given order."""
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            text = format_ini_value(value)
            if "\n" in text:
                raise ValueError(f"config.ini value for {section}.{key} contains a newline")
            lines.append(f"{key} = {text}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


MAX_INI_BYTES = 1 << 20
"""A config.ini is a few hundred bytes; one past a MiB is not FasterTransformer's."""


def read_ini(path: Path) -> dict[str, dict[str, str]]:
    """Parse ``config.ini`` into ``{section: {key: value}}`` (sections and keys lower-cased).

    Only a regular UTF-8 file of at most :data:`MAX_INI_BYTES` is read (a converted directory may be a
    stranger's: a device or named pipe is refused, not read forever); anything else is a CheckpointError.
    """
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(" ;", "\t;"), strict=False)
    try:
        parser.read_string(read_regular(path, MAX_INI_BYTES).decode("utf-8"), source=str(path))
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"cannot read {path}: it is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
            hint="a FasterTransformer config.ini is plain text: re-run the conversion",
        ) from None
    except TooLarge:
        raise CheckpointError(
            f"cannot read {path}: it is larger than {MAX_INI_BYTES} bytes, which no config.ini is",
            hint="re-run the conversion",
        ) from None
    except (OSError, configparser.Error) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}", hint="re-run the conversion") from exc
    return {s.lower(): {k.lower(): v for k, v in parser[s].items()} for s in parser.sections()}


def write_tensor(path: Path, array: np.ndarray) -> int:
    """Write raw little-endian C-order bytes; returns the byte count."""
    return write_tensor_counted(path, array, count_non_finite=False)[0]


_PASS_BYTES = 1 << 20
"""Bytes of a C-contiguous array written, hashed and checked at a time: each piece is read from memory once and
stays in cache for the other two."""
_BAND_BYTES = 4 << 20
"""Bytes of a strided array's output (whole rows of its first axis) copied into a thread's scratch buffer at a time,
then written, hashed and checked from there (a band of a few MiB keeps the tiled transpose's reads of each source row
long enough to use whole cache lines)."""


SPLIT_MIN_BYTES = 16 << 20
"""A file at least this large is written by several threads (:func:`write_tensor_counted`'s ``workers``), each of
its chunks copied (when strided), written and hashed by one of them."""


def write_tensor_counted(
    path: Path, array: np.ndarray, *, count_non_finite: bool = True, workers: Executor | None = None
) -> tuple[int, int]:
    """Write raw little-endian C-order bytes in one pass that also hashes them (their chunked digest,
    :func:`~ftx_triton.io.hashing.chunked_digests`' definition: the store then takes it instead of reading the
    file back) and, when asked, counts their NaN and Inf values; returns (bytes, count). A strided ``array`` (a
    transpose) is copied band by band into a small buffer that each band is written from, never whole: no copy
    of the tensor's size is made (and zeroed by the kernel), and each band is still in cache when it is written,
    hashed and counted. ``workers``: a file of at least :data:`SPLIT_MIN_BYTES` is written, hashed and counted
    chunk by chunk by them at once (a many-core host writes one large tensor at the speed of its pieces side by
    side; no thread hashes the whole file)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    split = (
        workers is not None
        and array.nbytes >= SPLIT_MIN_BYTES
        and hashing.CHUNKED_BYTES % max(array.itemsize, 1) == 0  # every chunk holds whole elements to count
    )
    return _write_split(path, array, count_non_finite, workers) if split else _write_pass(path, array, count_non_finite)


def _write_pass(path: Path, array: np.ndarray, count_non_finite: bool) -> tuple[int, int]:
    counter = _counter(array.dtype) if count_non_finite else None
    digest = ChunkedHasher()
    with path.open("wb") as fh:
        bad = _write_range(fh.fileno(), array, 0, array.nbytes, digest.update, counter)
        remember_written(path, digest.hexdigest(), os.fstat(fh.fileno()))
    return array.nbytes, bad


def _write_split(path: Path, array: np.ndarray, count_non_finite: bool, workers: Executor | None) -> tuple[int, int]:
    """:func:`_write_pass` of a little-endian ``array`` whose chunks (the chunked digest's) ``workers`` write
    (``pwrite``), hash and count at once; the file's digest is then made from the chunks' digests."""
    assert workers is not None
    step = hashing.CHUNKED_BYTES
    dtype = array.dtype if count_non_finite else None
    with path.open("wb") as fh:
        fd = fh.fileno()
        futures = [workers.submit(_write_chunk, fd, array, at, at + step, dtype) for at in range(0, array.nbytes, step)]
        wait(futures)  # no task may still write to the file once it is closed
        done = [future.result() for future in futures]
        remember_written(path, combine_chunks(array.nbytes, (digest for digest, _ in done)), os.fstat(fd))
    return array.nbytes, sum(bad for _, bad in done)


def _write_chunk(fd: int, array: np.ndarray, start: int, end: int, dtype: np.dtype | None) -> tuple[bytes, int]:
    """Write bytes ``start:end`` of ``array`` (one chunk of the chunked digest) at their offset of ``fd``: (their
    sha256, their NaN and Inf count when ``dtype`` is given)."""
    digest = hashlib.sha256()
    bad = _write_range(
        fd, array, start, min(end, array.nbytes), digest.update, _counter(dtype) if dtype is not None else None
    )
    return digest.digest(), bad


def _write_range(
    fd: int,
    array: np.ndarray,
    start: int,
    end: int,
    hash_piece: Callable[[memoryview], None],
    counter: NonFiniteCounter | None,
) -> int:
    """``pwrite`` the C-order bytes ``start:end`` of ``array`` at their offsets of ``fd`` piece by piece
    (:func:`_pieces`), each hashed (``hash_piece``) and counted (``counter``) while it is in cache; returns the NaN
    and Inf count. ``start`` and ``end`` fall on whole elements."""
    bad = 0
    for at, piece in _pieces(array, start, end):
        view = piece.data
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], at + done)
        hash_piece(view)
        if counter is not None:
            bad += counter.count(piece)
    return bad


def _pieces(array: np.ndarray, start: int, end: int) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, bytes) pieces of the C-order bytes ``start:end`` of ``array``: views of a C-contiguous one, else
    bands of whole rows of its first axis copied into this thread's scratch buffer (valid until the next piece)."""
    if end <= start:
        return
    if array.flags.c_contiguous:
        raw = array.reshape(-1).view(np.uint8)  # as bytes: ml_dtypes' bfloat16 does not export the buffer protocol
        step = _PASS_BYTES - _PASS_BYTES % array.itemsize
        for at in range(start, end, step):
            yield at, raw[at : min(at + step, end)]
        return
    row = array.nbytes // array.shape[0]
    rows = max(1, _BAND_BYTES // row)
    scratch = _scratch(rows * row)
    at = start
    while at < end:
        first = at // row
        last = min(first + rows, -(-end // row))
        band = array[first:last]
        data = contiguous(band, as_array(scratch, band.shape, band.dtype)).reshape(-1).view(np.uint8)
        stop = min(end, last * row)
        yield at, data[at - first * row : stop - first * row]
        at = stop


_scratches = threading.local()
"""Each thread's band buffer of :func:`_pieces` (made once per thread, not per file)."""


def _scratch(nbytes: int) -> np.ndarray:
    """A uint8 buffer of at least ``nbytes``: this thread's, kept while it holds at most two bands of
    :data:`_BAND_BYTES` (a band of one huge row gets a buffer of its own)."""
    kept = getattr(_scratches, "buffer", None)
    if kept is not None and kept.size >= nbytes:
        return kept
    buffer = np.empty(nbytes, np.uint8)
    if nbytes <= 2 * _BAND_BYTES:
        _scratches.buffer = buffer
    return buffer


_counters = threading.local()
"""Each thread's :class:`NonFiniteCounter` by dtype (their scratch arrays made once per thread, not per file)."""


def _counter(dtype: np.dtype) -> NonFiniteCounter | None:
    """This thread's counter for ``dtype`` (None for a dtype without NaN or Inf)."""
    cache = _counters.__dict__.setdefault("by_dtype", {})
    if dtype not in cache:
        cache[dtype] = NonFiniteCounter.for_dtype(dtype)
    return cache[dtype]


def read_tensor(path: Path, dtype: np.dtype, shape: tuple[int, ...], *, mmap: bool = False) -> np.ndarray:
    """Read a raw FT tensor, checking its size against ``shape``; ``mmap``: map the file copy-on-write
    instead of reading it (pages come from the page cache as they are touched; writes stay private)."""
    expected = int(np.prod(shape)) * dtype.itemsize
    try:
        actual = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be opened", hint="re-run the conversion for this tp") from exc
    if actual != expected:
        raise CheckpointError(
            f"{path} holds {actual} bytes but shape {list(shape)} in {dtype} needs {expected}",
            hint="weight_data_type or the <tp>-gpu directory does not match these files; re-convert",
        )
    if mmap and expected:
        return np.memmap(path, dtype=dtype, mode="c", shape=shape)
    return np.fromfile(path, dtype=dtype).reshape(shape)


_FINITE_CHUNK = 1 << 18
"""Elements tested at a time, into scratch buffers reused from chunk to chunk (no mask of the whole tensor, and
no fresh memory, whose page faults cost more than the test)."""
_FLOATS = (np.dtype(ml_dtypes.bfloat16),)
"""Float types numpy does not class as ``np.floating`` (ml_dtypes' bfloat16)."""


class NonFiniteCounter:
    """Counts NaN and Inf values in the raw bytes of one float dtype. IEEE floats are non-finite exactly when
    their exponent bits are all ones, so the test runs on the bits as unsigned integers (numpy's ``isfinite``
    on float16 and bfloat16 converts every element)."""

    def __init__(self, dtype: np.dtype) -> None:
        size = dtype.itemsize
        self.bits = np.dtype(f"<u{size}")
        mantissa = np.finfo(dtype).nmant if dtype not in _FLOATS else 7
        self.exponent = self.bits.type(((1 << (size * 8 - 1)) - 1) & ~((1 << mantissa) - 1))
        self._masked = np.empty(0, self.bits)
        self._equal = np.empty(0, np.bool_)

    @staticmethod
    def for_dtype(dtype: np.dtype) -> NonFiniteCounter | None:
        """A counter for ``dtype``, None for a dtype that holds no NaN or Inf (integers, bool)."""
        if np.issubdtype(dtype, np.floating) or dtype in _FLOATS:
            return NonFiniteCounter(dtype)
        return None

    def count(self, raw: np.ndarray) -> int:
        """NaN and Inf values in ``raw``: C-contiguous bytes (or values) of whole elements of the dtype."""
        flat = raw.reshape(-1).view(self.bits)
        if self._masked.size < min(flat.size, _FINITE_CHUNK):  # scratch as large as a chunk needs, made once
            self._masked = np.empty(min(flat.size, _FINITE_CHUNK), self.bits)
            self._equal = np.empty(self._masked.size, np.bool_)
        bad = 0
        for start in range(0, flat.size, _FINITE_CHUNK):
            chunk = flat[start : start + _FINITE_CHUNK]
            masked, equal = self._masked[: chunk.size], self._equal[: chunk.size]
            np.bitwise_and(chunk, self.exponent, out=masked)
            np.equal(masked, self.exponent, out=equal)
            bad += int(np.count_nonzero(equal))
        return bad


def non_finite_count(array: np.ndarray) -> int:
    """How many NaN or Inf values ``array`` holds, bfloat16 included. The count ignores order, so a transposed
    view is counted as laid out (no copy); another strided view is copied once."""
    counter = NonFiniteCounter.for_dtype(array.dtype)
    if counter is None:
        return 0
    if not array.flags.c_contiguous and array.flags.f_contiguous:
        array = array.T  # a transposed weight: the same values in memory order, no copy
    return counter.count(contiguous(array))


def non_finite_files(directory: Path, dtype: np.dtype) -> dict[str, int]:
    """``{file name: count}`` of the ``.bin`` files in ``directory`` that hold NaN or Inf values, each read
    (mapped, not loaded whole) as ``dtype``; files whose size is no whole number of elements are skipped."""
    found: dict[str, int] = {}
    for file in sorted(directory.glob("*.bin")):
        if not file.is_file() or file.stat().st_size % dtype.itemsize or file.stat().st_size == 0:
            continue
        if bad := non_finite_count(np.memmap(file, dtype=dtype, mode="r")):
            found[file.name] = bad
    return found
