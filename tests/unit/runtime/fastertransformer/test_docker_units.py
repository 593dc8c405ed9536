"""The fastertransformer runtime's pure parts (no daemon): log rules, hosts, GPUs/SM, container specs,
the serving plan, Dockerfile patching, the build stream, error explanations and options."""

from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path

import pytest
from ftx_triton.errors import ConfigError, ServeError, ToolError
from ftx_triton.plan.artifacts import GemmConfig
from ftx_triton.plan.settings import RunSettings
from ftx_triton.repository.model_config import FtModelOptions, build_ft_model_config, write_config
from ftx_triton.runtime.fastertransformer import gpus as gpus_mod
from ftx_triton.runtime.fastertransformer.docker.client import connect, explain
from ftx_triton.runtime.fastertransformer.docker.image import BuildDisplay, patch_dockerfile, stream_build
from ftx_triton.runtime.fastertransformer.docker.options import DockerOptions
from ftx_triton.runtime.fastertransformer.docker.serve import checkpoint_dirs, choose_ports, plan_serve
from ftx_triton.runtime.fastertransformer.docker.spec import ContainerSpec, Mount
from ftx_triton.runtime.fastertransformer.gpus import Gpu, default_sm, parse_sm_list, select_gpus
from ftx_triton.runtime.fastertransformer.hosts import HostList, mpirun_argv, node_layout, read_hosts
from ftx_triton.runtime.fastertransformer.logscan import LogScanner, ScanContext
from ftx_triton.runtime.fastertransformer.options import parse_env
from ftx_triton.server.ports import ServerPorts

# --------------------------------------------------------------------------- logscan

LINES = {
    "weight-missing": "[FT][WARNING] file /s/4-gpu/model.wte.bin cannot be opened, loading model fails! ",
    "weight-size": "[FT][WARNING] file /s/4-gpu/model.wte.bin only has 1024, but request 2048, loading model fails! ",
    "config-ini": "[ERROR] Can't load '/s/4-gpu/config.ini'",
    "world-size": "[ERROR] world_size (8) should equal to tensor_para_size_ * pipeline_para_size_ (4 * 1 here) ",
    "wrong-sm": "terminate called after throwing an instance of 'std::runtime_error'\n  what():  [FT][ERROR] CUDA "
    "runtime error: invalid device function /ft/src/fastertransformer/kernels/decoding_kernels.cu:52",
    "driver": "[FT][ERROR] CUDA runtime error: operation not supported /ft/src/fastertransformer/utils/allocator.h:181",
    "oom": "[FT][ERROR] CUDA runtime error: out of memory /ft/src/fastertransformer/utils/allocator.h:181",
    "kind-cpu": "E1122 model_lifecycle.cc:596] failed to load 'fastertransformer' version 1: Invalid argument: "
    "Instance Group: only KIND_CPU supports!",
    "load-failed": "E1122 model_lifecycle.cc:596] failed to load 'ensemble' version 1: Not found: tokenizer.json",
    "crash": "Signal (11) received.",
}


@pytest.mark.parametrize("kind", sorted(LINES))
def test_each_ft_failure_line_is_an_error_with_a_fix(kind: str) -> None:
    scanner = LogScanner(ScanContext(tp=4, pp=1, gpu_sm=(90,)))
    findings = [f for line in LINES[kind].splitlines() if (f := scanner.scan(line))]
    assert [f.kind for f in findings] == [kind]
    assert findings[0].severity == "error" and findings[0].hint


def test_wrong_sm_hint_names_this_gpu() -> None:
    finding = LogScanner(ScanContext(gpu_sm=(90,))).scan(
        "CUDA runtime error: no kernel image is available for execution on the device"
    )
    assert finding is not None and "ftx image build --sm 90" in finding.hint


def test_world_size_message_uses_the_numbers() -> None:
    finding = LogScanner(ScanContext(tp=4)).scan(LINES["world-size"])
    assert finding is not None
    assert "sees 8 GPU(s)" in finding.message and "tensor_para_size 4 x pipeline_para_size 1" in finding.message
    assert "--tp 4 --pp 1 as 4 GPU(s)" in finding.hint


