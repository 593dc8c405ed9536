"""Servers left running with ``TritonServer.detach``: their records under ``<home>/servers``,
listing and stopping them.

Records are ftx's own files in the user's home, trusted as such (docs/architecture.md, "What ftx
trusts"): one that cannot be read back into its record is damaged — reported, never acted upon, and
dropped by ``ftx stop NAME`` or ``--all``. Fields are not validated one by one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from ftx_triton.errors import ServeError
from ftx_triton.io.jsonfile import json_kind
from ftx_triton.server.launch import FTX_SHM_PREFIX
from ftx_triton.server.ports import client_host
from ftx_triton.server.process_tree import alive, end_processes_of, reap, remove_shm, terminate_group

log = structlog.get_logger(__name__)


class RecordError(ValueError):
    """A damaged record: unreadable, not JSON, not a JSON object, or missing what its record needs."""


def read_json_record(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a record ftx wrote); :class:`RecordError` when it is damaged."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise RecordError(f"unreadable: {exc.strerror or exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RecordError(f"not a JSON object but {json_kind(data)}")
    return data


@dataclass(frozen=True)
class MalformedRecord:
    """A record file that failed :func:`read_json_record`: never acted upon, only reported or removed."""

    path: Path
    problem: str

    @property
    def name(self) -> str:
        """The name ``ftx stop`` knows it by: the file's (records are written as ``<name>.json``)."""
        return self.path.stem

    def warn(self, event: str) -> None:
        log.warning(event, path=str(self.path), problem=self.problem, hint=f"`ftx stop {self.name}` removes it")


def malformed_records(directory: Path, read: Callable[[Path], object]) -> list[MalformedRecord]:
    """The files under ``directory`` that ``read`` rejects with a :class:`RecordError`."""
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            read(path)
        except RecordError as exc:
            found.append(MalformedRecord(path, str(exc)))
    return found


def remove_records(records: list[MalformedRecord], name: str | None) -> list[MalformedRecord]:
    """Delete the malformed records named ``name`` (all of them if None); return those deleted."""
    chosen = [r for r in records if name is None or r.name == name]
    for record in chosen:
        try:
            record.path.unlink(missing_ok=True)
        except OSError as exc:
            raise ServeError(
                f"cannot remove the malformed record {record.path}: {exc.strerror or exc}",
                hint="remove the file by hand",
            ) from exc
        log.info("record.malformed_removed", path=str(record.path), problem=record.problem)
    return chosen


DEVICE_ENV = "FTX_DEVICE"
"""The environment variable a server's processes carry their device in (a container's tritonserver has no
supervisor spec to say it)."""


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
    device: str = ""
    """What the runtime that started it serves on (``cpu``, ``cuda``, ``gpu``; empty: not said)."""
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
        """Read a state file (:class:`RecordError` if damaged); ``alive`` says whether that process still runs."""
        data = read_json_record(path)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k not in ("state_file", "alive")}
        try:
            record = cls(**{**known, "models": tuple(known.get("models", ()))}, state_file=str(path))
            # only a pid whose start time matches is ours: without one, a reused pid could be anybody's process
            verifiable = record.pid > 1 and record.start_ticks is not None
        except TypeError as exc:  # a field missing (an older or newer ftx wrote it), or not what ftx writes
            raise RecordError(f"not a server record: {exc}") from exc
        return replace(record, alive=verifiable and alive(record.pid, record.start_ticks))


def servers_dir(home: Path) -> Path:
    return Path(home) / "servers"


def list_servers(home: Path) -> list[ServerRecord]:
    """Detached servers recorded under ``home``, sorted by name; dead ones have ``alive=False``.
    Damaged records are left out, each with a warning."""
    records = []
    for path in sorted(servers_dir(home).glob("*.json")):
        try:
            records.append(ServerRecord.from_file(path))
        except RecordError as exc:
            MalformedRecord(path, str(exc)).warn("server.record_malformed")
    return records


def remove_malformed_servers(home: Path, name: str | None = None) -> list[MalformedRecord]:
    """Delete the malformed server records named ``name`` (all if None); return those deleted."""
    return remove_records(malformed_records(servers_dir(home), ServerRecord.from_file), name)


def _stop_record(record: ServerRecord) -> None:
    if record.alive:
        terminate_group(record.pid, record.start_ticks, record.exit_timeout_s + 20)
        reap(record.pid)
    if re.fullmatch(rf"{re.escape(FTX_SHM_PREFIX)}[0-9a-f]{{12}}-", record.shm_prefix):
        end_processes_of(record.shm_prefix)  # what a supervisor killed with SIGKILL left running
    remove_shm(record.shm_prefix)
    Path(record.state_file).unlink(missing_ok=True)
    log.info("server.stopped" if record.alive else "server.record_removed", name=record.name, pid=record.pid)


def stop_server(
    home: Path, name: str | None = None, *, all_servers: bool = False, missing_ok: bool = False
) -> list[ServerRecord]:
    """Stop detached servers and remove their records; return the records handled.

    ``name`` stops that server (no error if there is none and ``missing_ok``). Without a name:
    ``all_servers`` stops every one; otherwise the only running server is stopped (an error if
    several run). Records of dead servers are removed along the way and returned with ``alive=False``.
    """
    records = list_servers(home)
    if name is not None:
        chosen = [r for r in records if r.name == name]
        if not chosen and not missing_ok:
            known = ", ".join(r.name for r in records) or "none"
            raise ServeError(f"no server named {name!r} (known: {known})", hint="`ftx ps` lists detached servers")
    else:
        live = [r for r in records if r.alive]
        if len(live) > 1 and not all_servers:
            raise ServeError(
                f"{len(live)} servers are running: {', '.join(r.name for r in live)}",
                hint="name one (`ftx stop NAME`) or stop them all with `ftx stop --all`",
            )
        chosen = records
    for record in chosen:
        _stop_record(record)
    return chosen
