"""A local checkpoint is keyed by what it holds, not where it lies: the same files copied to two paths are one
artifact (they were two, each converted again)."""

from __future__ import annotations

import json
import os
import shutil
import time
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


@pytest.mark.parametrize("before", [False, True], ids=["after-reading", "before-reading"])
@pytest.mark.parametrize("change", [_write_in_place, _replace], ids=["written-in-place", "replaced"])
def test_a_source_changed_under_its_conversion_is_refused_and_nothing_kept(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change, before: bool
) -> None:
    """A first run hashes the source beside its conversion: a file changed before the converter reads it (the
    digest may be of the old bytes, the conversion of the new) or after is refused, and nothing is published,
    neither the conversion nor the fetch whose key it would have claimed."""
    from ftx_triton.conversion import convert as conversion

    source = shutil.copytree(tiny_gptj_dir, tmp_path / "model", copy_function=shutil.copy)
    real = conversion.convert_directory

    def changed_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        if before:
            change(source / "model.safetensors")
        result = real(*args, **kwargs)
        if not before:
            change(source / "model.safetensors")
        return result

    monkeypatch.setattr(conversion, "convert_directory", changed_meanwhile)  # imported when a conversion runs
    refused = ftx_cli("run", str(source), "--until", "convert", "--runtime", "python")
    assert refused.exit_code == 1 and refused.exception is None
    assert "changed while it was" in refused.stderr and "hint:" in refused.stderr
    assert _ls(ftx_cli) == []  # nothing stored as done
    assert not list((ftx_home / "store" / ".tmp").iterdir())  # the build in progress is removed
    monkeypatch.setattr(conversion, "convert_directory", real)
    again = ftx_cli("run", str(source), "--until", "convert", "--runtime", "python")
    assert again.exit_code == 0, again.stderr
    assert "convert   done" in again.stderr


def test_a_remembered_source_changed_under_its_conversion_keeps_only_its_fetch(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digest is remembered (no byte read to key the source): a change during the conversion is refused too."""
    from ftx_triton.conversion import convert as conversion
    from ftx_triton.fetching import local_keys

    source = shutil.copytree(tiny_gptj_dir, tmp_path / "model", copy_function=shutil.copy)
    now = local_keys._now_ns
    monkeypatch.setattr(local_keys, "_now_ns", lambda: now() + 10_000_000_000)  # the files are old by then
    fetched = ftx_cli("run", str(source), "--until", "fetch", "--runtime", "python")
    assert fetched.exit_code == 0, fetched.stderr
    real = conversion.convert_directory

    def changed_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = real(*args, **kwargs)
        _write_in_place(source / "model.safetensors")
        return result

    monkeypatch.setattr(conversion, "convert_directory", changed_meanwhile)
    refused = ftx_cli("run", str(source), "--until", "convert", "--runtime", "python")
    assert refused.exit_code == 1 and "changed while it was converted" in refused.stderr
    assert [r["stage"] for r in _ls(ftx_cli)] == ["fetch"]  # no conversion stored as done


def test_a_copy_whose_conversion_is_stored_stops_converting_once_its_key_is_known(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first run at a new path converts while it hashes; the digest shows the same files converted from
    another path, so the conversion in progress stops and the stored one is used (nothing converted twice)."""
    from ftx_triton.conversion import convert as conversion
    from ftx_triton.conversion.stopping import check_stopped

    first = shutil.copytree(tiny_gptj_dir, tmp_path / "here" / "model", copy_function=shutil.copy)
    second = shutil.copytree(tiny_gptj_dir, tmp_path / "there" / "copy", copy_function=shutil.copy)
    one = ftx_cli("run", str(first), "--until", "convert", "--runtime", "python")
    assert one.exit_code == 0, one.stderr
    real, stopped = conversion.convert_directory, []

    def until_stopped(*args, **kwargs):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 30  # a conversion longer than the digest: it waits to be stopped
        while time.monotonic() < deadline:
            try:
                check_stopped()
            except BaseException:
                stopped.append(True)
                raise
            time.sleep(0.01)
        return real(*args, **kwargs)

    monkeypatch.setattr(conversion, "convert_directory", until_stopped)
    two = ftx_cli("run", str(second), "--until", "convert", "--runtime", "python")
    assert two.exit_code == 0, two.stderr
    assert stopped and "convert   cached" in two.stderr and two.stdout == one.stdout
    assert sorted(r["stage"] for r in _ls(ftx_cli)) == ["convert", "fetch"]
    assert not list((ftx_home / "store" / ".tmp").iterdir())  # the stopped conversion's files are gone
