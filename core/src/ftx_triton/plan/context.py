"""The context handed to every stage hook besides its inputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftx_triton.plan.settings import RunSettings
from ftx_triton.terminal import lazylog

if TYPE_CHECKING:
    from ftx_triton.runtime.api import Runtime
    from ftx_triton.store.artifact_store import ArtifactStore


@dataclass(frozen=True)
class StageContext:
    """Settings (the plan's), store, home, the chosen runtime, the output function, logger and what the run
    has produced so far; frozen: each stage gets its own, with the keys of the stages before it."""

    settings: RunSettings
    store: ArtifactStore
    home: Path
    runtime: Runtime | None = None
    """The runtime chosen for this run (None before the tune stage chooses one)."""
    runtime_reason: str = ""
    log: Any = field(default_factory=lambda: lazylog.get_logger("ftx.stage"))
    show_progress: bool = True
    say: Callable[[str], None] = field(default=lambda text: None)
    """A human line for the user (the CLI's: stderr, above progress bars); runtimes report through it."""
    artifact_keys: Mapping[str, str] = field(default_factory=dict)
    """Keys of the artifacts this run has built or reused so far, by stage."""
    producer: Mapping[str, Any] = field(default_factory=dict)
    """ftx version, the family (name, distribution, version, fingerprint) and loaded plugin versions."""
