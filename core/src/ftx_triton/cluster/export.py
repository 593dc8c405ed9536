"""`ftx export`: a deployment written for a cluster's own tools (`ftx export slurm`: the batch script;
`ftx export k8s`: Kubernetes manifests and a Helm chart)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftx_triton import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl
def ftx_register_commands(cli: click.Group) -> None:
    """``ftx export`` with its ``slurm`` and ``k8s`` subcommands (imported here: the plugin host also loads
    in processes that never build a command line)."""
    import click

    from ftx_triton.cli.common import FtxGroup
    from ftx_triton.cluster.kubernetes.cli import k8s_command
    from ftx_triton.cluster.slurm.cli import script_command

    @click.group("export", cls=FtxGroup)
    def export() -> None:
        """Write a deployment for a cluster's own tools (sbatch, kubectl, helm)."""

    export.add_command(script_command, "slurm")
    export.add_command(k8s_command, "k8s")
    cli.add_command(export)
