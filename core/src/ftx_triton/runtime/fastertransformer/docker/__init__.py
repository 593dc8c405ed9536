"""The fastertransformer runtime: Triton with the FasterTransformer backend, run through Docker.

Everything here talks to the Docker daemon through the Python ``docker`` SDK (never a shelled-out
``docker`` command). Modules, one job each:

* ``client``   — connect to the daemon, turn SDK/daemon errors into ``FtxError``\\ s with a fix;
* ``gpus``     — the local GPUs (nvidia-smi, else torch) and their compute capability (SM);
* ``spec``     — ``ContainerSpec``: one container, as SDK arguments and as a ``docker run`` line;
* ``image``    — build the Triton + FT backend image from the backend repository's Dockerfile;
* ``tune``     — run the family's GEMM tool in the image (``gemm_config.in``);
* ``serve``    — the serving container: GPUs, shm, ulimits, mounts, mpirun, readiness, logs;
* ``logscan``  — FasterTransformer's silent failures in the server log, turned into errors;
* ``hosts``    — multi-node: ``--hosts FILE`` → mpirun hostfile invocation, validated;
* ``package``  — a self-contained image: model repository + checkpoint + ``gemm_config.in``;
* ``plan``     — ``describe_run``: every step and command of a run, for ``--dry-run``.

This ``__init__`` stays import-light (no docker SDK import) so ``--runtime auto`` can read the
defaults cheaply.
"""

from __future__ import annotations

DEFAULT_TRITON_VERSION = "23.05"
"""Triton release the image is built on: the default of the backend's ``docker/Dockerfile`` (it
carries the ``CUDAFLAGS="-include stdio.h"`` fix that 23.05+ needs)."""

DEFAULT_IMAGE_REPOSITORY = "ftx/triton-fastertransformer"
DEFAULT_IMAGE_TAG = f"{DEFAULT_IMAGE_REPOSITORY}:{DEFAULT_TRITON_VERSION}"
"""The image ``ftx image build`` makes by default and every fastertransformer run uses by default."""

from ftx_triton.runtime.fastertransformer.pins import component as _pinned  # noqa: E402 - plain data, no SDK

DEFAULT_BACKEND_REPO = "https://github.com/triton-inference-server/fastertransformer_backend.git"
DEFAULT_BACKEND_REF = _pinned("fastertransformer_backend").ref
"""The backend commit the image is built from: the native build's pin (never a moving branch)."""
FT_REPO = f"https://github.com/{_pinned('FasterTransformer').repository}.git"
FT_COMMIT = _pinned("FasterTransformer").ref
"""The FasterTransformer commit the backend's CMake fetches in the image (its CMakeLists says ``main``)."""

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
"""tritonserver inside the NGC base image."""

BACKEND_BUILD_DIR = "/workspace/build/fastertransformer_backend/build"
"""The backend's CMake build tree inside the image (``${WORKSPACE}/build/fastertransformer_backend``)."""

GEMM_BIN_DIR = f"{BACKEND_BUILD_DIR}/bin"
"""Where the image keeps ``gpt_gemm`` and ``t5_gemm`` (the Dockerfile deletes only ``*_example``)."""

LABEL_PREFIX = "org.ftx"
"""Prefix of every label ftx puts on images and containers."""

__all__ = [
    "BACKEND_BUILD_DIR",
    "DEFAULT_BACKEND_REF",
    "DEFAULT_BACKEND_REPO",
    "DEFAULT_IMAGE_REPOSITORY",
    "DEFAULT_IMAGE_TAG",
    "DEFAULT_TRITON_VERSION",
    "FT_COMMIT",
    "FT_REPO",
    "GEMM_BIN_DIR",
    "LABEL_PREFIX",
    "TRITONSERVER",
]
