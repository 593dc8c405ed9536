"""One MPI rank of a multi-process FasterTransformer server: its own GPUs and shared-memory names.

``mpirun`` starts the same command line on every rank. Ranks on one machine must not share GPUs
(FasterTransformer's backend uses every GPU its process sees), nor the python backend's shared-memory
region names (two servers with one prefix clash in /dev/shm). Open MPI tells each process its rank on
its machine (``OMPI_COMM_WORLD_LOCAL_RANK``); this small launcher takes that rank's slice of the GPU
list, makes the shm prefix its own, and then becomes tritonserver (``exec``)::

    mpirun ... python -m ftx_triton.runtime.fastertransformer.native.rank --gpus 0,1 --per-rank 1 \
        -- tritonserver --model-repository=...

Hand-written because mpirun gives all processes of one command line the same environment; its MPMD
form (one block per rank) cannot know how a machine's GPUs are numbered on the other machines either.
Imports only the standard library: it starts once per rank.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

SHM_OPTION = "shm-region-prefix-name="
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
"""Open MPI's mpirun, PMIx, MPICH and Slurm's srun (``--mpi=pmix`` sets PMIX_RANK but no local rank)."""


def _first_int(environ: Mapping[str, str], names: Sequence[str]) -> int:
    for name in names:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def rank_gpus(gpus: Sequence[str], per_rank: int, local_rank: int) -> list[str]:
    """The GPUs of the ``local_rank``-th process on a machine: its slice of ``gpus``."""
    chosen = list(gpus[local_rank * per_rank : (local_rank + 1) * per_rank])
    if per_rank < 1 or len(chosen) < per_rank:
        raise ValueError(
            f"local rank {local_rank} needs GPUs {local_rank * per_rank}..{(local_rank + 1) * per_rank - 1} "
            f"of {','.join(gpus) or 'none'} ({per_rank} per rank)"
        )
    return chosen


def rank_command(command: Sequence[str], rank: int) -> list[str]:
    """``command`` with the python backend's shm prefix made this rank's own (``<prefix>r<rank>-``)."""
    out = []
    for arg in command:
        head, found, prefix = arg.partition(SHM_OPTION)
        out.append(f"{head}{SHM_OPTION}{prefix}r{rank}-" if found and rank > 0 else arg)
    return out


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ftx_triton.runtime.fastertransformer.native.rank", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--gpus", required=True, help="GPU indices of one machine, comma-separated")
    parser.add_argument("--per-rank", type=int, required=True, help="GPUs of each process")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    environ = os.environ if environ is None else environ
    local, rank = _first_int(environ, LOCAL_RANK_VARS), _first_int(environ, RANK_VARS)
    try:
        gpus = rank_gpus([g for g in args.gpus.split(",") if g], args.per_rank, local)
    except ValueError as exc:
        print(f"error: ftx rank {rank}: {exc}", file=sys.stderr, flush=True)
        print(
            "hint: list a machine on as many lines of the hosts file as it has GPU groups, or name --gpus",
            file=sys.stderr,
            flush=True,
        )
        return 2
    env = dict(environ, CUDA_VISIBLE_DEVICES=",".join(gpus), FTX_MPI_RANK=str(rank))
    print(f"ftx: MPI rank {rank} (local {local}) on GPU(s) {env['CUDA_VISIBLE_DEVICES']}", file=sys.stderr, flush=True)
    final = rank_command(command, rank)
    os.execvpe(final[0], final, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
