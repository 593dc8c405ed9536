"""A deployment a cluster scheduler runs for this ``FTX_HOME`` (a Slurm job, ...), as `ftx ps` shows it.

Plugins report them through ``ftx_cluster_deployments``; the CLI lists them (`ftx ps`), reaches them
(`ftx generate`, `ftx bench`) and stops them (`ftx stop`) without knowing the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClusterDeployment:
    """One deployment on a cluster: where it runs, whether it answers, why it ended.

    ``state`` is ``pending``, ``preparing``, ``starting``, ``running``, ``ending`` (the server is gone, the
    scheduler has yet to end the job), ``ended`` or ``unknown`` (the scheduler
    cannot say: ``cause`` says why); ``http``/``grpc``/``openai``
    are addresses (``HOST:PORT``; the OpenAI one a URL) once ``running``; ``cause`` says why an ended one ended;
    ``stop`` ends it on the cluster and removes its records, returning a line saying what it did.
    """

    name: str
    state: str
    scheduler: str
    where: str
    model: str = "-"
    runtime: str = "-"
    http: str = ""
    grpc: str = ""
    openai: str = ""
    repository: str = ""
    cause: str | None = None
    stop: Callable[[], str] = field(default=lambda: "", compare=False, repr=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "alive": self.state not in ("ending", "ended"),
            "scheduler": self.scheduler,
            "where": self.where,
            "model": self.model,
            "runtime": self.runtime,
            "http_url": self.http,
            "grpc_url": self.grpc,
            "openai": self.openai,
            "repository": self.repository,
            "cause": self.cause,
        }
