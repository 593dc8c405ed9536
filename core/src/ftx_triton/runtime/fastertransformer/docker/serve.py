"""Serve a model repository with Triton + FasterTransformer in a Docker container.

The container gets exactly ``tp x pp`` GPUs (a device request plus ``CUDA_VISIBLE_DEVICES``), shared
memory, memlock/stack ulimits, the host's IPC namespace and network, the model repository and the
converted checkpoint mounted read-only at the **same absolute paths** (``config.pbtxt`` names the
checkpoint by its host path), and a working directory holding ``gemm_config.in``. It runs
``mpirun -n <nodes> --allow-run-as-root tritonserver --model-repository=…``. ftx waits for
``/v2/health/ready``, streams the log with a prefix, turns FasterTransformer's silent failures into
errors (``logscan``), and stops and removes the container on failure or Ctrl-C.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

import ftx_triton
from ftx_triton.errors import ConfigError, ServeError
from ftx_triton.paths import ftx_home
from ftx_triton.plan.artifacts import Endpoint, GemmConfig, ModelRepository
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.settings import RunSettings
from ftx_triton.repository.io import TEXT_MODEL_NAME
from ftx_triton.runtime.fastertransformer.base import prepare_work_dir
from ftx_triton.runtime.fastertransformer.docker import LABEL_PREFIX, TRITONSERVER
from ftx_triton.runtime.fastertransformer.docker.client import connect, docker_errors, explain
from ftx_triton.runtime.fastertransformer.docker.exposure import (
    ADMIN_APIS,
    ADMIN_KEY_HEADER,
    Exposure,
    exposure_for,
    triton_version_of,
)
from ftx_triton.runtime.fastertransformer.docker.options import MEMLOCK, STACK, DockerOptions
from ftx_triton.runtime.fastertransformer.docker.spec import ContainerSpec, Mount
from ftx_triton.runtime.fastertransformer.gpus import default_sm, select_gpus
from ftx_triton.runtime.fastertransformer.hosts import HOSTFILE_NAME, NodeLayout, mpirun_argv, node_layout, read_hosts
from ftx_triton.runtime.fastertransformer.logscan import LogScanner, ScanContext
from ftx_triton.runtime.fastertransformer.options import DEFAULT_SSH_PORT
from ftx_triton.server.ports import ServerPorts, busy_ports, client_host, http_ok
from ftx_triton.server.ports import choose_ports as shared_choose_ports
from ftx_triton.server.records import DEVICE_ENV
from ftx_triton.terminal.redact import redact, strip_secrets

log = structlog.get_logger(__name__)

LOG_TAIL = 40
_NAME_RE = re.compile(r"[^a-zA-Z0-9_.-]+")


# --------------------------------------------------------------------------- planning (pure)


def container_name(settings: RunSettings, family: str) -> str:
    """A stable container name per model, family and layout (a second server of it is refused)."""
    model = Path(settings.model).name if "/" in settings.model else settings.model
    slug = _NAME_RE.sub("-", model).strip("-.").lower() or "model"
    stem = family if slug == family else f"{family}-{slug}"
    return f"ftx-{stem}-tp{settings.convert.planned_tp}pp{settings.configure.pp}"[:120]


def work_dir_for(name: str, home: Path | None = None) -> Path:
    """The server's working directory on the host (holds gemm_config.in, the hostfile, the log)."""
    return (home or ftx_home()) / "docker" / "work" / name


def checkpoint_dirs(repository: Path) -> list[Path]:
    """Absolute ``model_checkpoint_path`` of every model in a repository (what must be mounted)."""
    from ftx_triton.repository.model_config import parse_config

    found: list[Path] = []
    for config in sorted(Path(repository).glob("*/config.pbtxt")):
        params = parse_config(config).parameters
        if "model_checkpoint_path" not in params:
            continue
        path = Path(params["model_checkpoint_path"].string_value)
        if not path.is_absolute():
            raise ConfigError(
                f"{config} names a relative model_checkpoint_path {str(path)!r}",
                hint="it resolves against tritonserver's working directory; use an absolute path",
            )
        if path not in found:
            found.append(path)
    return found


