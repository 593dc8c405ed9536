"""An honest install: the distributions are not on the package index yet, so the checkout installs itself as
wheels (scripts/install.sh) and a release workflow builds, checks and publishes every one of them from a tag."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from repo_paths import REPO

DISTRIBUTIONS = sorted(p.parent.relative_to(REPO).as_posix() for p in REPO.glob("*/pyproject.toml")) + sorted(
    p.parent.relative_to(REPO).as_posix() for p in REPO.glob("plugins/*/pyproject.toml")
)
"""Every distribution of the repository: core and each family plugin."""


def test_the_release_workflow_builds_every_distribution_from_a_tag() -> None:
    workflow = (REPO / ".github" / "workflows" / "release.yml").read_text()
    assert re.search(r"tags:\s*\[\"v\*\"\]", workflow)
    listed = re.findall(r"for project in ([^;]+);", workflow)
    assert listed and all(sorted(line.split()) == DISTRIBUTIONS for line in listed), (listed, DISTRIBUTIONS)
    assert "twine check --strict" in workflow and "pypa/gh-action-pypi-publish" in workflow
    assert "id-token: write" in workflow  # trusted publishing: no token in the repository


def test_install_script_builds_the_five_wheels(tmp_path: Path) -> None:
    script = (REPO / "scripts" / "install.sh").read_text()
    (listed,) = re.findall(r"^distributions=\(([^)]*)\)", script, flags=re.MULTILINE)
    assert sorted(d.removeprefix("./") for d in listed.split()) == DISTRIBUTIONS
    assert "--no-deps nvidia-pytriton" in script  # the tritonserver, which no extra can bring
    import os
    import sys

    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "install.sh"), "--python", sys.executable, "--wheels-only", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PIP_NO_BUILD_ISOLATION": "0"},  # this venv's hatchling: no download per build
    )
    assert built.returncode == 0, built.stderr[-2000:]
    names = {
        tomllib.loads((REPO / d / "pyproject.toml").read_text())["project"]["name"].replace("-", "_")
        for d in DISTRIBUTIONS
    }
    assert {w.name.split("-")[0] for w in tmp_path.glob("*.whl")} == names
