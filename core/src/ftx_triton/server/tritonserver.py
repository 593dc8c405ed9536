"""Run the ``tritonserver`` shipped in the nvidia-pytriton wheel as a supervised local process.

The wheel's server works on a CPU-only machine once three things are prepared: a copy of its
``backends`` tree holding the Python-backend stub for the running interpreter, ``PATH`` with this
interpreter's ``bin`` first (the stub finds its environment through ``python3``), and
``LD_LIBRARY_PATH`` = this interpreter's libpython dir, then ``nvidia_pytriton.libs``.
:class:`TritonServer` does that, binds to one host only, waits for the server and its models to be
ready (a broken stub hangs the server, so the wait has a timeout and watches the log), and on
failure raises :class:`~ftx_triton.errors.ServeError` with the cause and the log tail. Servers left running
with :meth:`TritonServer.detach` are recorded under
``<home>/servers`` and managed with :mod:`ftx_triton.server.records`; ports, the install, the process
tree and the log reading live in :mod:`~ftx_triton.server.ports`, :mod:`~ftx_triton.server.install`,
:mod:`~ftx_triton.server.process_tree` and :mod:`~ftx_triton.server.server_log`.

tritonserver runs under :mod:`ftx_triton.server.supervisor`, which owns its process tree (no stub outlives
it, its shared memory is removed however it ends), stops it when a stub dies, and serves the HTTP
front (:mod:`ftx_triton.front.shield`) that keeps requests tritonserver cannot survive away from it.
Paths the Python backend hands to ``bash -c`` (the repository, the backends directory) are given
to tritonserver through links of plain characters when they hold anything else (a space, ``$``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Self
from urllib.parse import quote

import structlog

from ftx_triton.errors import ServeError
from ftx_triton.front import SERVER_PID_HEADER
from ftx_triton.front.addresses import is_loopback
from ftx_triton.front.model_gate import gate_spec
from ftx_triton.io.atomic_file import write_atomic
from ftx_triton.server import head_start
from ftx_triton.server.admin_apis import admin_restriction
from ftx_triton.server.install import TritonInstall, find_tritonserver, prepare_backends, server_env
from ftx_triton.server.launch import Launch, log_file_name, new_shm_prefix, release
from ftx_triton.server.ports import ServerPorts, client_host, free_ports, http_ok, loopback_port
from ftx_triton.server.process_tree import (
    cmdline,
    kill_processes_of,
    killpg,
    proc_stat,
    remove_shm,
    stub_processes,
    sweep_orphans,
)
from ftx_triton.server.records import ServerRecord, list_servers, servers_dir
from ftx_triton.server.server_log import (
    LOADED,
    LOADING,
    MISSING_LIB,
    PORT_IN_USE,
    SERVICE_FAILED,
    STUB_LAUNCH,
    Diagnosis,
    LogWatch,
    diagnose,
    exit_cause,
    failed_models,
    log_clock,
    log_tail,
    python_backend_models,
    read_from,
)
from ftx_triton.server.stub_env import stub_env
from ftx_triton.server.supervisor import HOME_GONE
from ftx_triton.terminal import timeline

log = structlog.get_logger(__name__)

STUB_START_TIMEOUT_S = 60.0
"""A Python model being loaded with no stub process running for it this long will never load."""
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+=:,@%-]+")
"""Characters that pass through the Python backend's ``bash -c`` stub command line unchanged."""
MODEL_CONTROL_MODES = ("none", "poll", "explicit")
_POLL_S = 0.1
_LOADING_POLL_S = 1.0
_PROBE_GAP_S = 0.02
"""The least time between two readiness probes when the log grows fast (each look follows its growth)."""
_PORT_ATTEMPTS = 3
_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")


def repository_models(repository: Path) -> list[str]:
    """Model names in a repository: its non-hidden subdirectories."""
    return sorted(p.name for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith("."))


MAX_NAME_CHARS = 64
"""Server names go whole into log, record and temporary file names (255 bytes at most): longer ones are cut."""


def _safe_name(text: str) -> str:
    return _NAME_RE.sub("-", text).strip("-.")[:MAX_NAME_CHARS].strip("-.") or "triton"


