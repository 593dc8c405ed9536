"""Weight data types: the names FasterTransformer uses and their numpy element types."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ftx_triton.conversion.dtype_names import WEIGHT_DTYPE_NAMES
from ftx_triton.errors import ConfigError

WEIGHT_DTYPES: dict[str, np.dtype] = dict(
    zip(WEIGHT_DTYPE_NAMES, (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)), strict=True)
)


def numpy_dtype(name: str) -> np.dtype:
    """Numpy dtype for an FT weight dtype name (``fp32``, ``fp16``, ``bf16``)."""
    try:
        return WEIGHT_DTYPES[name]
    except KeyError:
        raise ConfigError(f"unknown weight dtype {name!r}", hint=f"use one of: {', '.join(WEIGHT_DTYPES)}") from None
