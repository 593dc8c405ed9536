"""Build FasterTransformer + its Triton backend + the GEMM tools into the store (stage ``backend``).

The key is made of the source pins, the patch set's digest, the toolchain (CUDA, compiler, MPI and
NCCL versions) and the SM list, so a second call with the same inputs is a cache hit. The build runs
in ``<home>/native/work/<key>``: the verified sources' used files are copied there, patched, configured
with CMake and built with ninja; only then are the libraries and tools copied into the store's temp
directory and published by one rename (:meth:`ftx_triton.store.artifact_store.ArtifactStore.build`). A build killed half-way
publishes nothing; the next call finds the work directory and lets ninja carry on from what it
finished (ninja re-runs every step it has no record of), and a changed recipe starts it afresh.
The work directory is removed once the artifact is published.

Artifact layout::

    backends/fastertransformer/libtriton_fastertransformer.so   the Triton backend
    backends/fastertransformer/libtransformer-shared.so         FasterTransformer
    bin/gpt_gemm, bin/t5_gemm                                   GEMM tuning tools
    ftx-backend.json                                            what was built, with what, for which SMs
    build.log                                                   the configure and build output
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import structlog

from ftx_triton.errors import ToolError
from ftx_triton.runtime.fastertransformer.native import BACKEND_STAGE
from ftx_triton.runtime.fastertransformer.native.patches import apply_patches, patch_set_digest
from ftx_triton.runtime.fastertransformer.native.sources import READY_MARK, used_files
from ftx_triton.runtime.fastertransformer.native.toolchain import CUDA_LIBS, Preflight, RuntimeLibraries
from ftx_triton.runtime.fastertransformer.pins import COMPONENTS, pins_fingerprint
from ftx_triton.store.artifact_store import ArtifactStore, make_key

log = structlog.get_logger(__name__)

RECIPE_VERSION = 2
"""Bump when the configure flags or the artifact layout change (part of the key)."""
TARGETS = ("triton-fastertransformer-backend", "gpt_gemm", "t5_gemm")
BACKEND_FILES = ("libtriton_fastertransformer.so", "libtransformer-shared.so")
TOOLS = ("gpt_gemm", "t5_gemm")
MANIFEST = "ftx-backend.json"
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


@dataclass(frozen=True)
class BuiltBackend:
    """A published backend build."""

    path: Path
    key: str
    cached: bool
    manifest: Mapping[str, Any]

    @property
    def backend_dir(self) -> Path:
        return self.path / "backends" / "fastertransformer"

    def tool(self, name: str) -> Path:
        return self.path / "bin" / name

    @property
    def lib_dirs(self) -> list[Path]:
        return [Path(p) for p in self.manifest.get("runtime_lib_dirs", [])]

    @property
    def opal_prefix(self) -> Path | None:
        value = self.manifest.get("opal_prefix")
        return Path(value) if value else None

    @property
    def sm(self) -> tuple[int, ...]:
        return tuple(self.manifest.get("sm", ()))


@functools.lru_cache(maxsize=1)
def _patches_digest() -> str:
    """The patch set's digest, made once a process (a run keys the build three times or more: availability,
    the tune key, the serve stage; each was a JSON dump of every patch and new file)."""
    return patch_set_digest()


def key_inputs(pre: Preflight) -> dict[str, Any]:
    """Everything that determines the binaries."""
    return {
        "pins": pins_fingerprint(),
        "patches": _patches_digest(),
        "toolchain": pre.toolchain_key(),
        "recipe": RECIPE_VERSION,
    }


def backend_key(pre: Preflight) -> str:
    return make_key({"stage": BACKEND_STAGE, **key_inputs(pre)})


def find_backend(store: ArtifactStore, pre: Preflight) -> BuiltBackend | None:
    """The published build for this toolchain and SM list, if there is one."""
    key = backend_key(pre)
    hit = store.lookup(BACKEND_STAGE, key)
    if hit is None:
        return None
    return BuiltBackend(hit.path, key, True, json.loads((hit.path / MANIFEST).read_text()))


# --------------------------------------------------------------------------- the CMake invocation


def rapidjson_config(dest: Path, include: Path) -> Path:
    """A RapidJSONConfig.cmake pointing at ``include`` (Triton's CMake finds RapidJSON in CONFIG mode)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "RapidJSONConfig.cmake").write_text(
        "# written by ftx: RapidJSON is header-only\n"
        f'set(RAPIDJSON_INCLUDE_DIRS "{include}")\nset(RapidJSON_INCLUDE_DIRS "{include}")\n'
    )
    return dest


