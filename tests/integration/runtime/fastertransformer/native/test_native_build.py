"""The backend build's store, log, cache and kill handling, with a real CMake + ninja build of a stand-in
project (the FasterTransformer sources need CUDA; ``native_build_support`` says what stands in), and the
FasterTransformer recipe's configure command."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import native_build_support as support
import pytest
from ftx_triton.errors import ToolError
from ftx_triton.runtime.fastertransformer.native import BACKEND_STAGE
from ftx_triton.runtime.fastertransformer.native.build import cmake_arguments, find_backend, link_unversioned
from ftx_triton.store.artifact_store import ArtifactStore

pytestmark = pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("ninja") and shutil.which("g++")), reason="needs cmake, ninja and g++"
)


def test_build_publishes_the_libraries_and_tools_then_hits_the_cache(tmp_path: Path) -> None:
    sources = support.write_sources(tmp_path / "src")
    lines: list[str] = []
    built = support.build(tmp_path / "home", sources, say=lines.append)
    assert not built.cached
    for name in ("libtriton_fastertransformer.so", "libtransformer-shared.so"):
        assert (built.backend_dir / name).is_file()
    assert os.access(built.tool("gpt_gemm"), os.X_OK) and os.access(built.tool("t5_gemm"), os.X_OK)
    assert subprocess.run([built.tool("gpt_gemm")], capture_output=True, text=True, check=True).stdout == "gemm\n"
    assert "ninja" in (built.path / "build.log").read_text()
    assert built.manifest["sm"] == [90] and built.manifest["opal_prefix"] == "/nonexistent/ompi"
    assert any("compiling with ninja" in line for line in lines)
    assert not (tmp_path / "home" / "native" / "work" / built.key).exists()  # the build tree is removed
    again = support.build(tmp_path / "home", sources)
    assert again.cached and again.path == built.path
    assert find_backend(ArtifactStore(tmp_path / "home"), support.preflight()) is not None


def test_a_failed_build_publishes_nothing_and_says_why(tmp_path: Path) -> None:
    sources = support.write_sources(tmp_path / "src")
    (sources / "ft.cc").write_text("int ft_answer() { return undefined_name; }\n")
    with pytest.raises(ToolError, match="the FasterTransformer build failed") as info:
        support.build(tmp_path / "home", sources)
    assert "undefined_name" in (info.value.hint or "")
    assert find_backend(ArtifactStore(tmp_path / "home"), support.preflight()) is None


def test_a_build_killed_half_way_leaves_nothing_trusted_and_the_next_call_builds(tmp_path: Path) -> None:
    sources = support.write_sources(tmp_path / "src", slow=True)
    home = tmp_path / "home"
    child = subprocess.Popen(
        [sys.executable, str(Path(support.__file__)), str(home), str(sources)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 120
        for line in child.stdout:  # wait until ninja runs (the slow step waits for the mark)
            if "compiling with ninja" in line or time.monotonic() > deadline:
                break
        time.sleep(1.0)
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    store = ArtifactStore(home)
    assert find_backend(store, support.preflight()) is None
    assert not (store.root / BACKEND_STAGE).exists() or not any((store.root / BACKEND_STAGE).iterdir())
    (sources / support.SLOW_MARK).unlink()
    built = support.build(home, sources)
    assert not built.cached and (built.backend_dir / "libtriton_fastertransformer.so").is_file()
    assert not list(store.tmp_root.glob(f"{BACKEND_STAGE}-*"))  # the killed build's temp directory is gone


def test_failed_preflight_stops_before_sources_are_touched(tmp_path: Path) -> None:
    pre = support.preflight()
    broken = replace(pre, checks=(*pre.checks, replace(pre.checks[0], ok=False, name="NCCL", fix="install it")))
    from ftx_triton.runtime.fastertransformer.native.build import build_backend

    def sources() -> Path:
        raise AssertionError("the sources must not be fetched when the preflight failed")

    with pytest.raises(ToolError, match="cannot build FasterTransformer here"):
        build_backend(ArtifactStore(tmp_path / "home"), broken, sources=sources, recipe=support.RECIPE)
    assert not (tmp_path / "home" / "native").exists()


def test_the_fastertransformer_configure_command(tmp_path: Path) -> None:
    pre = support.preflight()
    argv = cmake_arguments(pre, tmp_path / "src", tmp_path / "build", tmp_path / "deps", tmp_path / "link")
    text = " ".join(argv)
    for flag in (
        "-G Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DSM=90",
        "-DBUILD_MULTI_GPU=ON",
        "-DBUILD_CUTLASS_MOE=OFF",
        "-DBUILD_CUTLASS_MIXED_GEMM=OFF",
        "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        f"-DFT_DIR={tmp_path / 'src' / 'FasterTransformer'}",
        "-DMPI_C_COMPILER=/nonexistent/ompi/bin/mpicc",
        "-Wl,--disable-new-dtags",
        "-Wl,-rpath,/nonexistent/ompi/lib",
        "-Wno-error=deprecated-declarations",
    ):
        assert flag in text, flag
    assert argv[argv.index("-S") + 1] == str(tmp_path / "src" / "fastertransformer_backend")


def test_unversioned_library_names_are_linked_only_where_missing(tmp_path: Path) -> None:
    wheel, system, link = tmp_path / "wheel", tmp_path / "system", tmp_path / "link"
    wheel.mkdir()
    system.mkdir()
    (wheel / "libnccl.so.2").write_text("")
    (system / "libcublas.so").write_text("")
    (system / "libcublas.so.13").write_text("")
    link_unversioned(link, [system, wheel], ["nccl", "cublas", "curand"])
    assert (link / "libnccl.so").resolve() == (wheel / "libnccl.so.2").resolve()
    assert not (link / "libcublas.so").exists() and not (link / "libcurand.so").exists()
