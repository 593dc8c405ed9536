"""The background writer: splits, bounded memory, errors surface to the caller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ftx_triton.formats.fastcopy import contiguous
from ftx_triton.formats.writer import BackgroundWriter


@pytest.mark.parametrize("split", [None, 0, 1, -1])
def test_writes_each_rank_of_a_transposed_view(tmp_path: Path, split: int | None) -> None:
    source = np.arange(512 * 256, dtype=np.float16).reshape(512, 256)
    view = source.T  # strided, as a transpose op produces
    count = 1 if split is None else 4
    paths = [tmp_path / f"t.{r}.bin" for r in range(count)]
    with BackgroundWriter(max_pending_bytes=1 << 20, threads=3) as writer:
        writer.submit(paths, view, split)
    parts = [view] if split is None else np.split(view, count, axis=split)
    for path, part in zip(paths, parts, strict=True):
        assert path.read_bytes() == np.ascontiguousarray(part).tobytes()
    assert writer.bytes_written == view.nbytes


def test_an_error_reaches_the_submitter(tmp_path: Path) -> None:
    writer = BackgroundWriter(threads=1)
    writer.submit([tmp_path / "missing-dir" / "x.bin"], np.zeros(4, np.float32))
    with pytest.raises(FileNotFoundError):
        writer.close()


def test_fast_contiguous_copy_is_byte_identical() -> None:
    import ml_dtypes

    for dtype in (np.float16, np.float32, ml_dtypes.bfloat16):
        a = (np.random.default_rng(0).standard_normal((300, 500)) * 3).astype(dtype)
        for view in (a.T, a[:, ::2], np.stack([a, a]).transpose(2, 0, 1)):
            out = contiguous(view)
            assert out.flags.c_contiguous and out.dtype == view.dtype
            assert out.tobytes() == np.ascontiguousarray(view).tobytes()