def link_unversioned(link_dir: Path, lib_dirs: Sequence[Path], names: Sequence[str]) -> Path:
    """``link_dir/lib<x>.so`` -> ``lib<x>.so.N`` for libraries shipped only with versioned names (wheels)."""
    link_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        for directory in lib_dirs:
            if (directory / f"lib{name}.so").exists():
                break
            versioned = sorted(directory.glob(f"lib{name}.so.*"), key=lambda p: (len(p.name), p.name))
            if versioned:
                target = link_dir / f"lib{name}.so"
                target.unlink(missing_ok=True)
                target.symlink_to(versioned[0])
                break
    return link_dir


def cmake_arguments(pre: Preflight, src: Path, build: Path, deps: Path, link_dir: Path) -> list[str]:
    """The configure command: Release, the SM list, no MoE/mixed GEMM kernels, multi-GPU, offline."""
    p = pre.probe
    assert p.nvcc and p.cuda_root and p.cmake and p.cxx and p.mpi_prefix and p.nccl_include
    sm = ",".join(map(str, pre.sm))
    # on the compiler flags (not only CMake's include lists): CMake's try_run checks (NCCL's version) see them too
    includes = " ".join(f"-I{d}" for d in dict.fromkeys([*p.cuda_include_dirs, p.nccl_include]))
    lib_dirs = [link_dir, *p.cuda_lib_dirs, p.nccl_lib, p.mpi_prefix / "lib"]
    # DT_RPATH (not RUNPATH): the build's Open MPI, NCCL and CUDA libraries win over LD_LIBRARY_PATH, which may
    # list a system Open MPI with the same soname (libmpi.so.40)
    link_flags = " ".join(
        ["-Wl,--disable-new-dtags", *(f"-L{d}" for d in lib_dirs), *(f"-Wl,-rpath,{d}" for d in lib_dirs[1:])]
    )
    return [
        str(p.cmake),
        "-S",
        str(src / "fastertransformer_backend"),
        "-B",
        str(build),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DSM={sm}",
        f"-DCMAKE_CUDA_ARCHITECTURES={sm.replace(',', ';')}",
        "-DBUILD_CUTLASS_MOE=OFF",
        "-DBUILD_CUTLASS_MIXED_GEMM=OFF",
        "-DGIT_AUTOCLONE_CUTLASS=OFF",
        "-DBUILD_MULTI_GPU=ON",
        "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        f"-DFT_DIR={src / 'FasterTransformer'}",
        f"-DFETCHCONTENT_SOURCE_DIR_REPO-COMMON={src / 'triton' / 'common'}",
        f"-DFETCHCONTENT_SOURCE_DIR_REPO-CORE={src / 'triton' / 'core'}",
        f"-DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND={src / 'triton' / 'backend'}",
        f"-DRapidJSON_DIR={deps / 'RapidJSON'}",
        f"-DCMAKE_CUDA_COMPILER={p.nvcc}",
        f"-DCUDA_TOOLKIT_ROOT_DIR={p.cuda_root}",
        f"-DCUDAToolkit_ROOT={p.cuda_root}",
        f"-DCMAKE_CXX_COMPILER={p.cxx}",
        f"-DCMAKE_CUDA_HOST_COMPILER={p.cxx}",
        f"-DMPI_C_COMPILER={p.mpi_prefix / 'bin' / 'mpicc'}",
        f"-DMPI_CXX_COMPILER={p.mpi_prefix / 'bin' / 'mpicxx'}",
        f"-DNCCL_INCLUDE_DIR={p.nccl_include}",
        f"-DNCCL_LIB_DIR={link_dir if (link_dir / 'libnccl.so').exists() else p.nccl_lib}",
        f"-DPython3_EXECUTABLE={sys.executable}",
        f"-DCMAKE_CXX_FLAGS=-Wno-error=deprecated-declarations {includes}",
        f"-DCMAKE_CUDA_FLAGS={includes}",
        f"-DCMAKE_SHARED_LINKER_FLAGS={link_flags}",
        f"-DCMAKE_EXE_LINKER_FLAGS={link_flags}",
        f"-DCMAKE_MODULE_LINKER_FLAGS={link_flags}",
    ]


