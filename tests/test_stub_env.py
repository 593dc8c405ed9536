"""The Python-backend stubs' numpy-1 side environment hides packages that need numpy 2.

Found on a GPU image (numpy 2, SciPy and scikit-learn installed): transformers' generation utilities
import scikit-learn when they find it, scikit-learn imports SciPy, and SciPy built for numpy 2 fails
under the stubs' numpy 1 — so the python runtime's model failed to load. The fake distributions
below stand in for SciPy and scikit-learn (no network, and neither is installed here).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from ftx.triton import stub_env


def _dist(root: Path, name: str, requires: list[str], module_file: str | None = None) -> None:
    """An installed distribution ``name`` under ``root``: its package (or one module file) and dist-info."""
    module = module_file or name
    if module_file is None:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    else:
        (root / module_file).write_text(f"NAME = {name!r}\n")
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    record = f"{module}/__init__.py,,\n" if module_file is None else f"{module},,\n"
    (info / "RECORD").write_text(record + f"{info.name}/METADATA,,\n")


@pytest.fixture()
def fake_site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    _dist(root, "sciplike", ["numpy<2.8,>=2.0.0"])                    # SciPy 1.14+
    _dist(root, "learnlike", ["numpy>=1.22", "sciplike>=1.0"])        # scikit-learn: needs SciPy
    _dist(root, "onefile", ["numpy>=2"], module_file="onefile.py")    # a single-module distribution
    _dist(root, "okpkg", ["numpy>=1.22"])
    _dist(root, "plotextra", ['sciplike; extra == "plots"'])          # needs SciPy only for an extra
    return root


def test_packages_that_need_numpy_2_and_their_dependents_are_found(fake_site: Path) -> None:
    found = stub_env.numpy1_incompatible_modules("1.26.4", metadata.distributions(path=[str(fake_site)]))
    assert found == ["learnlike", "onefile", "sciplike"]
    assert stub_env.numpy1_incompatible_modules("2.1.0", metadata.distributions(path=[str(fake_site)])) == []


def test_the_hiding_line_makes_them_unimportable_and_unfindable(fake_site: Path, tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "ftx-hide.pth").write_text(stub_env.hiding_line(["learnlike", "sciplike"]))
    probe = ("import site, sys, importlib.util; site.addsitedir(sys.argv[1]); "
             "print(importlib.util.find_spec('learnlike')); import okpkg; import sciplike")
    done = subprocess.run([sys.executable, "-c", probe, str(hide)], cwd=fake_site, capture_output=True, text=True)
    assert done.stdout.splitlines() == ["None"], done.stdout + done.stderr
    assert "ModuleNotFoundError: import of sciplike halted" in done.stderr
    unguarded = subprocess.run([sys.executable, "-c", "import sciplike, learnlike"], cwd=fake_site, capture_output=True)
    assert unguarded.returncode == 0  # what the line changes


def test_the_stub_environment_hides_them(fake_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stub_python's venv (built as under numpy 2) cannot import the fakes of SciPy and scikit-learn, and
    still imports the others from this environment."""
    wheel = tmp_path / "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:  # a stand-in for the numpy 1 wheel: its contents are not used here
        zf.writestr("numpy_stand_in.py", "")
    monkeypatch.setenv(stub_env.WHEEL_ENV, str(wheel))
    monkeypatch.setattr(stub_env, "needed", lambda: True)
    monkeypatch.syspath_prepend(str(fake_site))
    python = stub_env.stub_python(tmp_path / "home")
    assert python is not None
    for module, importable in [("sciplike", False), ("learnlike", False), ("onefile", False), ("okpkg", True)]:
        done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True,
                              cwd=tmp_path)
        assert (done.returncode == 0) is importable, (module, done.stderr)
