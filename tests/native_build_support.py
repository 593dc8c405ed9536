"""A stand-in for FasterTransformer's sources: a tiny C++ CMake project with the same outputs.

It is built for real (cmake, ninja, the C++ compiler of this machine) through
:func:`ftx_triton.runtime.fastertransformer.native.build.build_backend` with a
:class:`~ftx_triton.runtime.fastertransformer.native.build.Recipe` of its own, and a
host probe whose CUDA parts are stand-ins (there is no GPU toolchain here). ``SLOW_MARK``: when that
file exists in the source folder the build has one step that waits for it to disappear (the
killed-build test kills the process then; the next build runs it again and goes on).

Run as a script (``python native_build_support.py HOME SOURCES``) to build once in a child process.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

from ftx_triton.runtime.fastertransformer.gpus import Gpu
from ftx_triton.runtime.fastertransformer.native.build import Recipe, build_backend
from ftx_triton.runtime.fastertransformer.native.toolchain import HostProbe, Preflight, evaluate
from ftx_triton.store.artifact_store import ArtifactStore

SLOW_MARK = "slow.mark"
CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(standin CXX)
add_library(transformer-shared SHARED ft.cc)
add_library(triton-fastertransformer-backend SHARED backend.cc)
set_target_properties(triton-fastertransformer-backend PROPERTIES OUTPUT_NAME triton_fastertransformer)
target_link_libraries(triton-fastertransformer-backend transformer-shared)
add_executable(gpt_gemm gemm.cc)
add_executable(t5_gemm gemm.cc)
if(EXISTS ${CMAKE_SOURCE_DIR}/wait.sh)
  add_custom_command(OUTPUT slow.done COMMAND sh ${CMAKE_SOURCE_DIR}/wait.sh COMMAND touch slow.done)
  add_custom_target(slow ALL DEPENDS slow.done)
  add_dependencies(triton-fastertransformer-backend slow)
endif()
"""
FILES = {
    "CMakeLists.txt": CMAKELISTS,
    "ft.cc": "int ft_answer() { return 42; }\n",
    "backend.cc": "int ft_answer();\nint backend_answer() { return ft_answer(); }\n",
    "gemm.cc": '#include <cstdio>\nint main() { std::puts("gemm"); return 0; }\n',
}


def write_sources(root: Path, slow: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (root / name).write_text(text)
    if slow:  # a build step that waits while the mark (in these sources, not the staged copy) exists
        (root / SLOW_MARK).write_text("")
        (root / "wait.sh").write_text(
            f"echo waiting\nwhile [ -e '{(root / SLOW_MARK).resolve()}' ]; do sleep 0.2; done\n"
        )
    return root


def _stage(sources: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(sources, dest)


def _configure(pre: Preflight, src: Path, build: Path, work: Path) -> list[str]:
    p = pre.probe
    return [str(p.cmake), "-S", str(src), "-B", str(build), "-G", "Ninja", f"-DCMAKE_CXX_COMPILER={p.cxx}"]


RECIPE = Recipe(stage=_stage, configure=_configure)


def preflight() -> Preflight:
    """Real cmake, ninja and C++ compiler; stand-ins for the CUDA toolchain, MPI, NCCL and the GPU."""
    fake = Path("/nonexistent")
    probe = HostProbe(
        nvcc=fake / "nvcc",
        cuda_version=(13, 0, 88),
        cuda_root=fake,
        cxx=Path(shutil.which("g++") or "g++"),
        cxx_version="g++ (stand-in)",
        cmake=Path(shutil.which("cmake") or "cmake"),
        cmake_version=(3, 25),
        ninja=Path(shutil.which("ninja") or "ninja"),
        mpi_prefix=fake / "ompi",
        mpi_version="5.0.11",
        nccl_include=fake / "include",
        nccl_lib=fake / "lib",
        cuda_include_dirs=(fake,),
        cuda_lib_dirs=(fake,),
        python_include=fake,
        gpus=(Gpu(0, "stand-in GPU", (9, 0)),),
        driver_version="580",
        driver_cuda=(13, 0),
    )
    return evaluate(replace(probe), "90")


def build(home: Path, sources: Path, **kwargs: object):  # -> BuiltBackend
    return build_backend(
        ArtifactStore(home), preflight(), sources=lambda: sources, recipe=RECIPE, show_progress=False, **kwargs
    )  # type: ignore[arg-type]


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]), say=lambda text: print(text, flush=True))
