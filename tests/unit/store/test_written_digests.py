"""The store records a converted file's chunked digest from the pass that wrote it, never from a second read, and
only while the file is as its writer left it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from chunked_digest import spelled_out
from ftx_triton.formats.ftformat import write_tensor
from ftx_triton.io import hashing
from ftx_triton.store import artifact_store
from ftx_triton.store.artifact_store import ArtifactStore


@pytest.fixture
def hashed_from_disk(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the store reads back to hash."""
    read: list[str] = []
    real = hashing.chunked_digests

    def spy(files, **kwargs):  # type: ignore[no-untyped-def]
        read.extend(Path(path).name for path, _size in files)
        return real(files, **kwargs)

    monkeypatch.setattr(artifact_store, "chunked_digests", spy)
    return read


def _build(home: Path, write) -> dict:  # type: ignore[no-untyped-def]
    store = ArtifactStore(home)
    artifact, cached = store.build("convert", "k" * 24, lambda tmp: write(tmp) or {}, inputs={}, producer={})
    assert not cached
    return dict(artifact.provenance["outputs"])


def test_a_written_tensor_is_recorded_without_reading_it_back(tmp_path: Path, hashed_from_disk: list[str]) -> None:
    values = np.arange(4096, dtype=np.float16).reshape(64, 64)

    def write(tmp: Path) -> None:
        write_tensor(tmp / "w.bin", values.T)  # a transposed view: written from its copy
        (tmp / "config.ini").write_text("[x]\n")  # written by other code: hashed from disk

    outputs = _build(tmp_path / "home", write)
    assert outputs["w.bin"]["chunked_sha256"] == spelled_out(np.ascontiguousarray(values.T).tobytes(), 16 << 20)
    assert hashed_from_disk == ["config.ini"]


def test_a_file_changed_after_its_writer_is_hashed_from_disk(tmp_path: Path, hashed_from_disk: list[str]) -> None:
    def write(tmp: Path) -> None:
        write_tensor(tmp / "w.bin", np.zeros(1024, np.float32))
        with open(tmp / "w.bin", "r+b") as fh:  # the same size, other bytes: a stale digest would be wrong
            fh.write(b"\x01" * 8)
        st = os.stat(tmp / "w.bin")
        os.utime(tmp / "w.bin", ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # moves ctime, as any write does

    outputs = _build(tmp_path / "home", write)
    assert outputs["w.bin"]["chunked_sha256"] == spelled_out(b"\x01" * 8 + bytes(4096 - 8), 16 << 20)
    assert hashed_from_disk == ["w.bin"]


def test_a_digest_is_handed_over_once(tmp_path: Path) -> None:
    write_tensor(tmp_path / "w.bin", np.ones(16, np.float32))
    st = os.lstat(tmp_path / "w.bin")
    assert hashing.written_digest(tmp_path / "w.bin", st) == spelled_out(np.ones(16, np.float32).tobytes(), 16 << 20)
    assert hashing.written_digest(tmp_path / "w.bin", st) is None
