"""A local checkpoint's key covers every byte its readers can reach (links to files and to folders followed),
refuses what it cannot cover, and is computed once: remembered against the files' identity (device, inode,
size, mtime, ctime), recomputed when any of it changes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from ftx_triton.errors import CheckpointError, SourceError
from ftx_triton.fetching import local_keys
from ftx_triton.fetching.local_keys import local_content_key, local_fingerprint, source_identity
from ftx_triton.formats.checkpoint import open_checkpoint
from ftx_triton.io.source_tree import tree_files
from ftx_triton.plan.settings import path_fingerprint

OLD = 1_600_000_000  # an mtime far from now


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run comes 10 s after the files were written (their ctime is now): a digest is remembered."""
    monkeypatch.setattr(local_keys, "_now_ns", lambda: time.time_ns() + 10_000_000_000)


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
    assert local_content_key(fp16, home).key != local_content_key(bf16, home).key
    assert [f.rel.as_posix() for f in tree_files(fp16)] == ["config.json", "shard_0/0.npz", "shard_1/0.npz"]
    assert path_fingerprint(fp16) != path_fingerprint(bf16)  # --tokenizer DIR and `ftx lock` follow links too


def test_a_linked_copy_keys_as_the_copy(tmp_path: Path) -> None:
    """Links change where bytes lie, not what they are: a linked tree keys as a plain copy of it."""
    linked = _linked_checkpoint(tmp_path, "linked", b"w" * 32)
    plain = tmp_path / "plain"
    for file in tree_files(linked):
        _write(plain / file.rel, file.path.read_bytes())
    home = tmp_path / "home"
    assert local_content_key(linked, home).key == local_content_key(plain, home).key


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


# -- computed once -------------------------------------------------------------------------------


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from ftx_triton.io import hashing

    calls: list[int] = []
    real = hashing.chunked_digests

    def counting(files, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(files))
        return real(files, **kwargs)

    monkeypatch.setattr(hashing, "chunked_digests", counting)
    return calls


@pytest.mark.usefixtures("later")
def test_the_digest_is_remembered_and_no_byte_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    calls = _count_hashes(monkeypatch)
    first = local_content_key(root, tmp_path / "home")
    second = local_content_key(root, tmp_path / "home")
    assert first == second and calls == [3]


def test_a_file_just_written_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written within the file system's timestamp tick of the read, it could change again unseen."""
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text("{}")  # mtime: now
    calls = _count_hashes(monkeypatch)
    local_content_key(root, tmp_path / "home")
    local_content_key(root, tmp_path / "home")
    assert calls == [1, 1]


@pytest.mark.usefixtures("later")
def test_a_write_in_place_with_the_old_size_and_mtime_changes_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    home = tmp_path / "home"
    before = local_content_key(root, home).key
    shard = root / "shard_1" / "0.npz"
    mtime = shard.stat().st_mtime_ns
    with open(shard, "r+b") as fh:  # same inode, same size
        fh.write(b"X")
    os.utime(shard, ns=(mtime, mtime))  # touch -d back to the old time: only ctime tells
    assert shard.stat().st_mtime_ns == mtime
    assert local_content_key(root, home).key != before


@pytest.mark.usefixtures("later")
def test_a_retargeted_folder_link_changes_the_key(tmp_path: Path) -> None:
    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    other = _linked_checkpoint(tmp_path, "other", b"v" * 32)
    home = tmp_path / "home"
    before = local_content_key(root, home).key
    (root / "shard_1").unlink()
    (root / "shard_1").symlink_to(os.readlink(other / "shard_1"), target_is_directory=True)
    assert local_content_key(root, home).key != before


