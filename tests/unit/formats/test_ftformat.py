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


def _views(values: np.ndarray) -> list[np.ndarray]:
    """Strided views a conversion writes: transposes (3-D: a fused QKV's), a column split, a row stride."""
    return [values[0].T, values.transpose(2, 1, 0), values[0][:, ::3], values[::2], values.reshape(-1)[::5]]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_a_strided_array_is_written_band_by_band_as_its_bytes_digest_and_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: type
) -> None:
    """Bands of a few rows (here 1000 bytes: none divides the rows, some rows are larger than a band) give the
    bytes of the C-order copy, the chunked digest of those bytes and numpy's count of NaN and Inf."""
    from chunked_digest import spelled_out
    from ftx_triton.formats import ftformat
    from ftx_triton.formats.ftformat import write_tensor_counted
    from ftx_triton.io.hashing import CHUNKED_BYTES, written_digest

    monkeypatch.setattr(ftformat, "_BAND_BYTES", 1000)
    values = (np.random.default_rng(2).standard_normal((3, 70, 90)) * 3).astype(np.float32)
    values[0, 4, 5], values[1, 69, 0], values[2, 10, 89], values[0, 0, 0] = np.nan, np.inf, -np.inf, 1e-40
    values = values.astype(dtype)
    for index, view in enumerate(_views(values)):
        path = tmp_path / f"{index}.bin"
        size, bad = write_tensor_counted(path, view)
        expected = np.ascontiguousarray(view).tobytes()
        assert path.read_bytes() == expected and size == len(expected), index
        assert bad == np.count_nonzero(~np.isfinite(view.astype(np.float32))), index
        assert written_digest(path, path.lstat()) == spelled_out(expected, CHUNKED_BYTES), index


def test_a_transpose_is_written_without_a_copy_of_its_size(tmp_path: Path) -> None:
    """The writer copies a transposed weight a band at a time (each band in cache for the write, hash and count)
    instead of whole into memory the kernel must fault in and zero: 64 MiB are written holding a few MiB at most."""
    import tracemalloc

    from ftx_triton.formats.ftformat import write_tensor_counted

    values = np.ones((4096, 8192), np.float16)
    tracemalloc.start()
    try:
        write_tensor_counted(tmp_path / "t.bin", values.T)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < values.nbytes // 4, peak
    assert (tmp_path / "t.bin").stat().st_size == values.nbytes
