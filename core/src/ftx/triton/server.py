"""Run the ``tritonserver`` shipped in the nvidia-pytriton wheel as a supervised local process.

The wheel's server works on a CPU-only machine once three things are prepared: a copy of its
``backends`` tree holding the Python-backend stub for the running interpreter, ``PATH`` with this
interpreter's ``bin`` first (the stub finds its environment through ``python3``), and
``LD_LIBRARY_PATH`` = this interpreter's libpython dir, then ``nvidia_pytriton.libs``.
:class:`TritonServer` does that, binds to one host only, waits for the server and its models to be
ready (a broken stub hangs the server, so the wait has a timeout and watches the log), and on
failure raises :class:`~ftx.errors.ServeError` with the cause and the log tail. Servers left running
with :meth:`TritonServer.detach` are recorded under
``<home>/servers`` and managed with :func:`list_servers` and :func:`stop_server`.

tritonserver runs under :mod:`ftx.triton.supervisor`, which owns its process tree (no stub outlives
it, its shared memory is removed however it ends), stops it when a stub dies, and serves the HTTP
front (:mod:`ftx.triton.front`) that keeps requests tritonserver cannot survive away from it.
Paths the Python backend hands to ``bash -c`` (the repository, the backends directory) are given
to tritonserver through links of plain characters when they hold anything else (a space, ``$``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from importlib import util as importlib_util
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

import psutil
import structlog

from ftx.errors import ServeError
from ftx.redact import strip_secrets
from ftx.triton.stub_env import STUB_PYTHON_ENV, stub_env

log = structlog.get_logger(__name__)

STUB_NAME = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
FTX_SHM_PREFIX = SHM_PREFIX + "ftx-"
STUB_START_TIMEOUT_S = 60.0
"""A Python model being loaded with no stub process running for it this long will never load."""
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+=:,@%-]+")
"""Characters that pass through the Python backend's ``bash -c`` stub command line unchanged."""
MODEL_CONTROL_MODES = ("none", "poll", "explicit")
LOG_TAIL_LINES = 30
_POLL_S = 0.1
_PORT_ATTEMPTS = 3
_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")


# --------------------------------------------------------------------------- ports


@dataclass(frozen=True)
class ServerPorts:
    """The three ports a tritonserver listens on."""

    http: int
    grpc: int
    metrics: int


