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


def test_the_copy_lands_in_a_given_buffer_and_refuses_a_wrong_one() -> None:
    a = np.arange(400 * 300, dtype=np.float16).reshape(400, 300)
    out = np.empty((300, 400), np.float16)
    assert contiguous(a.T, out) is out and out.tobytes() == np.ascontiguousarray(a.T).tobytes()
    with pytest.raises(ValueError, match="C-contiguous"):
        contiguous(a.T, np.empty((300, 400), np.float32))


def test_non_finite_values_are_counted_by_the_writer_under_their_label(tmp_path: Path) -> None:
    values = np.ones((256, 512), np.float16)
    values[3, 7], values[200, 500] = np.nan, np.inf
    paths = [tmp_path / f"t.{r}.bin" for r in range(2)]
    with BackgroundWriter(threads=2) as writer:
        writer.submit(paths, values.T, 0, label="bad")  # one non-finite value in each rank's file
        writer.submit([tmp_path / "ok.bin"], np.ones(8, np.float16), label="good")
        writer.submit([tmp_path / "unchecked.bin"], values)  # no label: not counted
    assert writer.non_finite == {"bad": 2}


@pytest.mark.parametrize("split", [None, 0, 1])
def test_a_file_split_over_helpers_is_the_same_file_with_its_digest_and_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: int | None
) -> None:
    """Large files go to helper threads chunk by chunk (copied, then written with pwrite, hashed and counted): the
    bytes, the NaN/Inf count and the digest the store takes are those of one pass by one thread whatever the number
    of helpers, and that digest is the chunked digest of the file's bytes (each chunk hashed by the thread that
    wrote it: no thread hashes a whole file)."""
    import os

    import ml_dtypes
    from chunked_digest import spelled_out
    from ftx_triton.formats import ftformat
    from ftx_triton.io import hashing
    from ftx_triton.io.hashing import chunked_digests, written_digest

    monkeypatch.setattr(ftformat, "SPLIT_MIN_BYTES", 1 << 12)
    monkeypatch.setattr(hashing, "CHUNKED_BYTES", 3000)  # pieces of a split file: not a multiple of 4, of 2 yes
    monkeypatch.setattr(ftformat, "_PASS_BYTES", 1100)  # one pass's pieces straddle the chunks' edges
    monkeypatch.setattr(ftformat, "_BAND_BYTES", 2000)  # a transpose's bands straddle the chunks' edges
    values = (np.random.default_rng(1).standard_normal((96, 160)) * 3).astype(ml_dtypes.bfloat16)
    values[5, 9], values[90, 150] = np.nan, -np.inf
    results = {}
    for helpers in (0, 2, 5):
        out = tmp_path / f"helpers{helpers}"
        out.mkdir()
        paths = [out / f"t.{r}.bin" for r in range(1 if split is None else 2)]
        with BackgroundWriter(threads=2, helpers=helpers) as writer:
            writer.submit(paths, values.T, split, label="w")
        contents = [path.read_bytes() for path in paths]
        for path, content in zip(paths, contents, strict=True):
            assert written_digest(path, os.lstat(path)) == spelled_out(content, 3000)
            assert chunked_digests([(path, len(content))])[path] == spelled_out(content, 3000)
        results[helpers] = (contents, writer.non_finite, writer.bytes_written)
    assert results[0] == results[2] == results[5] and results[5][1] == {"w": 2}


def test_converting_imports_no_torch(tmp_path: Path) -> None:
    """The tiled copy is numpy's: a conversion no longer pays torch's import (1-2 s) for its transposes."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from ftx_triton.formats.writer import BackgroundWriter\n"
        "a = np.ones((512, 1024), np.float16)\n"
        f"with BackgroundWriter(threads=2) as w: w.submit([__import__('pathlib').Path({str(tmp_path)!r}) / 't.bin'], a.T)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_pool_hands_back_what_fits_and_lets_the_oldest_go() -> None:
    from ftx_triton.formats.buffers import MIN_POOLED, BufferPool, as_array

    pool = BufferPool(keep_bytes=4 * MIN_POOLED)
    a, b = pool.take(2 * MIN_POOLED), pool.take(MIN_POOLED)
    pool.give(a)
    pool.give(b)
    assert pool.take(MIN_POOLED) is b  # the smallest that fits
    assert pool.take(MIN_POOLED // 2).size == MIN_POOLED // 2  # small requests are never pooled
    c = pool.take(3 * MIN_POOLED)
    pool.give(b)
    pool.give(c)  # 6 MiB kept of 4 allowed: the one given back longest ago (a) goes
    assert pool.take(3 * MIN_POOLED) is c and pool.take(MIN_POOLED) is b
    assert pool.take(MIN_POOLED).base is None  # fresh memory: a is gone
    view = as_array(np.zeros(64, np.uint8), (4, 4), np.dtype(np.float32))
    assert view.shape == (4, 4) and view.flags.c_contiguous


def test_a_large_free_buffer_serves_smaller_requests_at_once_and_is_whole_again_once_given_back() -> None:
    """An embedding's 400 MB buffer, once written, holds the next layer's matrices side by side instead of one of
    them while the others take fresh memory (which the kernel must fault in and zero); the pieces given back in any
    order join into the whole buffer again, ready for a request of its size."""
    from ftx_triton.formats.buffers import MIN_POOLED, BufferPool

    pool = BufferPool(keep_bytes=16 * MIN_POOLED)
    whole = pool.take(10 * MIN_POOLED)
    pool.give(whole)
    pieces = [pool.take(size * MIN_POOLED) for size in (3, 2, 4)]
    assert [piece.base for piece in pieces] == [whole] * 3
    assert len({piece.ctypes.data for piece in pieces}) == 3  # no two share memory
    assert pool.take(MIN_POOLED).base is whole and pool.take(MIN_POOLED).base is None  # 1 MiB left, then none
    for piece in (pieces[2], pieces[0], pieces[1]):
        pool.give(piece)
    again = pool.take(9 * MIN_POOLED)
    assert again.base is whole and again.ctypes.data == whole.ctypes.data
