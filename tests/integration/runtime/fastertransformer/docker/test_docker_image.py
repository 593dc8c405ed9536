"""``ftx image build|ls`` against a real Docker daemon.

The real build needs NGC's tritonserver base image and hours of CUDA compilation, and nothing can be
pulled here. The tests build instead from a miniature of the backend repository whose
``docker/Dockerfile`` keeps upstream's shape (``ARG TRITON_VERSION``, ``ARG BASE_IMAGE``,
``FROM ${BASE_IMAGE}``, ``ADD .``, the multi-line ``RUN cmake \\``) on top of the STAND-IN image, whose
``cmake`` records its arguments — so the SM injection, build args, streamed log, progress, labels and
recorded id all go through ftx's real code and a real daemon build.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import docker_daemon
import pytest
from ftx_triton.errors import ToolError
from ftx_triton.runtime.fastertransformer.docker.image import ImageBuild, build_image, list_images

docker_client = docker_daemon.docker_client  # a session fixture (shared daemon and images; see docker_daemon)
docker_env = docker_daemon.docker_env  # a session fixture (shared daemon and images; see docker_daemon)
standin_image = docker_daemon.standin_image  # a session fixture (shared daemon and images; see docker_daemon)

pytestmark = pytest.mark.docker

MINI_DOCKERFILE = """\
ARG TRITON_VERSION=22.12
ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3
FROM ${BASE_IMAGE}
ARG TRITON_VERSION
RUN echo "triton ${TRITON_VERSION}" > /workspace/triton-version.txt

# backend build
ADD . /workspace/build/fastertransformer_backend
RUN mkdir -p /workspace/build/fastertransformer_backend/build

WORKDIR /workspace/build/fastertransformer_backend/build
ARG FORCE_BACKEND_REBUILD=0
RUN CUDAFLAGS="-include stdio.h" cmake \\
      -D CMAKE_BUILD_TYPE=Release \\
      -D ENABLE_FP8=OFF \\
      -D CMAKE_INSTALL_PREFIX=/opt/tritonserver \\
      ..
{extra}
ENV NCCL_LAUNCH_MODE=GROUP
ENV WORKSPACE /workspace
WORKDIR /workspace
"""


def backend_repo(root: Path, extra: str = "") -> Path:
    """A miniature fastertransformer_backend checkout (stand-in): docker/Dockerfile + a CMakeLists.txt."""
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "Dockerfile").write_text(MINI_DOCKERFILE.replace("{extra}", extra))
    (root / "CMakeLists.txt").write_text("# stand-in\n")
    return root


def _run(client: Any, image: str, *argv: str) -> str:
    return client.containers.run(image, list(argv), remove=True, network_mode="none").decode()


def test_build_injects_sm_passes_build_args_and_records_the_id(
    docker_client: Any, standin_image: str, tmp_path: Path
) -> None:
    repo = backend_repo(tmp_path / "fastertransformer_backend")
    lines: list[str] = []
    build = ImageBuild(
        tag="ftx-test/triton-ft:1",
        triton_version="23.05",
        base_image=standin_image,
        sm=(80, 90),
        backend_repo=str(repo),
    )
    built = build_image(docker_client, build, home=tmp_path / "home", say=lines.append, progress=False)
    image = docker_client.images.get("ftx-test/triton-ft:1")
    assert built.id == image.id
    cmake_args = _run(docker_client, built.tag, "cat", "/workspace/cmake-args.txt").split("\n")
    assert cmake_args[:2] == ["-D", "SM=80,90"] and "CMAKE_INSTALL_PREFIX=/opt/tritonserver" in cmake_args
    assert _run(docker_client, built.tag, "cat", "/workspace/triton-version.txt").strip() == "triton 23.05"
    labels = image.labels
    assert labels["org.ftx.kind"] == "triton-fastertransformer" and labels["org.ftx.sm"] == "80,90"
    assert labels["org.ftx.triton-version"] == "23.05" and labels["org.ftx.base-image"] == standin_image
    record = json.loads(built.record.read_text())
    assert record["id"] == image.id and record["tag"] == built.tag
    assert any(line.startswith("image     step 1/") for line in lines)  # progress over Dockerfile steps
    assert "-D SM=80,90" in built.log_path.read_text() or "SM=80,90" in built.log_path.read_text()
    assert (repo / "docker" / "Dockerfile").read_text() == MINI_DOCKERFILE.replace("{extra}", "")  # untouched
    assert [i.tag for i in list_images(docker_client, tmp_path / "home")].count("ftx-test/triton-ft:1") == 1


def test_build_from_a_git_url_clones_the_ref(docker_client: Any, standin_image: str, tmp_path: Path) -> None:
    repo = backend_repo(tmp_path / "origin")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "release", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "mini"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    build = ImageBuild(
        tag="ftx-test/triton-ft:git",
        base_image=standin_image,
        sm=(90,),
        backend_repo=f"file://{repo}",
        backend_ref="release",
    )
    built = build_image(docker_client, build, home=tmp_path / "home", say=lambda text: None, progress=False)
    assert built.labels["org.ftx.backend-commit"] == commit
    assert (tmp_path / "home" / "images" / "src").is_dir()
    assert _run(docker_client, built.tag, "cat", "/workspace/cmake-args.txt").split("\n")[:2] == ["-D", "SM=90"]


def test_build_failure_names_the_step_and_shows_the_log(docker_client: Any, standin_image: str, tmp_path: Path) -> None:
    repo = backend_repo(tmp_path / "backend", extra="RUN echo compiling kernels && false")
    build = ImageBuild(tag="ftx-test/triton-ft:broken", base_image=standin_image, sm=(90,), backend_repo=str(repo))
    with pytest.raises(ToolError, match=r"the image build failed at step \d+/\d+ \(RUN echo compiling kernels") as err:
        build_image(docker_client, build, home=tmp_path / "home", say=lambda text: None, progress=False)
    assert "compiling kernels" in (err.value.hint or "") and "full log:" in (err.value.hint or "")


def test_cli_image_build_and_ls(docker_env: Any, standin_image: str, tmp_path: Path, ftx_cli: Any) -> None:
    repo = backend_repo(tmp_path / "backend")
    built = ftx_cli(
        "image",
        "build",
        "--backend-repo",
        str(repo),
        "--base-image",
        standin_image,
        "--sm",
        "9.0",
        "--tag",
        "ftx-test/triton-ft:cli",
    )
    assert built.exit_code == 0, built.stderr + repr(built.exception)
    assert built.stdout.strip() == docker_env.images.get("ftx-test/triton-ft:cli").id
    listed = ftx_cli("image", "ls")
    assert listed.exit_code == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("ftx-test/triton-ft:cli"))
    assert "triton-fastertransformer" in row and "23.05" in row and " 90 " in row
    as_json = json.loads(ftx_cli("image", "ls", "--json").stdout)
    assert any(i["tag"] == "ftx-test/triton-ft:cli" and i["labels"]["org.ftx.sm"] == "90" for i in as_json)
    bad = ftx_cli("image", "build", "--backend-repo", str(repo), "--sm", "100")
    assert bad.exit_code == 1 and "cannot be compiled for SM 100" in bad.stderr
