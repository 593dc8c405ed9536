"""Records of OpenAI endpoints left running with ``ftx run --detach`` (``<home>/openai/<name>.json``)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def records_dir(home: Path) -> Path:
    return Path(home) / "openai"


def write_record(home: Path, record: dict[str, Any]) -> Path:
    directory = records_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['name']}.json"
    tmp = directory / f".{record['name']}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def read_records(home: Path) -> list[dict[str, Any]]:
    """Records whose endpoint process still runs (the others are removed on the way)."""
    import psutil

    found = []
    for path in sorted(records_dir(home).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            alive = psutil.pid_exists(int(record["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive:
            found.append({**record, "record": str(path)})
        else:
            path.unlink(missing_ok=True)
    return found


def stop_record(record: dict[str, Any], timeout_s: float = 10.0) -> None:
    """Stop a recorded endpoint process and remove its record."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        proc = psutil.Process(int(record["pid"]))
        if "ftx.openai_api" in " ".join(proc.cmdline()):  # the pid is still ours, not a reused one
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except psutil.TimeoutExpired:
                proc.kill()
    Path(record["record"]).unlink(missing_ok=True)
