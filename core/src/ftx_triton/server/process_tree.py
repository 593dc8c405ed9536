"""tritonserver's processes: liveness that survives pid reuse, group termination, the Python-backend
stubs and their shared memory, and orphans left by a server that was killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import psutil
import structlog

from ftx_triton.server.launch import FTX_SHM_PREFIX, is_ftx_shm_prefix

log = structlog.get_logger(__name__)

STUB_NAME = "triton_python_backend_stub"
"""The Python backend's stub program, one process per model instance (its command line names the model)."""

SHM_DIR = Path("/dev/shm")


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first: proc(5)'s field N is
    index N - 3), or None if there is no such process."""
    try:
        _, paren, tail = Path(f"/proc/{pid}/stat").read_text().rpartition(")")
    except OSError:
        return None
    return tail.split() if paren else None


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, or None if there is none."""
    fields = stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[19]))


def children_of(pid: int) -> list[psutil.Process]:
    """The direct children of process ``pid`` (none when it is gone).

    Read from ``/proc/PID/task/*/children`` where the kernel has it, by hand: psutil's ``children()`` reads the
    parent of every process on the machine, which the supervisor, polling a few times a second, paid in CPU
    while its server sat idle. A child that starts or ends during the read is seen at the next poll."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    pids: list[int] = []
    listed = False
    for task in tasks:
        try:
            pids.extend(int(field) for field in (task / "children").read_text().split())
        except OSError:  # a thread that ended meanwhile, or a kernel without the file
            continue
        listed = True
    if not listed:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(pid).children()
        return []
    children = []
    for child in dict.fromkeys(pids):
        with contextlib.suppress(psutil.Error):
            children.append(psutil.Process(child))
    return children


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, started at ``start_ticks``."""
    stat = proc_stat(pid)
    if stat is None:
        return False
    state, started = stat
    if state in ("Z", "X"):
        reap(pid)
        return False
    return start_ticks is None or started == start_ticks


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_gone(pid: int, start_ticks: int | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid, start_ticks):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def terminate_group(pid: int, start_ticks: int | None, grace_s: float) -> None:
    """SIGTERM the server, SIGKILL its process group after ``grace_s``, then sweep stragglers.

    Servers run in their own session, so the group id is the server's pid and holds its stubs.
    """
    if alive(pid, start_ticks):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, start_ticks, grace_s):
            log.warning("server.kill", pid=pid, reason=f"no exit {grace_s:.0f} s after SIGTERM")
            killpg(pid, signal.SIGKILL)
            _wait_gone(pid, start_ticks, 5.0)
    killpg(pid, signal.SIGKILL)  # stubs left behind by a killed server


def processes_of(prefix: str) -> list[psutil.Process]:
    """The live processes of the server whose shared-memory prefix is ``prefix`` (tritonserver and its
    stubs carry it on their command lines; it is random per server, so nothing else matches)."""
    if not is_ftx_shm_prefix(prefix):
        raise ValueError(f"refusing to look for processes of other servers: {prefix!r}")
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(prefix in arg for arg in cmdline(process)) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def end_processes_of(prefix: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then after ``grace_s`` SIGKILL, what is left of a server whose supervisor is gone (killed
    with SIGKILL, it could not end tritonserver and the model's stubs); return their pids."""
    left = processes_of(prefix)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive_after = psutil.wait_procs(left, timeout=grace_s)
    _kill(alive_after)
    if left:
        log.warning("server.leftovers_ended", pids=[p.pid for p in left], prefix=prefix)
    return [p.pid for p in left]


def kill_processes_of(prefix: str) -> list[int]:
    """SIGKILL the live processes of the server whose shared-memory prefix is ``prefix`` and wait until they are
    gone; return their pids. What a kill of the server's process group leaves: its stubs that run in a session of
    their own (:mod:`~ftx_triton.server.stub_launcher`). A prefix ftx did not make for one server kills nothing."""
    if not is_ftx_shm_prefix(prefix):
        return []
    left = processes_of(prefix)
    _kill(left)
    return [p.pid for p in left]


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=5)


def remove_shm(prefix: str) -> list[Path]:
    """Delete the Python-backend shared-memory regions of the ftx server whose prefix is ``prefix`` (names starting
    with it); return them. A prefix ftx did not make for one server (empty, the start all ftx servers' regions share,
    another program's) removes nothing: the one guard of every caller (the supervisor, ``ftx stop``, a dropped head
    start, :class:`~ftx_triton.server.tritonserver.TritonServer`)."""
    if not is_ftx_shm_prefix(prefix):
        return []
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def is_stub(process: psutil.Process) -> bool:
    """Whether ``process`` is a Python-backend stub (its command line names it; a zombie's is empty)."""
    return _names_stub(cmdline(process))


def _names_stub(args: list[str]) -> bool:
    """Whether a command line is a Python-backend stub's."""
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
            if is_stub(process) and process.status() != psutil.STATUS_ZOMBIE:
                live.append(process)
    return live


_SERVER_PREFIX = re.compile(rf"({re.escape(FTX_SHM_PREFIX)}[0-9a-f]+-)")
"""One ftx server's shared-memory prefix, in a command line or a region's name."""


def sweep_orphans() -> list[str]:
    """Kill ftx's Python-backend stubs whose tritonserver is gone and remove shared memory no live
    process uses any more (what a server killed mid-start can leave); return what was removed.

    The regions are listed before the processes are read: a server that starts meanwhile (other ``ftx run``s, other
    users of the machine) makes its region after its tritonserver exists, so a region listed first either has its
    server among the processes read next or has none; one made during the read is not judged at all."""
    regions = list(SHM_DIR.glob(f"{FTX_SHM_PREFIX}*"))
    live_prefixes: set[str] = set()
    orphans: list[psutil.Process] = []
    for process in psutil.process_iter():
        args = cmdline(process)
        text = " ".join(args)
        found = _SERVER_PREFIX.findall(text)
        if not found:
            continue
        if _names_stub(args) and len(args) > 5 and args[5].isdigit() and not alive(int(args[5])):
            orphans.append(process)
            continue
        live_prefixes.update(found)
    swept = []
    for process in orphans:
        with contextlib.suppress(psutil.Error):
            process.kill()
            swept.append(f"stub pid {process.pid}")
    psutil.wait_procs(orphans, timeout=5)
    for path in regions:
        match = _SERVER_PREFIX.match(path.name)
        if match and match.group(1) not in live_prefixes:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                swept.append(path.name)
    if swept:
        log.warning("server.orphans_swept", removed=swept)
    return swept
