"""Choices of the fastertransformer runtime's Docker launcher.

:class:`DockerSection` declares what only a container needs (``--image``, ``--docker-host``, ``--shm-size``) beside
the shared :class:`~ftx_triton.runtime.fastertransformer.options.FtLaunchSection`; this module validates both into
one frozen :class:`DockerOptions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ftx_triton.errors import ConfigError
from ftx_triton.plan.options import OptionSection, option
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
class DockerSection(OptionSection):
    """What the Docker launcher takes from the user besides the shared launch options."""

    title: ClassVar[str] = "FasterTransformer runtime (Docker)"
    image: str | None = option(None, help="FasterTransformer image (default: the one `ftx image build` makes).")
    docker_host: str | None = option(None, help="Docker daemon URL (default: DOCKER_HOST or the local socket).")
    shm_size: str | None = option(None, help="Shared memory of the server container [default: 1g].")


@dataclass(frozen=True)
class DockerOptions(FtLaunchOptions):
    """The shared launch options plus the image, the container's shared memory and the daemon."""

    image: str = DEFAULT_IMAGE_TAG
    shm_size: str = DEFAULT_SHM_SIZE
    stop_timeout_s: int = 20
    docker_host: str | None = None

    @classmethod
    def from_settings(cls, settings: RunSettings) -> DockerOptions:
        launch = settings.options(DockerSection)
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


__all__ = ["DEFAULT_PORTS", "DEFAULT_SHM_SIZE", "MEMLOCK", "STACK", "DockerOptions", "DockerSection", "check_size"]
