"""ftx: deploy language models on Triton with FasterTransformer.

The names in ``__all__`` are the public API for plugin authors (families, runtimes, stage hooks)
and for code that drives ftx; everything else is internal and may change. They are imported
lazily, so ``import ftx`` stays cheap and importing a submodule never drags in the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy

hookimpl = pluggy.HookimplMarker("ftx")
"""Marker for plugin hook implementations: ``@ftx_triton.hookimpl``."""

PLUGIN_API_VERSION = 2
"""Version of the hook, Family and Runtime API; plugins declare the range they support.

2: runtimes are plugins (``ftx_register_runtimes``; ``runtime`` passed to the tune, configure and serve
hooks), stage settings are per-stage sections, and a family declares its config.ini as data (``ini``)."""

_EXPORTS: dict[str, str] = {
    # families
    "Family": "ftx_triton.conversion.family", "ModelSpec": "ftx_triton.conversion.family",
    "Preset": "ftx_triton.conversion.family",
    "FtIni": "ftx_triton.conversion.ftini", "IniSection": "ftx_triton.conversion.ftini",
    "M": "ftx_triton.conversion.tensormap", "Skip": "ftx_triton.conversion.tensormap",
    "TensorMap": "ftx_triton.conversion.tensormap",
    "Op": "ftx_triton.conversion.ops", "OpContext": "ftx_triton.conversion.ops",
    # runtimes
    "Runtime": "ftx_triton.runtime.api", "Availability": "ftx_triton.runtime.api",
    "DryRunPlan": "ftx_triton.runtime.api",
    # stage records, settings, context
    "SourceRef": "ftx_triton.plan.artifacts", "Source": "ftx_triton.plan.artifacts",
    "Checkpoint": "ftx_triton.plan.artifacts",
    "GemmConfig": "ftx_triton.plan.artifacts", "ModelRepository": "ftx_triton.plan.artifacts",
    "Endpoint": "ftx_triton.plan.artifacts",
    "RunSettings": "ftx_triton.plan.settings", "StageContext": "ftx_triton.plan.context",
    "FtModelOptions": "ftx_triton.repository.model_config",
    # driving ftx
    "Pipeline": "ftx_triton.engine.pipeline", "RunResult": "ftx_triton.engine.pipeline",
    "Stages": "ftx_triton.engine.stages",
    "ArtifactStore": "ftx_triton.store.artifact_store", "load_host": "ftx_triton.plugins",
    "PluginHost": "ftx_triton.plugins",
    # errors
    "FtxError": "ftx_triton.errors", "PluginError": "ftx_triton.errors", "FamilyResolutionError": "ftx_triton.errors",
    "SourceError": "ftx_triton.errors", "CheckpointError": "ftx_triton.errors", "MappingError": "ftx_triton.errors",
    "ConfigError": "ftx_triton.errors", "OutputError": "ftx_triton.errors", "ToolError": "ftx_triton.errors",
    "ServeError": "ftx_triton.errors",
}

__all__ = ["PLUGIN_API_VERSION", "__version__", "hookimpl", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("ftx-triton")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ftx' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec, Preset
    from ftx_triton.conversion.ftini import FtIni, IniSection
    from ftx_triton.conversion.ops import Op, OpContext
    from ftx_triton.conversion.tensormap import M, Skip, TensorMap
    from ftx_triton.engine.pipeline import Pipeline, RunResult
    from ftx_triton.engine.stages import Stages
    from ftx_triton.errors import (
        CheckpointError,
        ConfigError,
        FamilyResolutionError,
        FtxError,
        MappingError,
        OutputError,
        PluginError,
        ServeError,
        SourceError,
        ToolError,
    )
    from ftx_triton.plan.artifacts import Checkpoint, Endpoint, GemmConfig, ModelRepository, Source, SourceRef
    from ftx_triton.plan.context import StageContext
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import PluginHost, load_host
    from ftx_triton.repository.model_config import FtModelOptions
    from ftx_triton.runtime.api import Availability, DryRunPlan, Runtime
    from ftx_triton.store.artifact_store import ArtifactStore
