"""The fastertransformer runtime's serving container against a real Docker daemon.

The container runs the STAND-IN image of ``docker_daemon`` (busybox scripts at the real
``mpirun``/``tritonserver`` paths), because the real Triton + FasterTransformer image and GPUs cannot
run here. Everything else is ftx's real code path: the container spec ftx plans (mounts at the same
absolute paths, read-only; working directory with gemm_config.in; shm; memlock/stack ulimits; IPC and
network host; the mpirun command line), readiness on 127.0.0.1, the streamed log with its prefix,
log scanning (each planted FasterTransformer failure line must stop the run with its cause and fix),
stop and removal, Ctrl-C. Only the GPU device request is dropped (``spec.with_(gpus=None)``): this
daemon has no NVIDIA runtime, and one test checks the error ftx gives for exactly that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker_daemon
import pytest
from docker_daemon import can_raise, http_get, make_repository, permitted_ulimits
from ftx_triton.errors import ServeError
from ftx_triton.plan.artifacts import GemmConfig, ModelRepository
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer.docker.options import MEMLOCK, STACK, DockerOptions
from ftx_triton.runtime.fastertransformer.docker.plugin import DockerFasterTransformer
from ftx_triton.runtime.fastertransformer.docker.serve import (
    FtServer,
    checkpoint_dirs,
    plan_serve,
    serve_fastertransformer,
)
from ftx_triton.runtime.fastertransformer.logscan import ScanContext
from ftx_triton.server.ports import free_ports
from ftx_triton.store.artifact_store import ArtifactStore

docker_client = docker_daemon.docker_client  # a session fixture (shared daemon and images; see docker_daemon)
standin_image = docker_daemon.standin_image  # a session fixture (shared daemon and images; see docker_daemon)

pytestmark = pytest.mark.docker


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "ftx-home"
    monkeypatch.setenv("FTX_HOME", str(home))
    return home


def _server(
    client: Any,
    image: str,
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    gemm: Path | None = None,
    weights: bool = True,
    ready_timeout_s: float = 30,
    model: str = "tiny",
    tp: int = 1,
    lines: list[str] | None = None,
) -> FtServer:
    repo, _ = make_repository(tmp_path / "store", tp=tp, weights=weights)
    settings = RunSettings.of(model, tp=tp, runtime="fastertransformer", image=image, env=env or {})
    gemm_config = GemmConfig(gemm, gemm is not None, "")
    plan = plan_serve(
        repository=repo,
        checkpoints=checkpoint_dirs(repo),
        settings=settings,
        family="gptj",
        options=DockerOptions.from_settings(settings),
        gemm=gemm_config,
        ports=free_ports(),
    )
    # the test daemon has no NVIDIA runtime: run the planned container without its GPU request (and with
    # memlock clamped to what this sandbox allows, see permitted_ulimits)
    spec = plan.spec.with_(gpus=None, ulimits=permitted_ulimits(dict(plan.spec.ulimits)))
    plan = dataclasses.replace(plan, spec=spec)
    out = lines if lines is not None else []
    return FtServer(
        client,
        plan,
        scan=ScanContext(tp=tp, expect_gemm=plan.expect_gemm, gpu_sm=(90,)),
        say=out.append,
        ready_timeout_s=ready_timeout_s,
        stop_timeout_s=2,
    )


def _gone(client: Any, name: str) -> bool:
    return not client.containers.list(all=True, filters={"name": f"^/{name}$"})


def test_standin_serves_with_the_planned_container(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    """Stand-in tritonserver: the container ftx plans really has the mounts, cwd, ulimits, shm, IPC and command."""
    gemm = tmp_path / "tuned" / "gemm_config.in"
    gemm.parent.mkdir()
    gemm.write_text("batch_size ... tuned\n")
    lines: list[str] = []
    server = _server(docker_client, standin_image, tmp_path, gemm=gemm, lines=lines)
    repo = tmp_path / "store" / "repository"
    ckpt = tmp_path / "store" / "convert" / "1-gpu"
    with server:
        status, _ = http_get(f"http://{server.http_url}/v2/health/ready")
        assert status == 200
        assert http_get(f"http://{server.http_url}/v2/models/fastertransformer/ready")[0] == 200
        attrs = docker_client.containers.get(server.name).attrs
        host = attrs["HostConfig"]
        mounts = {m["Destination"]: m for m in attrs["Mounts"]}
        assert mounts[str(repo.resolve())]["Source"] == str(repo.resolve()) and not mounts[str(repo.resolve())]["RW"]
        assert mounts[str(ckpt)]["Source"] == str(ckpt) and not mounts[str(ckpt)]["RW"]
        work = server.plan.work_dir
        assert mounts[str(work)]["RW"] and attrs["Config"]["WorkingDir"] == str(work)
        assert host["IpcMode"] == "host" and host["NetworkMode"] == "host" and host["Init"] is True
        assert host["ShmSize"] == 1 << 30
        memlock = server.spec.ulimits["memlock"]
        assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {
            "memlock": (memlock, memlock),
            "stack": (67108864, 67108864),
        }
        assert "CUDA_VISIBLE_DEVICES=0" in attrs["Config"]["Env"]
        cmd = attrs["Config"]["Cmd"]
        assert cmd[:4] == ["mpirun", "-n", "1", "--allow-run-as-root"]
        assert cmd[4:] == [
            "/opt/tritonserver/bin/tritonserver",
            f"--model-repository={repo.resolve()}",
            f"--http-port={server.plan.ports.http}",
            f"--grpc-port={server.plan.ports.grpc}",
            f"--metrics-port={server.plan.ports.metrics}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
        ]
        text = "\n".join(lines)
        prefix = f"[{server.name}] "
        assert f"{prefix}standin-mpirun: -n 1 allow-run-as-root=yes" in text
        assert f"{prefix}standin-tritonserver: cwd {work}" in text
        shown = "unlimited" if memlock == -1 else str(memlock // 1024)
        assert f"{prefix}standin-tritonserver: ulimit-l {shown} ulimit-s 65536" in text
        assert f"{prefix}standin-tritonserver: ipc {os.readlink('/proc/self/ns/ipc')}" in text  # the host's IPC
        assert f"{prefix}standin-tritonserver: repository read-only" in text
        assert f"{prefix}standin-tritonserver: checkpoint read-only" in text
        assert f"{prefix}standin-tritonserver: read {ckpt}/config.ini" in text
        assert "gemm_config.in found (batch_size ... tuned" in text
        assert (work / "gemm_config.in").read_text() == gemm.read_text()
        assert "successfully loaded 'fastertransformer'" in server.log_path.read_text()
        assert server.running
    assert _gone(docker_client, server.name)


PLANTED = [
    (
        "[FT][WARNING] file /m/1-gpu/model.layers.0.attention.dense.weight.0.bin cannot be opened, loading model fails! ",
        "could not open the weight file /m/1-gpu/model.layers.0.attention.dense.weight.0.bin",
        "convert again",
    ),
    (
        "[ERROR] world_size (4) should equal to tensor_para_size_ * pipeline_para_size_ (1 * 1 here) ",
        "sees 4 GPU(s) but the model is configured for tensor_para_size 1",
        "exactly tp x pp GPUs",
    ),
    (
        "[FT][ERROR] CUDA runtime error: invalid device function /workspace/build/fastertransformer_backend/build/"
        "_deps/repo-ft-src/src/fastertransformer/kernels/layernorm_kernels.cu:180 ",
        "has no GPU code for this GPU",
        "ftx image build --sm 90",
    ),
    (
        "[FT][ERROR] CUDA runtime error: no kernel image is available for execution on the device x.cu:1",
        "has no GPU code for this GPU",
        "ftx image build --sm 90",
    ),
    ("[ERROR] Can't load '/m/1-gpu/config.ini'", "cannot read /m/1-gpu/config.ini", "model_checkpoint_path"),
    (
        "E0101 00:00:00.000000 1 model_lifecycle.cc:596] failed to load 'fastertransformer' version 1: Unsupported: "
        "Number of visible GPUs must be evenly divisble by TP * PP",
        "visible GPUs must be a multiple of TP x PP",
        "exactly tp x pp",
    ),
]


@pytest.mark.parametrize(
    ("line", "message", "hint"),
    PLANTED,
    ids=["weights", "world-size", "invalid-device-function", "no-kernel-image", "config-ini", "visible-gpus"],
)
def test_planted_ft_failure_stops_the_run(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path, line: str, message: str, hint: str
) -> None:
    """Stand-in tritonserver prints one FasterTransformer failure line and keeps serving: ftx must stop it."""
    server = _server(docker_client, standin_image, tmp_path, env={"FTX_STANDIN_PLANT": line})
    with pytest.raises(ServeError) as err:
        server.start()
    assert message in err.value.message
    assert hint in (err.value.hint or "")
    assert _gone(docker_client, server.name)


def test_missing_weight_file_is_an_error_not_garbage(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    """A checkpoint without model.wte.bin: the stand-in warns like FasterTransformer and serves; ftx refuses."""
    server = _server(docker_client, standin_image, tmp_path, weights=False)
    with pytest.raises(ServeError, match=r"could not open the weight file .*/1-gpu/model\.wte\.bin"):
        server.start()
    assert _gone(docker_client, server.name)


def test_untuned_gemm_fallback_is_an_error_only_when_tuning_was_expected(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    """Stand-in prints "gemm_config.in is not found" when its cwd lacks the file."""
    untuned = _server(docker_client, standin_image, tmp_path / "a", model="untuned")
    with untuned:
        assert untuned.scanner.gemm_not_found and not untuned.scanner.errors
    gemm = tmp_path / "gemm_config.in"
    gemm.write_text("tuned\n")
    tuned = _server(docker_client, standin_image, tmp_path / "b", gemm=gemm, model="tuned")
    # the tuned file never reaches the server's working directory (a broken placement)
    tuned.prepare = lambda: (
        tuned.plan.work_dir.mkdir(parents=True, exist_ok=True),  # type: ignore[method-assign]
        tuned.log_path.write_text(""),
    )
    with pytest.raises(ServeError, match="gemm_config.in was tuned for this run but FasterTransformer did not find it"):
        tuned.start()
    assert _gone(docker_client, tuned.name)


def test_exit_before_ready_shows_the_log_tail(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    server = _server(docker_client, standin_image, tmp_path, env={"FTX_STANDIN_EXIT": "3"})
    with pytest.raises(ServeError, match="exited with code 3 before it was ready") as err:
        server.start()
    assert "successfully loaded 'fastertransformer'" in (err.value.hint or "")
    assert _gone(docker_client, server.name)


def test_readiness_timeout_stops_the_container(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    server = _server(docker_client, standin_image, tmp_path, env={"FTX_STANDIN_DELAY": "60"}, ready_timeout_s=2)
    with pytest.raises(ServeError, match="not ready after 2s"):
        server.start()
    assert _gone(docker_client, server.name)


@contextlib.contextmanager
def _ctrl_c_after(seconds: float) -> Iterator[None]:
    """A SIGINT to this process ``seconds`` in; the block must end in KeyboardInterrupt."""
    # A shell that starts pytest in the background leaves SIGINT ignored; Ctrl-C must still mean stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        timer.cancel()


def test_ctrl_c_while_loading_stops_and_removes(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    server = _server(docker_client, standin_image, tmp_path, env={"FTX_STANDIN_DELAY": "60"})
    with _ctrl_c_after(1.5):
        server.start()
    assert _gone(docker_client, server.name)


def test_ctrl_c_while_serving_stops_and_removes(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    server = _server(docker_client, standin_image, tmp_path)
    server.start()
    import subprocess

    with pytest.raises(subprocess.TimeoutExpired):
        server.wait(timeout=0.3)
    with _ctrl_c_after(0.5):
        server.wait()
    assert _gone(docker_client, server.name)


def test_second_server_for_the_same_model_is_refused(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    first = _server(docker_client, standin_image, tmp_path / "a")
    with first:
        second = _server(docker_client, standin_image, tmp_path / "b")
        with pytest.raises(ServeError, match="already running"):
            second.start()
        assert first.running
    leftover = docker_client.containers.create(first.spec.image, ["true"], name=first.name)  # an exited leftover
    assert leftover.status == "created"
    with _server(docker_client, standin_image, tmp_path / "c") as third:
        assert third.running
    assert _gone(docker_client, first.name)


def test_serve_without_nvidia_runtime_says_how_to_fix(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    """The whole serve_fastertransformer path with its GPU device request, on a daemon without NVIDIA runtime."""
    repo, _ = make_repository(tmp_path / "store")
    ports = free_ports()
    settings = RunSettings.of(
        "tiny",
        runtime="fastertransformer",
        tp=1,
        http_port=ports.http,
        grpc_port=ports.grpc,
        metrics_port=ports.metrics,
        image=standin_image,
    )
    ctx = StageContext(settings=settings, store=ArtifactStore(home), home=home, runtime=DockerFasterTransformer())
    repository = ModelRepository(repo, "fastertransformer", ("fastertransformer",), "gptj")
    with pytest.raises(ServeError) as err:
        serve_fastertransformer(
            repository, GemmConfig(None, False, "--no-tune"), ctx, client=docker_client, say=lambda text: None
        )
    assert "cannot give GPUs to containers" in err.value.message
    assert "NVIDIA Container Toolkit" in (err.value.hint or "")
    assert _gone(docker_client, "ftx-gptj-tiny-tp1pp1")


@pytest.mark.skipif(can_raise(resource.RLIMIT_MEMLOCK), reason="this host lets dockerd raise memlock to unlimited")
def test_memlock_refused_by_the_daemon_says_why(
    docker_client: Any, standin_image: str, tmp_path: Path, home: Path
) -> None:
    """Where dockerd lacks CAP_SYS_RESOURCE (this sandbox, rootless Docker) memlock=-1 fails: ftx explains it."""
    server = _server(docker_client, standin_image, tmp_path)
    server.spec = server.spec.with_(ulimits={"memlock": MEMLOCK, "stack": STACK})  # what ftx plans, unclamped
    with pytest.raises(ServeError, match="may not raise the memlock limit") as err:
        server.start()
    assert "LimitMEMLOCK=infinity" in (err.value.hint or "")
    assert _gone(docker_client, server.name)
