"""One identity of a file (device, inode, size, mtime, ctime) in its three forms: the local-source keys' text, the
store's record, the written digests' comparison; a record in an older or damaged form is never taken for a match."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ftx_triton.io.identity import FileIdentity
from ftx_triton.io.source_tree import tree_files


def test_the_text_form_is_the_one_remembered_keys_were_made_with(tmp_path: Path) -> None:
    """The text the local-source memos hash (``FTX_HOME/local-keys``) is what earlier versions hashed: a source keyed
    by them is still found without reading a byte."""
    (tmp_path / "w.bin").write_bytes(b"x" * 10)
    st = os.stat(tmp_path / "w.bin")
    (file,) = tree_files(tmp_path)
    assert file.identity == FileIdentity.of(st)
    assert file.identity.token() == f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def test_the_record_form_reads_back_as_the_same_identity(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"x")
    identity = FileIdentity.of(os.lstat(tmp_path / "w.bin"))
    record = {"sha256": "0" * 64, **identity.as_record()}
    assert set(identity.as_record()) == {"size", "mtime_ns", "ctime_ns", "inode", "device"}
    assert FileIdentity.from_record(record) == identity


@pytest.mark.parametrize(
    "change",
    [
        {"ctime_ns": None},  # a field missing (an older form)
        {"inode": "123"},
        {"size": 1.0},
        {"device": True},  # a bool is an int to Python, never an identity
    ],
)
def test_a_record_in_another_form_is_no_identity(tmp_path: Path, change: dict) -> None:
    (tmp_path / "w.bin").write_bytes(b"x")
    identity = FileIdentity.of(os.lstat(tmp_path / "w.bin"))
    record = {k: v for k, v in {**identity.as_record(), **change}.items() if v is not None}
    assert FileIdentity.from_record(record) is None
    assert FileIdentity.from_record(record) != identity
