"""Builds a host-compiled driver of ftx's native patch files against a test harness's FAKE CUDA runtime (no GPU
here): the tests of the CUDA-graph step, the weight loader and the stream outputs share it. They skip where no
C++ compiler is found."""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def copy_patch_files(dest: Path, *names: str) -> None:
    """Copy the named files of ftx's native ``patch_files/`` into ``dest`` (made if missing)."""
    dest.mkdir(parents=True, exist_ok=True)
    patch_files = resources.files("ftx_triton.runtime.fastertransformer.native").joinpath("patch_files")
    for name in names:
        (dest / name).write_text(patch_files.joinpath(name).read_text(encoding="utf-8"))


def compile_driver(binary: Path, *args: str, what: str) -> Path:
    """``binary`` compiled (C++17, every warning an error) from ``args`` (flags and sources, in order); skips the
    test when no C++ compiler is found, saying it could not build ``what`` against the fake CUDA runtime."""
    if CXX is None:
        pytest.skip(f"no C++ compiler (g++) to build {what} against the fake CUDA runtime")
    command = [CXX, "-std=c++17", "-Wall", "-Werror", *args, "-o", str(binary)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    return binary
