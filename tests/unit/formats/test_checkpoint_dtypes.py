"""A safetensors header's dtypes read by name: the plan's source dtype without numpy, the readers' numpy dtypes."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from ftx_triton.formats.checkpoint import open_checkpoint, stored_weight_dtype
from ftx_triton.plan.resources import stored_dtype


def _write(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A safetensors file of zeros: name -> (header dtype, shape, bytes per element)."""
    header, blob = {}, b""
    for name, (dtype, shape, size) in tensors.items():
        nbytes = int(np.prod(shape)) * size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + nbytes]}
        blob += bytes(nbytes)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + blob)


def test_the_source_dtype_is_the_weight_dtype_of_most_bytes_across_shards(tmp_path: Path) -> None:
    _write(tmp_path / "a.safetensors", {"w1": ("BF16", [4, 4], 2), "ids": ("I64", [16], 8)})
    _write(tmp_path / "b.safetensors", {"w2": ("F32", [3], 4)})
    reader = open_checkpoint(tmp_path)  # two single files: one sharded reader
    try:
        assert [stored_weight_dtype(reader, n) for n in ("w1", "ids", "w2")] == ["bf16", None, "fp32"]
        assert stored_dtype(reader) == "bf16"  # 32 bytes of bf16 against 12 of fp32; the int64 is no weight
        assert [reader.dtype(n) for n in ("w1", "ids", "w2")] == [  # type: ignore[attr-defined]
            np.dtype(ml_dtypes.bfloat16),
            np.dtype(np.int64),
            np.dtype(np.float32),
        ]
    finally:
        reader.close()
