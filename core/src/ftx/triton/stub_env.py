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

Packages of this environment that cannot import under numpy 1 (SciPy 1.14+ requires numpy 2, and
scikit-learn requires SciPy) are hidden from the stubs: transformers imports scikit-learn whenever it
finds it, and a half-importable SciPy would fail the python runtime's model at load.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import numpy as np
from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ftx.errors import ServeError

STUB_PYTHON_ENV = "FTX_STUB_PYTHON"
"""In a server's ``env``: the python3 whose environment the Python-backend stubs run in (default: this one)."""
NUMPY_REQUIREMENT = "numpy<2"
WHEEL_ENV = "FTX_STUB_NUMPY"


def needed() -> bool:
    """Whether this environment's numpy is one the stub cannot exchange tensors with."""
    return int(np.__version__.split(".", 1)[0]) >= 2


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
    from ftx.console import say

    cache.mkdir(parents=True, exist_ok=True)
    say("fetching numpy 1 for the Python-backend stub (built for numpy 1; this environment keeps numpy 2) …")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           NUMPY_REQUIREMENT, "-d", str(cache)], capture_output=True, text=True, check=False)
    found = sorted(cache.glob("numpy-1.*.whl"))
    if done.returncode != 0 or not found:
        raise ServeError(f"could not fetch a numpy 1 wheel for the Python-backend stub: {done.stderr.strip()[-500:]}",
                         hint=f"set {WHEEL_ENV}=/path/to/numpy-1.x.whl (pip download 'numpy<2' --no-deps), "
                              "or use numpy<2 in this environment")
    return found[-1]


def _requirements(dist: metadata.Distribution) -> list[Requirement]:
    """``dist``'s unconditional requirements (extras left out); unparsable ones are skipped."""
    found = []
    for text in dist.requires or []:
        try:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                found.append(req)
        except (InvalidRequirement, UndefinedEnvironmentName, UndefinedComparison):
            continue
    return found


def _top_level_modules(dist: metadata.Distribution) -> set[str]:
    """The importable top-level names ``dist`` installs (top_level.txt, else its file list)."""
    listed = dist.read_text("top_level.txt")
    if listed:
        return {name for name in listed.split() if name.isidentifier()}
    names = set()
    for file in dist.files or []:
        top = file.parts[0]
        name = top.split(".", 1)[0] if len(file.parts) == 1 else top
        if name.isidentifier() and name != "__pycache__":
            names.add(name)
    return names


def numpy1_incompatible_modules(numpy_version: str, dists: Iterable[metadata.Distribution] | None = None
                                ) -> list[str]:
    """Top-level modules of ``dists`` (default: this environment's) that cannot import with numpy
    ``numpy_version``: their distribution requires a numpy it does not satisfy, or requires (directly
    or not) a distribution that does."""
    by_name = {canonicalize_name(d.metadata["Name"] or ""): d
               for d in (metadata.distributions() if dists is None else dists) if d.metadata["Name"]}
    needs = {name: _requirements(d) for name, d in by_name.items()}
    broken = {name for name, reqs in needs.items()
              if any(canonicalize_name(r.name) == "numpy" and not r.specifier.contains(numpy_version, prereleases=True)
                     for r in reqs)}
    grew = True
    while grew:  # whatever needs a broken distribution is broken too
        more = {name for name, reqs in needs.items() if name not in broken
                and any(canonicalize_name(r.name) in broken for r in reqs)}
        broken |= more
        grew = bool(more)
    modules = set().union(*(_top_level_modules(by_name[name]) for name in broken)) if broken else set()
    return sorted(modules - {"numpy"})


def hiding_line(modules: Iterable[str]) -> str:
    """A ``.pth`` line that makes ``modules`` unimportable and invisible to ``importlib.util.find_spec``
    (a ``None`` entry in ``sys.modules``), for every interpreter started in that environment."""
    return f"import sys; sys.modules.update(dict.fromkeys({sorted(modules)!r}))\n"


def _roots() -> list[str]:
    """This process's import roots outside the standard library (site-packages, editable sources)."""
    stdlib = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}
    roots = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.is_dir() and path not in stdlib and not any(path.is_relative_to(s) and "site-packages" not in
                                                             path.parts for s in stdlib):
            roots.append(str(path))
    return list(dict.fromkeys(roots))


def stub_python(home: Path) -> Path | None:
    """The ``python3`` the stubs should run (a numpy-1 side venv under numpy 2), or None for this one."""
    if not needed():
        return None
    from ftx.atomic import publish_dir

    wheel = _numpy1_wheel(home)
    roots = _roots()
    hidden = numpy1_incompatible_modules(wheel.name.split("-")[1])
    digest = hashlib.sha256("\n".join([sys.executable, wheel.name, *roots, *hidden]).encode()).hexdigest()[:12]
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
        if hidden:
            (site / "ftx-numpy2-only-hidden.pth").write_text(hiding_line(hidden))
    return python


def stub_env(home: Path) -> dict[str, str]:
    """``TritonServer(env=...)`` entries that run the stubs in :func:`stub_python`'s environment."""
    python = stub_python(home)
    return {STUB_PYTHON_ENV: str(python)} if python is not None else {}


__all__ = ["STUB_PYTHON_ENV", "hiding_line", "needed", "numpy1_incompatible_modules", "stub_env", "stub_python"]
