"""Where the FasterTransformer tritonserver listens: 127.0.0.1 unless asked, every endpoint, admin APIs guarded.

The serve plan is checked as data (no Docker call); the packaged image's entrypoint script runs for real
under /bin/sh with a stand-in ``mpirun`` on PATH that prints its arguments (no FasterTransformer image or
GPU exists here).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ftx_triton.plan.settings import RunSettings
from ftx_triton.repository.model_config import FtModelOptions, build_ft_model_config, write_config
from ftx_triton.runtime.fastertransformer.docker.exposure import ADMIN_KEY_HEADER, exposure_for, triton_version_of
from ftx_triton.runtime.fastertransformer.docker.options import DockerOptions
from ftx_triton.runtime.fastertransformer.docker.package import SERVE_SH
from ftx_triton.runtime.fastertransformer.docker.serve import plan_serve
from ftx_triton.server.ports import ServerPorts


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("nvcr.io/nvidia/tritonserver:23.05-py3", (23, 5)),
        ("ftx-fastertransformer:24.01", (24, 1)),
        ("registry:5000/team/ft:latest", None),
        ("ft", None),
        ("ft:123.456", None),
    ],
)
def test_the_triton_release_is_read_from_the_image_tag(image: str, version: tuple[int, int] | None) -> None:
    assert triton_version_of(image) == version


def test_loopback_binds_every_endpoint_there() -> None:
    old = exposure_for("127.0.0.1", (23, 5))  # metrics follow the HTTP address before 23.06
    assert old.flags == ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1") and old.caveat is None
    new = exposure_for("127.0.0.1", (24, 3))  # from 23.06 metrics have their own address, all interfaces by default
    assert "--metrics-address=127.0.0.1" in new.flags and new.admin_key is None
    assert not any("restricted" in flag for flag in new.flags)


def test_a_wider_address_restricts_the_admin_apis_where_triton_can() -> None:
    wide = exposure_for("0.0.0.0", (24, 1), admin_key="k3y")
    assert "--metrics-address=0.0.0.0" in wide.flags
    guarded = "model-repository,shared-memory,logging,trace:ftx-admin-key=k3y"
    assert f"--http-restricted-api={guarded}" in wide.flags and f"--grpc-restricted-protocol={guarded}" in wide.flags
    old = exposure_for("10.1.2.3", (23, 5))
    assert old.admin_key is None and "cannot restrict" in (old.caveat or "") and "24.01" in (old.caveat or "")
    assert exposure_for("", (24, 1)).flags[0] == "--http-address=0.0.0.0"  # empty means all interfaces, said so


def _repository(root: Path) -> Path:
    repo, ckpt = root / "repo", root / "convert" / "1-gpu"
    ckpt.mkdir(parents=True)
    write_config(
        build_ft_model_config(FtModelOptions(model_type="GPT-J", io_kind="decoder", checkpoint_path=ckpt, tp=1)),
        repo / "fastertransformer",
    )
    return repo


@pytest.mark.parametrize(
    ("image", "metrics"), [("ftx-fastertransformer:23.05", False), ("ftx-fastertransformer:24.05", True)]
)
def test_the_serve_container_listens_on_loopback_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image: str, metrics: bool
) -> None:
    monkeypatch.setenv("FTX_HOME", str(tmp_path / "home"))
    repo = _repository(tmp_path)
    plan = plan_serve(
        repository=repo,
        checkpoints=[tmp_path / "convert" / "1-gpu"],
        settings=RunSettings.of("m", tp=1),
        family="gptj",
        options=DockerOptions(image=image),
        gemm=None,
        ports=ServerPorts(1, 2, 3),
    )
    command = plan.spec.command
    assert "--http-address=127.0.0.1" in command and "--grpc-address=127.0.0.1" in command
    assert ("--metrics-address=127.0.0.1" in command) is metrics
    assert plan.spec.network_mode == "host"  # why the address matters: the container shares the host's interfaces


def _serve_sh(tmp_path: Path, version: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the packaged entrypoint with a stand-in mpirun that prints the tritonserver arguments."""
    from ftx_triton.runtime.fastertransformer.docker import package

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "mpirun").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    (bin_dir / "mpirun").chmod(0o755)
    text = SERVE_SH.format(
        models_dir="/models",
        work_dir=str(tmp_path),
        tritonserver="tritonserver",
        devices="0",
        gpus=1,
        metrics_address='--metrics-address="$address" ' if version >= "23.06" else "",
        restricted_api="yes" if version >= "24.01" else "",
        admin_apis=package.ADMIN_APIS,
        admin_header=ADMIN_KEY_HEADER,
    )
    script = tmp_path / "serve.sh"
    script.write_text(text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FTX_")}
    return subprocess.run(
        ["/bin/sh", str(script)],
        env={**clean, "PATH": f"{bin_dir}:{clean['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_packaged_entrypoint_binds_loopback_unless_asked(tmp_path: Path) -> None:
    done = _serve_sh(tmp_path, "24.01", {})
    args = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert {"--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"} <= set(args)
    assert not any("restricted" in a for a in args)


def test_the_packaged_entrypoint_needs_a_key_to_serve_wider(tmp_path: Path) -> None:
    refused = _serve_sh(tmp_path, "24.01", {"FTX_HTTP_ADDRESS": "0.0.0.0"})
    assert refused.returncode != 0 and "FTX_ADMIN_KEY" in refused.stderr and not refused.stdout
    served = _serve_sh(tmp_path, "24.01", {"FTX_HTTP_ADDRESS": "0.0.0.0", "FTX_ADMIN_KEY": "s3cret"})
    assert served.returncode == 0, served.stderr
    args = served.stdout.split()
    assert "--http-address=0.0.0.0" in args and "--metrics-address=0.0.0.0" in args
    assert "--http-restricted-api=model-repository,shared-memory,logging,trace:ftx-admin-key=s3cret" in args
    old = _serve_sh(tmp_path, "23.05", {"FTX_HTTP_ADDRESS": "0.0.0.0"})  # cannot restrict: says so, still serves
    assert old.returncode == 0 and "cannot restrict" in old.stderr
    assert "--http-address=0.0.0.0" in old.stdout.split() and "--metrics-address" not in old.stdout