def safe_path(path: Path, home: Path) -> Path:
    """``path``, or a link to it whose path has only plain characters.

    The Python backend starts each stub with ``bash -c "… exec <backends>/… <repository>/…"``: a
    space in either path breaks the command and the stub never starts; ``$(…)`` would run. Links
    live under a directory of the system's temporary space (or ``home``'s parent chain is refused).
    """
    path = Path(path).resolve()
    if _SAFE_PATH.fullmatch(str(path)):
        return path
    import hashlib

    for root in (Path(tempfile.gettempdir()), Path("/tmp")):
        links = root / f"ftx-{os.getuid()}" / "links"
        if _SAFE_PATH.fullmatch(str(links)):
            break
    else:
        raise ServeError(
            f"{path} holds characters the Python backend cannot pass to its stubs "
            "and no temporary directory with a plain path is available for a link",
            hint="use an FTX_HOME (and repository path) of letters, digits and ._-/ only",
        )
    links.mkdir(parents=True, exist_ok=True)
    link = links / hashlib.sha256(str(path).encode()).hexdigest()[:16]
    if not (link.is_symlink() and link.resolve() == path):
        tmp = links / f".{link.name}.{secrets.token_hex(4)}"
        tmp.symlink_to(path, target_is_directory=True)
        os.replace(tmp, link)
    log.info(
        "server.path_linked",
        path=str(path),
        link=str(link),
        reason="the Python backend's stub command line cannot quote this path",
    )
    return link


# --------------------------------------------------------------------------- the server


class _StartFailure(Exception):
    """Internal: why a start attempt failed (before the log is diagnosed)."""