TRITON_PORTS = ServerPorts(8000, 8001, 8002)
"""Triton's own defaults (HTTP, gRPC, metrics), what its clients and guides assume."""


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` right now."""
    family = socket.AF_INET6 if ":" in client_host(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((client_host(host), port))
        except OSError:
            return False
    return True


def choose_ports(host: str, http: int | None = None, grpc: int | None = None,
                 metrics: int | None = None) -> tuple[ServerPorts, str | None]:
    """The ports a server should take, and a sentence for the user when they are not the usual ones.

    Ports given are kept; the others are Triton's 8000/8001/8002 when all three are free, else free ones
    (the sentence says which defaults were taken).
    """
    wanted = (http, grpc, metrics)
    if all(p is not None for p in wanted):
        return ServerPorts(*wanted), None  # type: ignore[arg-type]
    taken = [p for p in (TRITON_PORTS.http, TRITON_PORTS.grpc, TRITON_PORTS.metrics) if not port_free(host, p)]
    defaults, note = TRITON_PORTS, None
    if taken:
        defaults = free_ports(client_host(host))
        note = (f"Triton's usual port(s) {', '.join(map(str, taken))} are in use on {client_host(host)}; "
                "taking free ones (pass --http-port/--grpc-port/--metrics-port to choose)")
    chosen = (w if w is not None else d for w, d in zip(wanted, (defaults.http, defaults.grpc, defaults.metrics),
                                                       strict=True))
    return ServerPorts(*chosen), note


def ports_for(host: str, http: int | None = None, grpc: int | None = None, metrics: int | None = None,
              say: Callable[[str], None] | None = None) -> tuple[ServerPorts, bool]:
    """The ports a local tritonserver takes (see :func:`choose_ports`; a change from Triton's usual ones is
    said) and whether the user gave any. A port the user gave that is busy fails now, before any model loads."""
    ports, note = choose_ports(host, http, grpc, metrics)
    given = {http, grpc, metrics} - {None}
    if busy := [p for p in busy_ports(host, ports) if p in given]:
        raise ServeError(f"port(s) {', '.join(map(str, busy))} on {host} are in use",
                         hint="pass free --http-port/--grpc-port/--metrics-port, or leave them out "
                              "(ftx takes Triton's 8000-8002, or free ones when those are taken)")
    if note and say is not None:
        say(note)
    return ports, bool(given)


def busy_ports(host: str, ports: ServerPorts) -> list[int]:
    """Which of ``ports`` cannot be bound on ``host`` now (checked before any model loads)."""
    return [p for p in (ports.http, ports.grpc, ports.metrics) if not port_free(host, p)]


def free_ports(host: str = "127.0.0.1") -> ServerPorts:
    """Return three distinct TCP ports that are free on ``host`` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(3):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
    return ServerPorts(*ports)


def _loopback_port() -> int:
    """A free port on 127.0.0.1 (tritonserver's own HTTP port behind the front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- install


@dataclass(frozen=True)
class TritonInstall:
    """Where the nvidia-pytriton wheel keeps tritonserver and what it needs at run time."""

    binary: Path  # pytriton/tritonserver/bin/tritonserver
    backends: Path  # pytriton/tritonserver/backends (no stub inside)
    stub: Path  # python_backend_stubs/<major.minor>/triton_python_backend_stub
    libs: Path  # site-packages/nvidia_pytriton.libs
    python_version: str  # "3.11": the interpreter the stub matches


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


TRITONSERVER_DIR_ENV = "FTX_TRITONSERVER_DIR"
"""A tritonserver install to use instead of the wheel's: ``bin/``, ``lib/``, ``backends/``, ``python_backend_stubs/``."""


def _install_from_dir(root: Path) -> TritonInstall:
    pyver = _python_version()
    install = TritonInstall(binary=root / "bin" / "tritonserver", backends=root / "backends",
                            stub=root / "python_backend_stubs" / pyver / STUB_NAME, libs=root / "lib", python_version=pyver)
    for path in (install.binary, install.backends / "python", install.libs, install.stub):
        if not path.exists():
            raise ServeError(f"{TRITONSERVER_DIR_ENV}={root} is not a tritonserver install: {path} is missing",
                             hint=f"unset {TRITONSERVER_DIR_ENV} to use the nvidia-pytriton wheel's server")
    return install


def find_tritonserver() -> TritonInstall:
    """Locate tritonserver, its backends, the stub for this Python and the vendored libs."""
    if os.environ.get(TRITONSERVER_DIR_ENV):
        return _install_from_dir(Path(os.environ[TRITONSERVER_DIR_ENV]))
    hint = "pip install nvidia-pytriton (the python runtime's embedded tritonserver)"
    spec = importlib_util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServeError("nvidia-pytriton is not installed, so there is no tritonserver to run", hint=hint)
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    pyver = _python_version()
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        backends=root / "backends",
        stub=root / "python_backend_stubs" / pyver / STUB_NAME,
        libs=package.parent / "nvidia_pytriton.libs",
        python_version=pyver,
    )
    for path in (install.binary, install.backends / "python", install.libs):
        if not path.exists():
            raise ServeError(f"nvidia-pytriton at {package} is incomplete: {path} is missing",
                             hint="pip install --force-reinstall nvidia-pytriton")
    if not install.stub.is_file():
        stubs = root / "python_backend_stubs"
        have = sorted(p.name for p in stubs.iterdir()) if stubs.is_dir() else []
        raise ServeError(f"nvidia-pytriton has no Python-backend stub for Python {pyver} "
                         f"(it has: {', '.join(have) or 'none'})",
                         hint=f"use a Python version among {', '.join(have)}" if have else hint)
    return install


def _stamp(install: TritonInstall) -> dict[str, object]:
    """What a prepared backends tree was copied from; a different stamp means copy again."""
    lib = install.backends / "python" / "libtriton_python.so"
    files = [install.stub] + ([lib] if lib.exists() else [])
    return {"source": str(install.backends), "stub": str(install.stub),
            "files": {str(p): [p.stat().st_size, p.stat().st_mtime_ns] for p in files}}


def _read_stamp(directory: Path) -> object:
    try:
        return json.loads((directory / ".ftx-stamp.json").read_text())
    except (OSError, ValueError):
        return None


def prepare_backends(install: TritonInstall, home: Path) -> Path:
    """Return ``<home>/triton/backends-<pyver>``: the wheel's backends plus the matching stub.

    Built once in a temporary directory and published by rename; rebuilt when the wheel changes.
    """
    parent = Path(home) / "triton"
    parent.mkdir(parents=True, exist_ok=True)
    target = parent / f"backends-{install.python_version}"
    stamp = _stamp(install)
    if _read_stamp(target) == stamp:
        return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=parent))
    try:
        shutil.copytree(install.backends, tmp, dirs_exist_ok=True)
        shutil.copy2(install.stub, tmp / "python" / STUB_NAME)
        (tmp / ".ftx-stamp.json").write_text(json.dumps(stamp, sort_keys=True))
        for _ in range(3):
            if _read_stamp(target) == stamp:  # another process published it meanwhile
                return target
            if target.exists():
                with contextlib.suppress(FileNotFoundError):
                    target.rename(parent / f".{target.name}-old-{secrets.token_hex(4)}")
            try:
                tmp.rename(target)
                log.info("server.backends_prepared", path=str(target), stub=str(install.stub))
                return target
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        raise ServeError(f"could not publish {target}", hint=f"remove {target} and retry")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for old in parent.glob(f".{target.name}-old-*"):
            shutil.rmtree(old, ignore_errors=True)


def _join_paths(*parts: str | None) -> str:
    """Join path lists, keeping the first occurrence of each entry."""
    seen: list[str] = []
    for part in parts:
        for entry in (part or "").split(os.pathsep):
            if entry and entry not in seen:
                seen.append(entry)
    return os.pathsep.join(seen)


def python_libdir() -> Path | None:
    """The directory of this interpreter's shared libpython, if it has one."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir:
        return None
    pattern = f"libpython{_python_version()}*.so*"
    return Path(libdir) if any(Path(libdir).glob(pattern)) else None


def server_env(install: TritonInstall, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver and its stubs need, on top of ``os.environ`` and ``env``."""
    result = strip_secrets({**os.environ, **(env or {})})  # a server needs no Hub or cloud credentials
    # STUB_PYTHON_ENV names another python3 for the stubs (the python runtime's numpy-1 side environment)
    python = result.pop(STUB_PYTHON_ENV, None) or sys.executable
    result["PATH"] = _join_paths(str(Path(python).parent), result.get("PATH") or os.defpath)
    libdir = python_libdir()
    if libdir is None:
        log.warning("server.libpython_missing", executable=sys.executable,
                    note="the stub will use the system libpython; a version mismatch can break models")
    # folders the caller names come first: a backend's own libraries (the native FasterTransformer build's
    # Open MPI) must win over same-named ones in libpython's folder (a system Open MPI in /usr/lib)
    result["LD_LIBRARY_PATH"] = _join_paths((env or {}).get("LD_LIBRARY_PATH"), str(libdir) if libdir else None,
                                            str(install.libs), result.get("LD_LIBRARY_PATH"))
    return result


# --------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, or None if there is none."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, started at ``start_ticks``."""
    stat = _proc_stat(pid)
    if stat is None:
        return False
    state, started = stat
    if state in ("Z", "X"):
        _reap(pid)
        return False
    return start_ticks is None or started == start_ticks


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_gone(pid: int, start_ticks: int | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid, start_ticks):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _terminate_group(pid: int, start_ticks: int | None, grace_s: float) -> None:
    """SIGTERM the server, SIGKILL its process group after ``grace_s``, then sweep stragglers.

    Servers run in their own session, so the group id is the server's pid and holds its stubs.
    """
    if _alive(pid, start_ticks):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, start_ticks, grace_s):
            log.warning("server.kill", pid=pid, reason=f"no exit {grace_s:.0f} s after SIGTERM")
            _killpg(pid, signal.SIGKILL)
            _wait_gone(pid, start_ticks, 5.0)
    _killpg(pid, signal.SIGKILL)  # stubs left behind by a killed server


def remove_shm(prefix: str) -> list[Path]:
    """Delete Python-backend shared-memory regions whose names start with ``prefix``."""
    if not prefix.startswith(SHM_PREFIX) or prefix == SHM_PREFIX:
        raise ValueError(f"refusing to remove shared memory of other servers: {prefix!r}")
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _is_stub(process: psutil.Process) -> bool:
    args = _cmdline(process)
    return bool(args) and Path(args[0]).name == STUB_NAME


def stub_processes(pid: int) -> list[psutil.Process]:
    """The live (not zombie) Python-backend stubs below process ``pid``."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    live = []
    for process in below:
        with contextlib.suppress(psutil.Error):
            if _is_stub(process) and process.status() != psutil.STATUS_ZOMBIE:
                live.append(process)
    return live


def sweep_orphans() -> list[str]:
    """Kill ftx's Python-backend stubs whose tritonserver is gone and remove shared memory no live
    process uses any more (what a server killed mid-start can leave); return what was removed."""
    live_prefixes: set[str] = set()
    orphans: list[psutil.Process] = []
    for process in psutil.process_iter():
        args = _cmdline(process)
        text = " ".join(args)
        found = re.findall(rf"({re.escape(FTX_SHM_PREFIX)}[0-9a-f]+-)", text)
        if not found:
            continue
        if args and Path(args[0]).name == STUB_NAME and len(args) > 5 and args[5].isdigit() \
                and not _alive(int(args[5])):
            orphans.append(process)
            continue
        live_prefixes.update(found)
    swept = []
    for process in orphans:
        with contextlib.suppress(psutil.Error):
            process.kill()
            swept.append(f"stub pid {process.pid}")
    psutil.wait_procs(orphans, timeout=5)
    for path in SHM_DIR.glob(f"{FTX_SHM_PREFIX}*"):
        match = re.match(rf"({re.escape(FTX_SHM_PREFIX)}[0-9a-f]+-)", path.name)
        if match and match.group(1) not in live_prefixes:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                swept.append(path.name)
    if swept:
        log.warning("server.orphans_swept", removed=swept)
    return swept


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
        raise ServeError(f"{path} holds characters the Python backend cannot pass to its stubs "
                         "and no temporary directory with a plain path is available for a link",
                         hint="use an FTX_HOME (and repository path) of letters, digits and ._-/ only")
    links.mkdir(parents=True, exist_ok=True)
    link = links / hashlib.sha256(str(path).encode()).hexdigest()[:16]
    if not (link.is_symlink() and link.resolve() == path):
        tmp = links / f".{link.name}.{secrets.token_hex(4)}"
        tmp.symlink_to(path, target_is_directory=True)
        os.replace(tmp, link)
    log.info("server.path_linked", path=str(path), link=str(link),
             reason="the Python backend's stub command line cannot quote this path")
    return link


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when this process dies (Linux only)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


# --------------------------------------------------------------------------- log reading


# Messages every CPU-only start prints; they never explain a failure.
_NOISE = re.compile(r"Unable to allocate pinned system memory|CUDA memory pool disabled|CudaDriverHelper has not"
                    r"|unable to create stream for ensemble: CUDA driver"
                    r"|Failed to initialize NVML|DCGM unable to start|Collecting CPU metrics")


def _clean_lines(text: str) -> list[str]:
    """Log lines minus blanks, table borders, the server-options table and CPU-only noise."""
    lines: list[str] = []
    in_options = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or re.fullmatch(r"\+[-+]*\+", stripped) or _NOISE.search(line):
            continue
        if stripped.startswith("|"):
            in_options = in_options or stripped.replace(" ", "").startswith("|Option|Value|")
            if not in_options:
                lines.append(re.sub(r" {2,}", " ", stripped))
            continue
        in_options = False
        lines.append(line)
    return lines


def log_tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` meaningful lines of a tritonserver log."""
    return "\n".join(_clean_lines(text)[-lines:])


def _unescape(message: str) -> str:
    return message.replace("\\n", "\n").replace('\\"', '"').strip().rstrip('"').strip()


def _compact_reason(reason: str) -> str:
    """'Internal: RuntimeError: boom\\n\\nAt:\\n  model.py(2): initialize' in one line."""
    lines = [line.strip() for line in _unescape(reason).splitlines() if line.strip()]
    if not lines:
        return "unknown reason"
    head, frames = lines[0], [line for line in lines[1:] if line != "At:"]
    text = head + (f" (at {frames[-1]})" if frames else "")
    return text if len(text) <= 600 else text[:597] + "..."


_FAILED_MODEL = re.compile(r"failed to load '([^']+)' version \d+: (.*)$")
_POLL_FAILED = re.compile(r"Poll failed for model directory '([^']+)': (.*)$")
_MISSING_LIB = re.compile(r"error while loading shared libraries: (\S+?): cannot open shared object file")
_PORT_IN_USE = re.compile(r"Socket '([^']+)' already in use")
_SERVICE_FAILED = re.compile(r"failed to start (\w+) service: (.*)$")
_LOADING = re.compile(r'"loading: ([^:"]+):\d+"')
_STUB_LAUNCH = re.compile(r"^bash: (?:line \d+: )?(.*)$", re.MULTILINE)
_CRASH = re.compile(r"Signal \((\d+)\) received")
_SUPERVISOR = re.compile(r"^ftx-supervisor: (.*)$", re.MULTILINE)
_LOADED = re.compile(r"successfully loaded '([^']+)'")


def failed_models(text: str) -> dict[str, str]:
    """Model name to a one-line reason, for each model the log says failed to load."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _FAILED_MODEL.search(line) or _POLL_FAILED.search(line)
        if match and match.group(1) not in found:
            found[match.group(1)] = _compact_reason(match.group(2))
    return found


