"""Materialise strided (transposed) arrays quickly.

numpy copies a transposed matrix at a few hundred MB/s (cache-unfriendly strides); torch's
tiled, multi-threaded copy is several times faster. Used for large arrays when torch is
installed; otherwise numpy. Results are byte-identical either way.
"""

from __future__ import annotations

import numpy as np

TORCH_MIN_ELEMENTS = 1 << 16
_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def contiguous(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array with the same values (``array`` itself when it already is)."""
    if array.flags.c_contiguous:
        return array
    if array.size >= TORCH_MIN_ELEMENTS and array.dtype.itemsize in _INT_OF_SIZE:
        try:
            import torch
        except ImportError:
            return np.ascontiguousarray(array)
        as_int = array.view(_INT_OF_SIZE[array.dtype.itemsize])  # same bytes, a dtype torch knows
        return torch.from_numpy(as_int).contiguous().numpy().view(array.dtype)
    return np.ascontiguousarray(array)
