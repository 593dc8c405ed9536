"""The login node's view of Slurm deployments: records + one query of Slurm -> ``ClusterDeployment``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ftx_triton.cluster.slurm import scheduler
from ftx_triton.cluster.slurm.records import ENDPOINT_FILE, JOB_FILE, deployment_names, read_json
from ftx_triton.cluster.slurm.script import deployment_dir
from ftx_triton.errors import ServeError
from ftx_triton.plan.cluster import ClusterDeployment

STOP_TIMEOUT_S = 180.0
"""How long `ftx stop` waits for Slurm to end a cancelled job's processes (its KillWait, then SIGKILL)."""


def list_deployments(home: Path) -> list[ClusterDeployment]:
    """This home's Slurm deployments, each with Slurm's state of its job and the job's own records."""
    names = deployment_names(home)
    if not names:
        return []
    jobs = {name: read_json(deployment_dir(home, name) / JOB_FILE) for name in names}
    ids = [str(job.get("job_id")) for job in jobs.values() if job.get("job_id")]
    try:
        if not scheduler.available():
            raise ServeError("this machine has no Slurm client (squeue)")
        states = scheduler.job_states(ids)
    except ServeError as exc:  # Slurm cannot say: the deployments are listed as unknown, with why
        return [_unknown(home, name, jobs[name], exc.message) for name in names]
    return [_deployment(home, name, jobs[name], states.get(str(jobs[name].get("job_id")))) for name in names]


def _unknown(home: Path, name: str, job: dict[str, Any], why: str) -> ClusterDeployment:
    job_id = str(job.get("job_id", "?"))
    return ClusterDeployment(
        name=name,
        state="unknown",
        scheduler="slurm",
        where=f"slurm job {job_id}",
        model=str(job.get("model", "-")),
        runtime=str(job.get("runtime", "-")),
        cause=f"Slurm cannot say how the job is: {why}",
        stop=lambda: stop(home, name, job_id),
    )


def _deployment(home: Path, name: str, job: dict[str, Any], state: scheduler.JobState | None) -> ClusterDeployment:
    directory = deployment_dir(home, name)
    endpoint = read_json(directory / ENDPOINT_FILE)
    job_id = str(job.get("job_id", "?"))
    where = f"slurm job {job_id}" + (f" on {endpoint['node']}" if endpoint.get("node") else "")
    fields: dict[str, Any] = {
        "name": name,
        "scheduler": "slurm",
        "model": str(job.get("model", "-")),
        "runtime": str(job.get("runtime", "-")),
        "repository": str(endpoint.get("repository", "")),
        "stop": lambda: stop(home, name, job_id),
    }
    if state is None or state.ended:
        return ClusterDeployment(state="ended", where=where, cause=_cause(directory, job_id, state, endpoint), **fields)
    if endpoint.get("state") == "ended":  # the server is gone; Slurm has yet to end the job (its epilog, its steps)
        return ClusterDeployment(
            state="ending", where=where, cause=_cause(directory, job_id, state, endpoint), **fields
        )
    if state is not None and state.state == "PENDING":
        return ClusterDeployment(state="pending", where=f"{where} ({state.reason or 'queued'})", **fields)
    phase = str(endpoint.get("state") or "preparing")  # the job runs its first steps
    if phase != "running":
        return ClusterDeployment(state=phase, where=where, **fields)
    address = scheduler.node_address(str(endpoint.get("node", "")))
    host = f"[{address}]" if ":" in address else address
    openai = f"http://{host}:{endpoint['openai_port']}/v1" if endpoint.get("openai_port") else ""
    return ClusterDeployment(
        state="running",
        where=where,
        http=f"{host}:{endpoint.get('http_port')}",
        grpc=f"{host}:{endpoint.get('grpc_port')}",
        openai=openai,
        **fields,
    )


def _cause(directory: Path, job_id: str, state: scheduler.JobState | None, endpoint: dict[str, Any]) -> str:
    """Why the job ended: Slurm's state (FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL …) and ftx's own error line."""
    said = []
    if state is not None and not state.ended:
        said.append(f"the server is gone; Slurm is ending the job (still {state.state})")
    elif state is not None:
        said.append(f"job {state.state}" + (f" ({state.reason})" if state.reason else ""))
        if state.exit_code and state.exit_code != "0:0":
            said.append(f"exit code {state.exit_code}")
    else:
        said.append("Slurm no longer knows the job")
    why = endpoint.get("cause") or _last_error(directory / f"job-{job_id}.log")
    if why:
        said.append(str(why))
    return "; ".join(said)


def _last_error(log: Path) -> str:
    try:
        with log.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 65536))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    ours = [line.strip() for line in lines if line.strip().startswith("error:")]
    theirs = [line.strip() for line in lines if line.strip().startswith(("srun: error:", "slurmstepd: error:"))]
    return (ours or theirs or [""])[-1]


def stop(home: Path, name: str, job_id: str) -> str:
    """scancel the job, wait until Slurm has ended its processes, remove the deployment's records."""
    from ftx_triton.io.trees import remove_tree

    cancelled = False
    if job_id and job_id != "?" and scheduler.available():
        state = scheduler.job_states([job_id]).get(job_id)
        if state is not None and not (state.ended and state.state != "COMPLETING"):
            scheduler.cancel(job_id)
            cancelled = True
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline:
                now = scheduler.job_states([job_id]).get(job_id)
                if now is None or (now.ended and now.state != "COMPLETING"):
                    break
                time.sleep(0.5)
    remove_tree(deployment_dir(home, name))
    return f"stopped {name} (slurm job {job_id} cancelled)" if cancelled else f"removed the records of {name}"
