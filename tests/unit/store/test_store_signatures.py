"""The store's record of each output's identity (``ftx-artifact.json``, ftx's own file): one in an older or damaged
form is re-read and rewritten whole, never taken for unchanged, never a crash."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from ftx_triton.io.identity import FileIdentity
from ftx_triton.store.artifact_store import PROVENANCE_FILE, ArtifactStore

KEY = "k" * 24


def _build(store: ArtifactStore) -> Path:
    def builder(tmp: Path) -> dict:
        (tmp / "w.bin").write_bytes(b"v1" * 1000)
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
