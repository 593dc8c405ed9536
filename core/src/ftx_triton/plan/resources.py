"""Before fetching: how big a model is, what the source stores, and whether disk and memory suffice.

The parameter count comes from the family's own table evaluated on the checkpoint's config
(:func:`ftx_triton.conversion.layout.ft_layout`), so it needs no weights. From it and the data types:

- download: parameters x the source's dtype (``torch_dtype``/``dtype`` in config.json, else the
  weight files' headers);
- converted: parameters x ``--weight-dtype`` (the FasterTransformer files, all ranks together);
- memory: what the python runtime holds in RAM (parameters x its compute type, fp16 computing as
  fp32 on a CPU, plus the server's own footprint).

A build that would not fit is refused before it starts, naming the flag that overrides the check
(``--no-resource-check``); ``--dry-run`` prints the same figures.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftx_triton.conversion.dtype_names import WEIGHT_DTYPE_BYTES
from ftx_triton.errors import FtxError, ResourceError

GiB = 1 << 30
SERVER_OVERHEAD_BYTES = 1 * GiB
"""tritonserver, the Python-backend stubs, torch and transformers before any weight is loaded."""
DISK_MARGIN = 1.05
"""Headroom on top of the estimate (metadata, tokenizer files, rounding)."""
OVERRIDE_FLAG = "--no-resource-check"

_CONFIG_DTYPES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def config_dtype(hf_config: Mapping[str, Any] | None) -> str | None:
    """The dtype config.json declares (``torch_dtype``, or ``dtype`` as transformers 5 writes it)."""
    if not hf_config:
        return None
    value = hf_config.get("torch_dtype") or hf_config.get("dtype")
    return _CONFIG_DTYPES.get(str(value).removeprefix("torch.")) if value else None


def stored_dtype(reader: Any) -> str | None:
    """The weight dtype holding most bytes in a weight reader (safetensors header, memory-mapped .bin)."""
    from ftx_triton.formats.checkpoint import stored_weight_dtype

    weights: Counter[str] = Counter()
    for name in reader.names():
        if found := stored_weight_dtype(reader, name):
            weights[found] += reader.nbytes(name)
    return weights.most_common(1)[0][0] if weights else None


def source_dtype(family: Any, path: Path | None, hf_config: Mapping[str, Any] | None) -> str | None:
    """What the source checkpoint stores: config.json's dtype, else its weight files' (None: unknown)."""
    found = config_dtype(hf_config)
    if found or path is None:
        return found
    try:
        reader = family.open_weights(Path(path))
    except FtxError:
        return None
    try:
        return stored_dtype(reader)
    finally:
        reader.close()


def default_weight_dtype(family: Any, found: str | None) -> str:
    """``--weight-dtype auto``: the source's dtype when the family stores it, else fp32."""
    if found and found in family.weight_dtypes:
        return found
    return "fp32" if "fp32" in family.weight_dtypes else family.weight_dtypes[0]


def weights_for_runtime(family: Any, runtime: Any, settings: Any) -> str:
    """``--weight-dtype auto`` once the runtime is known: the compute type where the runtime casts the weights
    to it when it loads them (FasterTransformer: an fp32 checkpoint served in fp16 converts to fp16 files, half
    the disk, conversion and load time) and the family stores it; else the weight dtype chosen so far."""
    compute = settings.configure.data_type
    if runtime is not None and runtime.weights_in_compute_type and compute in family.weight_dtypes:
        return str(compute)
    return str(settings.convert.weight_dtype)


def parameter_count(family: Any, spec: Any) -> int:
    """Every element of every tensor the family's table writes for ``spec``."""
    from ftx_triton.conversion.layout import ft_element_count

    return ft_element_count(family, spec)


def _bytes(dtype: str | None) -> int:
    return WEIGHT_DTYPE_BYTES[dtype or "fp32"]


