"""The context handed to every stage hook besides its inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ftx_triton.plan.settings import RunSettings
from ftx_triton.store.artifact_store import ArtifactStore

if TYPE_CHECKING:
    from ftx_triton.runtime.api import Runtime


@dataclass
class StageContext:
    """Settings, store, the chosen runtime, logger and what the run has produced so far."""

    settings: RunSettings
    store: ArtifactStore
    home: Path
    runtime: Runtime | None = None
    """The runtime chosen for this run (None before the tune stage chooses one)."""
    runtime_reason: str = ""
    log: Any = field(default_factory=lambda: structlog.get_logger("ftx.stage"))
    show_progress: bool = True
    artifact_keys: dict[str, str] = field(default_factory=dict)
    """Keys of the artifacts this run has built or reused so far, by stage."""
    producer: dict[str, Any] = field(default_factory=dict)
    """ftx version, the family (name, distribution, version, fingerprint) and loaded plugin versions."""
