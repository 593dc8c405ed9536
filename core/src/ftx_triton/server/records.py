"""Servers left running with ``TritonServer.detach``: their records under ``<home>/servers``,
listing and stopping them.

Records are files anybody can edit, so each is checked when it is read (:func:`read_json_record`):
a malformed one is reported, never acted upon, and removed only by ``ftx stop NAME`` or ``--all``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import structlog

from ftx_triton.errors import CheckpointError, ServeError
from ftx_triton.io.jsonfile import json_kind
from ftx_triton.io.regular import TooLarge, read_regular
from ftx_triton.server.ports import client_host
from ftx_triton.server.process_tree import SHM_PREFIX, alive, reap, remove_shm, terminate_group

log = structlog.get_logger(__name__)

_RECORD_MAX_BYTES = 1 << 20
PID_MAX = 2**31 - 1
"""The largest value of pid_t (a signed 32-bit int)."""


class RecordError(ValueError):
    """A record file that cannot be read, is not JSON, or is not a record of the expected shape."""


def is_pid(value: object) -> bool:
    """A pid ftx may look up or signal: a positive int within pid_t (never a bool, float or string)."""
    return type(value) is int and 0 < value <= PID_MAX


def _text(value: object) -> bool:
    return isinstance(value, str)


def _name(value: object) -> bool:
    return isinstance(value, str) and value.strip() != "" and "/" not in value


def _port(value: object) -> bool:
    return type(value) is int and 0 <= value <= 65535


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


Check = tuple[Callable[[object], bool], str]
"""A test of a record's field and what the field should be, for the message when it fails."""

NAME_CHECK: Check = (_name, "a non-empty name")
PID_CHECK: Check = (is_pid, f"a pid (an integer from 1 to {PID_MAX})")
TEXT_CHECK: Check = (_text, "a string")



def _shown(value: object, limit: int = 40) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_json_record(path: Path, checks: Mapping[str, Check], optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The JSON object in ``path`` whose fields pass ``checks`` (those in ``optional`` may be missing);
    other keys are kept unchecked. Raises :class:`RecordError` saying what is wrong."""
    try:
        raw = read_regular(path, _RECORD_MAX_BYTES)  # a named pipe put there would block a plain read forever
    except OSError as exc:
        raise RecordError(f"unreadable: {exc.strerror or exc}") from exc
    except CheckpointError as exc:
        raise RecordError("not a regular file") from exc
    except TooLarge as exc:
        raise RecordError(str(exc)) from exc
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RecordError(f"not a JSON object but {json_kind(data)}")
    for key, (ok, what) in checks.items():
        if key not in data:
            if key not in optional:
                raise RecordError(f'no field "{key}"')
        elif not ok(data[key]):
            raise RecordError(f'field "{key}" is not {what}: {_shown(data[key])}')
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
            raise ServeError(f"cannot remove the malformed record {record.path}: {exc.strerror or exc}",
                             hint="remove the file by hand") from exc
        log.info("record.malformed_removed", path=str(record.path), problem=record.problem)
    return chosen


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
        """Read a state file (:class:`RecordError` if malformed); ``alive`` says whether that process still runs."""
        data = read_json_record(path, _SERVER_CHECKS, _SERVER_OPTIONAL)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k not in ("state_file", "alive")}
        if not _count(known.get("start_ticks")):
            known["start_ticks"] = None  # an older or edited record: its pid cannot be verified (below)
        record = cls(**{**known, "models": tuple(known.get("models", ()))}, state_file=str(path))
        # only a pid whose start time matches is ours: without one, a reused pid could be anybody's process
        verifiable = record.pid > 1 and record.start_ticks is not None
        return replace(record, alive=verifiable and alive(record.pid, record.start_ticks))


_SERVER_CHECKS: dict[str, Check] = {
    "name": NAME_CHECK, "pid": PID_CHECK, "host": TEXT_CHECK,
    "http_port": (_port, "a port number"), "grpc_port": (_port, "a port number"),
    "metrics_port": (_port, "a port number"), "repository": TEXT_CHECK, "log_path": TEXT_CHECK,
    "started_at": TEXT_CHECK, "models": (_names, "a list of model names"), "shm_prefix": TEXT_CHECK,
    "exit_timeout_s": (_count, "a number of seconds"),
}  # start_ticks is not checked: a record without a usable one stays, its pid never verified (from_file)
_SERVER_OPTIONAL = frozenset(f.name for f in fields(ServerRecord) if f.default is not MISSING)


def servers_dir(home: Path) -> Path:
    return Path(home) / "servers"


def list_servers(home: Path) -> list[ServerRecord]:
    """Detached servers recorded under ``home``, sorted by name; dead ones have ``alive=False``.
    Malformed records are left out, each with a warning."""
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
    if record.shm_prefix.startswith(SHM_PREFIX + "ftx-"):
        remove_shm(record.shm_prefix)
    Path(record.state_file).unlink(missing_ok=True)
    log.info("server.stopped" if record.alive else "server.record_removed", name=record.name, pid=record.pid)


def stop_server(home: Path, name: str | None = None, *, all_servers: bool = False,
                missing_ok: bool = False) -> list[ServerRecord]:
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
            raise ServeError(f"{len(live)} servers are running: {', '.join(r.name for r in live)}",
                             hint="name one (`ftx stop NAME`) or stop them all with `ftx stop --all`")
        chosen = records
    for record in chosen:
        _stop_record(record)
    return chosen
