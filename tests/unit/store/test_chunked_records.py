"""The store records each output by its chunked digest (``ftx.artifact/2``), verifies it by that definition (a byte
changed in any chunk is found), and still verifies a record of ``ftx.artifact/1`` (a plain sha256) by its own
definition: a digest is only ever compared with the definition its field names."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from chunked_digest import spelled_out
from ftx_triton.io import hashing
from ftx_triton.store.artifact_store import PROVENANCE_FILE, ArtifactStore

KEY = "k" * 24
CHUNK = 1000
CONTENT = bytes((i * 7) % 251 for i in range(4321))
"""Five chunks of :data:`CHUNK` bytes, the last one short."""


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "CHUNKED_BYTES", CHUNK)
    monkeypatch.setattr(hashing, "_PIECE", 300)


def _build(store: ArtifactStore) -> Path:
    def builder(tmp: Path) -> dict:
        (tmp / "w.bin").write_bytes(CONTENT)  # not a writer of ftx's: hashed from disk by the store
        return {}

    artifact, cached = store.build("convert", KEY, builder, inputs={}, producer={})
    assert not cached
    return artifact.path


def _edit_record(path: Path, edit: Callable[[dict], object]) -> None:
    meta = json.loads((path / PROVENANCE_FILE).read_text())
    edit(meta)
    (path / PROVENANCE_FILE).write_text(json.dumps(meta))


def _rewrite_same_times(path: Path, content: bytes) -> None:
    """Write ``content`` into ``path`` in place with its size and mtime put back (only its ctime moves)."""
    st = os.stat(path)
    path.write_bytes(content)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_outputs_are_recorded_by_their_chunked_digest(ftx_home: Path) -> None:
    path = _build(ArtifactStore(ftx_home))
    meta = json.loads((path / PROVENANCE_FILE).read_text())
    assert meta["schema"] == "ftx.artifact/2"
    record = meta["outputs"]["w.bin"]
    assert record["chunked_sha256"] == spelled_out(CONTENT, CHUNK) and "sha256" not in record


@pytest.mark.parametrize("offset", [0, CHUNK - 1, CHUNK, 2 * CHUNK + 17, len(CONTENT) - 1])
def test_a_byte_flipped_in_any_chunk_is_found(ftx_home: Path, log_events: list, offset: int) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store)
    changed = bytearray(CONTENT)
    changed[offset] ^= 1
    _rewrite_same_times(path / "w.bin", bytes(changed))
    assert store.lookup("convert", KEY) is None
    assert [e["problem"] for e in log_events if e["event"] == "cache.corrupt"] == ["the content of w.bin changed"]


def _as_earlier_schema(meta: dict) -> None:
    """The record an ftx before chunked records wrote: schema 1, the plain sha256 of the file."""
    meta["schema"] = "ftx.artifact/1"
    record = meta["outputs"]["w.bin"]
    del record["chunked_sha256"]
    record["sha256"] = hashlib.sha256(CONTENT).hexdigest()


def test_a_record_of_the_earlier_schema_is_verified_by_its_plain_sha256(ftx_home: Path, log_events: list) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store)
    _edit_record(path, _as_earlier_schema)
    os.utime(path / "w.bin")  # its signature moved: the bytes are read again
    assert store.lookup("convert", KEY) is not None
    assert [e["files"] for e in log_events if e["event"] == "cache.rehashed"] == [1]
    changed = bytearray(CONTENT)
    changed[CHUNK] ^= 1
    _rewrite_same_times(path / "w.bin", bytes(changed))
    assert store.lookup("convert", KEY) is None


EDITS: dict[str, Callable[[dict], object]] = {
    # the old field holding the new definition's value, and the reverse: neither is the digest its field names
    "chunked-value-as-sha256": lambda record: record.update(sha256=record.pop("chunked_sha256")),
    "plain-value-as-chunked": lambda record: record.update(chunked_sha256=hashlib.sha256(CONTENT).hexdigest()),
    "both-fields": lambda record: record.update(sha256=hashlib.sha256(CONTENT).hexdigest()),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_digest_is_never_taken_for_the_other_definition(ftx_home: Path, edit: str) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store)
    _edit_record(path, lambda meta: EDITS[edit](meta["outputs"]["w.bin"]))
    os.utime(path / "w.bin")  # the bytes are intact, but read again against the record
    assert store.lookup("convert", KEY) is None
