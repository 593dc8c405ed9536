"""The tritonserver binary and its backends: found in the nvidia-pytriton wheel (or a directory),
prepared for this interpreter, and the environment it runs with.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import util as importlib_util
from pathlib import Path

import structlog

from ftx_triton import start_environ
from ftx_triton.errors import ServeError
from ftx_triton.server import stub_launcher
from ftx_triton.server.process_tree import STUB_NAME
from ftx_triton.server.stub_env import STUB_PYTHON_ENV
from ftx_triton.terminal.redact import strip_secrets

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TritonInstall:
    """Where the nvidia-pytriton wheel keeps tritonserver and what it needs at run time."""

    binary: Path  # pytriton/tritonserver/bin/tritonserver
    backends: Path  # pytriton/tritonserver/backends (no stub inside)
    stub: Path  # python_backend_stubs/<major.minor>/triton_python_backend_stub
    libs: Path  # site-packages/nvidia_pytriton.libs
    python_version: str  # "3.11": the interpreter the stub matches


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


TRITONSERVER_DIR_ENV = "FTX_TRITONSERVER_DIR"
"""A tritonserver install to use instead of the wheel's: ``bin/``, ``lib/``, ``backends/``, ``python_backend_stubs/``."""


def _install_from_dir(root: Path) -> TritonInstall:
    pyver = python_version()
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        backends=root / "backends",
        stub=root / "python_backend_stubs" / pyver / STUB_NAME,
        libs=root / "lib",
        python_version=pyver,
    )
    for path in (install.binary, install.backends / "python", install.libs, install.stub):
        if not path.exists():
            raise ServeError(
                f"{TRITONSERVER_DIR_ENV}={root} is not a tritonserver install: {path} is missing",
                hint=f"unset {TRITONSERVER_DIR_ENV} to use the nvidia-pytriton wheel's server",
            )
    return install


TRITONSERVER_INSTALL = "pip install --no-deps nvidia-pytriton"
"""What brings the embedded tritonserver: the nvidia-pytriton wheel, without its dependencies (its metadata pins
numpy<2, which ftx does not need; only the binary and its libraries are used). No extra of ftx-triton can say
``--no-deps``, so the hints give this line."""


def find_tritonserver() -> TritonInstall:
    """Locate tritonserver, its backends, the stub for this Python and the vendored libs."""
    if os.environ.get(TRITONSERVER_DIR_ENV):
        return _install_from_dir(Path(os.environ[TRITONSERVER_DIR_ENV]))
    hint = f"{TRITONSERVER_INSTALL} (the python runtime's embedded tritonserver)"
    spec = importlib_util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServeError("nvidia-pytriton is not installed, so there is no tritonserver to run", hint=hint)
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    pyver = python_version()
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        backends=root / "backends",
        stub=root / "python_backend_stubs" / pyver / STUB_NAME,
        libs=package.parent / "nvidia_pytriton.libs",
        python_version=pyver,
    )
    for path in (install.binary, install.backends / "python", install.libs):
        if not path.exists():
            raise ServeError(
                f"nvidia-pytriton at {package} is incomplete: {path} is missing",
                hint="pip install --force-reinstall nvidia-pytriton",
            )
    if not install.stub.is_file():
        stubs = root / "python_backend_stubs"
        have = sorted(p.name for p in stubs.iterdir()) if stubs.is_dir() else []
        raise ServeError(
            f"nvidia-pytriton has no Python-backend stub for Python {pyver} (it has: {', '.join(have) or 'none'})",
            hint=f"use a Python version among {', '.join(have)}" if have else hint,
        )
    return install


def _stamp(install: TritonInstall) -> dict[str, object]:
    """What a prepared backends tree was copied from; a different stamp means copy again."""
    lib = install.backends / "python" / "libtriton_python.so"
    files = [install.stub] + ([lib] if lib.exists() else [])
    return {
        "source": str(install.backends),
        "stub": str(install.stub),
        "launcher": stub_launcher.version(),
        "files": {str(p): [p.stat().st_size, p.stat().st_mtime_ns] for p in files},
    }


def _read_stamp(directory: Path) -> object:
    try:
        return json.loads((directory / ".ftx-stamp.json").read_text())
    except (OSError, ValueError):
        return None


def prepare_backends(install: TritonInstall, home: Path) -> Path:
    """Return ``<home>/triton/backends-<pyver>``: the wheel's backends plus the matching stub, behind ftx's launcher
    (:mod:`~ftx_triton.server.stub_launcher`).

    Built once beside it and published by rename (:func:`ftx_triton.io.atomic.publish_dir`, under a lock in
    ``<home>/locks``, so two processes never build it at once); rebuilt when the wheel changes.
    """
    parent = Path(home) / "triton"
    parent.mkdir(parents=True, exist_ok=True)
    target = parent / f"backends-{install.python_version}"
    stamp = _stamp(install)
    if _read_stamp(target) == stamp:
        return target
    from ftx_triton.io.atomic import announced, lock_for, publish_dir
    from ftx_triton.plan.resources import require_disk

    require_disk(
        parent,
        _tree_bytes(install.backends) + install.stub.stat().st_size + BACKENDS_MARGIN_BYTES,
        "installing the python backend",
    )
    with announced(lock_for(target, Path(home) / "locks"), f"installing the python backend in {target}"):
        if _read_stamp(target) == stamp:  # another process published it meanwhile
            return target
        with publish_dir(target, replace=True, locked=False) as tmp:
            shutil.copytree(install.backends, tmp, dirs_exist_ok=True)
            stub_launcher.install(tmp / "python", install.stub)
            (tmp / ".ftx-stamp.json").write_text(json.dumps(stamp, sort_keys=True))
    log.info("server.backends_prepared", path=str(target), stub=str(install.stub))
    return target


BACKENDS_MARGIN_BYTES = 4 << 20


def _tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (links not followed)."""
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(root) for f in files)


def _join_paths(*parts: str | None) -> str:
    """Join path lists, keeping the first occurrence of each entry."""
    seen: list[str] = []
    for part in parts:
        for entry in (part or "").split(os.pathsep):
            if entry and entry not in seen:
                seen.append(entry)
    return os.pathsep.join(seen)


def python_libdir() -> Path | None:
    """The directory of this interpreter's shared libpython, if it has one."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir:
        return None
    pattern = f"libpython{python_version()}*.so*"
    return Path(libdir) if any(Path(libdir).glob(pattern)) else None


def server_env(install: TritonInstall, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver and its stubs need, on top of the one ftx started with and ``env``."""
    result = strip_secrets({**start_environ.inherited(), **(env or {})})  # a server needs no Hub or cloud credentials
    # STUB_PYTHON_ENV names another python3 for the stubs (the python runtime's numpy-1 side environment)
    python = result.pop(STUB_PYTHON_ENV, None) or sys.executable
    result["PATH"] = _join_paths(str(Path(python).parent), result.get("PATH") or os.defpath)
    libdir = python_libdir()
    if libdir is None:
        log.warning(
            "server.libpython_missing",
            executable=sys.executable,
            note="the stub will use the system libpython; a version mismatch can break models",
        )
    # folders the caller names come first: a backend's own libraries (the native FasterTransformer build's
    # Open MPI) must win over same-named ones in libpython's folder (a system Open MPI in /usr/lib)
    result["LD_LIBRARY_PATH"] = _join_paths(
        (env or {}).get("LD_LIBRARY_PATH"),
        str(libdir) if libdir else None,
        str(install.libs),
        result.get("LD_LIBRARY_PATH"),
    )
    return result
