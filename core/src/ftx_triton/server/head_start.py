"""A cached ``ftx run``'s server, started before ftx has planned the run: the head start.

ftx's own start, plan and cached stages take about a second (imports, options, plugins, cache keys) before the
serve stage spawns the server, whose models then load for seconds more (the python runtime's model imports
torch). A run whose server became ready (cached or built) remembers how that server was spawned
(:class:`~ftx_triton.server.launch.Launch`), under a digest of the request: arguments, working folder, interpreter
and environment. The next identical request spawns that server again as the command starts (:func:`begin`), so
that its load overlaps ftx's start, plan and stages. The run goes on as ever; where its serve stage would spawn a
server it is handed the early one (:func:`adopt`) only when that is exactly the server it would spawn:

* the same launch (command line, environment, folder, log file, ports), the random parts taken from the early one;
* its model repository and backends still the directories they were when it started (a rebuilt one is new);
* every stage a cache hit: a stage that builds anything drops it first (:func:`stage_builds`);
* its process still running.

Anything else stops the early server, its whole process group at once and its shared memory removed, before the
run spawns its own: a wrong or stale model is never served, nor reported ready. Until it is adopted the early
server is on a leash (the supervisor's stdin, ``--leash``): however ftx ends, the server stops with it. A detached
server is released when its record is written. Light at import (the standard library and
:mod:`~ftx_triton.server.launch`): :func:`begin` runs before the command line is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftx_triton.io.atomic_file import write_json_atomic
from ftx_triton.server.launch import Launch, log_file_name, new_shm_prefix

if TYPE_CHECKING:
    from ftx_triton.server.ports import ServerPorts

FORMAT = 2
"""Version of the records; a record of another version is ignored."""
RECORDS_DIR = ("triton", "head-starts")
RECORDS_KEPT = 16
_GROUP_GONE_S = 5.0


@dataclass
class HeadStart:
    """A server spawned from the record of the last good run of this request, not yet adopted."""

    launch: Launch
    proc: subprocess.Popen[bytes]
    offset: int
    """Where this start's output begins in its log."""
    host: str
    ports: tuple[int, int, int]
    """The HTTP, gRPC and metrics ports users reach."""
    identities: dict[str, tuple[int, int] | None]
    """(device, inode) of the repository and backends directories when it was spawned."""
    spawned_at: float

    @property
    def leash(self) -> Any:
        return self.proc.stdin

    def mismatch(self, launch: Launch) -> str | None:
        """Why this server is not the one ``launch`` describes, or None when it is."""
        mine = self.launch
        if mine.env != launch.env:
            names = sorted(k for k in {*mine.env, *launch.env} if mine.env.get(k) != launch.env.get(k))
            return f"its environment differs ({', '.join(names[:5])})"
        for field in dataclasses.fields(Launch):
            if getattr(mine, field.name) != getattr(launch, field.name):
                return f"its {field.name.replace('_', ' ')} differs"
        if identities(launch) != self.identities:
            return "its model repository or backends directory was replaced since it started"
        code = self.proc.poll()
        if code is not None:
            return f"it exited (code {code})"
        return None

    def stop(self) -> None:
        """Kill its process group and its stubs in sessions of their own now, wait until they are gone, remove its
        shared memory, log and leash."""
        from ftx_triton.server.process_tree import kill_processes_of, killpg, remove_shm  # psutil: not at begin()'s

        prefix = str(self.launch.spec.get("shm_prefix") or "")
        killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        kill_processes_of(prefix)  # after the group: tritonserver, which starts stubs, is gone
        deadline = time.monotonic() + _GROUP_GONE_S
        while time.monotonic() < deadline:  # tritonserver and its stubs: the ports and memory they hold go with them
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.01)
        remove_shm(prefix)  # its own regions only
        with contextlib.suppress(OSError):
            if self.leash is not None:
                self.leash.close()
        Path(self.launch.log_path).unlink(missing_ok=True)


_request: str | None = None
"""This process's request digest, once :func:`begin` ran for an ``ftx run``."""
_pending: HeadStart | None = None
_recorded = False
"""Whether this run's launch was recorded (once a process)."""