def choose_ports(settings: RunSettings) -> ServerPorts:
    """The user's ports, else Triton's 8000/8001/8002 when free, else free ones (said in the log)."""
    serve = settings.serve
    ports, note = shared_choose_ports(serve.host, serve.http_port, serve.grpc_port, serve.metrics_port)
    if note:
        log.info("serve.ports", note=note)
    return ports


@dataclass(frozen=True)
class ServePlan:
    """The serving container and everything around it, decided before anything runs."""

    spec: ContainerSpec
    ports: ServerPorts
    host: str
    work_dir: Path
    layout: NodeLayout
    gemm_source: Path | None
    expect_gemm: bool
    gpus: tuple[int, ...]
    worker_spec: ContainerSpec | None = None
    exposure: Exposure | None = None

    @property
    def ready_url(self) -> str:
        return f"http://{client_host(self.host)}:{self.ports.http}/v2/health/ready"

    @property
    def hostfile(self) -> Path | None:
        return self.work_dir / HOSTFILE_NAME if self.layout.multi_node else None


def _mounts(
    repository: Path, checkpoints: Sequence[Path], work_dir: Path, extra: Sequence[Mount] = ()
) -> tuple[Mount, ...]:
    mounts = [Mount(str(repository), str(repository), True)]
    for ckpt in checkpoints:
        if not any(_inside(ckpt, Path(m.source)) for m in mounts):
            mounts.append(Mount(str(ckpt), str(ckpt), True))
    mounts.append(Mount(str(work_dir), str(work_dir), False))
    return tuple(mounts) + tuple(extra)


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.relative_to(parent)
        return True
    except ValueError:
        return False


def plan_serve(
    *,
    repository: Path,
    checkpoints: Sequence[Path],
    settings: RunSettings,
    family: str,
    options: DockerOptions,
    gemm: GemmConfig | None,
    ports: ServerPorts | None = None,
    home: Path | None = None,
    instances: int | None = None,
) -> ServePlan:
    """The serving container for a repository (no Docker call; ``--dry-run`` prints this)."""
    repository = Path(repository).resolve()
    hosts = read_hosts(options.hosts_file) if options.hosts_file else None
    layout = node_layout(
        hosts,
        tp=settings.convert.planned_tp,
        pp=settings.configure.pp,
        instances=settings.configure.instances if instances is None else instances,
        ssh_port=options.ssh_port or DEFAULT_SSH_PORT,  # the container runs its own sshd there
    )
    gpus = (
        select_gpus(layout.gpus_per_node, options.gpus)
        if not layout.multi_node or options.gpus
        else tuple(range(layout.gpus_per_node))
    )
    ports = ports or choose_ports(settings)
    name = container_name(settings, family)
    work_dir = work_dir_for(name, home)
    expect_gemm = bool(gemm and gemm.tuned and gemm.path)
    extra: list[Mount] = []
    hostfile = None
    if layout.multi_node:
        hostfile = str(work_dir / HOSTFILE_NAME)
        ssh_dir = Path.home() / ".ssh"
        extra.append(Mount(str(ssh_dir), "/root/.ssh", True))
    command = mpirun_argv(layout, hostfile) + [
        TRITONSERVER,
        f"--model-repository={repository}",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
    ]
    exposure = exposure_for(settings.serve.host, triton_version_of(options.image))
    command += list(exposure.flags)
    environment = strip_secrets(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(layout.gpus_per_node)),
            DEVICE_ENV: "gpu",  # what `ftx ps` shows for the container's tritonserver
            **options.env,
        }
    )
    labels = {
        f"{LABEL_PREFIX}.role": "serve",
        f"{LABEL_PREFIX}.model": redact(settings.model),
        f"{LABEL_PREFIX}.family": family,
        f"{LABEL_PREFIX}.repository": str(repository),
        f"{LABEL_PREFIX}.http-port": str(ports.http),
        f"{LABEL_PREFIX}.grpc-port": str(ports.grpc),
        f"{LABEL_PREFIX}.version": _ftx_version(),
    }
    common: dict[str, Any] = {
        "image": options.image,
        "gpus": tuple(str(g) for g in gpus),
        "environment": environment,
        "mounts": _mounts(repository, checkpoints, work_dir, extra),
        "working_dir": str(work_dir),
        "shm_size": options.shm_size,
        "ulimits": {"memlock": MEMLOCK, "stack": STACK},
        "ipc_mode": "host",
        "network_mode": "host",
        "init": True,
    }
    spec = ContainerSpec(command=tuple(command), name=name, labels=labels, **common)
    worker = None
    if layout.multi_node:
        worker = ContainerSpec(
            command=("/usr/sbin/sshd", "-D", "-p", str(layout.ssh_port)),
            name=f"{name}-worker",
            labels={**labels, f"{LABEL_PREFIX}.role": "serve-worker"},
            **common,
        )
    return ServePlan(
        spec,
        ports,
        settings.serve.host,
        work_dir,
        layout,
        gemm.path if gemm else None,
        expect_gemm,
        gpus,
        worker,
        exposure,
    )


