"""Byte buffers that a conversion hands out and takes back, so that its reads and copies land in memory that is
already mapped.

Fresh memory costs a page fault and the kernel's zeroing of every page; numpy hands a large array's memory
back to the system when it is freed, so a converter that reads each tensor into a new array zeroes the model's size
again (the writer copies transposes a band at a time into a small buffer of its own instead: no pool needed there).
A pool keeps a few freed buffers, up to ``keep_bytes``, and hands out the smallest that fits, or the front of
it when the rest is large enough for another request: pieces given back join again (a 4-layer GPT-J convert took
2.0 GB of fresh memory for 2.7 GB of reads and QKV fusions, 1.3 GB so).
"""

from __future__ import annotations

import threading

import numpy as np

MIN_POOLED = 1 << 20
"""Smaller requests get plain arrays (malloc reuses small blocks by itself)."""


class BufferPool:
    """Thread-safe: buffers come out with :meth:`take` and go back with :meth:`give`, once nothing uses them."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of ``nbytes`` or more: the smallest free one that fits, its first ``nbytes`` only when
        the rest is worth pooling (the rest stays free: one 400 MB embedding's buffer serves a layer's matrices at
        once), else a new one."""
        if nbytes >= MIN_POOLED:
            with self._lock:
                fits = [i for i, b in enumerate(self._free) if b.size >= nbytes]
                if fits:
                    index = min(fits, key=lambda i: self._free[i].size)
                    buffer = self._free[index]
                    if buffer.size - nbytes < MIN_POOLED:
                        return self._free.pop(index)
                    self._free[index] = buffer[nbytes:]
                    return buffer[:nbytes]
        return np.empty(nbytes, np.uint8)

    def give(self, buffer: np.ndarray) -> None:
        """Take ``buffer`` back (the caller holds no view of it any more), joined with the free pieces of the same
        memory beside it. Past ``keep_bytes``, the buffers given back longest ago are let go: the sizes a model's
        layers repeat keep coming back, the others age out."""
        if buffer.size < MIN_POOLED:
            return
        with self._lock:
            for piece in [b for b in self._free if _adjacent(b, buffer) or _adjacent(buffer, b)]:
                self._free = [b for b in self._free if b is not piece]
                buffer = _joined(piece, buffer)
            self._free.append(buffer)
            while sum(b.size for b in self._free) > self.keep_bytes:
                self._free.pop(0)


def _owner(buffer: np.ndarray) -> np.ndarray:
    """The array that owns ``buffer``'s memory (itself, or the base a piece was cut from)."""
    return buffer if buffer.base is None else buffer.base


def _adjacent(first: np.ndarray, second: np.ndarray) -> bool:
    """Whether ``second`` starts where ``first`` ends, in the memory of one owner."""
    return _owner(first) is _owner(second) and first.ctypes.data + first.size == second.ctypes.data


def _joined(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The piece of their owner's memory that the adjacent pieces ``a`` and ``b`` make together."""
    owner = _owner(a)
    start = min(a.ctypes.data, b.ctypes.data) - owner.ctypes.data
    return owner[start : start + a.size + b.size]


def as_array(buffer: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The first bytes of the uint8 ``buffer`` as a C-contiguous array of ``shape`` and ``dtype``."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return buffer[:nbytes].view(dtype).reshape(shape)
