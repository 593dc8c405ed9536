"""Weight data types: the names FasterTransformer uses and their numpy element types."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ftx_triton.errors import ConfigError

WEIGHT_DTYPES: dict[str, np.dtype] = {
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}


def numpy_dtype(name: str) -> np.dtype:
    """Numpy dtype for an FT weight dtype name (``fp32``, ``fp16``, ``bf16``)."""
    try:
        return WEIGHT_DTYPES[name]
    except KeyError:
        raise ConfigError(f"unknown weight dtype {name!r}", hint=f"use one of: {', '.join(WEIGHT_DTYPES)}") from None
