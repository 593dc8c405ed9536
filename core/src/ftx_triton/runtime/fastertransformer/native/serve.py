"""Serve a model repository on the natively built FasterTransformer backend, in the embedded tritonserver.

The plan (pure, tested without a GPU): exactly ``tp x pp`` GPUs (``CUDA_VISIBLE_DEVICES``), the build's
library folders and Open MPI's prefix in the environment, a working directory holding
``gemm_config.in`` (FasterTransformer reads it from the server's working directory), and a
``--backend-directory`` holding the FasterTransformer backend (plus the ``libtritonserver.so`` it links,
pointing at the server's own library) and the python backend for pre/post-processing. One node runs
tritonserver directly (MPI singleton); several nodes run it under ``mpirun`` with a hostfile, one
process per node. Once the server is ready its log is scanned for FasterTransformer's silent
failures (:mod:`ftx_triton.runtime.fastertransformer.logscan`): a weight file it could not open, a GPU it has no code
for, or ``gemm_config.in is not found`` when tuning ran are errors, not warnings; each GPU's weight-loading seconds
and GB/s are logged (:mod:`~ftx_triton.runtime.fastertransformer.native.weight_load`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from ftx_triton.errors import ConfigError, ServeError
from ftx_triton.plan.artifacts import Endpoint, GemmConfig, ModelRepository
from ftx_triton.plan.settings import RunSettings
from ftx_triton.repository.io import FT_MODEL_NAME, TEXT_MODEL_NAME
from ftx_triton.runtime.fastertransformer.base import prepare_work_dir as prepare_ft_work_dir
from ftx_triton.runtime.fastertransformer.hosts import FORWARDED_ENV, HOSTFILE_NAME, NodeLayout, node_layout, read_hosts
from ftx_triton.runtime.fastertransformer.logscan import LogScanner, ScanContext
from ftx_triton.runtime.fastertransformer.native.build import BuiltBackend
from ftx_triton.runtime.fastertransformer.native.options import NativeOptions
from ftx_triton.runtime.fastertransformer.native.tune import runtime_environment
from ftx_triton.runtime.fastertransformer.native.weight_load import log_weight_loads
from ftx_triton.server.smoke import check_generates, import_while_loading, server_name

log = structlog.get_logger(__name__)

CUDA_GRAPH_ENV = "FTX_FT_CUDA_GRAPH"
"""The backend's switch for GPT-J's decoding step in a CUDA graph ("1" on, "0" off; unset: on in fp16)."""
FORWARD = (*FORWARDED_ENV, "LD_LIBRARY_PATH", "OPAL_PREFIX", "PATH", "PYTHONPATH", "NCCL_NVLS_ENABLE", CUDA_GRAPH_ENV)
"""Variables mpirun passes to the other nodes."""
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class NativeServePlan:
    """Everything about the server decided before it starts."""

    gpus: tuple[int, ...]
    layout: NodeLayout
    env: Mapping[str, str]
    work_dir: Path
    launcher: tuple[str, ...]
    gemm_source: Path | None
    expect_gemm: bool

    @property
    def hostfile(self) -> Path | None:
        return self.work_dir / HOSTFILE_NAME if self.layout.multi_node else None


def work_dir_for(home: Path, settings: RunSettings) -> Path:
    """The server's working directory (gemm_config.in, the hostfile), one per model and layout."""
    return (
        home
        / "native"
        / "serve"
        / f"{server_name(settings.model)}-tp{settings.convert.planned_tp}pp{settings.configure.pp}"
    )


