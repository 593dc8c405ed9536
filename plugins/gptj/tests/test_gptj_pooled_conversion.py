"""A conversion reads through reused buffers (no fresh, zeroed memory for every tensor): the files it
writes are byte for byte those of a conversion into fresh arrays, whatever order the writer threads finish in."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_gptj.family import GPTJ
from ftx_triton.conversion.convert import convert_directory
from ftx_triton.formats import buffers
from ftx_triton.formats.writer import BackgroundWriter
from safetensors.numpy import save_file

HIDDEN, LAYERS, VOCAB = 1024, 3, 600  # tensors of 1-8 MB: above the pool's threshold


def _checkpoint(root: Path) -> Path:
    rng = np.random.default_rng(7)
    tensors: dict[str, np.ndarray] = {}

    def add(name: str, *shape: int) -> None:
        tensors[name] = (rng.standard_normal(shape) * 0.02).astype(np.float16)

    add("transformer.wte.weight", VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"transformer.h.{i}"
        add(f"{p}.ln_1.weight", HIDDEN)
        add(f"{p}.ln_1.bias", HIDDEN)
        for x in ("q", "k", "v", "out"):
            add(f"{p}.attn.{x}_proj.weight", HIDDEN, HIDDEN)
        add(f"{p}.mlp.fc_in.weight", 4 * HIDDEN, HIDDEN)
        add(f"{p}.mlp.fc_in.bias", 4 * HIDDEN)
        add(f"{p}.mlp.fc_out.weight", HIDDEN, 4 * HIDDEN)
        add(f"{p}.mlp.fc_out.bias", HIDDEN)
    add("transformer.ln_f.weight", HIDDEN)
    add("transformer.ln_f.bias", HIDDEN)
    add("lm_head.weight", VOCAB, HIDDEN)
    add("lm_head.bias", VOCAB)
    root.mkdir()
    save_file(tensors, str(root / "model.safetensors"))
    config = {"model_type": "gptj", "n_embd": HIDDEN, "n_head": HIDDEN // 64, "n_layer": LAYERS, "rotary_dim": 16}
    (root / "config.json").write_text(json.dumps({**config, "vocab_size": VOCAB, "n_positions": 64}))
    return root


@pytest.mark.parametrize("tp", [1, 2])
def test_pooled_buffers_write_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    source = _checkpoint(tmp_path / "hf")
    taken: list[int] = []
    reused: list[int] = []
    real_take = buffers.BufferPool.take

    def take(self: buffers.BufferPool, nbytes: int) -> np.ndarray:
        free = {id(b) for b in self._free}
        buffer = real_take(self, nbytes)
        (reused if id(buffer) in free else taken).append(nbytes)
        return buffer

    def submit_and_drain(self: BackgroundWriter, *args: Any, **kwargs: Any) -> None:
        """Each submission written before the next read (in this small model every tensor would fit in flight at
        once, and whether a read finds a buffer given back would be a race): every later read can reuse one."""
        real_submit(self, *args, **kwargs)
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    real_submit = BackgroundWriter.submit
    monkeypatch.setattr(buffers.BufferPool, "take", take)
    monkeypatch.setattr(BackgroundWriter, "submit", submit_and_drain)
    monkeypatch.setenv("FTX_CONVERT_THREADS", "3")
    pooled = convert_directory(GPTJ(), source, tmp_path / "pooled", tp=tp, weight_dtype="fp16")
    assert reused, "no buffer was reused"
    monkeypatch.setattr(buffers, "MIN_POOLED", 1 << 62)  # every array fresh, as before the pool
    fresh = convert_directory(GPTJ(), source, tmp_path / "fresh", tp=tp, weight_dtype="fp16")
    assert sorted(pooled.files) == sorted(fresh.files)
    for name in fresh.files:
        assert (pooled.directory / name).read_bytes() == (fresh.directory / name).read_bytes(), name


@pytest.mark.parametrize("tp", [1, 2])
def test_files_split_over_helper_threads_are_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp: int
) -> None:
    """On a many-core host each large file is copied, then written, hashed and counted in pieces by helper threads:
    the files are those one thread per file writes (pieces made small here, so that every
    tensor of this model is split into many)."""
    from ftx_triton.formats import ftformat
    from ftx_triton.io import hashing

    source = _checkpoint(tmp_path / "hf")
    monkeypatch.setenv("FTX_CONVERT_THREADS", "1")
    whole = convert_directory(GPTJ(), source, tmp_path / "whole", tp=tp, weight_dtype="fp16")
    monkeypatch.setattr(ftformat, "SPLIT_MIN_BYTES", 1 << 16)
    monkeypatch.setattr(hashing, "CHUNKED_BYTES", 48 << 10)  # a split file's pieces are the digest's chunks
    monkeypatch.setattr(ftformat, "_BAND_BYTES", 40 << 10)
    monkeypatch.setenv("FTX_CONVERT_THREADS", "5")
    split = convert_directory(GPTJ(), source, tmp_path / "split", tp=tp, weight_dtype="fp16")
    assert sorted(split.files) == sorted(whole.files)
    for name in whole.files:
        assert (split.directory / name).read_bytes() == (whole.directory / name).read_bytes(), name
        path = split.directory / name
        if path.suffix == ".bin":  # the digest its writers made from their chunks: the one a read of it gives
            found = hashing.written_digest(path, os.lstat(path))
            assert found == hashing.chunked_digests([(path, path.stat().st_size)])[path], name


def test_the_largest_lone_tensors_are_read_first_and_the_rest_in_storage_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The largest outputs (hashed by one thread each: a 6B model's embedding and head) start first, beside the
    rest, instead of one stored last being hashed alone at the end; q, k and v, which one job reads together, are
    not pulled forward even where they are as large. In this small model the MLP matrices (8 MB) are the largest."""
    from ftx_triton.formats.checkpoint import SafetensorsFile, open_checkpoint

    source = _checkpoint(tmp_path / "hf")
    read: list[str] = []
    real = SafetensorsFile.read_into

    def recording(self: SafetensorsFile, name: str, buffer: np.ndarray) -> np.ndarray:
        read.append(name)
        return real(self, name, buffer)

    monkeypatch.setattr(SafetensorsFile, "read_into", recording)
    convert_directory(GPTJ(), source, tmp_path / "out", tp=1, weight_dtype="fp16")
    stored = open_checkpoint(source).names()
    first = [name for name in stored if name.endswith(("fc_in.weight", "fc_out.weight"))]
    assert len(first) == 2 * LAYERS and read[: len(first)] == first
    assert read[len(first) :] == [name for name in stored if name not in first]
