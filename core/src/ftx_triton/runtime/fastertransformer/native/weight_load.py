"""How long each GPU's weights took to load, read from the native server's log.

ftx's build of the FasterTransformer backend logs one line per GPU once its weights are on it::

    ftx: weights of rank 0 on GPU 0 loaded: 6050123456 bytes (6.050 GB) from 229 files in 0.812 s (7.45 GB/s,
    pinned loader); 1.034 s in all

(one line: the seconds inside the weight-file loaders, then the GPU's whole weight set-up, allocation included).
:func:`weight_loads` reads them; :func:`log_weight_loads` reports them as ``serve.weights_loaded`` events, shown
with ``ftx -v`` beside the run's timeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

_LINE = re.compile(
    r"ftx: weights of rank (?P<rank>\d+) on GPU (?P<gpu>\d+) loaded: (?P<bytes>\d+) bytes \([\d.]+ GB\) from "
    r"(?P<files>\d+) files in (?P<seconds>\d+(?:\.\d+)?) s \((?P<gb_per_s>\d+(?:\.\d+)?) GB/s, "
    r"(?P<loader>[a-z]+) loader\); (?P<total_s>\d+(?:\.\d+)?) s in all"
)


@dataclass(frozen=True)
class WeightLoad:
    """One GPU's weight loading, as the backend logged it."""

    rank: int
    gpu: int
    bytes: int
    files: int
    seconds: float
    """Inside the weight-file loaders."""
    gb_per_s: float
    loader: str
    """``pinned`` (ftx's), ``upstream`` (FTX_FT_LOADER=upstream, or other file types), ``mixed`` or ``no``."""
    total_s: float
    """The GPU's whole weight set-up: allocation and files."""


def weight_loads(text: str) -> list[WeightLoad]:
    """Every weight-load line of a server log, in order (a restarted server's lines follow its first ones)."""
    return [
        WeightLoad(
            rank=int(m["rank"]),
            gpu=int(m["gpu"]),
            bytes=int(m["bytes"]),
            files=int(m["files"]),
            seconds=float(m["seconds"]),
            gb_per_s=float(m["gb_per_s"]),
            loader=m["loader"],
            total_s=float(m["total_s"]),
        )
        for m in _LINE.finditer(text)
    ]


def log_weight_loads(text: str) -> list[WeightLoad]:
    """Log a ``serve.weights_loaded`` event per GPU of the log (and return the loads)."""
    loads = weight_loads(text)
    for load in loads:
        log.info(
            "serve.weights_loaded",
            rank=load.rank,
            gpu=load.gpu,
            gb=round(load.bytes / 1e9, 3),
            files=load.files,
            seconds=load.seconds,
            gb_per_s=load.gb_per_s,
            loader=load.loader,
            total_s=load.total_s,
        )
    return loads


__all__ = ["WeightLoad", "log_weight_loads", "weight_loads"]
