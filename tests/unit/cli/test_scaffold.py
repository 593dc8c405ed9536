"""`ftx plugin new`: a plugin project from the template inside the installed ftx, and its refusals."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest


def test_a_new_plugin_names_itself_by_its_slug_and_keeps_the_checkpoints_model_type(ftx_cli: Any,
                                                                                    tmp_path: Path) -> None:
    dest = tmp_path / "ftx-mistral"
    result = ftx_cli("plugin", "new", "mistral", "--dir", str(dest))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(dest)
    project = tomllib.loads((dest / "pyproject.toml").read_text())
    assert project["project"]["name"] == "ftx-triton-mistral"
    assert project["project"]["entry-points"]["ftx"] == {"mistral": "ftx_mistral"}
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["src/ftx_mistral"]
    family = (dest / "src" / "ftx_mistral" / "family.py").read_text()
    assert 'name = "mistral"' in family and 'hf_model_types = ("gpt2",)' in family
    assert (dest / "tests" / "test_mistral_conformance.py").is_file()
    assert not list(dest.rglob("__pycache__")) and not list(tmp_path.glob(".*"))  # no lock or temp left beside it
    assert "model_type 'gpt2'" in result.stderr and "set both to yours" in result.stderr


@pytest.mark.parametrize(("slug", "needle"), [("My-Plugin", "cannot be a plugin slug"), ("9lives", "cannot be"),
                                              ("gptj", "already installed")])
def test_bad_slugs_are_refused_before_anything_is_written(ftx_cli: Any, tmp_path: Path, slug: str,
                                                          needle: str) -> None:
    result = ftx_cli("plugin", "new", slug, "--dir", str(tmp_path / "out"))
    assert result.exit_code == 1 and needle in result.stderr and "hint:" in result.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_directory_is_not_overwritten(ftx_cli: Any, tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    result = ftx_cli("plugin", "new", "mistral", "--dir", str(dest))
    assert result.exit_code == 1 and "not empty" in result.stderr
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