def test_gemm_fallback_is_an_error_only_when_tuned() -> None:
    line = "[WARNING] gemm_config.in is not found; using default GEMM algo"
    relaxed = LogScanner(ScanContext(expect_gemm=False))
    assert relaxed.scan(line) is None and relaxed.gemm_not_found and not relaxed.errors
    strict = LogScanner(ScanContext(expect_gemm=True))
    finding = strict.scan(line)
    assert finding is not None and finding.kind == "gemm-missing" and finding.severity == "error"


def test_custom_all_reduce_falling_back_to_nccl_is_a_warning_naming_why() -> None:
    scanner = LogScanner()
    line = (
        "[FT][WARNING] custom all-reduce is off: GPU 0 cannot access the memory of GPU 1 "
        "(no NVLink or PCIe peer access); using NCCL"
    )
    finding = scanner.scan(line)
    assert finding is not None and finding.kind == "custom-all-reduce" and finding.severity == "warning"
    assert "GPU 0 cannot access the memory of GPU 1" in finding.message and "NCCL" in finding.message
    assert "--no-custom-all-reduce" in finding.hint and not scanner.errors
    assert scanner.scan("[FT][INFO] custom all-reduce on GPUs 0-1 (2 ranks, messages up to 50331648 bytes)") is None


def test_specific_cause_beats_generic_failure_and_counts_repeats() -> None:
    scanner = LogScanner()
    scanner.scan(LINES["load-failed"])
    for name in ("model.wte.bin", "model.lm_head.weight.bin"):
        scanner.scan(f"[FT][WARNING] file /s/1-gpu/{name} cannot be opened, loading model fails! ")
    scanner.scan("I1122 successfully loaded 'fastertransformer' version 1")
    first = scanner.first_error()
    assert first is not None and first.kind == "weight-missing"
    assert "(2 such lines" in scanner.summary(first)


def test_cout_variant_without_spaces() -> None:
    finding = LogScanner().scan("file/s/1-gpu/model.wte.bincannot be opened, loading model fails!")
    assert finding is not None and "/s/1-gpu/model.wte.bin" in finding.message


# --------------------------------------------------------------------------- hosts


def test_read_hosts(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode-a gpus=8\n\nnode-b slots=8   # second\n")
    hosts = read_hosts(path)
    assert hosts.hosts == ("node-a", "node-b") and hosts.gpus == (8, 8)
    path.write_text("node-a\nnode-a\n")
    with pytest.raises(ConfigError, match="listed twice"):
        read_hosts(path)
    path.write_text("node-a cores=4\n")
    with pytest.raises(ConfigError, match="unknown option"):
        read_hosts(path)
    path.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="lists no node"):
        read_hosts(path)
    with pytest.raises(ConfigError, match="cannot read the hosts file"):
        read_hosts(tmp_path / "missing")


def test_node_layout_rules() -> None:
    two = HostList(("a", "b"), (8, 8))
    layout = node_layout(two, tp=8, pp=2)
    assert (layout.nodes, layout.gpus_per_node, layout.hostfile_text()) == (2, 8, "a slots=1\nb slots=1\n")
    with pytest.raises(ConfigError, match=r"tp x pp = 8 x 1 = 8 but 2 nodes x 8 GPUs = 16") as err:
        node_layout(two, tp=8, pp=1)
    assert "--tp 8 --pp 2" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="exactly one model instance"):
        node_layout(two, tp=8, pp=2, instances=2)
    with pytest.raises(ConfigError, match="different GPU counts"):
        node_layout(HostList(("a", "b"), (8, 4)), tp=6, pp=2)
    assert node_layout(HostList(("a", "b", "c", "d"), (None,) * 4), tp=4, pp=2).gpus_per_node == 2
    with pytest.raises(ConfigError, match="cannot be split evenly over 3 nodes"):
        node_layout(HostList(("a", "b", "c"), (None,) * 3), tp=4, pp=1)


