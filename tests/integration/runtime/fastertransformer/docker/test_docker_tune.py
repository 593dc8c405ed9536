"""GEMM tuning in the FasterTransformer image: argument lists, the tuning container, the tune stage.

The GEMM tools and GPUs cannot run here: the exact argument lists and container spec are checked as
data, and the container itself runs with the STAND-IN ``gpt_gemm``/``t5_gemm`` of ``docker_daemon``
(a script at the real path that writes ``gemm_config.in`` naming its arguments) on a real daemon,
without the GPU device request this daemon cannot satisfy.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import docker_daemon
import pytest
from ftx_gptj.family import GPTJ, GPTJ_6B_CONFIG
from ftx_t5.family import T5
from ftx_triton.engine.default_plugins import tune as tune_plugin
from ftx_triton.engine.stages import tune_key_inputs
from ftx_triton.errors import ToolError
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer import gpus as gpus_mod
from ftx_triton.runtime.fastertransformer.docker.plugin import DockerFasterTransformer
from ftx_triton.runtime.fastertransformer.docker.tune import gemm_command, run_tune, tune_spec
from ftx_triton.runtime.fastertransformer.gpus import Gpu
from ftx_triton.runtime.python.plugin import PythonRuntime
from ftx_triton.store.artifact_store import ArtifactStore

docker_client = docker_daemon.docker_client  # a session fixture (shared daemon and images; see docker_daemon)
docker_env = docker_daemon.docker_env  # a session fixture (shared daemon and images; see docker_daemon)
standin_image = docker_daemon.standin_image  # a session fixture (shared daemon and images; see docker_daemon)

BIN = "/workspace/build/fastertransformer_backend/build/bin"


def test_gpt_gemm_arguments_follow_the_guide() -> None:
    """The backend guide's example: gpt_gemm 8 1 32 16 256 16384 50400 1 2."""
    spec = GPTJ().spec(GPTJ_6B_CONFIG)
    s = RunSettings.of("gptj", tp=2, data_type="fp16", tune_batch=8, tune_beam=1, tune_max_input_len=32)
    assert gemm_command(GPTJ(), spec, s) == [f"{BIN}/gpt_gemm", "8", "1", "32", "16", "256", "16384", "50400", "1", "2"]


def test_t5_gemm_arguments_come_from_the_family() -> None:
    """t5-3b fp16 tp 1 -> t5_gemm 8 4 32 1024 32 128 16384 1024 32 128 16384 32128 1 1."""
    family = T5()
    spec = family.spec(family.presets["t5"].hf_config)
    s = RunSettings.of("t5", tp=1, data_type="fp16", tune_batch=8, tune_beam=4, tune_max_input_len=32)
    assert gemm_command(family, spec, s) == [
        f"{BIN}/t5_gemm",
        "8",
        "4",
        "32",
        "1024",
        "32",
        "128",
        "16384",
        "1024",
        "32",
        "128",
        "16384",
        "32128",
        "1",
        "1",
    ]


def test_tuning_container_spec(tmp_path: Path) -> None:
    spec = tune_spec(image="img:1", command=[f"{BIN}/gpt_gemm", "8"], work_dir=tmp_path, gpu=3, user="1000:1000")
    assert spec.gpus == ("3",)
    assert spec.working_dir == str(tmp_path)
    assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [(str(tmp_path), str(tmp_path), False)]
    assert spec.user == "1000:1000" and spec.network_mode == "none"
    kwargs = spec.create_kwargs()
    request = kwargs["device_requests"][0]
    assert request["DeviceIDs"] == ["3"] and request["Capabilities"] == [["gpu"]]
    assert kwargs["working_dir"] == str(tmp_path) and kwargs["command"] == [f"{BIN}/gpt_gemm", "8"]
    assert spec.docker_run_line() == (
        f"docker run --rm --init --gpus '\"device=3\"' --network none -u 1000:1000 -v {tmp_path}:{tmp_path} "
        f"-w {tmp_path} img:1 {BIN}/gpt_gemm 8"
    )
    assert tune_spec(image="i", command=["x"], work_dir=tmp_path, gpu=0).user == f"{os.getuid()}:{os.getgid()}"


@pytest.mark.docker
def test_standin_gemm_tool_writes_gemm_config_in_the_work_dir(
    docker_client: Any, standin_image: str, tmp_path: Path
) -> None:
    """Stand-in gpt_gemm in the tuning container (no GPU request here): gemm_config.in lands in the work dir."""
    spec = GPTJ().spec(GPTJ_6B_CONFIG)
    command = gemm_command(GPTJ(), spec, RunSettings.of("gptj", tp=4, data_type="fp16"))
    container = tune_spec(image=standin_image, command=command, work_dir=tmp_path, gpu=0).with_(gpus=None)
    lines: list[str] = []
    result = run_tune(docker_client, container, say=lines.append, prefix="gpt_gemm")
    assert result.path == tmp_path / "gemm_config.in"
    assert "standin gpt_gemm 8 1 512 16 256 16384 50400 1 4" in result.path.read_text()
    assert any(
        line.startswith("[gpt_gemm] standin-gemm: gpt_gemm 8 1 512") and f"uid {os.getuid()}" in line for line in lines
    )
    assert result.path.stat().st_uid == os.getuid()
    assert not docker_client.containers.list(all=True, filters={"label": "org.ftx.role=tune"})


