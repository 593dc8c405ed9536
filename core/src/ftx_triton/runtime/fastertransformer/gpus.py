"""The local NVIDIA GPUs and their compute capability (``nvidia-smi``, else ``torch.cuda``).

Used for the image's SM list (upstream compiles none for Hopper), the GPU model in the tuning
key, and checking that ``--tp x --pp`` GPUs exist before a container is started.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ftx_triton.errors import ConfigError

FT_SM_SETS = (52, 60, 61, 70, 75, 80, 86, 89, 90)
"""Architectures FasterTransformer's CMake accepts in ``-D SM=…`` (its ``SM_SETS``)."""

UPSTREAM_DEFAULT_SM = (70, 75, 80, 86)
"""What the backend's Dockerfile builds when no ``-D SM`` is given (no native Hopper code)."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as the host driver sees it."""

    index: int
    name: str
    compute_capability: tuple[int, int] | None = None
    uuid: str = ""
    memory_mib: int | None = None

    @property
    def sm(self) -> int | None:
        """Compute capability as FasterTransformer's SM number (9.0 -> 90)."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return major * 10 + minor


def _nvidia_smi(fields: str) -> list[list[str]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[cell.strip() for cell in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def _capability(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split(".")
        return int(major), int(minor)
    except ValueError:
        return None


DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
"""Where a loaded NVIDIA kernel driver shows itself (in a container too, when a GPU is passed in; ``/dev/dxg``:
WSL 2, whose GPUs have no ``/dev/nvidia*``)."""


def nvidia_driver_present() -> bool:
    """Does this machine show an NVIDIA driver? Checked before asking torch, whose import alone takes
    seconds (a plan on a machine without GPUs would otherwise pay it on every run)."""
    return any(os.path.exists(path) for path in DRIVER_PATHS)


def _from_torch() -> list[Gpu]:
    if not nvidia_driver_present():
        return []
    try:
        import torch
    except ImportError:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        return [
            Gpu(
                i,
                torch.cuda.get_device_name(i),
                tuple(torch.cuda.get_device_capability(i)),  # type: ignore[arg-type]
                memory_mib=torch.cuda.get_device_properties(i).total_memory >> 20,  # --tp auto plans by it
            )
            for i in range(torch.cuda.device_count())
        ]
    except Exception:
        return []


@functools.lru_cache(maxsize=1)
def local_gpus() -> tuple[Gpu, ...]:
    """The GPUs of this machine; empty when there is no NVIDIA driver."""
    rows = _nvidia_smi("index,name,compute_cap,uuid,memory.total")
    if rows is not None:
        return tuple(Gpu(int(r[0]), r[1], _capability(r[2]), r[3], _int(r[4])) for r in rows if len(r) >= 5)
    rows = _nvidia_smi("index,name,uuid,memory.total")  # drivers older than 510 lack compute_cap
    if rows is not None:
        caps = {g.index: g.compute_capability for g in _from_torch()}
        return tuple(Gpu(int(r[0]), r[1], caps.get(int(r[0])), r[2], _int(r[3])) for r in rows if len(r) >= 4)
    return tuple(_from_torch())


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_sm_list(text: str | Iterable[int | str]) -> tuple[int, ...]:
    """``"80,90"``, ``"8.0 9.0"``, ``"sm_90"`` or ints -> ``(80, 90)``; only architectures FT builds."""
    items = text.replace(";", ",").replace(" ", ",").split(",") if isinstance(text, str) else list(text)
    out: list[int] = []
    for item in items:
        raw = str(item).strip().lower().removeprefix("sm_").removeprefix("sm")
        if not raw:
            continue
        try:
            value = int(round(float(raw) * 10)) if "." in raw else int(raw)
        except ValueError:
            raise ConfigError(
                f"--sm {item!r} is not a compute capability", hint="write SM numbers like 80,90 (or 8.0,9.0)"
            ) from None
        if value not in FT_SM_SETS:
            raise ConfigError(
                f"FasterTransformer cannot be compiled for SM {value}",
                hint=f"its CMake accepts {', '.join(map(str, FT_SM_SETS))}",
            )
        if value not in out:
            out.append(value)
    return tuple(sorted(out))


def default_sm(gpus: Sequence[Gpu] | None = None) -> tuple[int, ...]:
    """The SM list for an image built for this machine's GPUs (empty when none are found)."""
    gpus = local_gpus() if gpus is None else gpus
    found = sorted({g.sm for g in gpus if g.sm is not None})
    return tuple(s for s in found if s in FT_SM_SETS)


def gpu_model(gpus: Sequence[Gpu]) -> str:
    """A short name of the GPU model(s), for keys and messages."""
    names = sorted({g.name for g in gpus})
    return " + ".join(names) if names else "unknown GPU"


def select_gpus(
    wanted: int, requested: Sequence[int] | None = None, available: Sequence[Gpu] | None = None
) -> tuple[int, ...]:
    """Host GPU indices for a container that needs ``wanted`` GPUs (``--gpus`` or the first ones).

    With ``available`` known (a driver is present) the choice is checked against it; without one the
    indices are taken as given (the Docker host may be another machine).
    """
    available = local_gpus() if available is None else available
    if requested:
        chosen = tuple(dict.fromkeys(int(i) for i in requested))
        if len(chosen) != wanted:
            raise ConfigError(
                f"--gpus names {len(chosen)} GPU(s) but tp x pp needs exactly {wanted}",
                hint=f"name {wanted} GPU indices, e.g. --gpus {','.join(map(str, range(wanted)))}",
            )
        known = {g.index for g in available}
        if available and not set(chosen) <= known:
            missing = sorted(set(chosen) - known)
            raise ConfigError(
                f"GPU(s) {missing} do not exist here (this machine has {sorted(known)})",
                hint="pick indices from `nvidia-smi -L`",
            )
        return chosen
    if available and len(available) < wanted:
        raise ConfigError(
            f"tp x pp needs {wanted} GPUs but this machine has {len(available)}",
            hint="lower --tp/--pp, or use several nodes with --hosts",
        )
    return tuple(range(wanted))