def test_several_instances_of_a_multi_gpu_model_are_refused_on_one_node() -> None:
    """They would share the tp x pp GPUs, each with its own all-reduce: the layout that hung under load."""
    with pytest.raises(ConfigError, match=r"--instances 2 with tp x pp = 2 x 1: .* wait on each other") as err:
        node_layout(None, tp=2, pp=1, instances=2)
    assert "--instances 1" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="--instances 3 with tp x pp = 1 x 2"):
        node_layout(HostList(("a",), (4,)), tp=1, pp=2, instances=3)
    assert node_layout(None, tp=1, pp=1, instances=4).gpus_per_node == 1  # one-GPU instances: no collective
    assert node_layout(None, tp=4, pp=1, instances=1).gpus_per_node == 4
    assert node_layout(None, tp=4, pp=1).nodes == 1
    with pytest.raises(ConfigError, match="do not fit on one node with 2 GPUs"):
        node_layout(HostList(("a",), (2,)), tp=4, pp=1)


def test_mpirun_argv() -> None:
    assert mpirun_argv(node_layout(None, tp=2, pp=1)) == ["mpirun", "-n", "1", "--allow-run-as-root"]
    argv = mpirun_argv(node_layout(HostList(("a", "b"), (4, 4)), tp=4, pp=2), "/w/ftx-hostfile")
    assert argv[:8] == [
        "mpirun",
        "-n",
        "2",
        "--allow-run-as-root",
        "--hostfile",
        "/w/ftx-hostfile",
        "--map-by",
        "ppr:1:node",
    ]
    assert ["-x", "CUDA_VISIBLE_DEVICES"] == argv[8:10]
    assert argv[-3:] == ["--mca", "plm_rsh_args", "-p 2222 -o StrictHostKeyChecking=no"]


# --------------------------------------------------------------------------- gpus


def test_parse_sm_list() -> None:
    assert parse_sm_list("90,80") == (80, 90)
    assert parse_sm_list("8.0 9.0") == (80, 90)
    assert parse_sm_list("sm_90;sm_86") == (86, 90)
    assert parse_sm_list([90, "80"]) == (80, 90)
    with pytest.raises(ConfigError, match="cannot be compiled for SM 100"):
        parse_sm_list("100")
    with pytest.raises(ConfigError, match="not a compute capability"):
        parse_sm_list("hopper")


def test_default_sm_and_select_gpus() -> None:
    mixed = (Gpu(0, "A100", (8, 0)), Gpu(1, "H100", (9, 0)), Gpu(2, "old", None))
    assert default_sm(mixed) == (80, 90)
    assert default_sm(()) == ()
    four = tuple(Gpu(i, "H100", (9, 0)) for i in range(4))
    assert select_gpus(2, None, four) == (0, 1)
    assert select_gpus(2, [3, 2], four) == (3, 2)
    with pytest.raises(ConfigError, match="exactly 2"):
        select_gpus(2, [0], four)
    with pytest.raises(ConfigError, match=r"GPU\(s\) \[7\] do not exist"):
        select_gpus(2, [0, 7], four)
    with pytest.raises(ConfigError, match="needs 8 GPUs but this machine has 4"):
        select_gpus(8, None, four)
    assert select_gpus(8, None, ()) == tuple(range(8))  # no local driver: the Docker host decides


def test_local_gpus_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in nvidia-smi on PATH answering the query ftx sends."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        '#!/bin/sh\necho "$@" > ' + str(tmp_path / "args") + "\n"
        "printf '0, NVIDIA H100 80GB HBM3, 9.0, GPU-aaa, 81559\\n1, NVIDIA H100 80GB HBM3, 9.0, GPU-bbb, 81559\\n'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    gpus_mod.local_gpus.cache_clear()
    try:
        found = gpus_mod.local_gpus()
    finally:
        gpus_mod.local_gpus.cache_clear()
    assert [(g.index, g.name, g.sm, g.memory_mib) for g in found] == [
        (0, "NVIDIA H100 80GB HBM3", 90, 81559),
        (1, "NVIDIA H100 80GB HBM3", 90, 81559),
    ]
    assert "--query-gpu=index,name,compute_cap,uuid,memory.total" in (tmp_path / "args").read_text()


