"""FasterTransformer's weight data type names, without numpy (``conversion.dtypes`` maps them to numpy types; the
CLI needs only the names, so ``ftx --help`` imports no numpy)."""

WEIGHT_DTYPE_NAMES = ("fp32", "fp16", "bf16")
WEIGHT_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
"""Bytes per element of each (what a plan's estimates need without numpy)."""