def plan_native_serve(
    *,
    settings: RunSettings,
    options: NativeOptions,
    built: BuiltBackend,
    gemm: GemmConfig | None,
    home: Path,
    available_gpus: Sequence[object] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> NativeServePlan:
    """The server's GPUs, environment, working directory and launcher (no process is started)."""
    from ftx_triton.runtime.fastertransformer.gpus import local_gpus, select_gpus

    layout = native_layout(settings, options)
    gpus_here = tuple(local_gpus()) if available_gpus is None else tuple(available_gpus)
    if not gpus_here:
        raise ServeError(
            "no NVIDIA GPU found: FasterTransformer needs tp x pp GPUs",
            hint="run on a GPU host with the NVIDIA driver (nvidia-smi), or use --runtime python",
        )
    here = layout.gpus_per_node * (layout.machines[0][1] if layout.multi_node else 1)
    gpus = select_gpus(here, options.gpus, gpus_here)  # type: ignore[arg-type]
    work = work_dir_for(home, settings)
    env = runtime_environment(built, gpus, options.env, base=base_env)
    if settings.configure.streaming:
        _graph_off_for_streaming(env)
    mpirun = str(built.opal_prefix / "bin" / "mpirun") if built.opal_prefix else "mpirun"
    launcher = rank_launcher(layout, options, work, mpirun)
    expect = bool(gemm and gemm.tuned and gemm.path)
    return NativeServePlan(gpus, layout, env, work, launcher, gemm.path if expect and gemm else None, expect)


def _graph_off_for_streaming(env: dict[str, str]) -> None:
    """A streaming (decoupled) model decodes eagerly on every rank: with GPT-J's CUDA graph on, its streamed
    requests hung after their third response at tp 2 and ended the server at tp 4 on GPUs, raw ids as well as
    through the ensemble, while the same requests with the graph off passed. Whatever the environment asked."""
    asked = env.get(CUDA_GRAPH_ENV)
    if asked not in (None, "", "0"):
        log.warning("serve.cuda_graph_off", asked=asked, reason="a streaming deployment decodes without the CUDA graph")
    env[CUDA_GRAPH_ENV] = "0"


def native_layout(settings: RunSettings, options: NativeOptions) -> NodeLayout:
    """The machines and GPUs per FasterTransformer process: the hosts file read and checked against tp x pp."""
    hosts = read_hosts(options.hosts_file, repeats=True) if options.hosts_file else None
    return node_layout(
        hosts,
        tp=settings.convert.planned_tp,
        pp=settings.configure.pp,
        instances=settings.configure.instances,
        ssh_port=options.ssh_port or 22,
    )


def rank_launcher(layout: NodeLayout, options: NativeOptions, work: Path, mpirun: str) -> tuple[str, ...]:
    """What starts the ranks of a multi-node layout (mpirun, then each rank's GPU launcher before tritonserver);
    empty for one node."""
    if not layout.multi_node:
        return ()
    per_machine = options.gpus or tuple(range(layout.gpus_per_node * layout.ranks_per_machine))
    return (
        mpirun,
        *native_mpirun_args(layout, work / HOSTFILE_NAME, options.ssh_port),
        sys.executable,
        "-m",
        "ftx_triton.runtime.fastertransformer.native.rank",
        f"--gpus={','.join(map(str, per_machine))}",
        f"--per-rank={layout.gpus_per_node}",
        "--",
    )


def native_mpirun_args(layout: NodeLayout, hostfile: Path, ssh_port: int | None) -> list[str]:
    """mpirun's options for one FasterTransformer process per hosts-file line: a slot per process, ranks
    in line order (``--map-by slot``), no core binding (each process runs a thread per GPU), the
    environment forwarded to the other machines, ssh on ``ssh_port`` when given. Machines named
    ``localhost`` are started without ssh."""
    argv = [
        "-n",
        str(layout.nodes),
        "--allow-run-as-root",
        "--hostfile",
        str(hostfile),
        "--map-by",
        "slot",
        "--bind-to",
        "none",
    ]
    for name in FORWARD:
        argv += ["-x", name]
    if ssh_port:
        argv += ["--prtemca", "plm_ssh_args", f"-p {ssh_port}"]
    return argv


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine (mpirun starts its processes without ssh)."""
    import socket

    return host in LOCAL_NAMES or host in {socket.gethostname(), socket.getfqdn()}


def check_hosts_reachable(
    layout: NodeLayout, ssh_port: int | None, timeout_s: float = 5.0, connect: Callable[..., object] | None = None
) -> None:
    """Every other machine of the hosts file resolves and answers on its ssh port, checked in seconds
    before mpirun would wait on it (ConfigError naming the first that does not)."""
    import socket

    connect = connect or socket.create_connection
    port = ssh_port or 22
    for host, _ in layout.machines:
        if is_local(host):
            continue
        try:
            conn = connect((host, port), timeout=timeout_s)
        except OSError as exc:
            raise ConfigError(
                f"the hosts file names {host}, which cannot be reached on ssh port {port}: {exc.strerror or exc}",
                hint="check the name and that sshd runs there (mpirun starts the other processes "
                "through ssh; --ssh-port sets the port), or remove the line",
            ) from None
        close = getattr(conn, "close", None)
        if close:
            close()


def prepare_work_dir(plan: NativeServePlan) -> None:
    """gemm_config.in (or none, so a stale one is never read) and the hostfile, in the working directory."""
    prepare_ft_work_dir(plan.work_dir, plan.gemm_source, plan.layout, HOSTFILE_NAME)


def backends_directory(built: BuiltBackend, home: Path) -> Path:
    """``--backend-directory`` for the native server: ``fastertransformer/`` (the build, plus the
    ``libtritonserver.so`` the backend links, pointing at the server's library) and ``python/``."""
    from ftx_triton.server.install import find_tritonserver, prepare_backends

    install = find_tritonserver()
    python_backends = prepare_backends(install, home)
    server_libs = sorted(install.libs.glob("libtritonserver*.so*")) or sorted(
        install.binary.parent.parent.glob("lib/libtritonserver*.so*")
    )
    if not server_libs:
        raise ServeError(
            f"the tritonserver at {install.binary} has no libtritonserver library next to it",
            hint="reinstall nvidia-pytriton",
        )
    root = home / "native" / "backends" / f"{built.key}-py{install.python_version}"
    ft_dir = root / "fastertransformer"
    ft_dir.mkdir(parents=True, exist_ok=True)
    links = {f.name: f for f in built.backend_dir.iterdir() if f.is_file()}
    links["libtritonserver.so"] = server_libs[0]
    for name, target in links.items():
        link = ft_dir / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            link.unlink()
        link.symlink_to(target)
    python_link = root / "python"
    if not (python_link.is_symlink() and Path(os.readlink(python_link)) == python_backends / "python"):
        python_link.unlink(missing_ok=True)
        python_link.symlink_to(python_backends / "python", target_is_directory=True)
    return root


def scan_log(text: str, context: ScanContext) -> LogScanner:
    scanner = LogScanner(context)
    for line in text.splitlines():
        scanner.scan(line)
    return scanner


def _finding_error(scanner: LogScanner, log_path: Path) -> ServeError | None:
    finding = scanner.first_error()
    if finding is None:
        return None
    return ServeError(scanner.summary(finding), hint=f"{finding.hint} (full log: {log_path})")


def serve_native(
    repository: ModelRepository,
    gemm: GemmConfig,
    settings: RunSettings,
    built: BuiltBackend,
    *,
    home: Path,
    say: Callable[[str], None] | None = None,
) -> Endpoint:
    """Start tritonserver with the FasterTransformer backend on ``repository``; return once it generates."""
    from ftx_triton.runtime.fastertransformer.gpus import local_gpus
    from ftx_triton.server.head_start import ports_for  # the early server's ports, if it is this run's
    from ftx_triton.server.tritonserver import TritonServer

    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    options = NativeOptions.from_settings(settings)
    plan = plan_native_serve(settings=settings, options=options, built=built, gemm=gemm, home=home)
    if plan.layout.multi_node:
        check_hosts_reachable(plan.layout, options.ssh_port)
    prepare_work_dir(plan)
    if gemm is not None and not gemm.tuned:
        say(f"serve     no gemm_config.in: {gemm.reason}")
    s = settings.serve
    ports, given = ports_for(s.host, s.http_port, s.grpc_port, s.metrics_port, say)
    server = TritonServer(
        repository.path,
        home=home,
        host=s.host,
        ports=ports,
        ports_given=given,
        name=settings.serve.name or server_name(settings.model),
        number_if_taken=settings.serve.name is None,
        env=plan.env,
        ready_timeout_s=options.ready_timeout_s,
        die_with_parent=not s.detach,
        backend_directory=backends_directory(built, home),
        cwd=plan.work_dir,
        launcher=plan.launcher,
        device="gpu",
    )
    context = ScanContext(
        tp=settings.convert.planned_tp,
        pp=settings.configure.pp,
        expect_gemm=plan.expect_gemm,
        gpu_sm=tuple(sorted({g.sm for g in local_gpus() if g.sm})),
        work_dir=str(plan.work_dir),
        rebuild="ftx backend build",
    )
    say(
        f"serve     tritonserver + FasterTransformer on GPU(s) {','.join(map(str, plan.gpus))}, working "
        f"directory {plan.work_dir}"
    )
    import_while_loading(settings.configure.streaming)  # the smoke generation's imports overlap the model load
    try:
        server.start(progress=say)
    except ServeError:
        found = _finding_error(scan_log(_log_text(server.log_path), context), server.log_path)
        if found is not None:
            raise found from None
        raise
    log_text = _log_text(server.log_path)
    scanned = scan_log(log_text, context)
    found = _finding_error(scanned, server.log_path)
    if found is not None:
        server.stop()
        raise found
    log_weight_loads(log_text)  # each GPU's seconds and GB/s of weight loading (`ftx -v`)
    for finding in scanned.findings:  # served, but not as asked (custom all-reduce fell back to NCCL)
        if finding.severity == "warning":
            say(f"warning   {finding.message}\n          hint: {finding.hint}")
    smoke = check_generates(server, "FasterTransformer")
    log.info(
        "serve.ready",
        runtime="fastertransformer-native",
        http=server.http_url,
        grpc=server.grpc_url,
        smoke_s=round(smoke.seconds, 3),
        gpus=list(plan.gpus),
        tuned=plan.expect_gemm,
    )
    text = TEXT_MODEL_NAME
    model = text if text in repository.models or (repository.path / text).is_dir() else FT_MODEL_NAME
    return Endpoint(
        http_url=server.http_url, grpc_url=server.grpc_url, model=model, handle=server, streams=smoke.decoupled
    )


def _log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


__all__ = [
    "NativeServePlan",
    "backends_directory",
    "check_hosts_reachable",
    "is_local",
    "native_mpirun_args",
    "plan_native_serve",
    "prepare_work_dir",
    "scan_log",
    "serve_native",
    "work_dir_for",
]
