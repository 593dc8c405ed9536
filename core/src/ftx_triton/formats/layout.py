"""Names of a FasterTransformer checkpoint's directories, without numpy: a cached `ftx convert` and `ftx run` name
them before (or without) reading a tensor."""

from __future__ import annotations


def gpu_dir_name(tp: int | str) -> str:
    """The directory FasterTransformer reads a checkpoint split for ``tp`` GPUs from: ``<tp>-gpu``."""
    return f"{tp}-gpu"