@dataclass(frozen=True)
class Diagnosis:
    """The likely cause of a failed start and what to do about it."""

    cause: str
    hint: str
    port_in_use: bool = False


def diagnose(text: str, *, log_path: Path | None = None) -> Diagnosis | None:
    """Recognise why tritonserver did not start from its log text, or None if nothing is known."""
    see_log = f"full log: {log_path}" if log_path else "see the server log"
    if match := _MISSING_LIB.search(text):
        lib = match.group(1)
        if lib.startswith("libpython"):
            ver = _python_version()
            return Diagnosis(f"the Python-backend stub cannot start: {lib} is missing",
                             f"install the shared libpython for Python {ver} (Debian: apt-get install "
                             f"libpython{ver}) or use a Python built with --enable-shared")
        return Diagnosis(f"the Python-backend stub cannot start: shared library {lib} not found",
                         "LD_LIBRARY_PATH must list <site-packages>/nvidia_pytriton.libs (ftx sets it); "
                         "reinstall nvidia-pytriton if that directory is incomplete")
    if match := _STUB_LAUNCH.search(text):
        return Diagnosis(f"the Python-backend stub could not be launched: bash: {match.group(1)}",
                         "tritonserver starts stubs through `bash -c`; a path it cannot split right (a space, "
                         "a `$`) breaks the command: use an FTX_HOME and repository path of plain characters; "
                         + see_log)
    if match := _PORT_IN_USE.search(text):
        return Diagnosis(f"port in use: {match.group(1)}",
                         "choose other ports, or let ftx pick free ones; `ftx ps` lists servers ftx left running",
                         port_in_use=True)
    failed = failed_models(text)
    if failed:
        cause = "; ".join(f"model '{name}' failed to load: {reason}" for name, reason in failed.items())
        if "_recursion_count" in text:
            libdir = sysconfig.get_config_var("LIBDIR")
            return Diagnosis(cause + " — the stub runs a different libpython than this interpreter",
                             f"put {libdir} first in LD_LIBRARY_PATH, or make the venv from the system python3")
        if "ModuleNotFoundError" in cause:
            return Diagnosis(cause, f"install the missing module into the environment of {sys.executable} "
                                    "(the stub runs the python3 first on PATH)")
        names = ", ".join(failed)
        return Diagnosis(cause, f"fix the model ({names}) in the repository; {see_log}")
    if match := _SERVICE_FAILED.search(text):
        return Diagnosis(f"tritonserver could not start its {match.group(1)} service: {_unescape(match.group(2))}",
                         see_log)
    if match := re.search(r"error: creating server: (.*)", text):
        return Diagnosis(f"tritonserver could not be created: {match.group(1).strip()}", see_log)
    return None


