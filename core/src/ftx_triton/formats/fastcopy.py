"""Materialise strided (transposed) arrays quickly, with numpy alone.

numpy copies a transposed matrix element by element in the output's order, reading the input across its
rows: every element is a cache miss, a few hundred MB/s. Copied tile by tile (a square of the first and last
axes at a time, each tile's reads and writes staying in cache), the same copy runs at memory speed, as fast
as torch's tiled copy, without importing torch (1-2 s) on the conversion path. Results are byte-identical to
``np.ascontiguousarray``.

A transpose (the input's first axis is the one adjacent in memory: a weight matrix's ``.T``) goes through a small
scratch tile whose rows are padded to an odd number of cache lines: a tile read straight from a matrix whose rows
are a power of two bytes apart (4096 or 16384 fp16 values) maps every row to the same cache set, so its elements
kept evicting each other (3-6x slower, measured). The tile is read row by row into the scratch, then copied out
transposed from there.
"""

from __future__ import annotations

import numpy as np

TILED_MIN_ELEMENTS = 1 << 16
"""Smaller arrays are copied by numpy directly (a tile loop's Python overhead would not pay)."""

_TILE_BYTES = 64 << 10
"""One tile's bytes (read and written): well inside a core's L2 cache."""


def contiguous(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous array with the same values: ``array`` itself when it already is one, else a copy (into
    ``out`` when given: a C-contiguous array of the same shape and dtype)."""
    if array.flags.c_contiguous and out is None:
        return array
    if out is None:
        out = np.empty(array.shape, dtype=array.dtype)
    elif out.shape != array.shape or out.dtype != array.dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {array.dtype} array of shape {array.shape}")
    if array.ndim < 2 or array.size < TILED_MIN_ELEMENTS or abs(array.strides[-1]) == array.itemsize:
        np.copyto(out, array)  # rows already run along memory: numpy copies them at memory speed
        return out
    if array.strides[0] == array.itemsize:
        return _transpose(array, out)
    side = max(16, int((_TILE_BYTES / (2 * array.itemsize * _middle(array))) ** 0.5))
    rows, cols = array.shape[0], array.shape[-1]
    for i in range(0, rows, side):
        for j in range(0, cols, side):
            out[i : i + side, ..., j : j + side] = array[i : i + side, ..., j : j + side]
    return out


_SCRATCH_SIDE_BYTES = 512
"""A scratch tile's side in bytes before padding (256 fp16 values: 128 KiB a tile, inside a core's L2 cache)."""
_LINE = 64
"""Cache line bytes: the scratch's rows are an odd number of them apart."""


def _transpose(array: np.ndarray, out: np.ndarray) -> np.ndarray:
    """:func:`contiguous` of an ``array`` whose first axis is adjacent in memory (a transpose): for each index of
    the middle axes, the (first, last) matrix is copied tile by tile through a padded scratch tile."""
    side = max(1, _SCRATCH_SIDE_BYTES // array.itemsize)
    row_bytes = side * array.itemsize + _LINE
    row_bytes += _LINE if (row_bytes // _LINE) % 2 == 0 else 0
    scratch = np.empty((side, -(-row_bytes // array.itemsize)), array.dtype)
    for middle in np.ndindex(*array.shape[1:-1]):
        index: tuple[slice | int, ...] = (slice(None), *middle)
        source, target = array[index].T, out[index]
        for j in range(0, source.shape[0], side):
            for i in range(0, source.shape[1], side):
                tile = scratch[: min(side, source.shape[0] - j), : min(side, source.shape[1] - i)]
                np.copyto(tile, source[j : j + side, i : i + side])  # rows along memory
                np.copyto(target[i : i + side, j : j + side], tile.T)  # in cache, no set conflicts
    return out


def _middle(array: np.ndarray) -> int:
    """Elements of a tile per (first, last) pair: the sizes of the axes between them."""
    count = 1
    for size in array.shape[1:-1]:
        count *= size
    return max(count, 1)
