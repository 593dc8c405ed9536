"""``ContainerSpec``: one container, as Docker SDK arguments and as the equivalent ``docker run`` line.

The same object is what ftx runs and what ``--dry-run`` prints, so the printed command is exactly
the container ftx would create.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Mount:
    """A bind mount; ftx mounts host paths at the same absolute path inside the container."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerSpec:
    """Everything that defines one container ftx starts."""

    image: str
    command: tuple[str, ...]
    name: str | None = None
    gpus: tuple[str, ...] | None = None
    """Host GPU ids for a device request (``--gpus '"device=…"'``); None asks for no GPU."""
    environment: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    working_dir: str | None = None
    shm_size: str | None = None
    ulimits: Mapping[str, int] = field(default_factory=dict)
    """name -> value, applied as soft = hard (-1 = unlimited)."""
    ipc_mode: str | None = None
    network_mode: str | None = "host"
    init: bool = True
    user: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] | None = None

    def with_(self, **changes: Any) -> ContainerSpec:
        return replace(self, **changes)

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``client.containers.create`` / ``run``."""
        import docker.types

        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": list(self.command),
            "environment": dict(self.environment),
            "mounts": [docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in self.mounts],
            "ulimits": [docker.types.Ulimit(name=k, soft=v, hard=v) for k, v in self.ulimits.items()],
            "labels": dict(self.labels),
            "init": self.init,
        }
        if self.name:
            kwargs["name"] = self.name
        if self.gpus is not None:
            kwargs["device_requests"] = [docker.types.DeviceRequest(device_ids=list(self.gpus), capabilities=[["gpu"]])]
        for key, value in (
            ("working_dir", self.working_dir),
            ("shm_size", self.shm_size),
            ("ipc_mode", self.ipc_mode),
            ("network_mode", self.network_mode),
            ("user", self.user),
        ):
            if value is not None:
                kwargs[key] = value
        if self.entrypoint is not None:
            kwargs["entrypoint"] = list(self.entrypoint)
        return kwargs

    def docker_run_argv(self, *, remove: bool = True, detach: bool = False, labels: bool = False) -> list[str]:
        """The ``docker run`` command line that creates the same container."""
        argv = ["docker", "run"]
        if remove:
            argv.append("--rm")
        if detach:
            argv.append("-d")
        if self.name:
            argv += ["--name", self.name]
        if self.init:
            argv.append("--init")
        if self.gpus is not None:
            argv += ["--gpus", f'"device={",".join(self.gpus)}"']
        for key, value in self.environment.items():
            argv += ["-e", f"{key}={value}"]
        if self.shm_size:
            argv += ["--shm-size", self.shm_size]
        for name, limit in self.ulimits.items():
            argv += ["--ulimit", f"{name}={limit}" if limit != -1 else f"{name}=-1"]
        if self.ipc_mode:
            argv += ["--ipc", self.ipc_mode]
        if self.network_mode:
            argv += ["--network", self.network_mode]
        if self.user:
            argv += ["-u", self.user]
        for m in self.mounts:
            argv += ["-v", f"{m.source}:{m.target}{':ro' if m.read_only else ''}"]
        if self.working_dir:
            argv += ["-w", self.working_dir]
        if labels:
            for key, value in self.labels.items():
                argv += ["--label", f"{key}={value}"]
        if self.entrypoint is not None:
            argv += ["--entrypoint", self.entrypoint[0] if self.entrypoint else ""]
        argv.append(self.image)
        if self.entrypoint and len(self.entrypoint) > 1:
            argv += list(self.entrypoint[1:])
        argv += list(self.command)
        return argv

    def docker_run_line(self, **kwargs: Any) -> str:
        """``docker_run_argv`` quoted for a POSIX shell."""
        return shlex.join(self.docker_run_argv(**kwargs))
