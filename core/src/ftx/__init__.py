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
"""Marker for plugin hook implementations: ``@ftx.hookimpl``."""

PLUGIN_API_VERSION = 2
"""Version of the hook, Family and Runtime API; plugins declare the range they support.

2: runtimes are plugins (``ftx_register_runtimes``; ``runtime`` passed to the tune, configure and serve
hooks), stage settings are per-stage sections, and a family declares its config.ini as data (``ini``)."""

_EXPORTS: dict[str, str] = {
    # families
    "Family": "ftx.family", "ModelSpec": "ftx.family", "Preset": "ftx.family",
    "FtIni": "ftx.ftini", "IniSection": "ftx.ftini",
    "M": "ftx.tensormap", "Skip": "ftx.tensormap", "TensorMap": "ftx.tensormap",
    "Op": "ftx.ops", "OpContext": "ftx.ops",
    # runtimes
    "Runtime": "ftx.runtime.api", "Availability": "ftx.runtime.api", "DryRunPlan": "ftx.runtime.api",
    # stage records, settings, context
    "SourceRef": "ftx.artifacts", "Source": "ftx.artifacts", "Checkpoint": "ftx.artifacts",
    "GemmConfig": "ftx.artifacts", "ModelRepository": "ftx.artifacts", "Endpoint": "ftx.artifacts",
    "RunSettings": "ftx.settings", "StageContext": "ftx.context",
    "FtModelOptions": "ftx.triton.model_config",
    # driving ftx
    "Pipeline": "ftx.pipeline", "RunResult": "ftx.pipeline", "Stages": "ftx.stages",
    "ArtifactStore": "ftx.store", "load_host": "ftx.plugins", "PluginHost": "ftx.plugins",
    # errors
    "FtxError": "ftx.errors", "PluginError": "ftx.errors", "FamilyResolutionError": "ftx.errors",
    "SourceError": "ftx.errors", "CheckpointError": "ftx.errors", "MappingError": "ftx.errors",
    "ConfigError": "ftx.errors", "OutputError": "ftx.errors", "ToolError": "ftx.errors", "ServeError": "ftx.errors",
}

__all__ = ["PLUGIN_API_VERSION", "__version__", "hookimpl", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("ftx")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ftx' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from ftx.artifacts import Checkpoint, Endpoint, GemmConfig, ModelRepository, Source, SourceRef
    from ftx.context import StageContext
    from ftx.errors import (
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
    from ftx.family import Family, ModelSpec, Preset
    from ftx.ftini import FtIni, IniSection
    from ftx.ops import Op, OpContext
    from ftx.pipeline import Pipeline, RunResult
    from ftx.plugins import PluginHost, load_host
    from ftx.runtime.api import Availability, DryRunPlan, Runtime
    from ftx.settings import RunSettings
    from ftx.stages import Stages
    from ftx.store import ArtifactStore
    from ftx.tensormap import M, Skip, TensorMap
    from ftx.triton.model_config import FtModelOptions
