"""The chunked digest behind local sources' content keys: one value whatever the number of threads that hash the
chunks, every byte covered, and a key of the earlier definition (whole-file sha256) never taken for it."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from chunked_digest import spelled_out
from ftx_triton.fetching import local_keys
from ftx_triton.fetching.local_keys import local_content_key
from ftx_triton.io import hashing
from ftx_triton.io.hashing import HashStopped, chunked_digests


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1000 bytes read in 300-byte pieces, so that a few KB span many chunks and pieces."""
    monkeypatch.setattr(hashing, "CHUNKED_BYTES", 1000)
    monkeypatch.setattr(hashing, "_PIECE", 300)


def _files(tmp_path: Path) -> list[tuple[Path, int]]:
    sizes = {"empty": 0, "one": 1, "edge": 1000, "many": 10_001}
    files = []
    for name, size in sizes.items():
        path = tmp_path / name
        path.write_bytes(bytes((i * 7 + size) % 251 for i in range(size)))
        files.append((path, size))
    return files


@pytest.mark.usefixtures("small_chunks")
def test_the_digest_is_the_same_for_every_thread_count(tmp_path: Path) -> None:
    files = _files(tmp_path)
    results = [chunked_digests(files, threads=threads) for threads in (1, 2, 3, 16)]
    assert all(result == results[0] for result in results)
    assert len(set(results[0].values())) == len(files)


@pytest.mark.usefixtures("small_chunks")
def test_the_digest_is_sha256_over_the_chunks_digests(tmp_path: Path) -> None:
    """The definition, spelled out independently: a change of chunk size, order or version is a change of key."""
    (path, size) = _files(tmp_path)[-1]
    assert chunked_digests([(path, size)], threads=4)[path] == spelled_out(path.read_bytes(), 1000)


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("offset", [0, 999, 1000, 5555, 10_000])
def test_one_byte_changed_anywhere_changes_the_digest(tmp_path: Path, offset: int) -> None:
    (path, size) = _files(tmp_path)[-1]
    before = chunked_digests([(path, size)], threads=3)[path]
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))
    assert chunked_digests([(path, size)], threads=3)[path] != before


@pytest.mark.usefixtures("small_chunks")
def test_hashing_gives_up_when_told(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(HashStopped):
        chunked_digests(_files(tmp_path), stop=stop, threads=3)


def test_a_remembered_key_of_the_whole_file_definition_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memo written by an earlier ftx (its identity text v2, its key over whole-file sha256s) is not found, and
    the key computed now differs from that definition's for the same bytes: a store entry keyed by the earlier key
    is never found by this one."""
    monkeypatch.setattr(local_keys, "_now_ns", lambda: 10**19)  # the files are old: the digest is remembered
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"w" * 5000)
    home = tmp_path / "home"
    files = local_keys.tree_files(root)
    old_identity = hashlib.sha256(b"tree-identity-v2\n")
    old_key = hashlib.sha256()
    for file in files:
        name = file.rel.as_posix().encode()
        old_identity.update(name + f"\0{file.identity.token()}\n".encode())
        old_key.update(name + f"\0{hashlib.sha256(file.path.read_bytes()).hexdigest()}\n".encode())
    v1 = f"content-{old_key.hexdigest()[:40]}"
    memo = home / "local-keys" / f"{old_identity.hexdigest()[:40]}.json"
    memo.parent.mkdir(parents=True)
    memo.write_text(json.dumps({"key": "content-" + "0" * 40, "path": str(root)}))
    key = local_content_key(root, home).key
    assert key.startswith("content-") and key not in (v1, "content-" + "0" * 40)
    assert local_content_key(root, home).key == key  # remembered under the new identity text
    assert len(list((home / "local-keys").glob("*.json"))) == 3  # the old memo, the path record, the new memo


@pytest.mark.usefixtures("small_chunks")
def test_a_file_shorter_than_listed_hashes_what_it_holds(tmp_path: Path) -> None:
    """A file truncated after it was listed is read to its end, not past it (the caller's identity check refuses
    the run); it never hashes as the listed bytes did."""
    (path, size) = _files(tmp_path)[-1]
    whole = chunked_digests([(path, size)])[path]
    os.truncate(path, 4321)
    assert chunked_digests([(path, size)])[path] != whole


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("piece", [1, 299, 1000, 1001, 20_000])
def test_bytes_fed_in_pieces_of_any_size_give_the_files_digest(tmp_path: Path, piece: int) -> None:
    """A writer's digest of the bytes it writes (:class:`ChunkedHasher`) is the one the store computes from disk."""
    for path, size in _files(tmp_path):
        data = path.read_bytes()
        hasher = hashing.ChunkedHasher()
        for start in range(0, size, piece):
            hasher.update(data[start : start + piece])
        assert hasher.hexdigest() == chunked_digests([(path, size)])[path] == spelled_out(data, 1000)


@pytest.mark.usefixtures("small_chunks")
def test_chunks_and_whole_files_are_hashed_by_one_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No pool of threads per call: every chunked digest runs on the threads that hash whole files."""
    files = _files(tmp_path)
    seen: list[set[threading.Thread]] = []
    real = os.preadv

    def spy(*args):  # type: ignore[no-untyped-def]
        seen[-1].add(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(os, "preadv", spy)
    for _ in range(2):
        seen.append(set())
        chunked_digests(files, threads=2)
    pool = hashing._pool(2)
    assert seen[0] | seen[1] <= set(pool._threads)  # type: ignore[attr-defined]
    assert all(thread.name.startswith("ftx-hash") for thread in seen[0])
