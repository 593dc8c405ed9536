"""Frozen records passed between stages and hooks.

Each stage writes into a directory the core gives it; these records describe what is there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SourceRef:
    """Where a checkpoint comes from, before it is fetched.

    ``kind`` is one of ``local``, ``hf``, ``url``. ``uri`` is the canonical text
    (``/abs/path``, ``hf://org/name``, ``https://…``); ``revision`` is a branch, tag or
    commit for ``hf`` (None = the default branch); ``sha256`` an expected archive checksum.
    ``preset`` names the preset the reference came from, if any.
    """

    kind: str
    uri: str
    revision: str | None = None
    sha256: str | None = None
    preset: str | None = None

    @property
    def display(self) -> str:
        return f"{self.uri}@{self.revision}" if self.revision else self.uri


@dataclass(frozen=True)
class Source:
    """A fetched checkpoint: a directory holding config.json and weights (or a slim checkpoint).

    ``revision`` is the resolved commit (hf) or a content fingerprint (local, url).
    """

    ref: SourceRef
    path: Path
    revision: str
    origin: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    """A converted FasterTransformer checkpoint: ``path`` is the ``<tp>-gpu`` directory."""

    path: Path
    tensor_parallel: int
    weight_dtype: str
    family: str


@dataclass(frozen=True)
class GemmConfig:
    """The result of GEMM tuning: ``path`` to ``gemm_config.in``, or None when untuned."""

    path: Path | None
    tuned: bool
    reason: str = ""


@dataclass(frozen=True)
class ModelRepository:
    """A Triton model repository ready to serve."""

    path: Path
    runtime: str
    models: tuple[str, ...]
    family: str


@dataclass(frozen=True)
class Endpoint:
    """A running server: its URLs and, for local servers, a handle to stop it."""

    http_url: str
    grpc_url: str
    model: str = "ensemble"
    handle: Any = None
