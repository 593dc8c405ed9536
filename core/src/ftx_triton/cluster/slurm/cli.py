"""`ftx slurm run` (submit a deployment as a Slurm job, like ``ftx run --detach``) and `ftx slurm script`
(the batch script, for teams that submit it themselves; also `ftx export slurm`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ftx_triton.cli.common import FtxCommand, FtxGroup, say

F = TypeVar("F", bound=Callable[..., Any])


def check_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--name as `ftx run --name` takes it (it names files and directories under FTX_HOME)."""
    from ftx_triton.cli.run import _check_name

    return _check_name(ctx, param, value)


JOB_OPTIONS: tuple[Callable[[F], F], ...] = (
    click.option("--nodes", type=click.IntRange(1, 1024), default=1, show_default=True, help="Nodes (= pp)."),
    click.option(
        "--gpus-per-node",
        type=click.IntRange(0, 64),
        help="GPUs of each node (= tp; default: --tp x --pp / --nodes when --tp is a number, else 0: the "
        "python runtime on CPUs).",
    ),
    click.option("--gpu-type", help="The GPU kind (Slurm gres type, e.g. a100); Slurm refuses one it lacks."),
    click.option("--partition", help="The partition (default: the cluster's default one)."),
    click.option("--time", "time_limit", help="The job's time limit (sbatch --time), e.g. 7-00:00:00."),
    click.option(
        "--sbatch",
        "sbatch_options",
        multiple=True,
        metavar="OPTION",
        help="A further sbatch option, as sbatch takes it (repeatable): --sbatch=--account=ml --sbatch=--qos=high.",
    ),
    click.option(
        "--mpi",
        type=click.Choice(["pmix", "pmi2", "none"]),
        default="pmix",
        show_default=True,
        help="srun's --mpi for the ranks of a multi-node server.",
    ),
    click.option(
        "--container-image", help="Run the steps in this image through pyxis/enroot (srun --container-image)."
    ),
    click.option(
        "--name",
        callback=lambda ctx, param, value: check_name(ctx, param, value),
        help="The deployment's name in `ftx ps`/`ftx stop` (letters, digits, . _ -; default: from MODEL).",
    ),
    click.option(
        "--python",
        type=click.Path(dir_okay=False),
        default=sys.executable,
        show_default="this interpreter",
        help="The interpreter the job runs ftx with (a shared install: the same path on every node).",
    ),
)


def job_options(func: F) -> F:
    for decorator in reversed(JOB_OPTIONS):
        func = decorator(func)
    return func


PASS_THROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}


def _request(model: str, run_args: tuple[str, ...], **opts: Any):  # -> tuple[SlurmRequest, dict]
    from ftx_triton.cluster.runargs import check_run_args
    from ftx_triton.cluster.slurm.script import SlurmRequest
    from ftx_triton.cluster.slurm.submit import REFUSED_RUN_OPTIONS, absolute_model, choose_name
    from ftx_triton.paths import ftx_home

    home = ftx_home()
    model = absolute_model(model)
    params = check_run_args(model, run_args, REFUSED_RUN_OPTIONS)
    request = SlurmRequest(
        name=choose_name(home, model, opts["name"]),
        model=model,
        run_args=run_args,
        home=home,
        python=opts["python"],
        nodes=opts["nodes"],
        gpus_per_node=_gpus_per_node(opts["gpus_per_node"], params, opts["nodes"]),
        gpu_type=opts["gpu_type"],
        partition=opts["partition"],
        time_limit=opts["time_limit"],
        mpi=opts["mpi"],
        container_image=opts["container_image"],
        sbatch=tuple(opts["sbatch_options"]),
    )
    return request, params


def _gpus_per_node(given: int | None, params: dict[str, object], nodes: int) -> int:
    """--gpus-per-node, else what `ftx run`'s --tp and --pp ask for spread over the nodes (tp x pp / nodes)."""
    if given is not None:
        return given
    tp, pp = params.get("tp"), params.get("pp")
    if isinstance(tp, int) and tp > 0 and isinstance(pp, int) and pp > 0:
        return max(1, tp * pp // nodes)
    return 0


@click.group("slurm", cls=FtxGroup)
def slurm() -> None:
    """Deployments as Slurm jobs: submitted, listed (`ftx ps`), asked (`ftx generate`) and ended (`ftx stop`)
    from the login node."""


@slurm.command("run", context_settings=PASS_THROUGH)
@job_options
@click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Return once the deployment answers.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), help="Give up waiting after this many seconds.")
@click.argument("model")
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
def run_command(
    model: str, run_args: tuple[str, ...], dry_run: bool, wait: bool, timeout_s: float | None, **opts: Any
) -> None:
    """Submit MODEL as a Slurm job that prepares (fetch, convert, tune, configure) and then serves it.

    Options after MODEL are `ftx run`'s (--runtime, --tp, --pp …), checked here before anything is
    submitted. The job behaves like `ftx run --detach`: `ftx ps` lists it, `ftx generate NAME` and
    `ftx bench NAME` reach it, `ftx stop NAME` cancels it (scancel) and removes its records.
    FTX_HOME must be the same directory on every node.
    """
    from ftx_triton.cluster.slurm.deployments import list_deployments
    from ftx_triton.cluster.slurm.script import render
    from ftx_triton.cluster.slurm.submit import describe, follow, new_token, submit

    request, params = _request(model, run_args, **opts)
    if dry_run:
        click.echo(render(request, "<token written at submission>"), nl=False)
        return
    job_id = submit(request, new_token(), str(params.get("runtime") or "auto"))
    say(f"slurm     submitted {request.name} as job {job_id} (log: {request.directory}/job-{job_id}.log)")
    if not wait:
        click.echo(
            f"{request.name} submitted as Slurm job {job_id}: `ftx ps` follows it, `ftx stop {request.name}` cancels it"
        )
        return
    try:
        deployment = follow(request.home, request.name, say, list_deployments, timeout_s)
    except KeyboardInterrupt:
        say(
            f"stopped waiting; job {job_id} stays queued or running: `ftx ps` follows it, `ftx stop {request.name}` ends it"
        )
        raise
    click.echo(describe(deployment))
    click.echo(
        f"\nleft running as {request.name!r} (Slurm job {job_id}): `ftx ps` lists it, `ftx stop {request.name}` ends it"
    )


@click.command("slurm", cls=FtxCommand, context_settings=PASS_THROUGH)
@job_options
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the script here (default: stdout)."
)
@click.argument("model")
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
def script_command(model: str, run_args: tuple[str, ...], output: Path | None, **opts: Any) -> None:
    """Write the batch script of a Slurm deployment of MODEL, for `sbatch` by hand.

    The script is what `ftx slurm run` submits. Submitted by hand, its deployment is not recorded on
    the login node: its log and address are under FTX_HOME/slurm/NAME/.
    """
    from ftx_triton.cluster.output import write_text
    from ftx_triton.cluster.slurm.records import TOKEN_FILE
    from ftx_triton.cluster.slurm.script import render
    from ftx_triton.cluster.slurm.submit import new_token

    request, _ = _request(model, run_args, **opts)
    token = new_token()
    text = render(request, token)
    if output is not None:
        write_text(output, text)
    write_text(request.directory / TOKEN_FILE, token + "\n")  # what the job's first step looks for
    if output is None:
        click.echo(text, nl=False)
        return
    say(f"wrote {output}: submit it with `sbatch {output}`")


slurm.add_command(script_command, "script")
