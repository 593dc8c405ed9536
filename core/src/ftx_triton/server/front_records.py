"""Records of OpenAI endpoints, the fronts ftx starts beside a tritonserver, left running with ``ftx run --detach``
(``<home>/openai/<name>.json``).

Records are ftx's own files (trusted, as the server records are): one that cannot be read back
(:func:`read_record`) is damaged — reported, never acted upon, and removed by ``ftx stop NAME`` or
``--all`` (:func:`remove_malformed_fronts`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, TypedDict

from ftx_triton.io.atomic_file import write_json_atomic
from ftx_triton.server.records import MalformedRecord, RecordError, malformed_records, read_json_record, remove_records


class FrontRecord(TypedDict):
    """A running endpoint: its process, the tritonserver's (None if unknown), its URL and its file."""

    name: str
    pid: int
    triton_pid: int | None
    url: str
    log: str
    record: str


FOREGROUND_PREFIX = "foreground-"
"""Names of the records a foreground ``ftx run`` keeps while it serves (for `ftx ps`); `ftx stop` leaves them."""


def records_dir(home: Path) -> Path:
    return Path(home) / "openai"


def write_record(home: Path, record: dict[str, Any]) -> Path:
    directory = records_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['name']}.json"
    write_json_atomic(path, record, indent=2, sort_keys=True)
    return path


def read_record(path: Path) -> FrontRecord:
    """The record in ``path``; :class:`RecordError` when it is damaged."""
    data = read_json_record(path)
    try:
        return FrontRecord(
            name=data["name"],
            pid=data["pid"],
            triton_pid=data.get("triton_pid"),
            url=data["url"],
            log=data.get("log", ""),
            record=str(path),
        )
    except KeyError as exc:
        raise RecordError(f"not an endpoint record: no field {exc}") from exc


def read_records(home: Path) -> list[FrontRecord]:
    """Records whose endpoint process still runs (the others are removed on the way; malformed ones
    are left out with a warning)."""
    import psutil

    found = []
    for path in sorted(records_dir(home).glob("*.json")):
        try:
            record = read_record(path)
        except RecordError as exc:
            MalformedRecord(path, str(exc)).warn("openai.record_malformed")
            continue
        if psutil.pid_exists(record["pid"]):
            found.append(record)
        else:
            path.unlink(missing_ok=True)
    return found


def remove_malformed_fronts(home: Path, name: str | None = None) -> list[MalformedRecord]:
    """Delete the malformed endpoint records named ``name`` (all if None); return those deleted."""
    return remove_records(malformed_records(records_dir(home), read_record), name)


def stop_record(record: FrontRecord, timeout_s: float = 10.0) -> None:
    """Stop a recorded endpoint process and remove its record."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):  # AccessDenied: another user's, not ours
        proc = psutil.Process(record["pid"])
        if "ftx_triton.openai_api" in " ".join(proc.cmdline()):  # the pid is still ours, not a reused one
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except psutil.TimeoutExpired:
                proc.kill()
    Path(record["record"]).unlink(missing_ok=True)
