"""Slurm's own commands (sbatch, squeue, scontrol, scancel, sinfo), run with a time limit; their failures
as ``error:``/``hint:``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from ftx_triton.errors import ConfigError, ServeError

TIMEOUT_S = 30.0
"""How long one Slurm command may take (slurmctld answers in milliseconds; a hung one is not waited on)."""


def available() -> bool:
    """Whether this machine has Slurm's client commands."""
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def run(argv: Sequence[str], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; an absent command or a hang is a ServeError naming it."""
    try:
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise ServeError(
            f"{argv[0]} not found: this machine has no Slurm client",
            hint="run ftx on a Slurm login node (sbatch, squeue and scancel on PATH)",
        ) from None
    except subprocess.TimeoutExpired:
        raise ServeError(
            f"`{' '.join(argv[:2])}` did not answer within {TIMEOUT_S:.0f} s", hint="is slurmctld up? (`scontrol ping`)"
        ) from None


def _message(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    return "; ".join(line.removeprefix("sbatch: error: ") for line in lines[-3:]) or f"exit status {result.returncode}"


def test_only(script: str) -> None:
    """``sbatch --test-only``: Slurm checks the whole request (partition, GPUs, nodes, time) and submits
    nothing; a request it refuses is a ConfigError before anything is submitted."""
    result = run(["sbatch", "--test-only"], stdin=script)
    if result.returncode != 0:
        raise ConfigError(f"Slurm refuses the job: {_message(result)}", hint=_hint_for(_message(result)))


def _hint_for(message: str) -> str:
    text = message.lower()
    if "partition" in text:
        return "`sinfo -s` lists the partitions; pass one with --partition (or leave it out for the default)"
    if "gres" in text or "gpu" in text:
        return "`sinfo -o '%P %G'` lists the GPUs (gres) of each partition; check --gpus-per-node/--gpu-type"
    if "node configuration" in text or "nodes" in text:
        return "the partition has fewer or smaller nodes than asked: check --nodes, --gpus-per-node and `sinfo -N -l`"
    return "check the --sbatch options (`sbatch --help`)"


def submit(script: str) -> str:
    """Submit the batch script; return the job id."""
    result = run(["sbatch", "--parsable"], stdin=script)
    if result.returncode != 0:
        raise ServeError(f"sbatch failed: {_message(result)}", hint=_hint_for(_message(result)))
    return result.stdout.strip().split(";", 1)[0]


@dataclass(frozen=True)
class JobState:
    """What Slurm says about one job: ``state`` (PENDING, RUNNING, FAILED, TIMEOUT …), its reason, exit code."""

    state: str
    reason: str = ""
    exit_code: str = ""
    nodes: str = ""

    @property
    def ended(self) -> bool:
        return self.state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")


def job_states(job_ids: Sequence[str]) -> dict[str, JobState]:
    """The states of ``job_ids``: squeue for queued and running jobs, ``scontrol show job`` for those that
    ended recently (Slurm forgets them after MinJobAge); a job Slurm no longer knows is missing."""
    if not job_ids:
        return {}
    found: dict[str, JobState] = {}
    result = run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"])
    if result.returncode != 0 and "Invalid job id" not in result.stderr:
        raise ServeError(f"squeue failed: {_message(result)}", hint="is slurmctld up? (`scontrol ping`)")
    for line in result.stdout.splitlines() if result.returncode == 0 else ():
        job, state, reason, nodes = (line.split("|") + ["", "", "", ""])[:4]
        found[job.strip()] = JobState(state.strip(), "" if reason.strip() == "None" else reason.strip(), "", nodes)
    for job in job_ids:
        if job in found and not found[job].ended and found[job].state != "COMPLETING":
            continue
        shown = run(["scontrol", "show", "job", "-o", job])
        if shown.returncode != 0:
            continue
        fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
        found[job] = JobState(
            fields.get("JobState", "UNKNOWN"),
            "" if fields.get("Reason") == "None" else fields.get("Reason", ""),
            fields.get("ExitCode", ""),
            fields.get("NodeList", ""),
        )
    return found


def cancel(job_id: str) -> None:
    """scancel the job (all its steps and processes: SIGTERM, then SIGKILL after the cluster's KillWait)."""
    result = run(["scancel", job_id])
    if result.returncode != 0 and "already completed" not in result.stderr and "Invalid job id" not in result.stderr:
        raise ServeError(f"scancel {job_id} failed: {_message(result)}", hint="check `squeue -j {job_id}`")


def node_address(node: str) -> str:
    """The address Slurm reaches ``node`` at (its NodeAddr), or the name itself."""
    result = run(["scontrol", "show", "node", "-o", node])
    fields = dict(item.split("=", 1) for item in result.stdout.split() if "=" in item)
    return fields.get("NodeAddr") or node


def partition_nodes(partition: str | None) -> list[str]:
    """The node names of ``partition`` (the default one when None); empty when Slurm does not say."""
    result = run(["sinfo", "-h", "-N", "-o", "%N|%P"])
    nodes = set()
    for line in result.stdout.splitlines():
        node, _, part = line.strip().partition("|")
        if node and (part.rstrip("*") == partition if partition else part.endswith("*")):
            nodes.add(node)
    return sorted(nodes)
