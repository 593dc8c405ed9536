"""Deployments that cluster schedulers run for this ``FTX_HOME`` (``ftx_cluster_deployments``), for
`ftx ps`, `ftx stop`, `ftx generate` and `ftx bench`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ftx_triton.plan.cluster import ClusterDeployment
    from ftx_triton.server.processes import ServedModel


def cluster_deployments(home: Path) -> list[ClusterDeployment]:
    """Every plugin's cluster deployments of ``home``, sorted by name."""
    from ftx_triton.cli.common import get_host

    found = [d for batch in get_host().hook.ftx_cluster_deployments(home=home) for d in batch or ()]
    return sorted(found, key=lambda d: d.name)


def running_as_served(home: Path) -> list[ServedModel]:
    """The running cluster deployments in the shape of a local server (`ftx generate`, `ftx bench` reach them)."""
    from ftx_triton.server.processes import ServedModel

    return [
        ServedModel(
            pid=0,
            name=d.name,
            model=d.model,
            runtime=d.runtime,
            device=d.where,
            memory_bytes=0,
            uptime_s=0.0,
            http=d.http,
            grpc=d.grpc,
            repository=d.repository,
            openai=d.openai,
            extra={"detached": True, "scheduler": d.scheduler},
        )
        for d in cluster_deployments(home)
        if d.running
    ]
