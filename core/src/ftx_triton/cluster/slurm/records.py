"""A Slurm deployment's records under the shared ``FTX_HOME/slurm/<name>/``: ``job.json`` (written on the
login node at submission), ``endpoint.json`` (written by the job's serve step on rank 0's node), the
script and the job's log. ftx's own files: trusted, a damaged one is dropped (see docs/architecture.md)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ftx_triton.cluster.slurm.script import deployment_dir

JOB_FILE = "job.json"
ENDPOINT_FILE = "endpoint.json"
SCRIPT_FILE = "job.sh"
TOKEN_FILE = "shared-token"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (temp file + rename: a reader never sees half a record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2, sort_keys=True)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    """The record in ``path``, or {} when it is absent or damaged (dropped, never acted upon)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_endpoint(home: Path, name: str, **fields: Any) -> None:
    path = deployment_dir(home, name) / ENDPOINT_FILE
    write_json(path, {**read_json(path), **fields})


def deployment_names(home: Path) -> list[str]:
    """Names of the deployments with a job record under ``home``."""
    root = Path(home) / "slurm"
    try:
        return sorted(p.name for p in root.iterdir() if (p / JOB_FILE).is_file())
    except OSError:
        return []
