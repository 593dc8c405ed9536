"""Launch choices both FasterTransformer launchers read the same way.

:class:`FtLaunchSection` declares them (``--gpus``, ``--env``, ``--hosts``, ``--ssh-port``: options of ``ftx run``
and settings of ``ftx.toml``, as the user wrote them); :class:`FtLaunchOptions` holds them checked (GPU indices,
extra environment, the hosts file and ssh port of a multi-node run, the readiness timeout); each launcher's
options subclass it with its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypedDict

from ftx_triton.errors import ConfigError
from ftx_triton.plan.options import OptionSection, option

if TYPE_CHECKING:
    from ftx_triton.plan.settings import RunSettings

DEFAULT_READY_TIMEOUT_S = 900.0
"""Loading a 6B-20B model onto GPUs takes minutes; a hung NCCL init must still end."""

DEFAULT_SSH_PORT = 2222


@dataclass(frozen=True)
class FtLaunchSection(OptionSection):
    """What both FasterTransformer launchers take from the user: GPUs, environment, nodes."""

    title: ClassVar[str] = "FasterTransformer runtime (Docker)"
    gpus: str | tuple[int, ...] | None = option(
        None, help="Host GPU indices to use, e.g. 0,1,2,3 (default: the first tp x pp)."
    )
    env: tuple[str, ...] | Mapping[str, str] = option(
        (), help="KEY=VALUE for the server container (repeatable), e.g. FT_LOG_LEVEL=DEBUG.", multiple=True
    )
    hosts: str | None = option(
        None,
        help="Multi-node: a file with one host per line (GPUs per node x nodes must equal tp x pp; "
        "the native launcher also takes a machine on several lines, one process each).",
        kind=Path,
        must_exist=True,
    )
    ssh_port: int | None = option(
        None,
        help="Multi-node: the ssh port mpirun reaches the other machines on [default: 22 natively, 2222 in Docker].",
        kind=int,
        low=1,
        high=65535,
    )
    ready_timeout: float | None = None
    """Seconds a starting server may take to answer (no option: ``RunSettings.of(ready_timeout=…)``)."""


class LaunchFields(TypedDict):
    """The shared fields of :class:`FtLaunchOptions`, as keyword arguments."""

    gpus: tuple[int, ...] | None
    env: Mapping[str, str]
    hosts_file: Path | None
    ssh_port: int | None
    ready_timeout_s: float


@dataclass(frozen=True)
class FtLaunchOptions:
    """The ``launch`` choices every FasterTransformer launcher reads: GPUs, environment, nodes, readiness."""

    gpus: tuple[int, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    hosts_file: Path | None = None
    ssh_port: int | None = None
    """sshd's port on the other machines when named (--ssh-port); None: ssh's own default."""
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S

    @staticmethod
    def launch_fields(settings: RunSettings) -> LaunchFields:
        """The shared fields as read from the run's :class:`FtLaunchSection` (keyword arguments of any subclass)."""
        launch = settings.options(FtLaunchSection)
        return {
            "gpus": parse_gpus(launch.gpus) if launch.gpus not in (None, "", ()) else None,
            "env": parse_env(launch.env) if launch.env else {},
            "hosts_file": Path(launch.hosts) if launch.hosts else None,
            "ssh_port": int(launch.ssh_port) if launch.ssh_port else None,
            "ready_timeout_s": float(launch.ready_timeout or DEFAULT_READY_TIMEOUT_S),
        }


def parse_gpus(value: str | Iterable[int | str]) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(str(i).strip()) for i in items if str(i).strip())
    except ValueError:
        raise ConfigError(f"--gpus {value!r} is not a list of GPU indices", hint="e.g. --gpus 0,1,2,3") from None


def parse_env(value: Mapping[str, str] | Iterable[str] | str) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    items = [value] if isinstance(value, str) else list(value)
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {item!r} is not KEY=VALUE", hint="e.g. --env FT_LOG_LEVEL=DEBUG")
        out[key] = val
    return out


__all__ = [
    "DEFAULT_READY_TIMEOUT_S",
    "DEFAULT_SSH_PORT",
    "FtLaunchOptions",
    "FtLaunchSection",
    "LaunchFields",
    "parse_env",
    "parse_gpus",
]
