"""`ftx ps` and `ftx stop` when Slurm cannot answer: a STAND-IN ``squeue`` (a shell script failing as the real one
does when slurmctld is down; the real one retries for up to a minute first) — the deployment is listed as
``unknown`` with why, `ftx ps` still works, and `ftx stop` keeps the records it could not act on."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

DOWN = "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"


@pytest.fixture
def slurm_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sbatch", "scontrol", "scancel"):
        (bin_dir / tool).write_text(DOWN)
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_a_controller_that_does_not_answer_leaves_the_deployment_unknown(
    ftx_cli: Any, ftx_home: Path, slurm_down: Path
) -> None:
    record = ftx_home / "slurm" / "gj"
    record.mkdir(parents=True)
    (record / "job.json").write_text(json.dumps({"job_id": "7", "model": "tiny-gptj", "runtime": "python"}))
    listed = ftx_cli("ps", "--json")
    assert listed.exit_code == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r.get("scheduler") == "slurm")
    assert row["state"] == "unknown" and "squeue failed: slurm_load_jobs error" in row["cause"]
    stopped = ftx_cli("stop", "gj")
    assert stopped.exit_code == 1 and "error: squeue failed" in stopped.stderr and "scontrol ping" in stopped.stderr
    assert (record / "job.json").exists()  # not cancelled, so not forgotten


def test_a_job_whose_server_is_gone_but_slurm_still_runs_is_ending_not_ended(
    ftx_cli: Any, ftx_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's step has recorded the server's end; a STAND-IN ``squeue`` still says RUNNING (slurmctld has yet
    to see the batch script exit). `ftx ps` says ``ending`` with ftx's error line, not ``ended`` with Slurm's
    final state it does not know yet."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho '7|RUNNING|None|node1'\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = ftx_home / "slurm" / "gj"
    record.mkdir(parents=True)
    (record / "job.json").write_text(json.dumps({"job_id": "7", "model": "tiny-gptj", "runtime": "python"}))
    cause = "error: tritonserver exited by itself: SIGKILL"
    (record / "endpoint.json").write_text(json.dumps({"state": "ended", "node": "node1", "cause": cause}))
    listed = ftx_cli("ps", "--json")
    assert listed.exit_code == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r.get("scheduler") == "slurm")
    assert row["state"] == "ending" and row["alive"] is False, row
    assert "Slurm is ending the job (still RUNNING)" in row["cause"] and cause in row["cause"], row
