"""Pinning: ftx.toml requirements checked before any stage, `ftx lock`, FTX_LOAD_PLUGINS, and cache
keys that follow the family table's fingerprint rather than version strings."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest


@pytest.fixture
def in_tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_unmet_requirements_stop_before_any_stage(ftx_cli, ftx_home: Path, in_tmp_cwd: Path,
                                                  tiny_gptj_dir: Path) -> None:
    (in_tmp_cwd / "ftx.toml").write_text('requires = ["ftx>=0.1,<1", "ftx-kogpt==9.9.9", "ftx-llama>=1"]\n')
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert result.exit_code == 1
    assert "ftx-kogpt==9.9.9 (ftx-kogpt 0.1.0 is installed)" in result.stderr
    assert "ftx-llama>=1 (not installed)" in result.stderr
    assert "ftx>=0.1" not in result.stderr.split("requires", 1)[1].split("hint")[0]
    assert not (ftx_home / "store" / "fetch").exists()


def test_met_requirements_let_the_run_go(ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path) -> None:
    (in_tmp_cwd / "ftx.toml").write_text('requires = ["ftx>=0.1,<1", "ftx-gptj==0.1.0"]\n')
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert result.exit_code == 0, result.stderr


def test_lock_pins_versions_and_source_then_run_uses_it(ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path) -> None:
    locked = ftx_cli("lock", str(tiny_gptj_dir))
    assert locked.exit_code == 0, locked.stderr
    data = tomllib.loads((in_tmp_cwd / "ftx.toml").read_text())
    assert {"ftx==0.1.0", "ftx-gptj==0.1.0", "ftx-t5==0.1.0", "ftx-gptneox==0.1.0", "ftx-kogpt==0.1.0"} <= set(
        data["requires"])
    assert data["model"]["source"] == str(tiny_gptj_dir)
    result = ftx_cli("run", "--until", "convert")  # MODEL comes from ftx.toml
    assert result.exit_code == 0, result.stderr
    assert Path(result.stdout.strip(), "config.ini").is_file()


def test_load_plugins_allowlist(ftx_cli) -> None:
    result = ftx_cli("plugins", "--json", env={"FTX_LOAD_PLUGINS": "ftx-gptj"})
    status = {r["name"]: r["status"] for r in json.loads(result.stdout)}
    assert status["gptj"] == "loaded"
    assert status["t5"] == status["gptneox"] == status["kogpt"] == "skipped"


def test_provenance_keys_follow_the_table_fingerprint(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ftx import ops
    from ftx.tensormap import M, TensorMap
    from ftx_gptj.family import GPTJ

    first = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert first.exit_code == 0, first.stderr
    same = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert same.stdout == first.stdout  # unchanged table: the conversion is reused
    rows = [M(r.src, r.dst, r.op, r.split, r.shape, r.optional, r.invert) for r in GPTJ.tensors.rows]
    rows[-1] = M("lm_head.bias", "model.lm_head.bias", ops.identity, None, ("V",), optional=True)
    monkeypatch.setattr(GPTJ, "tensors", TensorMap(*rows))  # a plugin upgrade that changes a mapping
    changed = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert changed.exit_code == 0 and changed.stdout != first.stdout
    assert len(list((ftx_home / "store" / "convert").iterdir())) == 2
