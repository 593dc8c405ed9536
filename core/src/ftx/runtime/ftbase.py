"""What both FasterTransformer launchers (Docker, native) share: the runtime base, launch options, GEMM file.

Each launcher knows only this layer (and the shared modules beside it: GPUs, hosts, log scan), never
the other launcher.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypedDict

from ftx.errors import ConfigError
from ftx.runtime.api import Runtime

if TYPE_CHECKING:
    from ftx.docker_runtime.hosts import NodeLayout
    from ftx.family import Family, ModelSpec
    from ftx.settings import RunSettings
    from ftx.triton.model_config import FtModelOptions

GEMM_FILE = "gemm_config.in"
"""What the GEMM tools write and FasterTransformer reads from tritonserver's working directory."""

DEFAULT_READY_TIMEOUT_S = 900.0
"""Loading a 6B-20B model onto GPUs takes minutes; a hung NCCL init must still end."""

DEFAULT_SSH_PORT = 2222


class LaunchFields(TypedDict):
    """The shared fields of :class:`FtLaunchOptions`, as keyword arguments."""

    gpus: tuple[int, ...] | None
    env: Mapping[str, str]
    hosts_file: Path | None
    ssh_port: int
    ready_timeout_s: float


@dataclass(frozen=True)
class FtLaunchOptions:
    """The ``launch`` choices every FasterTransformer launcher reads: GPUs, environment, nodes, readiness."""

    gpus: tuple[int, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    hosts_file: Path | None = None
    ssh_port: int = DEFAULT_SSH_PORT
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S

    @staticmethod
    def launch_fields(settings: RunSettings) -> LaunchFields:
        """The shared fields as read from ``settings.launch`` (keyword arguments of any subclass)."""
        launch = settings.launch
        return {
            "gpus": parse_gpus(launch.gpus) if launch.gpus not in (None, "", ()) else None,
            "env": parse_env(launch.env) if launch.env else {},
            "hosts_file": Path(launch.hosts) if launch.hosts else None,
            "ssh_port": int(launch.ssh_port or DEFAULT_SSH_PORT),
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


def gemm_arguments(family: Family, spec: ModelSpec, settings: RunSettings) -> list[str]:
    """The family's GEMM tool arguments for the serving settings (batch, beam, input length, dtype, tp)."""
    t = settings.tune
    return family.gemm_args(spec, batch=t.tune_batch, beam=t.tune_beam, max_input_len=t.tune_max_input_len,
                            data_type=settings.data_type, tp=settings.convert.tp)


def prepare_work_dir(work_dir: Path, gemm_source: Path | None, layout: NodeLayout, hostfile_name: str) -> None:
    """tritonserver's working directory: ``gemm_config.in`` (or none, so a stale one is never read) and,
    across nodes, the mpirun hostfile."""
    work_dir.mkdir(parents=True, exist_ok=True)
    target = work_dir / GEMM_FILE
    if gemm_source is not None:
        shutil.copyfile(gemm_source, target)
    else:
        target.unlink(missing_ok=True)
    if layout.multi_node:
        (work_dir / hostfile_name).write_text(layout.hostfile_text())


class FasterTransformerRuntime(Runtime):
    """A runtime serving the ``fastertransformer`` backend: tunes GEMMs, writes the backend's model config.

    ``--runtime fastertransformer`` selects whichever subclass is available (higher ``priority`` first).
    """

    selects_as: ClassVar[tuple[str, ...]] = ("fastertransformer",)
    default_data_type: ClassVar[str | None] = "fp16"
    uses_gemm_config: ClassVar[bool] = True

    def write_ft_model(self, model_dir: Path, options: FtModelOptions, family: Family) -> str:
        from ftx.triton.repository import write_backend_ft_model

        return write_backend_ft_model(model_dir, options, family)


__all__ = ["DEFAULT_READY_TIMEOUT_S", "GEMM_FILE", "FasterTransformerRuntime", "FtLaunchOptions", "gemm_arguments",
           "parse_env", "parse_gpus", "prepare_work_dir"]