def human_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class Estimate:
    """Sizes of one run's outputs and what this machine has for them."""

    parameters: int
    source_dtype: str | None
    weight_dtype: str
    download_bytes: int | None
    """None when nothing is downloaded (a local directory)."""
    converted_bytes: int
    ram_bytes: int | None
    """None when the runtime does not load the model into this machine's memory."""
    home: Path
    free_disk: int
    available_ram: int | None
    """None where ``ram_bytes`` is (not asked: psutil is imported only for a run that loads the model in RAM)."""

    def lines(self) -> list[str]:
        """Human lines for ``--dry-run`` and the run itself."""
        size = f"{self.parameters / 1e9:.2f} B" if self.parameters >= 1e8 else f"{self.parameters / 1e6:.2f} M"
        parts = [f"model     {size} parameters; source stored as {self.source_dtype or 'unknown (assuming fp32)'}"]
        disk = []
        if self.download_bytes is not None:
            disk.append(f"download {human_bytes(self.download_bytes)}")
        disk.append(f"converted {human_bytes(self.converted_bytes)} ({self.weight_dtype})")
        parts.append(f"disk      {', '.join(disk)}; {human_bytes(self.free_disk)} free at {self.home}")
        if self.ram_bytes is not None and self.available_ram is not None:
            parts.append(
                f"memory    python runtime needs about {human_bytes(self.ram_bytes)} of RAM; "
                f"{human_bytes(self.available_ram)} available"
            )
        return parts

    def disk_needed(self, *, download: bool = True, convert: bool = True) -> int:
        total = (self.download_bytes or 0) * download + self.converted_bytes * convert
        return int(total * DISK_MARGIN)

    def problems(self, *, download: bool = True, convert: bool = True, serve: bool = True) -> list[str]:
        found = []
        need = self.disk_needed(download=download, convert=convert)
        if need > self.free_disk:
            found.append(f"disk: {human_bytes(need)} needed at {self.home}, {human_bytes(self.free_disk)} free")
        if (
            serve
            and self.ram_bytes is not None
            and self.available_ram is not None
            and self.ram_bytes > self.available_ram
        ):
            found.append(
                f"memory: the python runtime needs about {human_bytes(self.ram_bytes)} of RAM, "
                f"{human_bytes(self.available_ram)} available"
            )
        return found


def estimate(
    family: Any,
    spec: Any,
    *,
    source: str | None,
    weight_dtype: str,
    compute_dtype: str | None,
    home: Path,
    local_source: bool,
    loads_in_ram: bool,
) -> Estimate:
    """Sizes for ``family``/``spec`` with these data types, and the free disk at ``home`` and RAM."""
    params = parameter_count(family, spec)
    ram = available = None
    if loads_in_ram:
        import psutil

        compute = compute_dtype or weight_dtype
        per_param = 4 if compute == "fp16" else _bytes(compute)  # fp16 computes as fp32 on a CPU
        ram = params * per_param + SERVER_OVERHEAD_BYTES
        available = psutil.virtual_memory().available
    Path(home).mkdir(parents=True, exist_ok=True)
    return Estimate(
        parameters=params,
        source_dtype=source,
        weight_dtype=weight_dtype,
        download_bytes=None if local_source else params * _bytes(source),
        converted_bytes=params * _bytes(weight_dtype),
        ram_bytes=ram,
        home=Path(home),
        free_disk=shutil.disk_usage(home).free,
        available_ram=available,
    )


def require_disk(directory: Path, needed: int, what: str) -> None:
    """Refuse to write ``what`` (about ``needed`` bytes) under ``directory`` (or its nearest existing parent)
    when its file system has less free: checked before the first byte, not discovered as ENOSPC halfway."""
    existing = Path(directory)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise ResourceError(
            f"{what} needs about {human_bytes(needed)} at {directory}, but only {human_bytes(free)} are free there",
            hint="free space on that file system, or set FTX_HOME to a directory with more room",
        )


def refuse(problems: list[str], what: str) -> ResourceError:
    """The error for a run that would not fit."""
    return ResourceError(
        f"{what} would not fit on this machine: " + "; ".join(problems),
        hint=f"free space or memory, choose a smaller --weight-dtype, or pass {OVERRIDE_FLAG} to go ahead anyway",
    )


__all__ = [
    "Estimate",
    "ResourceError",
    "config_dtype",
    "default_weight_dtype",
    "weights_for_runtime",
    "estimate",
    "human_bytes",
    "parameter_count",
    "refuse",
    "require_disk",
    "source_dtype",
    "stored_dtype",
]