def exit_cause(text: str) -> str | None:
    """Why a running tritonserver stopped, from its log: the supervisor's report of a dead stub or of
    how tritonserver ended, a crash signal, or a model failure."""
    causes = []
    crashes = [int(n) for n in _CRASH.findall(text) if int(n) not in (signal.SIGTERM, signal.SIGINT)]
    if crashes:  # tritonserver also says "Signal (15) received." when it is asked to stop
        number = crashes[0]
        try:
            causes.append(f"tritonserver crashed with {signal.Signals(number).name} (signal {number})")
        except ValueError:
            causes.append(f"tritonserver crashed with signal {number}")
    causes += [r for r in _SUPERVISOR.findall(text) if "died" in r or "exited by itself" in r]
    return "; ".join(causes) if causes else None


def python_backend_models(repository: Path) -> list[str]:
    """Models of a repository that run on the Python backend (each needs a stub process)."""
    found = []
    for config in Path(repository).glob("*/config.pbtxt"):
        with contextlib.suppress(OSError):
            if re.search(r'^\s*backend:\s*"python"', config.read_text(), re.MULTILINE):
                found.append(config.parent.name)
    return sorted(found)


class _LogWatch:
    """Reads lines appended to a log file since a given offset."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path, self.offset, self._partial = path, offset, ""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        text = self._partial + data.decode("utf-8", "replace")
        *lines, self._partial = text.split("\n")
        return lines


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- HTTP probes


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True if GET ``url`` answers 200 (a fresh connection each time: no keep-alive left open)."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def client_host(host: str) -> str:
    """The address a client on this machine uses to reach a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def repository_models(repository: Path) -> list[str]:
    """Model names in a repository: its non-hidden subdirectories."""
    return sorted(p.name for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith("."))


