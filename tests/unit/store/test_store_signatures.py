"""The store's record of each output (``ftx-artifact.json``, ftx's own file). Its identity: one in an older or
damaged form is re-read and rewritten whole, never taken for unchanged, never a crash. Its digest: the chunked digest
(``ftx.artifact/2``), verified by that definition (a byte changed in any chunk is found); a record of
``ftx.artifact/1`` (a plain sha256) is still verified by its own, and a digest is only ever compared with the
definition its field names."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from chunked_digest import spelled_out
from ftx_triton.io import hashing
from ftx_triton.io.identity import FileIdentity
from ftx_triton.store.artifact_store import PROVENANCE_FILE, ArtifactStore

KEY = "k" * 24


def _build(store: ArtifactStore, content: bytes = b"v1" * 1000) -> Path:
    def builder(tmp: Path) -> dict:
        (tmp / "w.bin").write_bytes(content)  # not a writer of ftx's: hashed from disk by the store
        return {}

    artifact, cached = store.build("convert", KEY, builder, inputs={}, producer={})
    assert not cached
    return artifact.path


def _rewrite_record(path: Path, edit: Callable[[dict], object]) -> None:
    meta = json.loads((path / PROVENANCE_FILE).read_text())
    edit(meta["outputs"]["w.bin"])
    (path / PROVENANCE_FILE).write_text(json.dumps(meta))


FORMS: dict[str, Callable[[dict], object]] = {
    "without-inode-device-ctime": lambda info: [info.pop(k) for k in ("inode", "device", "ctime_ns")],
    "mtime-a-string": lambda info: info.update(mtime_ns=str(info["mtime_ns"])),
    "inode-a-bool": lambda info: info.update(inode=True),
    "times-as-floats": lambda info: info.update(mtime_ns=float(info["mtime_ns"]), ctime_ns=float(info["ctime_ns"])),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_signature_in_another_form_is_read_again_and_rewritten(ftx_home: Path, log_events: list, form: str) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store)
    _rewrite_record(path, FORMS[form])
    assert store.lookup("convert", KEY) is not None  # the bytes are intact: a hit, after reading them
    assert [e["files"] for e in log_events if e["event"] == "cache.rehashed"] == [1]
    recorded = json.loads((path / PROVENANCE_FILE).read_text())["outputs"]["w.bin"]
    assert FileIdentity.from_record(recorded) == FileIdentity.of(os.lstat(path / "w.bin"))
    assert store.lookup("convert", KEY) is not None  # rewritten whole: not read a second time
    assert len([e for e in log_events if e["event"] == "cache.rehashed"]) == 1


def test_a_signature_in_an_older_form_does_not_hide_a_changed_file(ftx_home: Path) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store)
    _rewrite_record(path, FORMS["without-inode-device-ctime"])
    st = os.stat(path / "w.bin")
    (path / "w.bin").write_bytes(b"v2" * 1000)  # same size, the old mtime put back
    os.utime(path / "w.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store.lookup("convert", KEY) is None


CHUNK = 1000
CONTENT = bytes((i * 7) % 251 for i in range(4321))
"""Five chunks of :data:`CHUNK` bytes, the last one short."""


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "CHUNKED_BYTES", CHUNK)
    monkeypatch.setattr(hashing, "_PIECE", 300)


def _rewrite_same_times(path: Path, content: bytes) -> None:
    """Write ``content`` into ``path`` in place with its size and mtime put back (only its ctime moves)."""
    st = os.stat(path)
    path.write_bytes(content)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _flipped(offset: int) -> bytes:
    changed = bytearray(CONTENT)
    changed[offset] ^= 1
    return bytes(changed)


@pytest.mark.usefixtures("small_chunks")
def test_outputs_are_recorded_by_their_chunked_digest(ftx_home: Path) -> None:
    path = _build(ArtifactStore(ftx_home), CONTENT)
    meta = json.loads((path / PROVENANCE_FILE).read_text())
    assert meta["schema"] == "ftx.artifact/2"
    record = meta["outputs"]["w.bin"]
    assert record["chunked_sha256"] == spelled_out(CONTENT, CHUNK) and "sha256" not in record


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("offset", [0, CHUNK - 1, CHUNK, 2 * CHUNK + 17, len(CONTENT) - 1])
def test_a_byte_flipped_in_any_chunk_is_found(ftx_home: Path, log_events: list, offset: int) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store, CONTENT)
    _rewrite_same_times(path / "w.bin", _flipped(offset))
    assert store.lookup("convert", KEY) is None
    assert [e["problem"] for e in log_events if e["event"] == "cache.corrupt"] == ["the content of w.bin changed"]


def _as_earlier_schema(record: dict) -> None:
    """The record an ftx before chunked records wrote (``ftx.artifact/1``): the plain sha256 of the file."""
    del record["chunked_sha256"]
    record["sha256"] = hashlib.sha256(CONTENT).hexdigest()


@pytest.mark.usefixtures("small_chunks")
def test_a_record_of_the_earlier_schema_is_verified_by_its_plain_sha256(ftx_home: Path, log_events: list) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store, CONTENT)
    _rewrite_record(path, _as_earlier_schema)
    os.utime(path / "w.bin")  # its signature moved: the bytes are read again
    assert store.lookup("convert", KEY) is not None
    assert [e["files"] for e in log_events if e["event"] == "cache.rehashed"] == [1]
    _rewrite_same_times(path / "w.bin", _flipped(CHUNK))
    assert store.lookup("convert", KEY) is None


WRONG_FIELD: dict[str, Callable[[dict], object]] = {
    # the old field holding the new definition's value, and the reverse: neither is the digest its field names
    "chunked-value-as-sha256": lambda record: record.update(sha256=record.pop("chunked_sha256")),
    "plain-value-as-chunked": lambda record: record.update(chunked_sha256=hashlib.sha256(CONTENT).hexdigest()),
    "both-fields": lambda record: record.update(sha256=hashlib.sha256(CONTENT).hexdigest()),
}


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("edit", sorted(WRONG_FIELD))
def test_a_digest_is_never_taken_for_the_other_definition(ftx_home: Path, edit: str) -> None:
    store = ArtifactStore(ftx_home)
    path = _build(store, CONTENT)
    _rewrite_record(path, WRONG_FIELD[edit])
    os.utime(path / "w.bin")  # the bytes are intact, but read again against the record
    assert store.lookup("convert", KEY) is None