def test_no_driver_no_nvidia_smi_does_not_ask_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without nvidia-smi and without an NVIDIA driver, the GPU list is empty and torch (seconds to import)
    is not asked: a stand-in module in ``sys.modules`` records any use."""
    used: list[str] = []

    class Spy:
        def __getattr__(self, name: str) -> object:
            used.append(name)
            raise AttributeError(name)

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(gpus_mod, "DRIVER_PATHS", (str(tmp_path / "no-driver"),))
    monkeypatch.setitem(sys.modules, "torch", Spy())
    gpus_mod.local_gpus.cache_clear()
    try:
        assert gpus_mod.local_gpus() == ()
        assert used == []
        monkeypatch.setattr(gpus_mod, "DRIVER_PATHS", (str(tmp_path),))  # a driver shows: torch is asked
        gpus_mod.local_gpus.cache_clear()
        assert gpus_mod.local_gpus() == ()
        assert "cuda" in used
    finally:
        gpus_mod.local_gpus.cache_clear()


# --------------------------------------------------------------------------- container spec


def test_container_spec_kwargs_and_run_line() -> None:
    spec = ContainerSpec(
        image="img",
        command=("mpirun", "-n", "1"),
        name="n",
        gpus=("2", "3"),
        environment={"CUDA_VISIBLE_DEVICES": "0,1"},
        mounts=(Mount("/r", "/r"), Mount("/w", "/w", False)),
        working_dir="/w",
        shm_size="1g",
        ulimits={"memlock": -1, "stack": 67108864},
        ipc_mode="host",
    )
    kwargs = spec.create_kwargs()
    assert kwargs["device_requests"][0]["DeviceIDs"] == ["2", "3"]
    assert [(m["Source"], m["Target"], m["ReadOnly"], m["Type"]) for m in kwargs["mounts"]] == [
        ("/r", "/r", True, "bind"),
        ("/w", "/w", False, "bind"),
    ]
    assert [(u["Name"], u["Soft"], u["Hard"]) for u in kwargs["ulimits"]] == [
        ("memlock", -1, -1),
        ("stack", 67108864, 67108864),
    ]
    assert (kwargs["ipc_mode"], kwargs["network_mode"], kwargs["shm_size"], kwargs["init"]) == (
        "host",
        "host",
        "1g",
        True,
    )
    assert spec.docker_run_line() == (
        "docker run --rm --name n --init --gpus '\"device=2,3\"' -e CUDA_VISIBLE_DEVICES=0,1 --shm-size 1g "
        "--ulimit memlock=-1 --ulimit stack=67108864 --ipc host --network host -v /r:/r:ro -v /w:/w -w /w img "
        "mpirun -n 1"
    )
    assert "device_requests" not in spec.with_(gpus=None).create_kwargs()


# --------------------------------------------------------------------------- the serving plan


def _repository(root: Path, tp: int = 2, inside: bool = False) -> tuple[Path, Path]:
    repo = root / "repo"
    ckpt = (repo / "fastertransformer" / "1" / f"{tp}-gpu") if inside else (root / "convert" / f"{tp}-gpu")
    ckpt.mkdir(parents=True)
    write_config(
        build_ft_model_config(FtModelOptions(model_type="GPT-J", io_kind="decoder", checkpoint_path=ckpt, tp=tp)),
        repo / "fastertransformer",
    )
    return repo, ckpt


def test_serve_plan_for_tp2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTX_HOME", str(tmp_path / "home"))
    repo, ckpt = _repository(tmp_path)
    assert checkpoint_dirs(repo) == [ckpt]
    s = RunSettings.of("EleutherAI/gpt-j-6b", tp=2, gpus="4,5", env=["FT_LOG_LEVEL=DEBUG"], shm_size="8g")
    gemm = tmp_path / "gemm_config.in"
    plan = plan_serve(
        repository=repo,
        checkpoints=[ckpt],
        settings=s,
        family="gptj",
        options=DockerOptions.from_settings(s),
        gemm=GemmConfig(gemm, True, ""),
        ports=ServerPorts(9000, 9001, 9002),
    )
    spec = plan.spec
    assert spec.name == "ftx-gptj-gpt-j-6b-tp2pp1"
    assert plan.work_dir == tmp_path / "home" / "docker" / "work" / spec.name
    assert spec.gpus == ("4", "5") and spec.environment == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "FTX_DEVICE": "gpu",
        "FT_LOG_LEVEL": "DEBUG",
    }
    assert [(m.source, m.read_only) for m in spec.mounts] == [
        (str(repo), True),
        (str(ckpt), True),
        (str(plan.work_dir), False),
    ]
    assert all(m.source == m.target for m in spec.mounts)
    assert spec.working_dir == str(plan.work_dir) and spec.shm_size == "8g"
    assert dict(spec.ulimits) == {"memlock": -1, "stack": 67108864}
    assert (spec.ipc_mode, spec.network_mode, spec.init) == ("host", "host", True)
    assert spec.command[:4] == ("mpirun", "-n", "1", "--allow-run-as-root")
    assert plan.ready_url == "http://127.0.0.1:9000/v2/health/ready" and plan.expect_gemm
    assert spec.labels["org.ftx.role"] == "serve" and spec.labels["org.ftx.http-port"] == "9000"


def test_serve_plan_edge_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTX_HOME", str(tmp_path / "home"))
    repo, ckpt = _repository(tmp_path / "a", tp=1, inside=True)
    s = RunSettings.of("m", host="0.0.0.0", tp=1)
    plan = plan_serve(
        repository=repo,
        checkpoints=checkpoint_dirs(repo),
        settings=s,
        family="gptj",
        options=DockerOptions(),
        gemm=None,
        ports=ServerPorts(1, 2, 3),
    )
    assert [m.source for m in plan.spec.mounts] == [str(repo), str(plan.work_dir)]  # checkpoint inside repo
    assert "--http-address=0.0.0.0" in plan.spec.command  # all interfaces, asked for
    assert plan.exposure is not None and "cannot restrict" in (plan.exposure.caveat or "")  # the 23.05 default image
    assert plan.ready_url.startswith("http://127.0.0.1:1/") and not plan.expect_gemm
    with pytest.raises(ConfigError, match="exactly 2"):
        plan_serve(
            repository=repo,
            checkpoints=[],
            settings=RunSettings.of("m", tp=2, gpus="0"),
            family="gptj",
            options=DockerOptions(gpus=(0,)),
            gemm=None,
        )
    config = repo / "fastertransformer" / "config.pbtxt"
    config.write_text(config.read_text().replace(str(ckpt), "relative/1-gpu"))
    with pytest.raises(ConfigError, match="relative model_checkpoint_path"):
        checkpoint_dirs(repo)


def test_choose_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    assert choose_ports(RunSettings.of("m", http_port=1, grpc_port=2, metrics_port=3)) == ServerPorts(1, 2, 3)
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 8000))
        except OSError:
            pytest.skip("port 8000 is in use on this machine")
        busy.listen()
        ports = choose_ports(RunSettings.of("m", grpc_port=7001))
        assert ports.http != 8000 and ports.grpc == 7001


# --------------------------------------------------------------------------- image build pieces


UPSTREAM = """WORKDIR /workspace/build/fastertransformer_backend/build
ARG FORCE_BACKEND_REBUILD=0
RUN cmake \\
      -D CMAKE_EXPORT_COMPILE_COMMANDS=1 \\
      -D CMAKE_BUILD_TYPE=Release \\
      ..
