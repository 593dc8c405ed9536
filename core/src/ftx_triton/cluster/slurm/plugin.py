"""The Slurm launcher as a plugin: `ftx slurm run` and `ftx export slurm` (``ftx_register_commands``), its
deployments in `ftx ps`/`generate`/`bench`/`stop` (``ftx_cluster_deployments``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ftx_triton import hookimpl

if TYPE_CHECKING:
    import click

    from ftx_triton.plan.cluster import ClusterDeployment


@hookimpl
def ftx_register_commands(cli: click.Group) -> None:
    from ftx_triton.cluster.slurm.cli import slurm

    cli.add_command(slurm)


@hookimpl
def ftx_cluster_deployments(home: Path) -> Sequence[ClusterDeployment]:
    from ftx_triton.cluster.slurm.deployments import list_deployments

    return list_deployments(home)
