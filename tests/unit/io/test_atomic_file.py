"""The one atomic file write: a reader finds the old file or the new one, never half; a failed write leaves no
temp file and the old file as it was; permissions as asked; a link at the target is replaced, never followed."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from ftx_triton.io.atomic_file import write_atomic, write_json_atomic


def _umasked(mode: int) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def test_a_record_is_replaced_whole_and_no_temp_file_is_left(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"b": [1, 2]}, indent=2, sort_keys=True)
    assert json.loads(path.read_text()) == {"b": [1, 2]}
    assert path.read_text() == json.dumps({"b": [1, 2]}, indent=2, sort_keys=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert stat.S_IMODE(path.stat().st_mode) == _umasked(0o666)  # as open() makes a file


def test_a_private_record_is_its_owners_only(tmp_path: Path) -> None:
    write_atomic(tmp_path / "job.json", "{}", mode=0o600)
    assert stat.S_IMODE((tmp_path / "job.json").stat().st_mode) == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()  # the rename onto a directory fails after the temp file was written
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "taken", "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    path = tmp_path / "r.json"
    path.write_text('{"old": true}')
    with pytest.raises(TypeError):
        write_json_atomic(path, {"not json": object()})
    assert path.read_text() == '{"old": true}' and sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "taken"]


def test_a_given_temp_file_is_used_and_one_it_did_not_make_is_left_alone(tmp_path: Path) -> None:
    side = tmp_path / "side"
    side.mkdir()
    write_atomic(tmp_path / "r.json", "1", tmp=side / "t")
    assert (tmp_path / "r.json").read_text() == "1" and list(side.iterdir()) == []
    (side / "t").write_text("someone else's")
    with pytest.raises(FileExistsError):
        write_atomic(tmp_path / "r.json", "2", tmp=side / "t")
    assert (side / "t").read_text() == "someone else's" and (tmp_path / "r.json").read_text() == "1"


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "r.json").symlink_to(victim)
    write_atomic(tmp_path / "r.json", "new")
    assert victim.read_text() == "keep"
    assert not (tmp_path / "r.json").is_symlink() and (tmp_path / "r.json").read_text() == "new"


def test_concurrent_writers_never_show_a_reader_half_a_record(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, {"n": -1, "pad": ""})
    stop = threading.Event()
    damaged: list[str] = []

    def read() -> None:
        while not stop.is_set():
            text = path.read_text()
            try:
                json.loads(text)
            except ValueError:
                damaged.append(text[:80])

    def write(n: int) -> None:
        for i in range(100):
            write_json_atomic(path, {"n": n * 1000 + i, "pad": "x" * 65536})  # larger than one write's chunk

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert damaged == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