def _safe_name(text: str) -> str:
    return _NAME_RE.sub("-", text).strip("-.") or "triton"


# --------------------------------------------------------------------------- state records


@dataclass(frozen=True)
class ServerRecord:
    """A detached server as written to ``<home>/servers/<name>.json``."""

    name: str
    pid: int
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    repository: str
    log_path: str
    started_at: str
    models: tuple[str, ...] = ()
    shm_prefix: str = ""
    exit_timeout_s: int = 10
    start_ticks: int | None = None
    state_file: str = field(default="", compare=False)
    alive: bool = field(default=True, compare=False)

    @property
    def http_url(self) -> str:
        return f"{client_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{client_host(self.host)}:{self.grpc_port}"

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("state_file")
        data.pop("alive")
        data["models"] = list(self.models)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_file(cls, path: Path) -> ServerRecord:
        """Read a state file; ``alive`` says whether that process still runs."""
        data = json.loads(path.read_text())
        known = {f for f in cls.__dataclass_fields__ if f not in ("state_file", "alive")}
        record = cls(**{k: v for k, v in data.items() if k in known}, state_file=str(path))
        return replace(record, models=tuple(record.models), alive=_alive(record.pid, record.start_ticks))


def servers_dir(home: Path) -> Path:
    return Path(home) / "servers"