def build_environment(pre: Preflight, link_dir: Path) -> dict[str, str]:
    """The environment of the build: the toolchain first on PATH, its libraries findable, Open MPI relocated."""
    p = pre.probe
    libs = RuntimeLibraries.of(p)
    env = dict(os.environ)
    path_dirs = [str(d.parent) for d in (p.nvcc, p.ninja, p.cmake) if d is not None]
    env["PATH"] = os.pathsep.join([*dict.fromkeys(path_dirs), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(link_dir), *map(str, libs.lib_dirs), env.get("LD_LIBRARY_PATH", "")])
    if libs.opal_prefix:
        env["OPAL_PREFIX"] = str(libs.opal_prefix)
    env["CUDACXX"] = str(p.nvcc)
    return env


# --------------------------------------------------------------------------- running with a log and progress


def run_logged(
    argv: Sequence[str],
    *,
    log_file: Path,
    env: Mapping[str, str],
    cwd: Path | None = None,
    on_line: Callable[[str], None] | None = None,
    what: str = "the build",
) -> None:
    """Run ``argv`` with its output appended to ``log_file`` (and each line to ``on_line``); ToolError on failure."""
    with log_file.open("a", encoding="utf-8") as out:
        out.write(f"\n# ftx: {' '.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except OSError as exc:
            raise ToolError(
                f"cannot run {argv[0]}: {exc.strerror or exc}", hint="run `ftx backend preflight`"
            ) from None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
    if code != 0:
        raise ToolError(
            f"{what} failed ({Path(argv[0]).name} exited with code {code})",
            hint=f"the first error in the log says why:\n{first_errors(log_file)}\nfull log: {log_file}",
        )


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a build and everything it started (its own process group)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


_ERROR_LINE = re.compile(r"(error:|error :|CMake Error|fatal error|FAILED:|undefined reference)", re.IGNORECASE)


def first_errors(log_file: Path, limit: int = 6) -> str:
    """The first error lines of a build log, indented."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return "  (no log)"
    hits = [line.strip() for line in lines if _ERROR_LINE.search(line)][:limit]
    return "\n".join(f"  {h[:300]}" for h in hits) or "\n".join(f"  {line[:300]}" for line in lines[-limit:])


class NinjaProgress:
    """Turns ninja's ``[done/total]`` lines into a rich bar on a terminal, else a line every 10%."""

    def __init__(self, say: Callable[[str], None], enabled: bool = True) -> None:
        self.say = say
        self.enabled = enabled
        self._bar: Any = None
        self._task: Any = None
        self._last_decile = -1

    def __enter__(self) -> Self:
        if self.enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("[bold]building FasterTransformer"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("build", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def line(self, text: str) -> None:
        m = _NINJA_STEP.match(text)
        if not m:
            return
        done, total = int(m.group(1)), int(m.group(2))
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
        elif self.enabled:
            decile = done * 10 // max(total, 1)
            if decile > self._last_decile:
                self._last_decile = decile
                self.say(f"backend   build {done}/{total} steps")


# --------------------------------------------------------------------------- staging and building


def stage_sources(sources: Path, dest: Path) -> None:
    """Copy the used files of every component into ``dest`` (a fresh directory) and patch them."""
    if dest.exists():
        shutil.rmtree(dest)
    for comp in COMPONENTS:
        for rel in used_files(sources, comp):
            target = dest / comp.folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(sources / comp.folder / rel, target)
    apply_patches(dest)


def _staged(work: Path, stamp: Mapping[str, Any]) -> bool:
    try:
        return json.loads((work / READY_MARK).read_text()) == dict(stamp)
    except (OSError, ValueError):
        return False


def _collect(build: Path, dest: Path) -> dict[str, str]:
    """Copy the backend libraries and the tools from the build tree into the artifact."""
    found: dict[str, str] = {}
    backend = dest / "backends" / "fastertransformer"
    backend.mkdir(parents=True)
    (dest / "bin").mkdir()
    for name, where in [*((n, backend) for n in BACKEND_FILES), *((n, dest / "bin") for n in TOOLS)]:
        matches = sorted(p for p in build.rglob(name) if p.is_file() and "CMakeFiles" not in p.parts)
        if not matches:
            raise ToolError(
                f"the build finished but produced no {name}", hint=f"look for errors in {build.parent / 'build.log'}"
            )
        shutil.copy2(matches[0], where / name)
        found[name] = str(matches[0].relative_to(build))
    return found


def configure_fastertransformer(pre: Preflight, src: Path, build: Path, work: Path) -> list[str]:
    """Prepare RapidJSON's CMake config and the unversioned library links; return the configure command."""
    p = pre.probe
    rapidjson_config(work / "deps" / "RapidJSON", src / "rapidjson" / "include")
    lib_dirs = [*p.cuda_lib_dirs, *([p.nccl_lib] if p.nccl_lib else [])]
    link_unversioned(work / "link", lib_dirs, (*CUDA_LIBS, "nccl"))
    return cmake_arguments(pre, src, build, work / "deps", work / "link")


@dataclass(frozen=True)
class Recipe:
    """How verified sources become the artifact: staging (copy + patch), the configure command, ninja targets."""

    stage: Callable[[Path, Path], None] = stage_sources
    configure: Callable[[Preflight, Path, Path, Path], list[str]] = configure_fastertransformer
    targets: tuple[str, ...] = TARGETS


FASTERTRANSFORMER = Recipe()


def build_backend(
    store: ArtifactStore,
    pre: Preflight,
    *,
    sources: Callable[[], Path],
    jobs: int | None = None,
    force: bool = False,
    say: Callable[[str], None] = lambda text: None,
    show_progress: bool = True,
    producer: Mapping[str, Any] | None = None,
    recipe: Recipe = FASTERTRANSFORMER,
) -> BuiltBackend:
    """The backend build for ``pre``'s toolchain and SM list: from the store, else built now.

    ``sources`` is called only when a build is needed (it may download or extract). Raises ToolError
    with the fix before anything builds when the preflight failed.
    """
    key = backend_key(pre)
    inputs = key_inputs(pre)
    if not force and (hit := find_backend(store, pre)) is not None:
        return hit
    pre.raise_for_failures()
    work = store.home / "native" / "work" / key

    def builder(tmp: Path) -> Mapping[str, Any]:
        started = time.monotonic()
        work.mkdir(parents=True, exist_ok=True)
        log_file = work / "build.log"
        src, build, link = work / "src", work / "build", work / "link"
        stamp = {"key": key, "sources": "staged"}
        if not _staged(work, stamp):
            say("backend   staging and patching the sources")
            root = sources()
            shutil.rmtree(build, ignore_errors=True)
            log_file.write_text("")
            recipe.stage(root, src)
            (work / READY_MARK).write_text(json.dumps(stamp))
        else:
            say(f"backend   resuming the build in {work}")
        p = pre.probe
        argv = recipe.configure(pre, src, build, work)
        env = build_environment(pre, link)
        if not (build / "build.ninja").is_file():
            say(f"backend   configuring (CMake, SM {','.join(map(str, pre.sm))}); log: {log_file}")
            try:
                run_logged(argv, log_file=log_file, env=env, what="CMake configure")
            except BaseException:
                shutil.rmtree(build, ignore_errors=True)  # CMake caches failed checks; the next try starts clean
                raise
        n = jobs or os.cpu_count() or 4
        say(f"backend   compiling with ninja -j{n} (a few minutes on 16 cores); log: {log_file}")
        with NinjaProgress(say, show_progress) as progress:
            run_logged(
                [str(p.ninja), "-C", str(build), f"-j{n}", *recipe.targets],
                log_file=log_file,
                env=env,
                on_line=progress.line,
                what="the FasterTransformer build",
            )
        outputs = _collect(build, tmp)
        libs = RuntimeLibraries.of(p)
        manifest = {
            "key": key,
            "sm": list(pre.sm),
            "toolchain": pre.toolchain_key(),
            "pins": pins_fingerprint(),
            "patches": patch_set_digest(),
            "built_from": outputs,
            "build_seconds": round(time.monotonic() - started, 1),
            "runtime_lib_dirs": [str(d) for d in libs.lib_dirs],
            "opal_prefix": str(libs.opal_prefix) if libs.opal_prefix else None,
            "nvcc": str(p.nvcc),
            "cuda_root": str(p.cuda_root),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        shutil.copy2(log_file, tmp / "build.log")
        return {"backend": manifest}

    artifact, cached = store.build(
        BACKEND_STAGE, key, builder, inputs=inputs, producer=dict(producer or {}), force=force
    )
    if not cached:
        shutil.rmtree(work, ignore_errors=True)
    manifest = json.loads((artifact.path / MANIFEST).read_text())
    log.info("backend.ready", key=key, path=str(artifact.path), cached=cached)
    return BuiltBackend(artifact.path, key, cached, manifest)


__all__ = [
    "FASTERTRANSFORMER",
    "BuiltBackend",
    "Recipe",
    "backend_key",
    "build_backend",
    "cmake_arguments",
    "configure_fastertransformer",
    "find_backend",
    "key_inputs",
    "link_unversioned",
    "run_logged",
    "stage_sources",
]
