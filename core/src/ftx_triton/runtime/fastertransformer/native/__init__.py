"""FasterTransformer built natively: the ``fastertransformer-native`` runtime and ``ftx backend build``.

FasterTransformer and its Triton backend are compiled on the GPU host from pinned upstream sources
(with ftx's own patch set for CUDA 13 / CCCL 3 / C++17 / CMake 4), published as a ``backend``
artifact of the store, and loaded into the embedded tritonserver (the nvidia-pytriton wheel's).
Modules, one job each:

* ``pins``      — the upstream components: repository, commit or tag, which files the build uses,
                  and the sha256 of that file tree;
* ``sources``   — get the sources (public archives, or ``--sources DIR|ARCHIVE``) and verify them;
* ``patches``   — ftx's patch set: text edits that must each apply exactly once;
* ``toolchain`` — find nvcc, the C++ compiler, cmake, ninja, Open MPI, NCCL, cuBLAS/cuRAND, the
                  GPUs and the driver; ``preflight`` says what is missing before anything builds;
* ``build``     — stage, patch, configure (CMake) and build (ninja) into the store, with a log;
* ``options``   — the one place that reads the run's settings for this runtime;
* ``tune``      — run ``gpt_gemm`` / ``t5_gemm`` from the build for the deployment's shapes;
* ``serve``     — the serving plan (backend directory, environment, GPUs, mpirun) and the server;
* ``plugin``    — the ``fastertransformer-native`` runtime class and its registration.

This ``__init__`` stays import-light.
"""

from __future__ import annotations

BACKEND_STAGE = "backend"
"""Store stage of the built backend (``<home>/store/backend/<key>``)."""

__all__ = ["BACKEND_STAGE"]
