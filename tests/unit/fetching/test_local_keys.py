"""A local checkpoint's key covers every byte its readers can reach (links to files and to folders followed),
and refuses what it cannot cover."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ftx_triton.errors import CheckpointError, SourceError
from ftx_triton.fetching.local_keys import local_content_key, local_fingerprint
from ftx_triton.io.checkpoint import open_checkpoint
from ftx_triton.io.source_tree import tree_files
from ftx_triton.plan.settings import path_fingerprint

OLD = 1_600_000_000  # an mtime far from now


def _write(path: Path, data: bytes, *, mtime: int = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def _linked_checkpoint(tmp_path: Path, name: str, weights: bytes) -> Path:
    """``name/`` with config.json beside ``shard_0`` and ``shard_1``, each a link to a folder on "another disk"."""
    elsewhere = tmp_path / "disk2" / name
    for shard in (0, 1):
        _write(elsewhere / f"shard_{shard}" / "0.npz", weights + bytes([shard]))
    root = tmp_path / name
    _write(root / "config.json", b'{"n_head": 4}')
    for shard in (0, 1):
        (root / f"shard_{shard}").symlink_to(elsewhere / f"shard_{shard}", target_is_directory=True)
    return root


def test_linked_shard_folders_with_different_weights_key_differently(tmp_path: Path) -> None:
    fp16 = _linked_checkpoint(tmp_path, "fp16", b"\x00\x3c" * 64)
    bf16 = _linked_checkpoint(tmp_path, "bf16", b"\x80\x3f" * 64)
    home = tmp_path / "home"
    assert local_content_key(fp16, home) != local_content_key(bf16, home)
    assert [f.rel.as_posix() for f in tree_files(fp16)] == ["config.json", "shard_0/0.npz", "shard_1/0.npz"]
    assert path_fingerprint(fp16) != path_fingerprint(bf16)  # --tokenizer DIR and `ftx lock` follow links too


def test_a_linked_copy_keys_as_the_copy(tmp_path: Path) -> None:
    """Links change where bytes lie, not what they are: a linked tree keys as a plain copy of it."""
    linked = _linked_checkpoint(tmp_path, "linked", b"w" * 32)
    plain = tmp_path / "plain"
    for file in tree_files(linked):
        _write(plain / file.rel, file.path.read_bytes())
    home = tmp_path / "home"
    assert local_content_key(linked, home) == local_content_key(plain, home)


def test_a_link_cycle_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "model"
    _write(root / "config.json", b"{}")
    (root / "shard_0").mkdir()
    (root / "shard_0" / "loop").symlink_to(root, target_is_directory=True)
    with pytest.raises(SourceError, match="links back to a folder above it") as err:
        local_content_key(root, tmp_path / "home")
    assert err.value.hint


def test_a_broken_folder_link_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "model"
    _write(root / "config.json", b"{}")
    (root / "shard_0").symlink_to(tmp_path / "unmounted-disk" / "shard_0", target_is_directory=True)
    with pytest.raises(SourceError, match="broken symlink"):
        local_content_key(root, tmp_path / "home")


def test_an_unreadable_folder_is_refused_not_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(Permission denied is faked by a scandir that raises it: the tests may run as root, who reads all.)"""
    root = tmp_path / "model"
    _write(root / "config.json", b"{}")
    _write(root / "shards" / "a.safetensors", b"x")
    real = os.scandir

    def denied(path):  # type: ignore[no-untyped-def]
        if Path(path) == root / "shards":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr("ftx_triton.io.source_tree.os.scandir", denied)
    with pytest.raises(SourceError, match="shards in the local source cannot be read: Permission denied"):
        local_content_key(root, tmp_path / "home")


def test_a_tree_past_the_entry_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ftx_triton.io.source_tree.MAX_ENTRIES", 3)
    root = tmp_path / "model"
    for n in range(4):
        _write(root / f"{n}.json", b"{}")
    with pytest.raises(SourceError, match="more than 3 files"):
        local_fingerprint(root)


def test_an_index_may_not_name_a_shard_in_a_skipped_folder(tmp_path: Path) -> None:
    """.git is left out of the key, so no reader may take weights from it."""
    root = tmp_path / "model"
    _write(root / ".git" / "model.safetensors", b"x")
    index = {"weight_map": {"w": ".git/model.safetensors"}}
    _write(root / "model.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(CheckpointError, match="inside a .git folder"):
        open_checkpoint(root)
