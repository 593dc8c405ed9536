"""The tritonservers running on this machine, seen through psutil: what `ftx ps` shows.

A server is found by its process (whoever started it: ``ftx run`` in the foreground, ``--detach``,
or the Docker launcher, whose container processes are visible to the host) serving a repository in
this ``FTX_HOME``'s store, so a foreground run is listed too. Its deployment record
(``ftx-deployment.json`` in the model repository) says which model and runtime it serves; records
of detached servers (``<home>/servers``) add their names, and the OpenAI-compatible endpoint's
record its address.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftx_triton.server.records import ServerRecord

DEPLOYMENT_FILE = "ftx-deployment.json"
CLUSTER_ENV = "FTX_CLUSTER_DEPLOYMENT"
"""Set by a cluster launcher's job for the servers it starts; `ftx ps` lists those through the launcher."""


@dataclass
class ServedModel:
    """One running tritonserver and what it serves."""

    pid: int
    name: str
    model: str
    runtime: str
    device: str
    memory_bytes: int
    uptime_s: float
    http: str
    grpc: str
    repository: str
    openai: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """``ftx ps --json``: every address in one form, its scheme included (``http://``, ``grpc://``; the
        OpenAI endpoint's base URL, or null)."""
        data = {k: v for k, v in self.__dict__.items() if k != "extra"}
        addresses = {"http": f"http://{self.http}", "grpc": f"grpc://{self.grpc}", "openai": self.openai or None}
        return {**data, **addresses, **self.extra}


def _flag(cmdline: list[str], name: str) -> str | None:
    prefix = f"--{name}="
    return next((arg[len(prefix) :] for arg in cmdline if arg.startswith(prefix)), None)


def _address(cmdline: list[str], kind: str, default_port: str) -> str:
    host = _flag(cmdline, f"{kind}-address") or "0.0.0.0"
    port = _flag(cmdline, f"{kind}-port") or default_port
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)
    return f"{shown}:{port}"


def _front_address(front: object, kind: str, default_port: str) -> str | None:
    """The address a front of the supervisor's spec listens on (None without that front)."""
    if not isinstance(front, dict):
        return None
    return _address(
        [f"--{kind}-address={front.get('host', '')}", f"--{kind}-port={front.get('port', '')}"], kind, default_port
    )


def _tree_rss(proc: Any) -> int:
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _device(proc: Any, spec: Mapping[str, Any], record: ServerRecord | None) -> str:
    """What the runtime said it serves on: in the detached record or the supervisor's spec (``TritonServer(device=)``),
    else in the server's environment (``FTX_DEVICE``, as a container's tritonserver has it); ``?`` when unsaid."""
    import psutil

    from ftx_triton.server.records import DEVICE_ENV

    said = (record.device if record is not None else "") or spec.get("device")
    if said:
        return str(said)
    try:
        return str(proc.environ().get(DEVICE_ENV) or "?")
    except (psutil.AccessDenied, psutil.NoSuchProcess, OSError):
        return "?"


def _cluster_managed(proc: Any) -> bool:
    """Whether a cluster scheduler's job started this server (``FTX_CLUSTER_DEPLOYMENT`` in its environment)."""
    import psutil

    try:
        return bool(proc.environ().get(CLUSTER_ENV))
    except (psutil.AccessDenied, psutil.NoSuchProcess, OSError):
        return False


def _deployment(repository: Path) -> dict[str, Any]:
    try:
        return json.loads((repository / DEPLOYMENT_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _supervisor(proc: Any) -> tuple[Any, dict[str, Any]]:
    """The ``ftx_triton.server.supervisor`` process above a tritonserver (None if it has none) and its spec."""
    import psutil

    try:
        parents = proc.parents()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None, {}
    for parent in parents:
        try:
            cmdline = parent.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "ftx_triton.server.supervisor" in cmdline:
            try:
                spec = json.loads(cmdline[-1])
            except ValueError:
                spec = {}
            return parent, spec if isinstance(spec, dict) else {}
    return None, {}


def served_models(home: Path, servers: list[ServerRecord] | None = None) -> list[ServedModel]:
    """The running tritonservers of this home (serving a repository under it, or recorded by
    ``--detach``), oldest first, with the detached record's name where there is one (``servers``:
    the records of ``home`` when the caller has read them already). The ranks of one multi-process
    server (the tritonservers under one supervisor) are one entry, their memory summed."""
    import psutil

    from ftx_triton.server.front_records import read_records
    from ftx_triton.server.records import list_servers

    records = {r.pid: r for r in (list_servers(home) if servers is None else servers) if r.alive}
    openai = {r["triton_pid"]: r["url"] for r in read_records(home)}
    found: dict[int, ServedModel] = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
        cmdline = proc.info.get("cmdline") or []
        if not cmdline or (Path(cmdline[0]).name != "tritonserver" and proc.info.get("name") != "tritonserver"):
            continue
        repo_text = _flag(cmdline, "model-repository")
        if repo_text is None:
            continue
        repository = Path(repo_text)
        if _cluster_managed(proc):
            continue  # a cluster deployment's server on this node: its plugin reports it (ftx_cluster_deployments)
        supervisor, spec = _supervisor(proc)
        owner = supervisor.pid if supervisor is not None else proc.pid  # the pid ftx recorded
        if owner in found:  # another MPI rank of the same server (mpirun runs one tritonserver per rank)
            found[owner].memory_bytes += _tree_rss(proc)
            found[owner].extra["ranks"] = int(found[owner].extra.get("ranks", 1)) + 1
            continue
        record = records.get(owner)
        if record is None and not repository.resolve().is_relative_to(Path(home).resolve()):
            continue  # another FTX_HOME's (or not ftx's) server
        deployment = _deployment(repository)
        runtime = str(deployment.get("runtime", "?"))
        # clients reach tritonserver's HTTP and gRPC through the supervisor's fronts
        http = _front_address(spec.get("front"), "http", "8000") or _address(cmdline, "http", "8000")
        grpc = _front_address(spec.get("grpc_front"), "grpc", "8001") or _address(cmdline, "grpc", "8001")
        found[owner] = ServedModel(
            pid=owner,
            name=record.name if record else str(spec.get("name") or "(foreground)"),
            model=str(deployment.get("model") or repository.name),
            runtime=runtime,
            device=_device(proc, spec, record),
            memory_bytes=_tree_rss(proc),
            uptime_s=time.time() - proc.info["create_time"],
            http=http,
            grpc=grpc,
            repository=str(repository),
            openai=openai.get(owner, ""),
            extra={
                "detached": record is not None,
                "family": deployment.get("family"),
                "tp": deployment.get("tp"),
                "data_type": deployment.get("data_type"),
            },
        )
    return sorted(found.values(), key=lambda s: -s.uptime_s)


__all__ = ["ServedModel", "served_models"]