RUN cd _deps/repo-ft-src/ && make -j install
"""


def test_patch_dockerfile() -> None:
    patched = patch_dockerfile(UPSTREAM, (80, 90))
    assert "RUN cmake \\\n      -D SM=80,90 \\\n      -D CMAKE_EXPORT_COMPILE_COMMANDS=1" in patched
    assert patched.count("-D SM=") == 1
    assert patch_dockerfile(UPSTREAM, ()) == UPSTREAM
    newer = UPSTREAM.replace("RUN cmake \\", 'RUN CUDAFLAGS="-include stdio.h" cmake \\')
    assert "cmake \\\n      -D SM=90 \\\n" in patch_dockerfile(newer, (90,))
    with pytest.raises(ToolError, match="cannot find the `RUN"):
        patch_dockerfile("FROM x\nRUN cmake ..\n", (90,))


def test_stream_build_reports_steps_id_and_errors() -> None:
    shown: list[str] = []
    log = io.StringIO()
    chunks = [
        {"stream": "Step 1/3 : FROM base\n"},
        {"stream": " ---> abc\n"},
        {"stream": "Step 2/3 : RUN cmake\n"},
        {"aux": {"ID": "sha256:feed"}},
        {"stream": "Successfully built feed\n"},
    ]
    image_id, tail = stream_build(iter(chunks), BuildDisplay(shown.append, progress=False), log)
    assert image_id == "sha256:feed" and tail[-1] == "Successfully built feed"
    assert shown[:2] == ["image     step 1/3: FROM base", "[build]  ---> abc"]
    failing = [
        {"stream": "Step 5/9 : RUN make -j install\n"},
        {"stream": "nvcc fatal: Unsupported gpu architecture\n"},
        {
            "error": "The command '/bin/sh -c make' returned a non-zero code: 2",
            "errorDetail": {"message": "The command '/bin/sh -c make' returned a non-zero code: 2"},
        },
    ]
    with pytest.raises(ToolError, match=r"failed at step 5/9 \(RUN make -j install\)") as err:
        stream_build(iter(failing), BuildDisplay(shown.append, progress=False), io.StringIO())
    assert "nvcc fatal" in (err.value.hint or "")


# --------------------------------------------------------------------------- errors and options


class _ApiError(Exception):
    def __init__(self, explanation: str) -> None:
        super().__init__(explanation)
        self.explanation = explanation


@pytest.mark.parametrize(
    ("text", "needle", "hint"),
    [
        (
            'could not select device driver "" with capabilities: [[gpu]]',
            "cannot give GPUs",
            "NVIDIA Container Toolkit",
        ),
        ("No such image: ftx/x:1", "not present", "ftx image build"),
        (
            "Head https://registry-1.docker.io/v2/: dial tcp: lookup registry-1.docker.io: no such host",
            "could not reach the image registry",
            "docker load",
        ),
        (
            'invalid mount config for type "bind": bind source path does not exist: /x',
            "does not exist",
            "same absolute path",
        ),
        (
            "error setting rlimits for ready process: error setting rlimit type 8: operation not permitted",
            "memlock",
            "LimitMEMLOCK",
        ),
        ('Conflict. The container name "/n" is already in use by container "abc"', "already in use", "already running"),
    ],
)
def test_explain_docker_errors(text: str, needle: str, hint: str) -> None:
    error = explain(_ApiError(text), "starting x", ServeError)
    assert isinstance(error, ServeError) and needle in error.message and hint in (error.hint or "")


def test_connect_to_a_missing_daemon(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="cannot reach a Docker daemon") as err:
        connect(f"unix://{tmp_path}/none.sock", timeout=2)
    assert "start the Docker daemon" in (err.value.hint or "")


def test_options() -> None:
    opts = DockerOptions.from_settings(RunSettings.of("m", gpus=[1, 2], env={"A": 1}, image="i:1", ready_timeout="5"))
    assert (opts.gpus, dict(opts.env), opts.image, opts.ready_timeout_s) == ((1, 2), {"A": "1"}, "i:1", 5.0)
    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(ConfigError, match="not KEY=VALUE"):
        parse_env(["novalue"])
    with pytest.raises(ConfigError, match="not a size"):
        DockerOptions.from_settings(RunSettings.of("m", shm_size="lots"))
    with pytest.raises(ConfigError, match="not a list of GPU indices"):
        DockerOptions.from_settings(RunSettings.of("m", gpus="a,b"))
