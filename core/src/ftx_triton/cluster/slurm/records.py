"""A Slurm deployment's records under the shared ``FTX_HOME/slurm/<name>/``: ``job.json`` (written on the
login node at submission), ``endpoint.json`` (written by the job's serve step on rank 0's node), the
script and the job's log. ftx's own files: trusted, a damaged one is dropped (see docs/architecture.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftx_triton.cluster.slurm.script import deployment_dir
from ftx_triton.io.atomic_file import write_json_atomic

JOB_FILE = "job.json"
ENDPOINT_FILE = "endpoint.json"
SCRIPT_FILE = "job.sh"
TOKEN_FILE = "shared-token"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write the record ``data`` atomically (a reader never sees half of it), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data, indent=2, sort_keys=True, mode=0o600)


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
