"""Servers left running with ``TritonServer.detach``: their records under ``<home>/servers``,
listing and stopping them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import structlog

from ftx.errors import ServeError
from ftx.triton.ports import client_host
from ftx.triton.process_tree import SHM_PREFIX, alive, reap, remove_shm, terminate_group

log = structlog.get_logger(__name__)


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
        # only a pid whose start time matches is ours: without one, a reused pid could be anybody's process
        verifiable = type(record.pid) is int and record.pid > 1 and type(record.start_ticks) is int
        return replace(record, models=tuple(record.models),
                       alive=verifiable and alive(record.pid, record.start_ticks))


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
        terminate_group(record.pid, record.start_ticks, record.exit_timeout_s + 20)
    reap(record.pid)
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
