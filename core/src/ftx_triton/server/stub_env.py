"""A numpy-1 view of this environment for the Python-backend stubs, when this environment has numpy 2.

The ``triton_python_backend_stub`` in the nvidia-pytriton wheel (Triton 2.51) was built against
numpy 1: under numpy 2 its numpy bridge hands models garbage — numeric tensors could go through
DLPack (the python runtime's model can), but BYTES tensors (the ensemble's text) have no other path.
The stub finds its Python environment through the ``python3`` first on ``PATH``, so ftx gives it a
tiny venv of its own (:func:`stub_python`): numpy 1 in its site-packages, then — through a
``.pth`` file — every ``sys.path`` entry of this environment (torch, transformers, ftx and its
plugins as installed). This environment itself keeps numpy 2; nothing is pinned for the user.

numpy 1 comes from ``FTX_STUB_NUMPY`` (a wheel file), a wheel cached under ``<home>/triton/wheels``,
or ``pip download`` from the package index the first time (said on the terminal).

Optional packages of this environment that fail to import under numpy 1 are hidden from the stubs
(:func:`modules_to_hide`): transformers imports scikit-learn whenever it finds it, scikit-learn imports
SciPy, and a SciPy built for numpy 2 fails there, which failed the python runtime's model at load.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterable, Sequence
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import structlog

from ftx_triton.errors import ServeError

log = structlog.get_logger(__name__)

STUB_PYTHON_ENV = "FTX_STUB_PYTHON"
"""In a server's ``env``: the python3 whose environment the Python-backend stubs run in (default: this one)."""
NUMPY_REQUIREMENT = "numpy<2"
WHEEL_ENV = "FTX_STUB_NUMPY"


def needed() -> bool:
    """Whether this environment's numpy is one the stub cannot exchange tensors with: its distribution's version,
    read without importing numpy (0.1 s of CPU that a run's serve stage would take from the models' load)."""
    try:
        version = metadata.version("numpy")
    except metadata.PackageNotFoundError:  # a numpy without its distribution's metadata (a bare folder on a path)
        import numpy as np

        version = np.__version__
    return int(version.split(".", 1)[0]) >= 2


def _numpy1_wheel(home: Path) -> Path:
    explicit = os.environ.get(WHEEL_ENV)
    if explicit:
        if not Path(explicit).is_file():
            raise ServeError(f"{WHEEL_ENV}={explicit} is not a file", hint="point it at a numpy 1.x wheel")
        return Path(explicit)
    cache = Path(home) / "triton" / "wheels"
    found = sorted(cache.glob("numpy-1.*.whl"))
    if found:
        return found[-1]
    from ftx_triton.terminal.console import say

    cache.mkdir(parents=True, exist_ok=True)
    say("fetching numpy 1 for the Python-backend stub (built for numpy 1; this environment keeps numpy 2) …")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            NUMPY_REQUIREMENT,
            "-d",
            str(cache),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    found = sorted(cache.glob("numpy-1.*.whl"))
    if done.returncode != 0 or not found:
        raise ServeError(
            f"could not fetch a numpy 1 wheel for the Python-backend stub: {done.stderr.strip()[-500:]}",
            hint=f"set {WHEEL_ENV}=/path/to/numpy-1.x.whl (pip download 'numpy<2' --no-deps), "
            "or use numpy<2 in this environment",
        )
    return found[-1]


PROBE_MODULES = ("transformers.modeling_utils", "transformers.generation.utils")
"""What the python runtime's model imports; transformers' optional imports (SciPy for its losses,
scikit-learn for assisted generation) happen there."""

_PROBE = """
import json, sys, traceback
try:
    for name in sys.argv[1:]:
        __import__(name)
except Exception as exc:
    root = exc
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    paths = sorted((p.rstrip("/") + "/" for p in sys.path if p), key=len, reverse=True)
    tops = []
    for frame in traceback.extract_tb(root.__traceback__):
        base = next((p for p in paths if frame.filename.startswith(p)), None)
        if base is not None:
            tops.append(frame.filename[len(base):].split("/", 1)[0].removesuffix(".py"))
    print(json.dumps({"error": repr(root)[:300], "modules": list(dict.fromkeys(tops))}))
else:
    print(json.dumps({"error": None, "modules": []}))
"""


