"""``ftx package``: an image holding the model repository, checkpoint and gemm_config.in, run with one ``docker run``.

Built ``FROM`` the STAND-IN image of ``docker_daemon`` (the real FasterTransformer image cannot be
built or pulled here), on a real daemon; the packaged image is then run the way its label says
(minus the GPU request this daemon cannot satisfy), and the stand-in tritonserver must find the
rewritten checkpoint path, the checkpoint files and gemm_config.in inside the image.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import docker_daemon
import pytest
from docker_daemon import http_get, make_repository, permitted_ulimits
from ftx_triton.repository.model_config import parse_config
from ftx_triton.runtime.fastertransformer.docker.package import PackageInputs, package_image, run_spec
from ftx_triton.server.ports import free_ports

docker_client = docker_daemon.docker_client  # a session fixture (shared daemon and images; see docker_daemon)
docker_env = docker_daemon.docker_env  # a session fixture (shared daemon and images; see docker_daemon)
standin_image = docker_daemon.standin_image  # a session fixture (shared daemon and images; see docker_daemon)

pytestmark = pytest.mark.docker

IN_IMAGE = "/opt/ftx/models/fastertransformer/1/1-gpu"


def run_packaged(client: Any, tag: str, gpus: int = 1) -> tuple[Any, int]:
    """`docker run` the packaged image as its org.ftx.run label says (no GPU request on this daemon)."""
    spec = run_spec(tag, gpus)
    spec = spec.with_(gpus=None, ulimits=permitted_ulimits(dict(spec.ulimits)))
    ports = free_ports()
    kwargs = spec.create_kwargs()
    kwargs["environment"] = {
        "FTX_HTTP_PORT": str(ports.http),
        "FTX_GRPC_PORT": str(ports.grpc),
        "FTX_METRICS_PORT": str(ports.metrics),
        "FTX_HTTP_ADDRESS": "127.0.0.1",
    }
    container = client.containers.run(detach=True, **kwargs)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if http_get(f"http://127.0.0.1:{ports.http}/v2/health/ready", 1)[0] == 200:
            return container, ports.http
        container.reload()
        if container.status == "exited":
            break
        time.sleep(0.2)
    logs = container.logs().decode()
    container.remove(force=True)
    raise AssertionError(f"the packaged image did not serve:\n{logs}")


def test_ftx_package_cli_builds_an_image_that_serves(
    docker_env: Any, standin_image: str, ftx_cli: Any, tiny_gptj_dir: Path
) -> None:
    """tiny GPT-J -> convert -> configure (fastertransformer runtime, --no-tune) -> package -> docker run."""
    result = ftx_cli(
        "package", str(tiny_gptj_dir), "--tag", "ftx-test/pkg:cli", "--base-image", standin_image, "--no-tune"
    )
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    image = docker_env.images.get("ftx-test/pkg:cli")
    assert result.stdout.strip() == image.id
    labels = image.labels
    assert labels["org.ftx.kind"] == "package" and labels["org.ftx.family"] == "gptj"
    assert labels["org.ftx.tp"] == "1" and labels["org.ftx.gemm"] == "untuned"
    assert labels["org.ftx.source"] == str(tiny_gptj_dir) and labels["org.ftx.convert-key"]
    assert labels["org.ftx.base-image-id"] == docker_env.images.get(standin_image).id
    assert labels["org.ftx.run"].startswith("docker run --rm --init --gpus '\"device=0\"' --shm-size 1g")
    assert json.loads(labels["org.ftx.checkpoints"]) == {"fastertransformer": IN_IMAGE}
    container, port = run_packaged(docker_env, "ftx-test/pkg:cli")
    try:
        assert http_get(f"http://127.0.0.1:{port}/v2/models/fastertransformer/ready")[0] == 200
        status, config = http_get(f"http://127.0.0.1:{port}/v2/models/fastertransformer/config")
        assert status == 200 and f'string_value: "{IN_IMAGE}"' in config
        deadline = time.monotonic() + 30  # the stand-in's log lines can trail its readiness on a loaded machine
        logs = container.logs().decode()
        while f"read {IN_IMAGE}/config.ini" not in logs and time.monotonic() < deadline:
            time.sleep(0.2)
            logs = container.logs().decode()
        assert f"read {IN_IMAGE}/config.ini" in logs and "cannot be opened" not in logs
        assert "standin-tritonserver: cwd /opt/ftx/work" in logs
        assert "standin-mpirun: -n 1 allow-run-as-root=yes" in logs
        assert "CUDA_VISIBLE_DEVICES=0" in logs
        assert "gemm_config.in is not found" in logs  # packaged with --no-tune
    finally:
        container.remove(force=True)
    listed = ftx_cli("image", "ls")
    assert any(line.startswith("ftx-test/pkg:cli") and "package" in line for line in listed.stdout.splitlines())


def test_package_carries_gemm_config_and_leaves_the_store_alone(
    docker_client: Any, standin_image: str, tmp_path: Path
) -> None:
    repo, ckpt = make_repository(tmp_path / "store", tp=2)
    gemm = tmp_path / "tune" / "gemm_config.in"
    gemm.parent.mkdir()
    gemm.write_text("tuned-for-this-gpu\n")
    before = (repo / "fastertransformer" / "config.pbtxt").read_text()
    built = package_image(
        docker_client,
        PackageInputs(
            repository=repo,
            tag="ftx-test/pkg:gemm",
            base_image=standin_image,
            gemm=gemm,
            tp=2,
            provenance={"model": "tiny"},
        ),
        say=lambda text: None,
        progress=False,
    )
    assert (repo / "fastertransformer" / "config.pbtxt").read_text() == before
    assert parse_config(repo / "fastertransformer" / "config.pbtxt").parameters[
        "model_checkpoint_path"
    ].string_value == str(ckpt)
    assert built.labels["org.ftx.model"] == "tiny" and len(built.labels["org.ftx.gemm"]) == 64
    assert '"device=0,1"' in built.run_command
    container, _ = run_packaged(docker_client, built.tag, gpus=2)
    try:
        logs = container.logs().decode()
        assert "gemm_config.in found (tuned-for-this-gpu" in logs
        assert "read /opt/ftx/models/fastertransformer/1/2-gpu/config.ini" in logs
        assert "CUDA_VISIBLE_DEVICES=0,1" in logs
    finally:
        container.remove(force=True)
