"""Preflight of the native FasterTransformer build and runtime: every fault gets its message before anything builds.

The host is described by stand-in :class:`HostProbe` values (no GPU or CUDA libraries here); one test
probes this machine for real (its nvcc, compiler, cmake).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from ftx_triton.cli import cli
from ftx_triton.errors import ConfigError, ToolError
from ftx_triton.runtime.fastertransformer.gpus import Gpu
from ftx_triton.runtime.fastertransformer.native.toolchain import (
    HostProbe,
    driver_version,
    evaluate,
    gpus_for,
    nvcc_version,
    probe_host,
)

H100 = Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0))
GOOD = HostProbe(
    nvcc=Path("/usr/local/cuda/bin/nvcc"),
    cuda_version=(13, 0, 88),
    cuda_root=Path("/usr/local/cuda"),
    cxx=Path("/usr/bin/g++"),
    cxx_version="g++ 13.3.0",
    cmake=Path("/usr/bin/cmake"),
    cmake_version=(4, 4, 3),
    ninja=Path("/usr/bin/ninja"),
    mpi_prefix=Path("/opt/ompi"),
    mpi_version="5.0.11",
    nccl_include=Path("/opt/nccl/include"),
    nccl_lib=Path("/opt/nccl/lib"),
    cuda_include_dirs=(Path("/usr/local/cuda/include"),),
    cuda_lib_dirs=(Path("/usr/local/cuda/lib64"),),
    python_include=Path("/usr/include/python3.12"),
    gpus=(H100, replace(H100, index=1)),
    driver_version="580.159.04",
    driver_cuda=(13, 0),
)


def _failed(probe: HostProbe, sm: str | None = None, need_gpu: bool = True) -> dict[str, str]:
    pre = evaluate(probe, sm, need_gpu=need_gpu)
    return {c.name: f"{c.detail} | {c.fix}" for c in pre.failures}


def test_a_complete_host_passes_and_builds_for_its_gpus() -> None:
    pre = evaluate(GOOD)
    assert pre.ok, pre.failures
    assert pre.sm == (90,)
    pre.raise_for_failures()


def test_no_gpu_or_driver_is_reported_with_the_fix() -> None:
    failed = _failed(replace(GOOD, gpus=(), driver_cuda=None))
    assert "no NVIDIA GPU found" in failed["GPU"] and "install the NVIDIA driver" in failed["GPU"]
    assert "no GPU architecture to build for" in failed["SM"]


def test_without_a_gpu_an_explicit_sm_builds_anyway() -> None:
    pre = evaluate(replace(GOOD, gpus=(), driver_cuda=None), "90", need_gpu=False)
    assert pre.ok and pre.sm == (90,)


def test_a_driver_older_than_the_toolkit_is_refused() -> None:
    failed = _failed(replace(GOOD, driver_cuda=(12, 2), driver_version="535.104.05"))
    assert "driver 535.104.05 runs CUDA up to 12.2; nvcc is 13.0.88" in failed["driver"]
    assert "580.65.06" in failed["driver"]


def test_an_architecture_fastertransformer_cannot_build_is_refused() -> None:
    assert "cannot be compiled for SM 100" in _failed(GOOD, "100")["SM"]
    volta = replace(GOOD, gpus=(Gpu(0, "Tesla V100", (7, 0)),))
    assert "cannot compile for sm_70 (its oldest is sm_75)" in _failed(volta)["SM"]
    turing = replace(GOOD, gpus=(Gpu(0, "Tesla T4", (7, 5)),))
    assert "add 75" in _failed(turing, "90")["SM"]  # code only for newer GPUs than this one
    assert "SM" not in _failed(GOOD, "80")  # sm_80 code (with its PTX) runs on sm_90


def test_missing_tools_and_libraries_name_what_to_install() -> None:
    bare = replace(
        GOOD,
        nvcc=None,
        cuda_version=None,
        cxx=None,
        cxx_version=None,
        cmake=None,
        cmake_version=None,
        ninja=None,
        mpi_prefix=None,
        nccl_include=None,
        nccl_lib=None,
        python_include=None,
        missing_headers=("cublas_v2.h",),
        missing_libs=("curand",),
    )
    failed = _failed(bare)
    assert "nvcc was not found" in failed["nvcc"] and "ftx-triton[native]" in failed["nvcc"]
    assert "apt-get install g++" in failed["C++ compiler"]
    assert "nvidia-nccl-cu13" in failed["NCCL"]
    assert "cublas_v2.h" in failed["CUDA libraries"] and "libcurand" in failed["CUDA libraries"]
    assert "python3-dev" in failed["Python headers"]
    assert set(failed) >= {"cmake", "ninja", "Open MPI"}
    with pytest.raises(ToolError, match=r"cannot build FasterTransformer here \(8 problem\(s\)\)") as info:
        evaluate(bare).raise_for_failures()
    assert info.value.hint and info.value.hint.startswith("nothing was built")


def test_an_old_nvcc_is_refused() -> None:
    assert "needs 12.9 or newer" in _failed(replace(GOOD, cuda_version=(12, 4, 131)))["nvcc"]


def test_fewer_gpus_than_tp_times_pp_is_refused() -> None:
    assert gpus_for(GOOD, 2) == (0, 1)
    with pytest.raises(ConfigError, match="tp x pp needs 4 GPUs but this machine has 2"):
        gpus_for(GOOD, 4)
    with pytest.raises(ConfigError, match="no NVIDIA GPU found"):
        gpus_for(replace(GOOD, gpus=()), 1)


def test_the_build_key_follows_toolchain_and_sm() -> None:
    from ftx_triton.runtime.fastertransformer.native.build import backend_key

    key = backend_key(evaluate(GOOD))
    assert key == backend_key(evaluate(GOOD))
    assert key != backend_key(evaluate(GOOD, "80,90"))
    assert key != backend_key(evaluate(replace(GOOD, cuda_version=(13, 1, 10))))
    assert key != backend_key(evaluate(replace(GOOD, cxx_version="g++ 14.1.0")))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_probing_this_machine_finds_its_compilers() -> None:
    probe = probe_host()
    assert probe.nvcc is not None and probe.cuda_version == nvcc_version(probe.nvcc)
    assert probe.cuda_root is not None and (probe.cuda_root / "bin").is_dir()
    assert probe.cxx is not None and probe.cxx_version


def test_cli_preflight_and_build_stop_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTX_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    result = runner.invoke(cli, ["backend", "preflight", "--sm", "100"])
    assert result.exit_code == 1 and "cannot be compiled for SM 100" in result.output
    result = runner.invoke(cli, ["backend", "build", "--sm", "61", "--sources", str(tmp_path)])
    if evaluate(probe_host(), "61", need_gpu=False).ok:  # pragma: no cover - a host with the whole toolchain
        pytest.skip("this host could build for real")
    assert result.exit_code == 1
    assert "cannot build FasterTransformer here" in result.output and "nothing was built" in result.output
    assert not (tmp_path / "home" / "store" / "backend").exists() or not any(
        (tmp_path / "home" / "store" / "backend").iterdir()
    )


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct  9 01:23:45 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "580.159.04",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)  "
            "Tue Mar  5 22:23:53 UTC 2024\n",
            "550.54.15",
        ),
    ],
    ids=["proprietary", "open"],
)
def test_the_driver_version_is_read_from_the_kernel_modules_proc_file(tmp_path: Path, text: str, version: str) -> None:
    """No nvidia-smi started for it: the planner of every native run asks."""
    proc = tmp_path / "version"
    proc.write_text(text)
    assert driver_version(proc) == version


def test_without_the_proc_file_the_driver_version_comes_from_nvidia_smi_or_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert driver_version(tmp_path / "absent") is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 580.159.04\n")
    smi.chmod(0o755)
    assert driver_version(tmp_path / "absent") == "580.159.04"