def modules_to_hide(python: Path, site: Path, probes: Sequence[str] = PROBE_MODULES, attempts: int = 8) -> list[str]:
    """Import ``probes`` with ``python``; while that fails inside an optional package they pulled in (the
    first top-level package in the failing traceback other than the probes' own and numpy), hide that
    package through ``site`` and try again. Returns what it hid (written to ``site`` already).

    Probing, not package metadata: SciPy 1.17 declares ``numpy>=1.26.4`` yet fails under numpy 1.
    """
    own = {probe.split(".", 1)[0] for probe in probes}
    hidden: list[str] = []
    for _ in range(attempts):
        done = subprocess.run([str(python), "-c", _PROBE, *probes], capture_output=True, text=True, check=False)
        try:
            found = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return hidden  # the probe itself could not run: leave the environment as it is
        culprit = next((m for m in found["modules"] if m not in {*own, "numpy", *hidden} and m.isidentifier()), None)
        if found["error"] is None or culprit is None:
            return hidden
        hidden.append(culprit)
        log.info(
            "stub_env.hidden",
            module=culprit,
            failure=found["error"],
            reason="it fails to import under the stubs' numpy 1; transformers imports it only when found",
        )
        (site / HIDING_PTH).write_text(hiding_line(hidden))
    return hidden


HIDING_PTH = "ftx-hidden-under-numpy1.pth"


_HIDER = """
import sys
from importlib.machinery import PathFinder

class FtxHiddenUnderNumpy1(PathFinder):
    hidden = frozenset(%r)

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in cls.hidden:
            return None
        return PathFinder.find_spec(fullname, path, target)

sys.meta_path[:] = [FtxHiddenUnderNumpy1 if f is PathFinder else f for f in sys.meta_path]
"""


def hiding_line(modules: Iterable[str]) -> str:
    """A ``.pth`` line after which ``modules`` (and their submodules) look not installed: imports raise
    ModuleNotFoundError and ``importlib.util.find_spec`` returns None. The path finder is filtered
    rather than ``sys.modules`` set to None, which breaks ``find_spec`` of a hidden package's submodules."""
    return f"import sys; exec({_HIDER % (sorted(modules),)!r}, {{}})\n"


def _roots() -> list[str]:
    """This process's import roots outside the standard library (site-packages, editable sources)."""
    stdlib = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}
    roots = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if (
            path.is_dir()
            and path not in stdlib
            and not any(path.is_relative_to(s) and "site-packages" not in path.parts for s in stdlib)
        ):
            roots.append(str(path))
    return list(dict.fromkeys(roots))


def stub_python(home: Path) -> Path | None:
    """The ``python3`` the stubs should run (a numpy-1 side venv under numpy 2), or None for this one."""
    if not needed():
        return None
    from ftx_triton.io.atomic import publish_dir

    wheel = _numpy1_wheel(home)
    roots = _roots()
    layout = [sys.executable, wheel.name, HIDING_PTH, *roots]  # HIDING_PTH: envs made before the probe are redone
    digest = hashlib.sha256("\n".join(layout).encode()).hexdigest()[:12]
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    target = Path(home) / "triton" / f"stub-env-{pyver}-{digest}"
    python = target / "bin" / "python3"
    if python.exists():
        return python
    with publish_dir(target, replace=True) as tmp:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
        site = tmp / "lib" / f"python{pyver}" / "site-packages"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
        (site / "ftx-main-environment.pth").write_text("\n".join(roots) + "\n")
        if all(find_spec(probe.split(".", 1)[0]) is not None for probe in PROBE_MODULES):
            modules_to_hide(tmp / "bin" / "python3", site, probes=PROBE_MODULES)
    return python


def stub_env(home: Path) -> dict[str, str]:
    """``TritonServer(env=...)`` entries that run the stubs in :func:`stub_python`'s environment."""
    python = stub_python(home)
    return {STUB_PYTHON_ENV: str(python)} if python is not None else {}


__all__ = ["STUB_PYTHON_ENV", "hiding_line", "modules_to_hide", "needed", "stub_env", "stub_python"]
