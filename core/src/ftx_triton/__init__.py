"""ftx: deploy language models on Triton with FasterTransformer.

The names in ``__all__`` are the public API for plugin authors (families, runtimes, stage hooks)
and for code that drives ftx; everything else is internal and may change. They are imported
lazily, so ``import ftx_triton`` stays cheap and importing a submodule never drags in the rest.
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

_MODULES: dict[str, tuple[str, ...]] = {
    # families
    "ftx_triton.conversion.family": ("Family", "ModelSpec", "Preset"),
    "ftx_triton.conversion.ftini": ("FtIni", "IniSection"),
    "ftx_triton.conversion.tensormap": ("M", "Skip", "TensorMap"),
    "ftx_triton.conversion.ops": ("Op", "OpContext"),
    # runtimes
    "ftx_triton.runtime.api": ("Runtime", "Availability", "DryRunPlan", "Layout"),
    "ftx_triton.plan.options": ("OptionSection", "option"),
    # stage records, settings, context
    "ftx_triton.plan.artifacts": ("SourceRef", "Source", "Checkpoint", "GemmConfig", "ModelRepository", "Endpoint"),
    "ftx_triton.plan.settings": ("RunSettings", "AUTO"),
    "ftx_triton.plan.context": ("StageContext",),
    "ftx_triton.repository.model_config": ("FtModelOptions",),
    # driving ftx
    "ftx_triton.engine.pipeline": ("Pipeline", "RunResult"),
    "ftx_triton.engine.stages": ("Stages",),
    "ftx_triton.store.artifact_store": ("ArtifactStore",),
    "ftx_triton.plugins": ("load_host", "PluginHost"),
    # errors
    "ftx_triton.errors": (
        "FtxError",
        "PluginError",
        "FamilyResolutionError",
        "SourceError",
        "CheckpointError",
        "MappingError",
        "ConfigError",
        "OutputError",
        "ToolError",
        "ServeError",
    ),
}
_EXPORTS: dict[str, str] = {name: module for module, names in _MODULES.items() for name in names}

__all__ = ["PLUGIN_API_VERSION", "__version__", "hookimpl", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # looked up once: every stage's producer record names it
        from importlib.metadata import version

        globals()["__version__"] = found = version("ftx-triton")
        return found
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ftx_triton' has no attribute {name!r}")
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
    from ftx_triton.plan.options import OptionSection, option
    from ftx_triton.plan.settings import AUTO, RunSettings
    from ftx_triton.plugins import PluginHost, load_host
    from ftx_triton.repository.model_config import FtModelOptions
    from ftx_triton.runtime.api import Availability, DryRunPlan, Layout, Runtime
    from ftx_triton.store.artifact_store import ArtifactStore