def _ftx_version() -> str:
    try:
        return str(ftx_triton.__version__)
    except Exception:
        return "unknown"


# --------------------------------------------------------------------------- running


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class FtServer:
    """One serving container: start (and wait for readiness), stop, wait, detach.

    The log is streamed to ``say`` with a ``[name]`` prefix and kept in ``<work_dir>/server.log``;
    every line goes through a :class:`LogScanner`. Any error finding, an early exit or the readiness
    timeout stops and removes the container and raises :class:`ServeError` with the cause and the fix.
    """

    def __init__(
        self,
        client: Any,
        plan: ServePlan,
        *,
        scan: ScanContext | None = None,
        say: Callable[[str], None] | None = None,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: int = 20,
        echo: bool = True,
    ) -> None:
        self.client = client
        self.plan = plan
        self.spec = plan.spec
        self.name = plan.spec.name or "ftx-server"
        self.scanner = LogScanner(scan or ScanContext(expect_gemm=plan.expect_gemm))
        self.say = say or _stderr
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.echo = echo
        self.container: Any = None
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self._lock = threading.Lock()
        self._pump: threading.Thread | None = None
        self._pump_done = threading.Event()
        self._seen_started = threading.Event()
        self._last_line = 0.0
        self._detached = False
        self.log_path = plan.work_dir / "server.log"

    # ----------------------------------------------------------------- properties

    @property
    def http_url(self) -> str:
        return f"{client_host(self.plan.host)}:{self.plan.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{client_host(self.plan.host)}:{self.plan.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{client_host(self.plan.host)}:{self.plan.ports.metrics}/metrics"

    @property
    def pid(self) -> int | None:
        """None: the server runs in a container, not as a process of this host ftx could signal."""
        return None

    @property
    def stop_hint(self) -> str:
        """How a user stops this server once ftx has detached from it."""
        return f"a container; `docker stop {self.name}` stops it"

    @property
    def running(self) -> bool:
        return self._status() == "running"

    def _status(self) -> str:
        if self.container is None:
            return "absent"
        try:
            self.container.reload()
        except docker_errors():
            return "absent"
        return str(self.container.status)

    # ----------------------------------------------------------------- start

    def prepare(self) -> None:
        """Create the working directory: gemm_config.in (or none) and the multi-node hostfile."""
        prepare_work_dir(self.plan.work_dir, self.plan.gemm_source, self.plan.layout, HOSTFILE_NAME)
        self.log_path.write_text("")

    def _remove_leftover(self) -> None:
        import docker

        try:
            old = self.client.containers.get(self.name)
        except docker.errors.NotFound:
            return
        except docker_errors() as exc:
            raise explain(exc, "looking for an earlier server container", ServeError) from None
        if old.status == "running":
            http = old.labels.get(f"{LABEL_PREFIX}.http-port", "?")
            raise ServeError(
                f"a server for this model is already running: container {self.name} (HTTP port {http})",
                hint=f"use it, or stop it first (`docker stop {self.name}`)",
            )
        log.info("container.leftover_removed", name=self.name, status=old.status)
        old.remove(force=True)

    def start(self) -> None:
        """Create and start the container, then wait until Triton is ready (or fail with the cause)."""
        self.prepare()
        self._remove_leftover()
        ports = self.plan.ports
        busy = busy_ports(self.plan.host, ports)
        if busy:
            raise ServeError(
                f"port(s) {', '.join(map(str, busy))} on {client_host(self.plan.host)} are in use "
                "(the server shares the host's network)",
                hint="pass free --http-port/--grpc-port/--metrics-port, or leave them out to get free ones",
            )
        try:
            self.container = self.client.containers.create(**self.spec.create_kwargs())
        except docker_errors() as exc:
            raise explain(exc, f"creating the server container {self.name}", ServeError) from None
        log.info("container.created", name=self.name, id=self.container.short_id, image=self.spec.image)
        try:
            try:
                self.container.start()
            except docker_errors() as exc:
                raise explain(exc, f"starting the server container {self.name}", ServeError) from None
            self.say(f"serve     container {self.name} started; waiting for {self.plan.ready_url}")
            self._pump = threading.Thread(target=self._read_logs, name=f"{self.name}-logs", daemon=True)
            self._pump.start()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("server.ready", name=self.name, http=self.http_url, grpc=self.grpc_url)

    def _read_logs(self) -> None:
        buf = b""
        try:
            for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._line(line.decode(errors="replace").rstrip("\r"))
            if buf:
                self._line(buf.decode(errors="replace").rstrip("\r"))
        except Exception as exc:  # the container was removed under us, or the daemon went away
            log.debug("container.logs_ended", name=self.name, error=str(exc))
        finally:
            self._pump_done.set()
            self._seen_started.set()

    def _line(self, line: str) -> None:
        with self._lock:
            self.tail.append(line)
            self._last_line = time.monotonic()
            if "Started HTTPService" in line:
                self._seen_started.set()
            finding = self.scanner.scan(line)
        with self.log_path.open("a") as fh:
            fh.write(line + "\n")
        if self.echo:
            self.say(f"[{self.name}] {line}")
        if finding is not None and finding.severity == "error":
            log.warning("server.failure_line", name=self.name, kind=finding.kind, line=line)

    def _settle(self, quiet_s: float = 0.5, max_s: float = 5.0) -> None:
        """Let the log reader catch up: wait until no new line came for ``quiet_s``."""
        end = time.monotonic() + max_s
        while time.monotonic() < end and not self._pump_done.is_set():
            with self._lock:
                idle = time.monotonic() - self._last_line
            if idle >= quiet_s:
                return
            time.sleep(0.05)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.scanner.errors:
                self._settle()
                raise self._failure()
            status = self._status()
            if status in ("exited", "dead", "absent"):
                self._pump_done.wait(5)
                if self.scanner.errors:
                    raise self._failure()
                code = self._exit_code()
                raise ServeError(
                    f"the server container {self.name} exited with code {code} before it was ready",
                    hint=self._tail_hint(),
                )
            if http_ok(self.plan.ready_url):
                self._seen_started.wait(10)  # tritonserver logs "Started HTTPService" after loading the models
                self._settle()
                if self.scanner.errors:
                    raise self._failure()
                return
            if time.monotonic() > deadline:
                raise ServeError(
                    f"the server was not ready after {self.ready_timeout_s:.0f}s "
                    f"({self.plan.ready_url} never answered 200)",
                    hint=self._tail_hint(),
                )
            time.sleep(0.2)

    def _exit_code(self) -> int | str:
        try:
            return int(self.container.attrs["State"]["ExitCode"])
        except Exception:
            return "?"

    def _failure(self) -> ServeError:
        finding = self.scanner.first_error()
        assert finding is not None
        return ServeError(self.scanner.summary(finding), hint=f"{finding.hint} (full log: {self.log_path})")

    def _tail_hint(self) -> str:
        with self._lock:
            tail = list(self.tail)[-15:]
        shown = "\n".join(f"  {line}" for line in tail) or "  (no output)"
        return f"last log lines:\n{shown}\nfull log: {self.log_path}"

    def exit_report(self) -> str:
        """Why the container stopped by itself: a FasterTransformer failure in its log, else its exit code,
        with the log's last lines."""
        finding = self.scanner.first_error()
        head = (
            self.scanner.summary(finding)
            if finding is not None
            else f"the server container {self.name} stopped by itself (exit code {self._exit_code()})"
        )
        return f"{head}\n{self._tail_hint()}"

    # ----------------------------------------------------------------- stop, wait, detach

    def stop(self) -> None:
        """Stop and remove the container; idempotent."""
        if self.container is None:
            return
        import docker

        container, self.container = self.container, None
        try:
            container.stop(timeout=self.stop_timeout_s)
        except docker.errors.NotFound:
            pass
        except docker_errors() as exc:
            log.warning("container.stop_failed", name=self.name, error=str(exc))
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker_errors() as exc:
            if "already in progress" not in str(exc):
                log.warning("container.remove_failed", name=self.name, error=str(exc))
        if self._pump is not None:
            self._pump.join(timeout=5)
        log.info("container.removed", name=self.name)

    def wait(self, timeout: float | None = None) -> int:
        """Block until the container exits and return its exit code; Ctrl-C stops and removes it.

        With ``timeout``, raise ``subprocess.TimeoutExpired`` if it is still running then (the same
        contract as the python runtime's server).
        """
        if self.container is None:
            raise ServeError(f"server {self.name} is not running", hint="start() it first")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                status = self._status()
                if status in ("exited", "dead"):
                    code = self._exit_code()
                    return code if isinstance(code, int) else -1
                if status == "absent":
                    return -1
                if deadline is not None and time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(self.name, timeout or 0)
                time.sleep(0.1 if deadline is not None else 0.5)
        except KeyboardInterrupt:
            self.say(f"serve     stopping {self.name}")
            self.stop()
            raise

    def detach(self) -> str:
        """Leave the container running after ftx exits; return its name."""
        if not self.running:
            raise ServeError(f"server {self.name} is not running, so it cannot be detached")
        self._detached = True
        self.echo = False
        self.say(f"serve     {self.name} keeps running; stop it with `docker stop {self.name}`")
        return self.name

    def __enter__(self) -> FtServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._detached:
            self.stop()

    def __repr__(self) -> str:
        return f"FtServer({self.name!r}, http={self.http_url})"


