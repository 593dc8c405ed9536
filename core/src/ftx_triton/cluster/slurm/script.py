"""The batch script of a Slurm deployment (what `ftx slurm run` submits, `--dry-run` prints and
`ftx export slurm` writes).

One job, three parts, each a job step so that Slurm tracks, signals and accounts every process:

1. ``check-shared`` on every node: the token file written beside the script must be there (FTX_HOME is
   the same directory on every node);
2. ``prepare`` on one node: fetch, convert, tune and configure (``ftx run … --until configure``) on the
   job's GPU kind, into the shared FTX_HOME;
3. ``serve`` on the job's first node (rank 0): ``ftx run`` in the foreground, its address recorded for the
   login node; with several nodes the FasterTransformer ranks are started by ``srun --mpi=pmix
   --ntasks-per-node=1`` over the job's nodes (one process per node: tp = GPUs per node, pp = nodes).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ftx_triton.errors import ConfigError

STEP_MODULE = "ftx_triton.cluster.slurm.step"


@dataclass(frozen=True)
class SlurmRequest:
    """A deployment as a Slurm job: the model and its ``ftx run`` options, the job's shape and options."""

    name: str
    model: str
    run_args: tuple[str, ...]
    home: Path
    python: str
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_type: str | None = None
    partition: str | None = None
    time_limit: str | None = None
    mpi: str = "pmix"
    container_image: str | None = None
    sbatch: tuple[str, ...] = field(default=())

    @property
    def directory(self) -> Path:
        """Its records under the shared home: the script, the token, the job log, the endpoint."""
        return deployment_dir(self.home, self.name)


def deployment_dir(home: Path, name: str) -> Path:
    return Path(home) / "slurm" / name


def _q(text: str | Path) -> str:
    return shlex.quote(str(text))


def check_request(request: SlurmRequest) -> None:
    """No value may hold a line break or other control character: in an ``#SBATCH`` line it would start a
    line of its own, which bash then runs."""
    values = [request.name, request.model, *request.run_args, *request.sbatch, request.python]
    values += [v for v in (request.gpu_type, request.partition, request.time_limit, request.container_image) if v]
    for value in values:
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(
                f"{value[:60]!r} holds a control character (a line break?)",
                hint="give each option and value without line breaks or tabs",
            )


def render(request: SlurmRequest, token: str) -> str:
    """The sbatch script (bash), every value quoted."""
    check_request(request)
    directives = [
        f"--job-name=ftx-{request.name}",
        f"--nodes={request.nodes}",
        "--ntasks-per-node=1",
        f"--output={request.directory / 'job-%j.log'}",
        "--open-mode=append",
    ]
    if request.gpus_per_node:
        kind = f"{request.gpu_type}:" if request.gpu_type else ""
        directives.append(f"--gpus-per-node={kind}{request.gpus_per_node}")
    if request.partition:
        directives.append(f"--partition={request.partition}")
    if request.time_limit:
        directives.append(f"--time={request.time_limit}")
    directives += request.sbatch
    srun = ["srun", "--kill-on-bad-exit=1"]
    if request.container_image:  # pyxis/enroot: the image holds ftx; FTX_HOME is mounted at the same path
        srun += [f"--container-image={request.container_image}", f"--container-mounts={request.home}:{request.home}"]
    step = [request.python, "-m", STEP_MODULE, "--home", str(request.home), "--name", request.name]
    run_part = ["--", request.model, *request.run_args]
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {_q(d)}" for d in directives),
        f"# ftx deployment {request.name!r}: {request.model} on {request.nodes} node(s)"
        + (f" x {request.gpus_per_node} GPU(s)" if request.gpus_per_node else ""),
        "set -euo pipefail",
        f"export FTX_HOME={_q(request.home)}",
        f"export FTX_CLUSTER_DEPLOYMENT={_q(request.name)}",
        f"export FTX_SLURM_MPI={_q(request.mpi)}",
        "",
        "# 1. FTX_HOME is the same directory on every node of the job",
        _join([*srun, "--ntasks-per-node=1", *step, "--token", token, "check-shared"]),
        "# 2. fetch, convert, tune, configure on one node (a GPU of the kind that serves)",
        _join([*srun, "--nodes=1", "--ntasks=1", *step, "prepare", *run_part]),
        "# 3. serve on rank 0's node until scancel (`ftx stop`); several nodes: srun --mpi starts one rank per node",
        _join([*srun, "--nodes=1", "--ntasks=1", *step, "serve", *run_part]),
        "",
    ]
    return "\n".join(lines)


def _join(argv: Sequence[str]) -> str:
    return " ".join(_q(a) for a in argv)