class TritonServer:
    """One local tritonserver process: start, wait for readiness, stop, or detach.

    ``model_control`` is Triton's ``--model-control-mode`` (none, poll, explicit);
    ``load_models`` (explicit mode only) are loaded at startup. ``start`` waits for the server
    and each expected model (``load_models``, or every model in the repository otherwise).
    ``die_with_parent`` makes the server get SIGTERM if this process dies; such a server cannot
    be detached, so pass ``die_with_parent=False`` for servers meant to outlive ftx.
    ``http_front`` puts :mod:`ftx_triton.front.shield` on the HTTP port (bodies up to ``max_body_bytes``, other
    :class:`ftx_triton.front.limits.Limits` fields in ``front_limits``);
    ``grpc_front`` puts :mod:`ftx_triton.front.grpc_front` on the gRPC port (messages up to ``max_body_bytes``,
    decompressed);
    ``stub_start_timeout_s``: how long a Python model may load without a stub process of its own.
    ``pid`` is the supervisor's (:mod:`ftx_triton.server.supervisor`), the leader of the server's processes.
    A ``name`` a live detached server has is refused at ``detach``, unless ``number_if_taken``
    (default: only when no name is given), which makes it ``name-2``…; names are cut to 64 characters.
    """

    def __init__(
        self,
        repository: Path,
        *,
        home: Path,
        host: str = "127.0.0.1",
        ports: ServerPorts | None = None,
        model_control: str = "none",
        load_models: Sequence[str] = (),
        ready_timeout_s: float = 180.0,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        exit_timeout_s: int = 10,
        name: str | None = None,
        die_with_parent: bool = True,
        http_front: bool = True,
        grpc_front: bool = True,
        max_body_bytes: int | None = None,
        front_limits: Mapping[str, float] | None = None,
        stub_start_timeout_s: float = STUB_START_TIMEOUT_S,
        backend_directory: Path | None = None,
        cwd: Path | None = None,
        launcher: Sequence[str] = (),
        ports_given: bool | None = None,
        number_if_taken: bool | None = None,
        device: str = "",
        gpu_metrics: bool = True,
    ) -> None:
        if model_control not in MODEL_CONTROL_MODES:
            raise ServeError(
                f"unknown model control mode {model_control!r}", hint=f"use one of: {', '.join(MODEL_CONTROL_MODES)}"
            )
        if load_models and model_control != "explicit":
            raise ServeError(
                f"load_models needs model_control='explicit' (got {model_control!r})",
                hint="pass model_control='explicit' or drop load_models",
            )
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise ServeError(
                f"model repository {self.repository} does not exist", hint="build the repository first (ftx configure)"
            )
        self.home = Path(home)
        self.host = host
        # ports ftx chose (not the user) are re-picked when another process takes them first
        self._auto_ports = ports is None if ports_given is None else not ports_given
        self.ports = ports or free_ports(host)
        self.model_control = model_control
        self.load_models = tuple(load_models)
        self.ready_timeout_s = ready_timeout_s
        self.env = dict(env or {})
        self.exit_timeout_s = int(exit_timeout_s)
        self._explicit_name = name is not None if number_if_taken is None else not number_if_taken
        self.name = _safe_name(name or self.repository.name)
        self.die_with_parent = die_with_parent
        self.http_front = http_front
        self.grpc_front = grpc_front
        self.max_body_bytes = max_body_bytes
        self.front_limits = dict(front_limits or {})
        self.stub_start_timeout_s = stub_start_timeout_s
        self._internal_http_port: int | None = None
        self._internal_grpc_port: int | None = None
        self.shm_prefix = new_shm_prefix()
        self.backend_directory = Path(backend_directory) if backend_directory else None
        """Serve with this ``--backend-directory`` instead of the prepared wheel backends (python only)."""
        self.cwd = Path(cwd) if cwd else None
        """The server's working directory (default: its log folder); FasterTransformer reads gemm_config.in there."""
        self.launcher = tuple(launcher)
        """Put before the server's command line (``mpirun -n 2 …`` for several nodes)."""
        self.device = device
        """What the runtime serves on (``cpu``, ``cuda``, ``gpu``), for ``ftx ps``: in the supervisor's spec and
        the detached record."""
        self.gpu_metrics = gpu_metrics
        """tritonserver's GPU metrics (DCGM); off for a deployment on the CPU, where starting them can hold the
        server a minute after its models loaded (seen about once in 80 cached runs on a machine without GPUs)."""
        self._log_path = (
            Path(log_path) if log_path else self.home / "triton" / "logs" / log_file_name(self.name, self.shm_prefix)
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._launch: Launch | None = None
        self._leash: IO[bytes] | None = None
        """The stdin of a supervisor that head_start started (it stops when that ends, unless released)."""
        self._load_began: dict[str, float | None] = {}
        self._start_ticks: int | None = None
        self._state_file: Path | None = None
        self._started_at = ""
        self._detached = False
        self._swept = False

    # ----------------------------------------------------------------- properties

    @property
    def http_url(self) -> str:
        """``host:port`` for ``tritonclient.http.InferenceServerClient``."""
        return f"{client_host(self.host)}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc.InferenceServerClient``."""
        return f"{client_host(self.host)}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{client_host(self.host)}:{self.ports.metrics}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def stop_hint(self) -> str | None:
        """None: a detached server is recorded, so ``ftx ps`` lists it and ``ftx stop`` stops it."""
        return None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def expected_models(self) -> tuple[str, ...]:
        """Models ``start`` waits for."""
        if self.model_control == "explicit":
            return self.load_models if self.load_models != ("*",) else tuple(repository_models(self.repository))
        return tuple(repository_models(self.repository))

    def command(self, backends: Path, binary: Path, repository: Path | None = None) -> list[str]:
        """The tritonserver command line (its HTTP and gRPC on the loopback behind the fronts, if any)."""
        if self.http_front:
            http = f"--http-address=127.0.0.1 --http-port={self._internal_http_port}".split()
        else:
            http = [f"--http-address={self.host}", f"--http-port={self.ports.http}"]
        if self.grpc_front:
            grpc = ["--grpc-address=127.0.0.1", f"--grpc-port={self._internal_grpc_port}"]
        else:
            grpc = [f"--grpc-address={self.host}", f"--grpc-port={self.ports.grpc}"]
        cmd = [
            str(binary),
            f"--model-repository={repository or self.repository}",
            f"--backend-directory={backends}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *http,
            *grpc,
            "--allow-metrics=true",
            *(() if self.gpu_metrics else ("--allow-gpu-metrics=false",)),
            f"--metrics-address={self.host}",
            f"--metrics-port={self.ports.metrics}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--model-control-mode={self.model_control}",
            # ftx's repositories carry complete configs: auto-completing them started every Python model's
            # stub twice (once to ask model.py for a config, once to serve), seconds each before ready
            "--disable-auto-complete-config",
        ]
        cmd += [f"--load-model={model}" for model in self.load_models]
        if not is_loopback(self.host):
            cmd += self.admin_restrictions()
        return cmd

    def admin_restrictions(self) -> list[str]:
        """On an address wider than loopback, tritonserver's administrative APIs need a key nobody is
        given (gRPC; and HTTP when no front guards it): clients elsewhere cannot register this host's
        shared memory, turn on verbose logging or load models. Clients here use the HTTP front."""
        restriction = admin_restriction(secrets.token_urlsafe(18))
        flags = [f"--grpc-restricted-protocol={restriction}"]
        if not self.http_front:
            flags.append(f"--http-restricted-api={restriction}")
        return flags

    # ----------------------------------------------------------------- lifecycle

    def start(self, progress: Callable[[str], None] | None = None) -> None:
        """Spawn tritonserver and return once it and the expected models are ready.

        On failure the server is stopped, its shared memory removed, and ServeError raised with
        the likely cause and the log tail. Auto-chosen ports that turn out taken are re-picked.
        """
        if self._proc is not None:
            raise ServeError(f"server {self.name} was already started", hint="create a new TritonServer")
        say = progress or (lambda _msg: None)
        install = find_tritonserver()
        backends = safe_path(self.backend_directory or prepare_backends(install, self.home), self.home)
        repository = safe_path(self.repository, self.home)
        sweep_orphans()
        env = server_env(install, {**stub_env(self.home), **self.env})
        attempts = _PORT_ATTEMPTS if self._auto_ports else 1
        for attempt in range(1, attempts + 1):
            offset = self._spawn(install, backends, env, repository, ahead=attempt == 1)
            say(f"starting tritonserver on {self.http_url} (log: {self._log_path})")
            began = time.monotonic()
            try:
                self._wait_ready(offset, say)
            except _StartFailure as failure:
                self._cleanup_process()
                text = read_from(self._log_path, offset)
                found = diagnose(text, log_path=self._log_path)
                if found and found.port_in_use and attempt < attempts:
                    log.info("server.port_retry", name=self.name, attempt=attempt, cause=found.cause)
                    self.ports = free_ports(self.host)
                    self._internal_http_port = self._internal_grpc_port = None
                    self._proc, self._swept = None, False
                    continue
                raise self._start_error(str(failure), found, text) from None
            except BaseException:
                self._cleanup_process()
                raise
            self._started_at = datetime.now(UTC).isoformat(timespec="seconds")
            timeline.step("tritonserver ready", models=len(self.expected_models))
            if self._launch is not None:
                ports = (self.ports.http, self.ports.grpc, self.ports.metrics)
                head_start.remember(self._launch, self.host, ports, auto_ports=self._auto_ports)
            log.info(
                "server.started",
                name=self.name,
                pid=self.pid,
                http=self.http_url,
                grpc=self.grpc_url,
                models=list(self.expected_models),
                seconds=round(time.monotonic() - began, 2),
            )
            say(f"tritonserver ready on {self.http_url} (pid {self.pid})")
            return

    def supervisor_command(self, triton_command: list[str]) -> list[str]:
        """``python -m ftx_triton.server.supervisor SPEC`` for a tritonserver command line."""
        spec: dict[str, object] = {
            "command": triton_command,
            "shm_prefix": self.shm_prefix,
            "exit_timeout_s": self.exit_timeout_s,
            "name": self.name,  # `ftx ps` names a foreground server by it
            "home": str(self.home.resolve()),
        }
        if self.device:
            spec["device"] = self.device
        if self.http_front:
            front: dict[str, object] = {
                "host": self.host,
                "port": self.ports.http,
                "upstream_port": self._internal_http_port,
                **self.front_limits,
                "max_body_bytes": self.max_body_bytes,
            }
            gate = gate_spec(self.repository)
            if gate:
                front["gate"] = gate  # requests for the model held while it is busy (front/model_gate.py)
            spec["front"] = front
        if self.grpc_front:
            spec["grpc_front"] = {
                "host": self.host,
                "port": self.ports.grpc,
                "upstream_port": self._internal_grpc_port,
                "max_message_bytes": self.max_body_bytes,
            }
        return [sys.executable, "-m", "ftx_triton.server.supervisor", json.dumps(spec)]

    def _spawn(
        self, install: TritonInstall, backends: Path, env: dict[str, str], repository: Path, *, ahead: bool = False
    ) -> int:
        """Start the supervisor (and so tritonserver) with output appended to the log; return the log offset of
        this run. ``ahead``: take the server :mod:`~ftx_triton.server.head_start` started early instead, when it is
        exactly the one this would start (its random parts, shared-memory prefix, internal ports and log, taken
        over first); any other is stopped first."""
        head = head_start.pending() if ahead else None
        if head is not None:
            fresh = (self.shm_prefix, self._internal_http_port, self._internal_grpc_port, self._log_path)
            self.shm_prefix = str(head.launch.spec.get("shm_prefix"))
            self._internal_http_port, self._internal_grpc_port = head.launch.internal_ports
            self._log_path = Path(head.launch.log_path)
            taken = head_start.adopt(self._describe(install, backends, env, repository))
            if taken is not None:
                self._proc, self._leash = taken.proc, taken.leash
                return self._spawned(taken.offset, ahead=True)
            self.shm_prefix, self._internal_http_port, self._internal_grpc_port, self._log_path = fresh
        launch = self._describe(install, backends, env, repository)
        self._proc, offset = launch.spawn()
        return self._spawned(offset)

    def _describe(self, install: TritonInstall, backends: Path, env: dict[str, str], repository: Path) -> Launch:
        """The launch of this server (internal ports picked when not yet)."""
        taken = {self.ports.http, self.ports.grpc, self.ports.metrics}
        if self.http_front and self._internal_http_port is None:
            self._internal_http_port = loopback_port(taken)
        taken.add(self._internal_http_port or 0)
        if self.grpc_front and self._internal_grpc_port is None:
            self._internal_grpc_port = loopback_port(taken)
        triton = [*self.launcher, *self.command(backends, install.binary, repository)]
        self._launch = Launch(
            argv=tuple(self.supervisor_command(triton)),
            env=env,
            cwd=str(self.cwd or self._log_path.parent),
            log_path=str(self._log_path),
            header=f"# ftx: {' '.join(triton)}",
            die_with_parent=self.die_with_parent,
        )
        return self._launch

    def _spawned(self, offset: int, *, ahead: bool = False) -> int:
        assert self._proc is not None and self._launch is not None
        stat = proc_stat(self._proc.pid)
        self._start_ticks = stat[1] if stat else None
        log.debug("server.spawned", name=self.name, pid=self._proc.pid, cmd=list(self._launch.argv), ahead=ahead)
        return offset

    def _wait_ready(self, offset: int, say: Callable[[str], None]) -> None:
        """Poll readiness; raise _StartFailure on exit, a fatal log line, or timeout."""
        assert self._proc is not None
        base = f"http://{self.http_url}"
        # behind ftx's front, only an answer signed by this server's supervisor counts: another deployment that
        # took the port first (both saw it free) must not be taken for this one
        signed = (SERVER_PID_HEADER, str(self._proc.pid)) if self.http_front else None
        watch = LogWatch(self._log_path, offset)
        expected = self.expected_models
        pending = list(expected)
        server_ready = False
        deadline = time.monotonic() + self.ready_timeout_s
        python_models = set(python_backend_models(self.repository))
        loading: dict[str, float] = {}
        in_load: set[str] = set()  # models the log says are loading: the server cannot be ready before they load
        asked = 0.0
        while True:
            for line in watch.new_lines():
                self._scan_line(line, expected, say)
                if match := LOADING.search(line):
                    in_load.add(match.group(1))
                    if match.group(1) in python_models:
                        loading[match.group(1)] = time.monotonic()
                elif match := LOADED.search(line):
                    loading.pop(match.group(1), None)
                    in_load.discard(match.group(1))
            code = self._proc.poll()
            if code is not None:
                raise _StartFailure(f"tritonserver exited with code {code} while starting")
            self._check_stubs_started(loading)
            # each probe costs this process, the front and tritonserver CPU that the loading models need: while
            # the log shows loads under way it is sent once a second (as a check of the log), else on each look
            since = time.monotonic() - asked
            if not server_ready and (since >= _LOADING_POLL_S or (not in_load and since >= _PROBE_GAP_S)):
                asked = time.monotonic()
                server_ready = http_ok(f"{base}/v2/health/ready", signed=signed)
            if server_ready:
                pending = [
                    m for m in pending if not http_ok(f"{base}/v2/models/{quote(m, safe='')}/ready", signed=signed)
                ]
                if not pending:
                    return
            if time.monotonic() > deadline:
                waiting = "the server" if not server_ready else "models " + ", ".join(pending)
                raise _StartFailure(
                    f"tritonserver was not ready after {self.ready_timeout_s:g} s (still waiting for {waiting})"
                )
            # the next look comes as soon as the log grows (the last model's "loaded" line, then tritonserver's
            # "Started HTTPService"), else after a poll interval: readiness is seen within ~10 ms of its line
            watch.wait(_POLL_S)

    def _check_stubs_started(self, loading: dict[str, float]) -> None:
        """A Python model loading for STUB_START_TIMEOUT_S with no stub process of its own never
        will load (tritonserver waits for it forever)."""
        assert self._proc is not None
        overdue = [m for m, since in loading.items() if time.monotonic() - since > self.stub_start_timeout_s]
        if not overdue:
            return
        running = {
            part
            for stub in stub_processes(self._proc.pid)
            for part in Path(cmdline(stub)[1]).parts[-3:-2]
            if len(cmdline(stub)) > 1
        }
        missing = [m for m in overdue if m not in running]
        if missing:
            raise _StartFailure(
                f"no Python-backend stub started for {', '.join(missing)} within "
                f"{self.stub_start_timeout_s:g} s of loading"
            )
        for model in overdue:
            loading.pop(model)  # its stub runs: the model is just slow to load

    def _scan_line(self, line: str, expected: Sequence[str], say: Callable[[str], None]) -> None:
        """Report progress from a log line; raise _StartFailure if it means the start has failed."""
        if match := LOADING.search(line):
            say(f"loading model {match.group(1)}")
            self._load_began[match.group(1)] = log_clock(line)
        elif match := LOADED.search(line):
            say(f"loaded model {match.group(1)}")
            began, ended = self._load_began.pop(match.group(1), None), log_clock(line)
            if began is not None and ended is not None:  # tritonserver's own clock: no polling delay in it
                log.info("server.model_loaded", model=match.group(1), seconds=round((ended - began) % 86400, 3))
        if MISSING_LIB.search(line) or STUB_LAUNCH.search(line):
            raise _StartFailure("a Python-backend stub could not start")
        if PORT_IN_USE.search(line) or SERVICE_FAILED.search(line):
            raise _StartFailure("a network service could not start")
        failed = failed_models(line)
        if any(name in expected for name in failed):
            raise _StartFailure("a model failed to load")

    def _start_error(self, summary: str, found: Diagnosis | None, text: str) -> ServeError:
        # A known cause is said once (the log repeats it in several forms); the tail is shown only
        # when the cause is unknown. The CLI prints the error, so the event is for JSON logs only.
        cause = found.cause if found else "no known cause found in the log"
        hint = found.hint if found else f"read the full log: {self._log_path}"
        if str(self._log_path) not in hint:
            hint += f" (full log: {self._log_path})"
        message = f"tritonserver did not start: {summary}\n{cause}"
        if found is None:
            message += f"\n--- last lines of {self._log_path} ---\n{log_tail(text)}"
        log.info("server.start_failed", name=self.name, summary=summary, cause=cause, log=str(self._log_path))
        return ServeError(message, hint=hint)

    def _cleanup_process(self) -> None:
        """Stop the process (if any), kill stragglers in its group and its stubs in sessions of their own, remove its
        shared memory."""
        if self._proc is not None and not self._swept:
            if self._proc.poll() is None:
                self._terminate()
            killpg(self._proc.pid, signal.SIGKILL)  # stubs of a killed server; the group is ours
            kill_processes_of(self.shm_prefix)
            self._swept = True
        remove_shm(self.shm_prefix)

    def _terminate(self) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGTERM)
        try:  # the supervisor gives tritonserver exit_timeout_s + 5 s, then cleans up
            self._proc.wait(timeout=self.exit_timeout_s + 20)
        except subprocess.TimeoutExpired:
            log.warning("server.kill", name=self.name, pid=self._proc.pid, reason="no exit after SIGTERM")
            killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its shared memory; idempotent.

        Close your tritonclient clients first: an open keep-alive connection makes tritonserver
        wait ``exit_timeout_s`` before it exits.
        """
        was_running = self.running
        self._cleanup_process()
        if self._state_file is not None:
            self._state_file.unlink(missing_ok=True)
            self._state_file = None
        if was_running:
            code = self._proc.returncode if self._proc else None
            log.info("server.stopped", name=self.name, pid=self.pid, exit_code=code)

    def exit_report(self) -> str:
        """Why the server stopped by itself, from its log: the cause (a crash signal, a dead stub, a
        model failure) and the log's last lines."""
        code = self._proc.returncode if self._proc else None
        if code == HOME_GONE:
            return f"tritonserver stopped: its FTX_HOME {self.home} was deleted (its records and logs with it)"
        text = read_from(self._log_path, 0)
        cause = exit_cause(text) or (diagnose(text, log_path=self._log_path) or Diagnosis("", "")).cause
        head = f"tritonserver stopped by itself (supervisor exit code {code})"
        return (
            f"{head}: {cause}\n--- last lines of {self._log_path} ---\n{log_tail(text)}"
            if cause
            else f"{head}\n--- last lines of {self._log_path} ---\n{log_tail(text)}"
        )

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server exits; return its exit code."""
        if self._proc is None:
            raise ServeError(f"server {self.name} was not started", hint="call start() first")
        return self._proc.wait(timeout=timeout)

    def detach(self) -> Path:
        """Leave the server running after this process ends; record it and return the state file."""
        if self.die_with_parent:
            raise ServeError(
                f"server {self.name} was started with die_with_parent=True and would die with ftx",
                hint="create it with TritonServer(..., die_with_parent=False) to detach it",
            )
        if not self.running:
            raise ServeError(f"server {self.name} is not running, so it cannot be detached", hint="start() it first")
        directory = servers_dir(self.home)
        directory.mkdir(parents=True, exist_ok=True)
        self.name = self._free_name()
        path = directory / f"{self.name}.json"
        record = ServerRecord(
            name=self.name,
            pid=self.pid or 0,
            host=self.host,
            http_port=self.ports.http,
            grpc_port=self.ports.grpc,
            metrics_port=self.ports.metrics,
            repository=str(self.repository),
            log_path=str(self._log_path),
            started_at=self._started_at,
            models=self.expected_models,
            shm_prefix=self.shm_prefix,
            exit_timeout_s=self.exit_timeout_s,
            start_ticks=self._start_ticks,
            device=self.device,
        )
        write_atomic(path, record.to_json())
        release(self._leash)  # recorded: it may outlive this process now
        self._state_file = path
        self._detached = True
        log.info("server.detached", name=self.name, pid=self.pid, state=str(path))
        return path

    def _free_name(self) -> str:
        """This server's name, or ``name-2``… if a live server already uses it (unless chosen)."""
        live = {r.name for r in list_servers(self.home) if r.alive and r.pid != self.pid}
        if self.name not in live:
            return self.name
        if self._explicit_name:
            raise ServeError(
                f"a server named {self.name!r} is already running",
                hint=f"stop it (`ftx stop {self.name}`) or choose another name",
            )
        n = 2
        while self._numbered(n) in live:
            n += 1
        return self._numbered(n)

    def _numbered(self, n: int) -> str:
        """``name-n``, the name cut so that the whole stays within MAX_NAME_CHARS."""
        suffix = f"-{n}"
        return self.name[: MAX_NAME_CHARS - len(suffix)].rstrip("-.") + suffix

    # ----------------------------------------------------------------- context manager

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._detached:
            self.stop()

    def __repr__(self) -> str:
        return f"TritonServer(name={self.name!r}, http={self.http_url}, pid={self.pid})"
