"""`ftx plugin new`: a plugin project from the template inside the installed ftx, and its refusals."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REPO


def test_a_new_plugin_names_itself_by_its_slug_and_keeps_the_checkpoints_model_type(
    ftx_cli: Any, tmp_path: Path
) -> None:
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
    assert "class Mistral(Family):" in family and 'hf_model_class = "GPT2LMHeadModel"' in family
    assert "GPT2(" not in family and "type[Mistral]" in (dest / "src" / "ftx_mistral" / "__init__.py").read_text()
    assert "class TestMistral(FamilyConformance):" in (dest / "tests" / "test_mistral_conformance.py").read_text()
    tox = (dest / "tox.ini").read_text()  # CI: lint, then the kit over the supported ftx-triton versions
    assert "ruff check" in tox and "ftx-triton[kit]==0.1.*" in tox and "download.pytorch.org/whl/cpu" in tox
    assert "tox" in (dest / ".github" / "workflows" / "ci.yml").read_text()
    assert (dest / "tests" / "test_mistral_conformance.py").is_file()
    assert not list(dest.rglob("__pycache__")) and not list(tmp_path.glob(".*"))  # no lock or temp left beside it
    assert "model_type 'gpt2'" in result.stderr and "set both to yours" in result.stderr


@pytest.mark.parametrize(
    ("slug", "needle"),
    [("My-Plugin", "cannot be a plugin slug"), ("9lives", "cannot be"), ("gptj", "already installed")],
)
def test_bad_slugs_are_refused_before_anything_is_written(ftx_cli: Any, tmp_path: Path, slug: str, needle: str) -> None:
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


def test_siblings_named_like_ftxs_leftovers_are_the_users_and_kept(ftx_cli: Any, tmp_path: Path) -> None:
    """Folders beside --dir named like ftx's temporary and moved-aside ones, but not made by ftx (no marker),
    are neither removed nor renamed into place; a leftover ftx did make is cleaned up."""
    from ftx_triton.io.atomic import new_holder

    dest = tmp_path / "D"
    mine = [tmp_path / ".D.old-1", tmp_path / ".D.tmp-2", tmp_path / ".D.old-zz"]
    for folder in mine:
        folder.mkdir()
        (folder / "keep.txt").write_text("mine")
    left = new_holder(dest, "tmp")  # what a killed `ftx plugin new` leaves
    result = ftx_cli("plugin", "new", "mistral", "--dir", str(dest))
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    assert [(f / "keep.txt").read_text() for f in mine] == ["mine"] * 3
    assert not left.exists() and (dest / "pyproject.toml").is_file()


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        ("under-a-file", "exists and is not a directory"),
        ("in-proc", "cannot create --dir"),
        ("long-name", "File name too long"),
    ],
)
def test_unusable_dirs_are_refused_cleanly(ftx_cli: Any, tmp_path: Path, where: str, needle: str) -> None:
    from cli_helpers import assert_clean_failure

    room = tmp_path / "room"
    room.mkdir()
    (room / "afile").write_text("x")
    dest = {
        "under-a-file": room / "afile" / "sub",
        "in-proc": Path("/proc/ftx-plugin"),
        "long-name": room / ("a" * 300),
    }[where]
    assert_clean_failure(ftx_cli("plugin", "new", "mistral", "--dir", str(dest)), needle, "--dir")
    assert sorted(p.name for p in room.iterdir()) == ["afile"]


def test_a_link_to_an_empty_folder_is_written_where_it_points(ftx_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    result = ftx_cli("plugin", "new", "mistral", "--dir", str(tmp_path / "link"))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "empty")
    assert (tmp_path / "empty" / "pyproject.toml").is_file() and (tmp_path / "link").is_symlink()


KIT_MODULES = ("testing", "oracle")
"""Packages of core that run in a plugin author's test session (the conformance kit and its FT reference)."""


def _core_project() -> dict[str, Any]:
    return tomllib.loads((REPO / "core" / "pyproject.toml").read_text())["project"]


def test_the_next_step_installs_the_test_extra(ftx_cli: Any, tmp_path: Path) -> None:
    """A plain install has no pytest: the printed command installs the plugin with its test extra."""
    dest = tmp_path / "ftx-mistral"
    result = ftx_cli("plugin", "new", "mistral", "--dir", str(dest))
    assert result.exit_code == 0, result.stderr
    assert (
        "next      pip install torch --index-url https://download.pytorch.org/whl/cpu && "
        f"pip install -e '{dest}[test]' && pytest {dest / 'tests'}" in result.stderr
    )


def test_the_plugins_test_extra_pulls_cores_kit_extra(ftx_cli: Any, tmp_path: Path) -> None:
    from packaging.requirements import Requirement

    dest = tmp_path / "ftx-mistral"
    assert ftx_cli("plugin", "new", "mistral", "--dir", str(dest)).exit_code == 0
    project = tomllib.loads((dest / "pyproject.toml").read_text())["project"]
    (core,) = [Requirement(r) for r in project["dependencies"]]
    (test,) = [Requirement(r) for r in project["optional-dependencies"]["test"]]
    assert test.name == core.name == _core_project()["name"]
    assert test.extras == {"kit"} and test.specifier == core.specifier
    assert "kit" in _core_project()["optional-dependencies"]


def test_the_kit_extra_covers_every_import_of_the_kit() -> None:
    """Every third-party module the kit's packages import (lazily or not) comes from core's dependencies or
    its kit extra, so `pip install 'PLUGIN[test]'` is all a plugin author needs before `pytest`."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = _core_project()
    provided = {
        canonicalize_name(Requirement(r).name)
        for r in [*project["dependencies"], *project["optional-dependencies"]["kit"]]
    }
    owners = packages_distributions()
    needed: dict[str, set[str]] = {}
    for package in KIT_MODULES:
        for source in sorted((REPO / "core" / "src" / "ftx_triton" / package).glob("*.py")):
            for node in ast.walk(ast.parse(source.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module and not node.level
                    else []
                )
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in ("ftx_triton", "__future__"):
                        continue
                    needed.setdefault(top, set()).add(source.name)
    assert {"pytest", "torch", "transformers"} <= set(needed)
    missing = {
        top: sorted(files)
        for top, files in needed.items()
        if not {canonicalize_name(d) for d in owners.get(top, [top])} & provided
    }
    assert not missing, f"imported by the kit but in neither core's dependencies nor its kit extra: {missing}"