def list_servers(home: Path) -> list[ServerRecord]:
    """Detached servers recorded under ``home``, sorted by name; dead ones have ``alive=False``."""
    records = []
    for path in sorted(servers_dir(home).glob("*.json")):
        try:
            records.append(ServerRecord.from_file(path))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("server.state_unreadable", path=str(path), error=str(exc))
    return records


def _stop_record(record: ServerRecord) -> None:
    if record.alive:
        _terminate_group(record.pid, record.start_ticks, record.exit_timeout_s + 20)
    _reap(record.pid)
    if record.shm_prefix.startswith(SHM_PREFIX + "ftx-"):
        remove_shm(record.shm_prefix)
    Path(record.state_file).unlink(missing_ok=True)
    log.info("server.stopped" if record.alive else "server.record_removed", name=record.name, pid=record.pid)


def stop_server(home: Path, name: str | None = None, *, all_servers: bool = False) -> list[ServerRecord]:
    """Stop detached servers and remove their records; return the records handled.

    ``name`` stops that server. Without a name: ``all_servers`` stops every one; otherwise the
    only running server is stopped (an error if several run). Records of dead servers are
    removed along the way and returned with ``alive=False``.
    """
    records = list_servers(home)
    if name is not None:
        chosen = [r for r in records if r.name == name]
        if not chosen:
            known = ", ".join(r.name for r in records) or "none"
            raise ServeError(f"no server named {name!r} (known: {known})", hint="`ftx ps` lists detached servers")
    else:
        live = [r for r in records if r.alive]
        if len(live) > 1 and not all_servers:
            raise ServeError(f"{len(live)} servers are running: {', '.join(r.name for r in live)}",
                             hint="name one (`ftx stop NAME`) or stop them all with `ftx stop --all`")
        chosen = records
    for record in chosen:
        _stop_record(record)
    return chosen


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
    ``http_front`` puts :mod:`ftx.triton.front` on the HTTP port (bodies up to ``max_body_bytes``);
    ``stub_start_timeout_s``: how long a Python model may load without a stub process of its own.
    ``pid`` is the supervisor's (:mod:`ftx.triton.supervisor`), the leader of the server's processes.
    """

    def __init__(self, repository: Path, *, home: Path, host: str = "127.0.0.1",
                 ports: ServerPorts | None = None, model_control: str = "none",
                 load_models: Sequence[str] = (), ready_timeout_s: float = 180.0,
                 log_path: Path | None = None, env: Mapping[str, str] | None = None,
                 exit_timeout_s: int = 10, name: str | None = None,
                 die_with_parent: bool = True, http_front: bool = True,
                 max_body_bytes: int | None = None, stub_start_timeout_s: float = STUB_START_TIMEOUT_S,
                 backend_directory: Path | None = None, cwd: Path | None = None,
                 launcher: Sequence[str] = (), ports_given: bool | None = None) -> None:
        if model_control not in MODEL_CONTROL_MODES:
            raise ServeError(f"unknown model control mode {model_control!r}",
                             hint=f"use one of: {', '.join(MODEL_CONTROL_MODES)}")
        if load_models and model_control != "explicit":
            raise ServeError(f"load_models needs model_control='explicit' (got {model_control!r})",
                             hint="pass model_control='explicit' or drop load_models")
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise ServeError(f"model repository {self.repository} does not exist",
                             hint="build the repository first (ftx configure)")
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
        self._explicit_name = name is not None
        self.name = _safe_name(name or self.repository.name)
        self.die_with_parent = die_with_parent
        self.http_front = http_front
        self.max_body_bytes = max_body_bytes
        self.stub_start_timeout_s = stub_start_timeout_s
        self._internal_http_port: int | None = None
        self.shm_prefix = f"{FTX_SHM_PREFIX}{secrets.token_hex(6)}-"
        self.backend_directory = Path(backend_directory) if backend_directory else None
        """Serve with this ``--backend-directory`` instead of the prepared wheel backends (python only)."""
        self.cwd = Path(cwd) if cwd else None
        """The server's working directory (default: its log folder); FasterTransformer reads gemm_config.in there."""
        self.launcher = tuple(launcher)
        """Put before the server's command line (``mpirun -n 2 …`` for several nodes)."""
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self._log_path = Path(log_path) if log_path else (
            self.home / "triton" / "logs" / f"{self.name}-{stamp}-{self.shm_prefix[-7:-1]}.log")
        self._proc: subprocess.Popen[bytes] | None = None
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
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def expected_models(self) -> tuple[str, ...]:
        """Models ``start`` waits for."""
        if self.model_control == "explicit":
            return self.load_models if self.load_models != ("*",) else tuple(repository_models(self.repository))
        return tuple(repository_models(self.repository))

    def command(self, backends: Path, binary: Path, repository: Path | None = None) -> list[str]:
        """The tritonserver command line (its HTTP on the loopback behind the front, if any)."""
        if self.http_front:
            http = f"--http-address=127.0.0.1 --http-port={self._internal_http_port}".split()
        else:
            http = [f"--http-address={self.host}", f"--http-port={self.ports.http}"]
        cmd = [
            str(binary),
            f"--model-repository={repository or self.repository}",
            f"--backend-directory={backends}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *http,
            f"--grpc-address={self.host}", f"--grpc-port={self.ports.grpc}",
            "--allow-metrics=true", f"--metrics-address={self.host}", f"--metrics-port={self.ports.metrics}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--model-control-mode={self.model_control}",
        ]
        cmd += [f"--load-model={model}" for model in self.load_models]
        return cmd

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
            offset = self._spawn(install, backends, env, repository)
            say(f"starting tritonserver on {self.http_url} (log: {self._log_path})")
            began = time.monotonic()
            try:
                self._wait_ready(offset, say)
            except _StartFailure as failure:
                self._cleanup_process()
                text = _read_from(self._log_path, offset)
                found = diagnose(text, log_path=self._log_path)
                if found and found.port_in_use and attempt < attempts:
                    log.info("server.port_retry", name=self.name, attempt=attempt, cause=found.cause)
                    self.ports = free_ports(self.host)
                    self._internal_http_port = None
                    self._proc, self._swept = None, False
                    continue
                raise self._start_error(str(failure), found, text) from None
            except BaseException:
                self._cleanup_process()
                raise
            self._started_at = datetime.now(UTC).isoformat(timespec="seconds")
            log.info("server.started", name=self.name, pid=self.pid, http=self.http_url, grpc=self.grpc_url,
                     models=list(self.expected_models), seconds=round(time.monotonic() - began, 2))
            say(f"tritonserver ready on {self.http_url} (pid {self.pid})")
            return

    def supervisor_command(self, triton_command: list[str]) -> list[str]:
        """``python -m ftx.triton.supervisor SPEC`` for a tritonserver command line."""
        spec: dict[str, object] = {"command": triton_command, "shm_prefix": self.shm_prefix,
                                   "exit_timeout_s": self.exit_timeout_s}
        if self.http_front:
            spec["front"] = {"host": self.host, "port": self.ports.http, "upstream_port": self._internal_http_port,
                             "max_body_bytes": self.max_body_bytes}
        return [sys.executable, "-m", "ftx.triton.supervisor", json.dumps(spec)]

    def _spawn(self, install: TritonInstall, backends: Path, env: dict[str, str], repository: Path) -> int:
        """Start the supervisor (and so tritonserver) with output appended to the log; return the log
        offset of this run."""
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.http_front and self._internal_http_port is None:
            self._internal_http_port = _loopback_port()
        triton = [*self.launcher, *self.command(backends, install.binary, repository)]
        cmd = self.supervisor_command(triton)
        with self._log_path.open("ab") as out:
            out.write(f"# ftx: {' '.join(triton)}\n".encode())
            out.flush()
            offset = out.tell()
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=self.cwd or self._log_path.parent, start_new_session=True,
                # only prctl/getppid/kill run between fork and exec
                preexec_fn=_parent_death_signal() if self.die_with_parent else None,  # noqa: PLW1509
            )
        stat = _proc_stat(self._proc.pid)
        self._start_ticks = stat[1] if stat else None
        log.debug("server.spawned", name=self.name, pid=self._proc.pid, cmd=cmd)
        return offset

    def _wait_ready(self, offset: int, say: Callable[[str], None]) -> None:
        """Poll readiness; raise _StartFailure on exit, a fatal log line, or timeout."""
        assert self._proc is not None
        base = f"http://{self.http_url}"
        watch = _LogWatch(self._log_path, offset)
        expected = self.expected_models
        pending = list(expected)
        server_ready = False
        deadline = time.monotonic() + self.ready_timeout_s
        python_models = set(python_backend_models(self.repository))
        loading: dict[str, float] = {}
        while True:
            for line in watch.new_lines():
                self._scan_line(line, expected, say)
                if (match := _LOADING.search(line)) and match.group(1) in python_models:
                    loading[match.group(1)] = time.monotonic()
                elif match := _LOADED.search(line):
                    loading.pop(match.group(1), None)
            code = self._proc.poll()
            if code is not None:
                raise _StartFailure(f"tritonserver exited with code {code} while starting")
            self._check_stubs_started(loading)
            if not server_ready:
                server_ready = http_ok(f"{base}/v2/health/ready")
            if server_ready:
                pending = [m for m in pending if not http_ok(f"{base}/v2/models/{quote(m, safe='')}/ready")]
                if not pending:
                    return
            if time.monotonic() > deadline:
                waiting = "the server" if not server_ready else "models " + ", ".join(pending)
                raise _StartFailure(f"tritonserver was not ready after {self.ready_timeout_s:g} s "
                                    f"(still waiting for {waiting})")
            time.sleep(_POLL_S)

    def _check_stubs_started(self, loading: dict[str, float]) -> None:
        """A Python model loading for STUB_START_TIMEOUT_S with no stub process of its own never
        will load (tritonserver waits for it forever)."""
        assert self._proc is not None
        overdue = [m for m, since in loading.items() if time.monotonic() - since > self.stub_start_timeout_s]
        if not overdue:
            return
        running = {part for stub in stub_processes(self._proc.pid) for part in Path(_cmdline(stub)[1]).parts[-3:-2]
                   if len(_cmdline(stub)) > 1}
        missing = [m for m in overdue if m not in running]
        if missing:
            raise _StartFailure(f"no Python-backend stub started for {', '.join(missing)} within "
                                f"{self.stub_start_timeout_s:g} s of loading")
        for model in overdue:
            loading.pop(model)  # its stub runs: the model is just slow to load

    def _scan_line(self, line: str, expected: Sequence[str], say: Callable[[str], None]) -> None:
        """Report progress from a log line; raise _StartFailure if it means the start has failed."""
        if match := _LOADING.search(line):
            say(f"loading model {match.group(1)}")
        elif match := _LOADED.search(line):
            say(f"loaded model {match.group(1)}")
        if _MISSING_LIB.search(line) or _STUB_LAUNCH.search(line):
            raise _StartFailure("a Python-backend stub could not start")
        if _PORT_IN_USE.search(line) or _SERVICE_FAILED.search(line):
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
        """Stop the process (if any), kill stragglers in its group, remove its shared memory."""
        if self._proc is not None and not self._swept:
            if self._proc.poll() is None:
                self._terminate()
            _killpg(self._proc.pid, signal.SIGKILL)  # stubs of a killed server; the group is ours
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
            _killpg(self._proc.pid, signal.SIGKILL)
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
        text = _read_from(self._log_path, 0)
        code = self._proc.returncode if self._proc else None
        cause = exit_cause(text) or (diagnose(text, log_path=self._log_path) or Diagnosis("", "")).cause
        head = f"tritonserver stopped by itself (supervisor exit code {code})"
        return f"{head}: {cause}\n--- last lines of {self._log_path} ---\n{log_tail(text)}" if cause else \
            f"{head}\n--- last lines of {self._log_path} ---\n{log_tail(text)}"

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server exits; return its exit code."""
        if self._proc is None:
            raise ServeError(f"server {self.name} was not started", hint="call start() first")
        return self._proc.wait(timeout=timeout)

    def detach(self) -> Path:
        """Leave the server running after this process ends; record it and return the state file."""
        if self.die_with_parent:
            raise ServeError(f"server {self.name} was started with die_with_parent=True and would die with ftx",
                             hint="create it with TritonServer(..., die_with_parent=False) to detach it")
        if not self.running:
            raise ServeError(f"server {self.name} is not running, so it cannot be detached",
                             hint="start() it first")
        directory = servers_dir(self.home)
        directory.mkdir(parents=True, exist_ok=True)
        self.name = self._free_name()
        path = directory / f"{self.name}.json"
        record = ServerRecord(
            name=self.name, pid=self.pid or 0, host=self.host, http_port=self.ports.http,
            grpc_port=self.ports.grpc, metrics_port=self.ports.metrics, repository=str(self.repository),
            log_path=str(self._log_path), started_at=self._started_at, models=self.expected_models,
            shm_prefix=self.shm_prefix, exit_timeout_s=self.exit_timeout_s, start_ticks=self._start_ticks,
        )
        tmp = directory / f".{self.name}.{secrets.token_hex(4)}.tmp"
        tmp.write_text(record.to_json())
        os.replace(tmp, path)
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
            raise ServeError(f"a server named {self.name!r} is already running",
                             hint=f"stop it (`ftx stop {self.name}`) or choose another name")
        n = 2
        while f"{self.name}-{n}" in live:
            n += 1
        return f"{self.name}-{n}"

    # ----------------------------------------------------------------- context manager

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._detached:
            self.stop()

    def __repr__(self) -> str:
        return f"TritonServer(name={self.name!r}, http={self.http_url}, pid={self.pid})"
