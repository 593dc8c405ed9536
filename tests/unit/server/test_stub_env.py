"""The Python-backend stubs' numpy-1 side environment hides optional packages that fail there.

Found on a GPU image (numpy 2, SciPy and scikit-learn installed): transformers' generation utilities
import scikit-learn when they find it, scikit-learn imports SciPy, and SciPy built for numpy 2 fails
under the stubs' numpy 1 (``module 'numpy' has no attribute 'long'``), so the python runtime's model
failed to load. The fake packages below stand in for transformers, scikit-learn and SciPy (neither
is installed here, and the stubs' numpy 1 environment is only built under numpy 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ftx_triton.server import stub_env

FAKES = {
    # transformers: imports its optional scikit-learn when it finds it
    "fakeformers/__init__.py": "",
    "fakeformers/generation.py": "import importlib.util\nif importlib.util.find_spec('learnlike'):\n"
    "    import learnlike\nREADY = True\n",
    # transformers' losses: import SciPy when they find it
    "fakeformers/losses.py": "import importlib.util\nif importlib.util.find_spec('sciplike'):\n    import sciplike\n",
    # scikit-learn: needs SciPy
    "learnlike/__init__.py": "import sciplike\n",
    # SciPy built for numpy 2: fails under numpy 1
    "sciplike/__init__.py": "raise AttributeError(\"module 'numpy' has no attribute 'long'\")\n",
}


@pytest.fixture()
def fake_site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for name, text in FAKES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _venv(tmp_path: Path, fake_site: Path) -> tuple[Path, Path]:
    """A bare venv that sees ``fake_site`` through a .pth file, as the stubs' environment sees this one."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python3"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "fake-main-environment.pth").write_text(f"{fake_site}\n")
    return python, site


def _imports(python: Path, module: str) -> bool:
    return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, cwd="/").returncode == 0


def test_the_probe_hides_the_optional_package_that_fails(tmp_path: Path, fake_site: Path) -> None:
    python, site = _venv(tmp_path, fake_site)
    assert not _imports(python, "fakeformers.generation")  # the failure the probe is for
    assert stub_env.modules_to_hide(python, site, probes=["fakeformers.generation"]) == ["learnlike"]
    assert _imports(python, "fakeformers.generation")
    assert not _imports(python, "learnlike")


def test_nothing_is_hidden_when_the_probe_imports(tmp_path: Path, fake_site: Path) -> None:
    (fake_site / "sciplike" / "__init__.py").write_text("")
    python, site = _venv(tmp_path, fake_site)
    assert stub_env.modules_to_hide(python, site, probes=["fakeformers.generation"]) == []
    assert not (site / stub_env.HIDING_PTH).exists() and _imports(python, "learnlike")


def test_a_failure_in_the_probed_package_itself_hides_nothing(tmp_path: Path, fake_site: Path) -> None:
    """Hiding is for optional packages; a broken transformers stays broken, and says so at load."""
    (fake_site / "fakeformers" / "generation.py").write_text("import sciplike\n")
    (fake_site / "sciplike" / "__init__.py").write_text("")
    (fake_site / "fakeformers" / "__init__.py").write_text("raise ImportError('broken install')\n")
    python, site = _venv(tmp_path, fake_site)
    assert stub_env.modules_to_hide(python, site, probes=["fakeformers.generation"]) == []


def test_the_hiding_line_makes_modules_unimportable_and_unfindable(tmp_path: Path, fake_site: Path) -> None:
    python, site = _venv(tmp_path, fake_site)
    (fake_site / "sciplike" / "__init__.py").write_text("")
    (site / "ftx-hide.pth").write_text(stub_env.hiding_line(["learnlike"]))
    probe = (
        "import importlib.util as u; print(u.find_spec('learnlike'))\n"
        "try:\n    u.find_spec('learnlike.sub')\nexcept ModuleNotFoundError as e:\n    print(e)\n"
        "import sciplike; import learnlike"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd="/")
    # as if not installed: find_spec None (of a submodule: ModuleNotFoundError), the import fails
    assert done.stdout.splitlines() == ["None", "No module named 'learnlike'"], done.stdout + done.stderr
    assert "ModuleNotFoundError: No module named 'learnlike'" in done.stderr
    assert "sciplike" not in done.stderr  # only the named ones are hidden


def test_the_stub_environment_is_probed_when_built(
    tmp_path: Path, fake_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stub_python (as under numpy 2) builds its venv, probes it, and the stubs can import what
    the model imports."""
    wheel = tmp_path / "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:  # stands in for the numpy 1 wheel: its contents are not used here
        zf.writestr("numpy_stand_in.py", "")
    monkeypatch.setenv(stub_env.WHEEL_ENV, str(wheel))
    monkeypatch.setattr(stub_env, "needed", lambda: True)
    monkeypatch.setattr(stub_env, "PROBE_MODULES", ("fakeformers.losses", "fakeformers.generation"))
    monkeypatch.syspath_prepend(str(fake_site))
    python = stub_env.stub_python(tmp_path / "home")
    assert python is not None
    for module in ("fakeformers.losses", "fakeformers.generation"):
        assert _imports(python, module), module
    assert not _imports(python, "learnlike") and not _imports(python, "sciplike")


def test_whether_the_stubs_need_numpy_1_is_decided_without_importing_numpy() -> None:
    """A run's serve stage asks it beside the models' load: numpy's version comes from its distribution (importing
    numpy took 0.1 CPU-s there), and it is the version numpy itself says."""
    code = (
        "import json, sys\n"
        "from ftx_triton.server import stub_env\n"
        "needed = stub_env.needed()\n"
        "imported = 'numpy' in sys.modules\n"
        "import numpy\n"
        "print(json.dumps([needed, imported, int(numpy.__version__.split('.')[0]) >= 2]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    needed, imported, by_numpy = json.loads(done.stdout)
    assert not imported and needed == by_numpy


def test_a_numpy_without_distribution_metadata_is_asked_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """A numpy found on a path without its distribution's metadata still decides: numpy's own version."""
    import numpy

    def unknown(name: str) -> str:
        raise stub_env.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(stub_env.metadata, "version", unknown)
    assert stub_env.needed() == (int(numpy.__version__.split(".")[0]) >= 2)
