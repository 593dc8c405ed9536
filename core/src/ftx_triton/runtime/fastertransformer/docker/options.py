"""Choices of the fastertransformer runtime's Docker launcher, read from the ``launch`` settings section.

CLI commands pass them as options (``--image``, ``--gpus``, ``--shm-size``, ``--env``, ``--hosts``,
``--docker-host``); this module validates them into one frozen :class:`DockerOptions`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftx_triton.errors import ConfigError
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer.docker import DEFAULT_IMAGE_TAG
from ftx_triton.runtime.fastertransformer.options import parse_env, parse_gpus
from ftx_triton.server.ports import TRITON_PORTS

DEFAULT_SHM_SIZE = "1g"
DEFAULT_READY_TIMEOUT_S = 900.0
"""Loading a 6B-20B model onto GPUs takes minutes; a hung NCCL init must still end."""
DEFAULT_PORTS = (TRITON_PORTS.http, TRITON_PORTS.grpc, TRITON_PORTS.metrics)
"""Triton's own defaults (HTTP, gRPC, metrics); ftx takes free ones when these are busy."""
MEMLOCK = -1
STACK = 67108864


@dataclass(frozen=True)
class DockerOptions:
    image: str = DEFAULT_IMAGE_TAG
    gpus: tuple[int, ...] | None = None
    shm_size: str = DEFAULT_SHM_SIZE
    env: Mapping[str, str] = field(default_factory=dict)
    hosts_file: Path | None = None
    ssh_port: int = 2222
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    stop_timeout_s: int = 20
    docker_host: str | None = None

    @classmethod
    def from_settings(cls, settings: RunSettings) -> DockerOptions:
        o = dataclasses.asdict(settings.launch)
        kwargs: dict[str, Any] = {}
        if o.get("image"):
            kwargs["image"] = str(o["image"])
        if o.get("gpus") not in (None, "", ()):
            kwargs["gpus"] = parse_gpus(o["gpus"])
        if o.get("shm_size"):
            kwargs["shm_size"] = check_size(str(o["shm_size"]))
        if o.get("env"):
            kwargs["env"] = parse_env(o["env"])
        if o.get("hosts"):
            kwargs["hosts_file"] = Path(o["hosts"])
        if o.get("ssh_port"):
            kwargs["ssh_port"] = int(o["ssh_port"])
        if o.get("ready_timeout"):
            kwargs["ready_timeout_s"] = float(o["ready_timeout"])
        if o.get("docker_host"):
            kwargs["docker_host"] = str(o["docker_host"])
        return cls(**kwargs)


def check_size(text: str) -> str:
    if not re.fullmatch(r"\d+[bkmgBKMG]?", text):
        raise ConfigError(f"--shm-size {text!r} is not a size", hint="e.g. --shm-size 1g or 512m")
    return text.lower()