# --------------------------------------------------------------------------- the hook's entry point


def serve_fastertransformer(
    repository: ModelRepository,
    gemm: GemmConfig,
    ctx: StageContext,
    *,
    client: Any = None,
    say: Callable[[str], None] | None = None,
) -> Endpoint:
    """Start the FasterTransformer server for ``repository``; return its endpoint (handle: FtServer)."""
    s = ctx.settings
    options = DockerOptions.from_settings(s)
    say = say or ctx.say
    plan = plan_serve(
        repository=repository.path,
        checkpoints=checkpoint_dirs(repository.path),
        settings=s,
        family=repository.family,
        options=options,
        gemm=gemm,
        home=ctx.home,
    )
    if plan.layout.multi_node:
        say(f"serve     multi-node: start this on each other node first ({', '.join(plan.layout.hosts[1:])}):")
        say(f"          {plan.worker_spec.docker_run_line(detach=True) if plan.worker_spec else ''}")
    if gemm is not None and not gemm.tuned:
        say(f"serve     no gemm_config.in: {gemm.reason}")
    if plan.exposure and plan.exposure.caveat:
        log.warning("serve.exposed", address=s.serve.host, detail=plan.exposure.caveat)
    if plan.exposure and plan.exposure.admin_key:
        say(
            f"serve     listening on {s.serve.host}: the {ADMIN_APIS} APIs need the header "
            f"'{ADMIN_KEY_HEADER}: {plan.exposure.admin_key}' (this run only)"
        )
    client = client or connect(options.docker_host)
    scan = ScanContext(
        tp=s.convert.planned_tp,
        pp=s.configure.pp,
        expect_gemm=plan.expect_gemm,
        gpu_sm=default_sm(),
        image=options.image,
    )
    server = FtServer(
        client, plan, scan=scan, say=say, ready_timeout_s=options.ready_timeout_s, stop_timeout_s=options.stop_timeout_s
    )
    server.start()
    text = TEXT_MODEL_NAME
    model = text if text in repository.models else (repository.models[0] if repository.models else "")
    say(f"serve     ready: http {server.http_url}, grpc {server.grpc_url} (container {server.name})")
    return Endpoint(http_url=server.http_url, grpc_url=server.grpc_url, model=model, handle=server)


__all__ = [
    "FtServer",
    "ServePlan",
    "checkpoint_dirs",
    "container_name",
    "plan_serve",
    "serve_fastertransformer",
    "work_dir_for",
]