@pytest.mark.docker
def test_gemm_tool_usage_exit_0_without_a_file_is_an_error(
    docker_client: Any, standin_image: str, tmp_path: Path
) -> None:
    """Like the real tool, the stand-in prints its usage and exits 0 on a wrong argument count."""
    container = tune_spec(image=standin_image, command=[f"{BIN}/gpt_gemm", "8", "1"], work_dir=tmp_path, gpu=0).with_(
        gpus=None
    )
    with pytest.raises(ToolError, match="wrote no gemm_config.in") as err:
        run_tune(docker_client, container, say=lambda text: None)
    assert "Usage: gpt_gemm" in (err.value.hint or "")


def _ctx(tmp_path: Path, **settings: Any) -> StageContext:
    s = RunSettings.of("gptj", runtime="fastertransformer", **{"tp": 1, "weight_dtype": "fp32", **settings})
    return StageContext(
        settings=s, store=ArtifactStore(tmp_path / "home"), home=tmp_path / "home", runtime=DockerFasterTransformer()
    )


def _tune(ctx: StageContext, dest: Path) -> Any:
    return tune_plugin.ftx_tune(
        family=GPTJ(), spec=GPTJ().spec(GPTJ_6B_CONFIG), dest=dest, ctx=ctx, runtime=ctx.runtime
    )


def _key(ctx: StageContext, spec: Any = None) -> dict[str, Any]:
    return tune_key_inputs(GPTJ(), spec or GPTJ().spec(GPTJ_6B_CONFIG), ctx.runtime, ctx.settings)


def test_no_tune_says_what_it_costs(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, tune=False)
    result = _tune(ctx, tmp_path)
    assert result is not None and not result.tuned and result.path is None
    assert "default GEMM algorithms" in result.reason and "slower per token" in result.reason
    key = _key(ctx)  # no docker needed
    assert key["settings"]["tune"] is False and "target" not in key


def test_python_runtime_tunes_nothing(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    ctx = dataclasses.replace(ctx, runtime=PythonRuntime())
    result = _tune(ctx, tmp_path)
    assert result is not None and not result.tuned and "python runtime" in result.reason
    assert "target" not in _key(ctx)


@pytest.mark.docker
def test_tune_key_holds_gpu_model_image_id_and_arguments(
    docker_env: Any, standin_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h100 = (Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0)), Gpu(1, "NVIDIA H100 80GB HBM3", (9, 0)))
    monkeypatch.setattr(gpus_mod, "local_gpus", lambda: h100)
    spec = GPTJ().spec(GPTJ_6B_CONFIG)
    key = _key(_ctx(tmp_path, tp=2, image=standin_image), spec)["target"]
    assert key["gpu"] == "NVIDIA H100 80GB HBM3"
    assert key["image_id"] == docker_env.images.get(standin_image).id
    assert key["args"] == ["8", "1", "512", "16", "256", "16384", "50400", "0", "2"]
    a100 = (Gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0)), Gpu(1, "NVIDIA A100-SXM4-80GB", (8, 0)))
    monkeypatch.setattr(gpus_mod, "local_gpus", lambda: a100)
    other = _key(_ctx(tmp_path, tp=2, image=standin_image), spec)["target"]
    assert other["gpu"] == "NVIDIA A100-SXM4-80GB" and other != key


@pytest.mark.docker
def test_tune_stage_without_the_image_says_how_to_build_it(docker_env: Any, tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, image="ftx-test/absent:1")
    with pytest.raises(ToolError, match="not on this Docker host") as err:
        _key(ctx)
    assert "ftx image ls" in (err.value.hint or "")


@pytest.mark.docker
def test_tune_stage_on_a_daemon_without_gpus_says_how_to_fix(
    docker_env: Any, standin_image: str, tmp_path: Path
) -> None:
    """The whole FT tune path (device request included) on this GPU-less daemon: a clear error, nothing left."""
    ctx = _ctx(tmp_path, image=standin_image)
    with pytest.raises(ToolError, match="cannot give GPUs to containers") as err:
        _tune(ctx, tmp_path)
    assert "NVIDIA Container Toolkit" in (err.value.hint or "")
    assert not docker_env.containers.list(all=True, filters={"label": "org.ftx.role=tune"})


@pytest.mark.docker
def test_cli_tune_on_a_daemon_without_gpus(
    docker_env: Any, standin_image: str, ftx_cli: Any, tiny_gptj_dir: Path
) -> None:
    """`ftx tune` converts, resolves the image and starts the GEMM tool's container; here the GPU request fails."""
    result = ftx_cli("tune", str(tiny_gptj_dir), "--image", standin_image, "--tune-batch", "4")
    assert result.exit_code == 1, result.stderr + repr(result.exception)
    assert (
        "cannot give GPUs to containers" in result.stderr
        and "hint: install the NVIDIA Container Toolkit" in result.stderr
    )
