"""Choices of the fastertransformer runtime's Docker launcher, read from the ``launch`` settings section.

CLI commands pass them as options (``--image``, ``--gpus``, ``--shm-size``, ``--env``, ``--hosts``,
``--docker-host``); this module validates them into one frozen :class:`DockerOptions` (the shared
:class:`~ftx_triton.runtime.fastertransformer.options.FtLaunchOptions` plus what only a container needs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ftx_triton.errors import ConfigError
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer.docker import DEFAULT_IMAGE_TAG
from ftx_triton.runtime.fastertransformer.options import FtLaunchOptions
from ftx_triton.server.ports import TRITON_PORTS

DEFAULT_SHM_SIZE = "1g"
DEFAULT_PORTS = (TRITON_PORTS.http, TRITON_PORTS.grpc, TRITON_PORTS.metrics)
"""Triton's own defaults (HTTP, gRPC, metrics); ftx takes free ones when these are busy."""
MEMLOCK = -1
STACK = 67108864


@dataclass(frozen=True)
class DockerOptions(FtLaunchOptions):
    """The shared launch options plus the image, the container's shared memory and the daemon."""

    image: str = DEFAULT_IMAGE_TAG
    shm_size: str = DEFAULT_SHM_SIZE
    stop_timeout_s: int = 20
    docker_host: str | None = None

    @classmethod
    def from_settings(cls, settings: RunSettings) -> DockerOptions:
        launch = settings.launch
        kwargs: dict[str, Any] = dict(cls.launch_fields(settings))
        if launch.image:
            kwargs["image"] = str(launch.image)
        if launch.shm_size:
            kwargs["shm_size"] = check_size(str(launch.shm_size))
        if launch.docker_host:
            kwargs["docker_host"] = str(launch.docker_host)
        return cls(**kwargs)


def check_size(text: str) -> str:
    if not re.fullmatch(r"\d+[bkmgBKMG]?", text):
        raise ConfigError(f"--shm-size {text!r} is not a size", hint="e.g. --shm-size 1g or 512m")
    return text.lower()


__all__ = ["DEFAULT_PORTS", "DEFAULT_SHM_SIZE", "MEMLOCK", "STACK", "DockerOptions", "check_size"]
