"""FasterTransformer files: counting NaN/Inf in every float type the converter writes."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from ftx_triton.formats.ftformat import non_finite_count, non_finite_files, write_tensor


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_non_finite_values_are_counted_in_every_weight_dtype(dtype: type) -> None:
    """bfloat16 is no ``np.floating`` to numpy: its NaNs went uncounted at conversion."""
    values = np.array([1.0, np.nan, np.inf, -np.inf, 2.0], dtype=np.float32).astype(dtype)
    assert non_finite_count(values) == 3


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_views_are_counted_as_their_values(dtype: type) -> None:
    """A transposed weight (as the converter writes most of them) is counted in memory order without a copy;
    a view that is neither C- nor F-ordered is copied first: the count is the same either way."""
    values = np.zeros((64, 96, 32), dtype=np.float32)
    values[1, 2, 3], values[63, 0, 31], values[5, 95, 0] = np.nan, np.inf, -np.inf
    values = values.astype(dtype)
    assert non_finite_count(values[0].T) == 0 and non_finite_count(values[1].T) == 1
    assert non_finite_count(values.reshape(64, -1).T) == 3  # F-ordered
    assert non_finite_count(values.transpose(1, 0, 2)) == 3  # neither
    assert non_finite_count(values[::2]) == 0 and non_finite_count(values[1::2]) == 3  # strided


def test_the_files_holding_them_are_named(tmp_path: Path) -> None:
    write_tensor(tmp_path / "a.bin", np.array([1.0, np.nan], dtype=ml_dtypes.bfloat16))
    write_tensor(tmp_path / "b.bin", np.ones(4, dtype=ml_dtypes.bfloat16))
    assert non_finite_files(tmp_path, np.dtype(ml_dtypes.bfloat16)) == {"a.bin": 1}


def test_a_mapped_tensor_is_the_files_pages_and_writes_stay_private(tmp_path: Path) -> None:
    """``mmap=True`` maps the file copy-on-write: the same values as a read, no copy, the file unchanged."""
    from ftx_triton.formats.ftformat import read_tensor

    values = np.arange(12, dtype=np.float16).reshape(3, 4)
    write_tensor(tmp_path / "w.bin", values)
    mapped = read_tensor(tmp_path / "w.bin", np.dtype(np.float16), (3, 4), mmap=True)
    assert isinstance(mapped, np.memmap)
    assert np.array_equal(mapped, read_tensor(tmp_path / "w.bin", np.dtype(np.float16), (3, 4)))
    mapped[0, 0] = 99
    assert np.array_equal(np.fromfile(tmp_path / "w.bin", dtype=np.float16).reshape(3, 4), values)
