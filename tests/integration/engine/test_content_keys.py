"""A local checkpoint is keyed by what it holds, not where it lies: the same files copied to two paths are one
artifact (they were two, each converted again)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


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