def request_digest(argv: Sequence[str]) -> str:
    """What the server of a run may depend on before ftx has read it: arguments, folder, interpreter, environment."""
    text = json.dumps(
        [FORMAT, sys.executable, os.getcwd(), list(argv), sorted(os.environ.items())], separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def records_dir(home: Path) -> Path:
    return home.joinpath(*RECORDS_DIR)


def _home() -> Path:
    from ftx_triton.paths import ftx_home

    return ftx_home()


def begin(argv: Sequence[str]) -> None:
    """At the start of ``ftx ARGV``: for a run, spawn the server its last good run of the same request spawned,
    when that can be done as it was (its directories there, its ports free). Never raises."""
    global _request, _pending
    if "run" not in argv or _pending is not None:
        return
    try:
        _request = request_digest(argv)
        record = json.loads((records_dir(_home()) / f"{_request}.json").read_text())
        if record.get("format") != FORMAT or record.get("request") != _request:
            return
        _pending = _spawn(record)
    except Exception:  # noqa: BLE001 - no record, an unusable home or record: the run spawns its own server, as ever
        _pending = None


def _spawn(record: dict[str, Any]) -> HeadStart | None:
    from ftx_triton.server.ports import TRITON_PORTS, port_free

    last = Launch.from_json(record["launch"])
    spec = last.spec
    host, ports = str(record["host"]), tuple(int(p) for p in record["ports"])
    internal = [p for p in last.internal_ports if p]
    usual = (TRITON_PORTS.http, TRITON_PORTS.grpc, TRITON_PORTS.metrics)
    if len(ports) != 3 or not all(port_free(host, p) for p in ports):
        return None  # tritonserver could not bind them
    if record["auto_ports"] and ports != usual and all(port_free(host, p) for p in usual):
        return None  # free ports ftx took while Triton's were in use: a run would take Triton's now
    if not all(port_free("127.0.0.1", int(p)) for p in internal):
        return None
    found = identities(last)
    if None in found.values():
        return None  # the repository or the backends are gone: the run rebuilds them
    old, new = str(spec["shm_prefix"]), new_shm_prefix()
    launch = dataclasses.replace(
        last,
        argv=tuple(arg.replace(old, new) for arg in last.argv),
        header=last.header.replace(old, new),
        log_path=str(Path(last.log_path).parent / log_file_name(str(spec.get("name") or "triton"), new)),
    )
    proc, offset = launch.spawn(leash=True)
    return HeadStart(launch, proc, offset, host, ports, found, time.monotonic())


def identities(launch: Launch) -> dict[str, tuple[int, int] | None]:
    """(device, inode) of the directories a launch serves from (a published directory replaced is a new inode);
    None for one that is missing."""
    found: dict[str, tuple[int, int] | None] = {}
    for arg in launch.spec.get("command", []):
        for flag in ("--model-repository=", "--backend-directory="):
            if str(arg).startswith(flag):
                try:
                    st = os.stat(str(arg)[len(flag) :])
                    found[flag] = (st.st_dev, st.st_ino)
                except OSError:
                    found[flag] = None
    return found


def pending() -> HeadStart | None:
    """The early server not yet adopted or dropped, if any."""
    return _pending


def ports_for(
    host: str,
    http: int | None = None,
    grpc: int | None = None,
    metrics: int | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[ServerPorts, bool]:
    """:func:`ftx_triton.server.ports.ports_for`, the early server's ports counted as its own, not as in use: they
    are the choice when they are the one it would make had that server not started (Triton's usual ones, or, while
    those are in use by another, the early server's free ones, said as ever). An early server on other ports, or
    on another host, is stopped first."""
    from ftx_triton.server import ports as server_ports

    if _pending is not None:
        held = server_ports.ServerPorts(*_pending.ports)
        if _pending.host == host and server_ports.choose_ports(host, http, grpc, metrics, held=held)[0] == held:
            return server_ports.ports_for(host, http, grpc, metrics, say, held=held)
        discard(f"it listens on {_pending.host} ports {_pending.ports}, not this run's")
    return server_ports.ports_for(host, http, grpc, metrics, say)


def adopt(launch: Launch) -> HeadStart | None:
    """The early server when it is exactly ``launch`` (its random parts included), else None: then it is stopped
    and gone before this returns."""
    global _pending
    head = _pending
    if head is None:
        return None
    why = head.mismatch(launch)
    if why is not None:
        discard(why)
        return None
    _pending = None
    import structlog

    structlog.get_logger(__name__).info(
        "server.head_start", taken=True, pid=head.proc.pid, ahead_s=round(time.monotonic() - head.spawned_at, 3)
    )
    return head


def discard(reason: str) -> None:
    """Stop the early server, if there is one, and say why."""
    global _pending
    head, _pending = _pending, None
    if head is None:
        return
    head.stop()
    import structlog

    structlog.get_logger(__name__).info("server.head_start", taken=False, pid=head.proc.pid, reason=reason)


def stage_builds(stage: str) -> None:
    """A stage of this run builds: the early server serves what the build replaces, so it stops. This run's own
    launch is still recorded once ready: its server inherits the environment ftx started with
    (:mod:`ftx_triton.start_environ`), not what the build's imports wrote to it, so the next identical run, all
    cached, spawns exactly that server."""
    discard(f"the {stage} stage builds")


def end() -> None:
    """At the command's end: an early server nobody took stops."""
    discard("the command ended without serving it")


def remember(launch: Launch, host: str, ports: tuple[int, int, int], *, auto_ports: bool) -> None:
    """Record the launch of this run's ready server for the next identical request (once a process; only in an
    ``ftx run`` that :func:`begin` saw). A record that cannot be written is
    skipped. ``auto_ports``: ftx chose the ports (none was given)."""
    global _recorded
    if _request is None or _recorded:
        return
    _recorded = True
    record = {
        "format": FORMAT,
        "request": _request,
        "launch": launch.to_json(),
        "host": host,
        "ports": list(ports),
        "auto_ports": auto_ports,
    }
    with contextlib.suppress(Exception):  # a head start never stands in a run's way
        directory = records_dir(_home())
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_json_atomic(directory / f"{_request}.json", record)
        records = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in records[RECORDS_KEPT:]:
            old.unlink(missing_ok=True)


def reset() -> None:
    """Forget this process's request and early server (tests)."""
    global _request, _pending, _recorded
    discard("reset")
    _request, _recorded = None, False


__all__ = [
    "HeadStart",
    "adopt",
    "begin",
    "discard",
    "end",
    "stage_builds",
    "pending",
    "ports_for",
    "remember",
    "request_digest",
]
