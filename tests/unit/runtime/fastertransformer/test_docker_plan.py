"""``describe_run``: ``ftx run gptj --runtime fastertransformer --dry-run --tp 4`` prints the GPT-J guide's steps
(image build, convert, tune, configure, serve on 4 GPUs) as exact commands, with nothing left to edit."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from ftx_gptj.family import GPTJ, GPTJ_6B_CONFIG
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer import gpus as gpus_mod
from ftx_triton.runtime.fastertransformer.docker.plan import describe_run
from ftx_triton.runtime.fastertransformer.gpus import Gpu

H100 = tuple(Gpu(i, "NVIDIA H100 80GB HBM3", (9, 0)) for i in range(8))


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Path, Path, Path]:
    monkeypatch.setenv("FTX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(gpus_mod, "local_gpus", lambda: H100)
    monkeypatch.setattr("ftx_triton.runtime.fastertransformer.docker.plan.local_gpus", lambda: H100)
    ckpt = tmp_path / "home" / "store" / "convert" / "c0ffee" / "4-gpu"
    repo = tmp_path / "home" / "store" / "configure" / "beef"
    settings = RunSettings.of("gptj", tp=4, runtime="fastertransformer", weight_dtype="fp16", dry_run=True)
    lines = describe_run(settings, GPTJ(), GPTJ().spec(GPTJ_6B_CONFIG), ckpt, repo)
    return lines, ckpt, repo, tmp_path / "home" / "docker" / "work" / "ftx-gptj-tp4pp1"


def _step(lines: list[str], number: int) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{number}. "))
    end = next((i for i, line in enumerate(lines) if i > start and line[:1].isdigit()), len(lines))
    return lines[start:end]


def _commands(block: list[str]) -> list[list[str]]:
    return [shlex.split(line.split("$ ", 1)[1]) for line in block if "$ " in line]


def test_steps_in_guide_order(plan: tuple[list[str], Path, Path, Path]) -> None:
    lines = plan[0]
    print("\n".join(lines))
    assert lines[0].startswith("fastertransformer runtime: GPT-J") and "tp 4 x pp 1 = 4 GPU(s) on 1 node(s)" in lines[0]
    heads = [line.split()[1] for line in lines if line[:1].isdigit()]
    assert heads == ["image", "convert", "tune", "configure", "serve"]
    assert not any("<" in line and ">" in line for line in lines)  # no placeholder left to fill in


def test_image_step_builds_for_hopper(plan: tuple[list[str], Path, Path, Path]) -> None:
    block = _step(plan[0], 1)
    assert _commands(block) == [
        [
            "ftx",
            "image",
            "build",
            "--tag",
            "ftx/triton-fastertransformer:23.05",
            "--triton-version",
            "23.05",
            "--sm",
            "90",
        ]
    ]
    text = "\n".join(block)
    assert "--branch" not in text and " main " not in text  # never a moving branch
    assert (
        "fetch -q --depth 1 https://github.com/triton-inference-server/fastertransformer_backend.git "
        "c6936c39be6fc57c161db34cfe5c45d1bef81ee2" in text
    )
    assert "GIT_TAG df4a7534860137e060e18d2ebf019906120ea204" in text
    sed = next(line for line in block if "sed -i -E" in line)
    assert "-D SM=90" in sed and "fastertransformer_backend/docker/Dockerfile" in sed
    assert (
        "docker build --rm --build-arg TRITON_VERSION=23.05 --build-arg "
        "BASE_IMAGE=nvcr.io/nvidia/tritonserver:23.05-py3 -t ftx/triton-fastertransformer:23.05 "
        "-f fastertransformer_backend/docker/Dockerfile fastertransformer_backend"
    ) in text


def test_convert_step(plan: tuple[list[str], Path, Path, Path]) -> None:
    lines, ckpt, _, _ = plan
    block = _step(lines, 2)
    assert f"hf://EleutherAI/gpt-j-6b -> {ckpt}" in block[0]
    assert _commands(block) == [
        [
            "ftx",
            "convert",
            "hf://EleutherAI/gpt-j-6b",
            "--family",
            "gptj",
            "--tp",
            "4",
            "--weight-dtype",
            "fp16",
            "-o",
            str(ckpt.parent),
        ]
    ]


def test_tune_step_runs_gpt_gemm_for_tp4(plan: tuple[list[str], Path, Path, Path]) -> None:
    lines, _, _, work = plan
    block = _step(lines, 3)
    mkdir, run = _commands(block)
    assert mkdir == ["mkdir", "-p", str(work)]
    assert run[:2] == ["docker", "run"] and run[run.index("--gpus") + 1] == '"device=0"'
    assert run[run.index("-w") + 1] == str(work) and f"{work}:{work}" in run
    image = run.index("ftx/triton-fastertransformer:23.05")
    assert run[image + 1 :] == [
        "/workspace/build/fastertransformer_backend/build/bin/gpt_gemm",
        "8",
        "1",
        "512",
        "16",
        "256",
        "16384",
        "50400",
        "1",
        "4",
    ]


def test_configure_step(plan: tuple[list[str], Path, Path, Path]) -> None:
    lines, ckpt, repo, _ = plan
    text = "\n".join(_step(lines, 4))
    assert str(repo / "fastertransformer" / "config.pbtxt") in text
    assert (
        f"parameters: model_type GPT-J, tensor_para_size 4, pipeline_para_size 1, data_type fp16, "
        f"model_checkpoint_path {ckpt}"
    ) in text
    assert "instance_group count 1 KIND_CPU" in text


def test_serve_step_on_4_gpus(plan: tuple[list[str], Path, Path, Path]) -> None:
    lines, ckpt, repo, work = plan
    block = _step(lines, 5)
    assert "4 GPU(s) per node (host GPUs 0,1,2,3), HTTP 127.0.0.1:8000" in block[0]
    (run,) = _commands(block)
    assert run[run.index("--gpus") + 1] == '"device=0,1,2,3"'
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in run
    for flag, value in (("--shm-size", "1g"), ("--ipc", "host"), ("--network", "host"), ("-w", str(work))):
        assert run[run.index(flag) + 1] == value
    assert ["--ulimit", "memlock=-1"] == run[run.index("memlock=-1") - 1 : run.index("memlock=-1") + 1]
    assert "stack=67108864" in run
    assert f"{repo}:{repo}:ro" in run and f"{ckpt}:{ckpt}:ro" in run and f"{work}:{work}" in run
    image = run.index("ftx/triton-fastertransformer:23.05")
    assert run[image + 1 :] == [
        "mpirun",
        "-n",
        "1",
        "--allow-run-as-root",
        "/opt/tritonserver/bin/tritonserver",
        f"--model-repository={repo}",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
    ]
    assert "http://127.0.0.1:8000/v2/health/ready" in block[-1]


def test_no_tune_and_multi_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("ftx_triton.runtime.fastertransformer.docker.plan.local_gpus", lambda: ())
    hosts = tmp_path / "hosts"
    hosts.write_text("node-a gpus=4\nnode-b gpus=4  # second node\n")
    settings = RunSettings.of("gptj", tp=4, pp=2, tune=False, hosts=str(hosts), weight_dtype="fp32")
    lines = describe_run(settings, GPTJ(), GPTJ().spec(GPTJ_6B_CONFIG), tmp_path / "c" / "4-gpu", tmp_path / "r")
    text = "\n".join(lines)
    assert "3. tune       skipped — --no-tune: FasterTransformer will use cuBLAS's default GEMM" in text
    assert "no local GPU found" in text and "pass --sm 90" in text
    assert "on 2 node(s)" in lines[0]
    assert "hostfile" in text and "node-a slots=1; node-b slots=1" in text
    serve = _commands(_step(lines, 5))
    worker, rank0 = serve
    assert worker[worker.index("--gpus") + 1] == '"device=0,1,2,3"' and worker[-4:] == [
        "/usr/sbin/sshd",
        "-D",
        "-p",
        "2222",
    ]
    image = rank0.index("ftx/triton-fastertransformer:23.05")
    assert rank0[image + 1 : image + 9] == [
        "mpirun",
        "-n",
        "2",
        "--allow-run-as-root",
        "--hostfile",
        str(tmp_path / "home" / "docker" / "work" / "ftx-gptj-tp4pp2" / "ftx-hostfile"),
        "--map-by",
        "ppr:1:node",
    ]
