"""A local checkpoint is keyed by what it holds, not where it lies: the same files copied to two paths are one
artifact (they were two, each converted again)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest


def _ls(ftx_cli) -> list[dict]:
    result = ftx_cli("ls", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_the_same_checkpoint_at_two_paths_is_one_artifact(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    first = shutil.copytree(tiny_gptj_dir, tmp_path / "here" / "model", copy_function=shutil.copy)
    second = shutil.copytree(tiny_gptj_dir, tmp_path / "there" / "copy", copy_function=shutil.copy)  # new mtimes
    one = ftx_cli("run", str(first), "--until", "convert", "--runtime", "python")
    assert one.exit_code == 0, one.stderr
    two = ftx_cli("run", str(second), "--until", "convert", "--runtime", "python")
    assert two.exit_code == 0, two.stderr
    assert one.stdout == two.stdout  # the same converted directory
    assert "convert   cached" in two.stderr
    rows = _ls(ftx_cli)
    assert sorted(r["stage"] for r in rows) == ["convert", "fetch"]
    shutil.rmtree(first)  # the artifact remembered the first path; a run from the copy reads the copy
    again = ftx_cli("run", str(second), "--until", "configure", "--runtime", "python")
    assert again.exit_code == 0, again.stderr
    (second / "config.json").write_text((second / "config.json").read_text().replace("}", ', "ftx_note": 1}', 1))
    changed = ftx_cli("run", str(second), "--until", "fetch", "--runtime", "python")
    assert changed.exit_code == 0, changed.stderr
    assert sum(r["stage"] == "fetch" for r in _ls(ftx_cli)) == 2  # different bytes: a different key


def _write_in_place(path: Path) -> None:
    """Same inode, same size, the old mtime put back (``touch -d``): only ctime tells."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(st.st_size // 2)
        fh.write(b"\xff\xff")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _replace(path: Path) -> None:
    """A new file under the old name (a new inode), as a download or copy over it does."""
    fresh = path.with_name(path.name + ".new")
    shutil.copyfile(path, fresh)
    os.replace(fresh, path)


@pytest.mark.parametrize("change", [_write_in_place, _replace], ids=["written-in-place", "replaced"])
def test_a_source_changed_under_its_conversion_is_refused_and_nothing_kept(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change
) -> None:
    from ftx_triton.engine.default_plugins import convert as default_convert

    source = shutil.copytree(tiny_gptj_dir, tmp_path / "model", copy_function=shutil.copy)
    real = default_convert.convert_directory

    def changed_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = real(*args, **kwargs)
        change(source / "model.safetensors")
        return result

    monkeypatch.setattr(default_convert, "convert_directory", changed_meanwhile)
    refused = ftx_cli("run", str(source), "--until", "convert", "--runtime", "python")
    assert refused.exit_code == 1 and refused.exception is None
    assert "changed while it was converted" in refused.stderr and "hint:" in refused.stderr
    assert [r["stage"] for r in _ls(ftx_cli)] == ["fetch"]  # no conversion stored as done
    monkeypatch.setattr(default_convert, "convert_directory", real)
    again = ftx_cli("run", str(source), "--until", "convert", "--runtime", "python")
    assert again.exit_code == 0, again.stderr
    assert "convert   done" in again.stderr