@pytest.mark.usefixtures("later")
def test_a_retargeted_file_link_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weights file that is a link (as in a Hugging Face cache snapshot) pointed at other bytes of the same size
    and mtime: the remembered digest is not used."""
    blobs = tmp_path / "blobs"
    _write(blobs / "a", b"w" * 64)
    _write(blobs / "b", b"v" * 64)
    root = tmp_path / "model"
    _write(root / "config.json", b"{}")
    (root / "model.safetensors").symlink_to(blobs / "a")
    home = tmp_path / "home"
    before = local_content_key(root, home).key
    calls = _count_hashes(monkeypatch)
    assert local_content_key(root, home).key == before and calls == []  # remembered
    (root / "model.safetensors").unlink()
    (root / "model.safetensors").symlink_to(blobs / "b")
    assert local_content_key(root, home).key != before and calls == [2]


def test_a_file_replaced_while_hashed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    from ftx_triton.io import hashing

    real = hashing.chunked_digests

    def replaced_meanwhile(files, **kwargs):  # type: ignore[no-untyped-def]
        digests = real(files, **kwargs)
        _write(root / "config.json.new", b'{"n_head": 8}')
        os.replace(root / "config.json.new", root / "config.json")  # a new inode
        return digests

    monkeypatch.setattr(hashing, "chunked_digests", replaced_meanwhile)
    with pytest.raises(SourceError, match="changed while it was hashed"):
        local_content_key(root, tmp_path / "home")
    assert not list((tmp_path / "home").glob("local-keys/*.json"))


@pytest.mark.parametrize("when", ["before its check", "after its check"])
def test_a_file_removed_before_it_is_hashed_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Listed, then removed before its check or between the check and the hash: the error names the change."""
    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    pending = local_keys.remembered_key(root, tmp_path / "home")
    assert isinstance(pending, local_keys.PendingKey)
    shard = root / "shard_1" / "0.npz"
    if when == "before its check":
        shard.unlink()
    else:
        real = local_keys.PendingKey.check_readable

        def checked_then_removed(self: local_keys.PendingKey) -> None:
            real(self)
            shard.unlink()

        monkeypatch.setattr(local_keys.PendingKey, "check_readable", checked_then_removed)
    with pytest.raises(SourceError, match="changed while it was hashed"):
        local_keys.settle(pending)


def test_a_file_replaced_by_a_pipe_after_its_check_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked as a regular file, then swapped for a FIFO before its chunks are read (a stranger's checkpoint
    racing the hash): the error names the change, never a traceback or a hang."""
    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    pending = local_keys.remembered_key(root, tmp_path / "home")
    assert isinstance(pending, local_keys.PendingKey)
    shard = root / "shard_1" / "0.npz"
    real = local_keys.PendingKey.check_readable

    def checked_then_piped(self: local_keys.PendingKey) -> None:
        real(self)
        target = shard.resolve()
        target.unlink()
        os.mkfifo(target)

    monkeypatch.setattr(local_keys.PendingKey, "check_readable", checked_then_piped)
    with pytest.raises(SourceError, match="changed while it was hashed"):
        local_keys.settle(pending)


def test_source_identity_moves_with_every_kind_of_change(tmp_path: Path) -> None:
    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    seen = {source_identity(root)}
    _write(root / "extra.json", b"{}")  # added
    seen.add(source_identity(root))
    (root / "extra.json").unlink()  # removed
    assert source_identity(root) in seen
    os.chmod(root / "config.json", 0o600)  # metadata only: ctime moves, so it is hashed again (never stale)
    seen.add(source_identity(root))
    assert len(seen) == 3


def test_a_background_key_is_the_same_key_and_gives_up_when_told(tmp_path: Path) -> None:
    import threading

    from ftx_triton.io.hashing import HashStopped

    root = _linked_checkpoint(tmp_path, "model", b"w" * 32)
    expected = local_content_key(root, tmp_path / "plain").key
    pending = local_keys.remembered_key(root, tmp_path / "home")
    assert isinstance(pending, local_keys.PendingKey)
    told: list[str] = []
    background = local_keys.BackgroundKey(pending, lambda key: told.append(key.key))
    assert background.result().key == expected and told == [expected]
    stop = threading.Event()
    stop.set()
    with pytest.raises(HashStopped):
        local_keys.settle(pending, stop)
