"""Run settings and the context handed to every stage hook."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from ftx.store import ArtifactStore

STAGES = ("fetch", "convert", "tune", "configure", "serve")
RUNTIMES = ("auto", "python", "fastertransformer")


@dataclass(frozen=True)
class RunSettings:
    """Everything a user chose for one run; stage keys are built from the relevant parts."""

    model: str
    source: str | None = None
    revision: str | None = None
    sha256: str | None = None
    family: str | None = None
    tp: int = 1
    pp: int = 1
    weight_dtype: str = "fp32"
    data_type: str | None = None
    until: str = "serve"
    runtime: str = "auto"
    force: frozenset[str] = frozenset()
    dry_run: bool = False
    # configure
    max_batch_size: int = 8
    instances: int = 1
    streaming: bool = False
    dynamic_batching: bool = True
    tokenizer: Path | None = None
    # tune
    tune: bool = True
    tune_batch: int = 8
    tune_beam: int = 1
    tune_max_input_len: int = 512
    # serve
    host: str = "127.0.0.1"
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    detach: bool = False
    device: str = "auto"
    options: Mapping[str, Any] = field(default_factory=dict)

    def with_(self, **changes: Any) -> RunSettings:
        return replace(self, **changes)

    @property
    def effective_data_type(self) -> str:
        """Compute type: explicit ``--data-type``, else the weight dtype."""
        return self.data_type or self.weight_dtype


@dataclass
class StageContext:
    """What a stage hook gets besides its inputs."""

    settings: RunSettings
    store: ArtifactStore
    home: Path
    runtime: str = "python"
    runtime_reason: str = ""
    log: Any = field(default_factory=lambda: structlog.get_logger("ftx.stage"))
    show_progress: bool = True
    artifact_keys: dict[str, str] = field(default_factory=dict)
    """Keys of the artifacts this run has built or reused so far, by stage."""
    producer: dict[str, Any] = field(default_factory=dict)
    """ftx version, the family (name, distribution, version, fingerprint) and loaded plugin versions."""
