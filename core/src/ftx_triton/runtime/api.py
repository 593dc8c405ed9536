"""The runtime interface: what serves a model repository, registered by plugins.

A runtime is a class registered through the ``ftx_register_runtimes`` hook, exactly as a model
family is registered through ``ftx_register_families`` (core's own runtimes — ``python`` and
``fastertransformer-docker`` — are registered that way too). Core asks each runtime whether it can
run here and why, lets ``--runtime auto`` pick the available one with the highest ``priority``, and
then calls it for the stages that depend on it: ``layout`` (``--tp auto``: how the model is spread over
devices), ``tune`` (GEMM tuning), ``write_ft_model`` (its part of the model repository: the
``fastertransformer`` model), ``serve`` and ``stop``. ``describe`` gives the ``--dry-run`` lines. The options
it reads are declared in ``option_sections`` (``ftx run`` gets them as options, ``ftx.toml`` as settings) and
read back typed with ``settings.options(Section)``. Core never branches on a runtime's name.

``--runtime NAME`` selects by ``name`` or by one of ``selects_as`` (``fastertransformer`` selects
whichever FasterTransformer launcher is available, preferring the higher ``priority``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ftx_triton.plan.options import OptionSection

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec
    from ftx_triton.plan.artifacts import Endpoint, GemmConfig, ModelRepository
    from ftx_triton.plan.context import RunSettings, StageContext
    from ftx_triton.repository.model_config import FtModelOptions
    from ftx_triton.store.artifact_store import ArtifactStore


@dataclass(frozen=True)
class Availability:
    """Whether a runtime can run on this machine, and the reason either way (shown to the user)."""

    ok: bool
    reason: str


@dataclass(frozen=True)
class DryRunPlan:
    """What ``--dry-run`` knows when it asks a runtime to describe the stages after convert."""

    settings: RunSettings
    family: Family
    spec: ModelSpec
    checkpoint_dir: Path
    repository_dir: Path
    store: ArtifactStore
    """The run's store (``store.home`` is FTX_HOME): where cached builds and working directories are."""


@dataclass(frozen=True)
class Layout:
    """How a runtime spreads one model over its devices: tp ranks x pp stages, instances, and why (said as
    ``place     --tp auto: <reason>``)."""

    tp: int
    pp: int = 1
    instances: int = 1
    reason: str = ""


class Runtime:
    """Base class of every runtime. Subclasses set the class attributes and override the methods.

    Instances are created once per process by the plugin host (no constructor arguments).
    """

    name: ClassVar[str] = ""
    """Registry name, unique: ``python``, ``fastertransformer-docker``, ``fastertransformer-native``."""
    selects_as: ClassVar[tuple[str, ...]] = ()
    """Other ``--runtime`` values that select this runtime (``("fastertransformer",)``)."""
    priority: ClassVar[int] = 0
    """``--runtime auto`` (and an alias) picks the available runtime with the highest priority."""
    description: ClassVar[str] = ""
    """One line for ``ftx plugins`` / ``--help``."""
    default_data_type: ClassVar[str | None] = None
    """Compute type when ``--data-type`` is not given (None: the weight dtype)."""
    weights_in_compute_type: ClassVar[bool] = False
    """Whether ``--weight-dtype auto`` converts to the compute type (True) rather than the source's dtype: a
    runtime that casts the weights to the compute type when it loads them gains nothing from wider files."""
    uses_gemm_config: ClassVar[bool] = False
    """Whether ``gemm_config.in`` matters to this runtime (the tune stage asks it to tune)."""
    loads_into_host_memory: ClassVar[bool] = False
    """Whether serving holds the whole model in this machine's RAM (checked before fetching)."""
    option_sections: ClassVar[tuple[type[OptionSection], ...]] = ()
    """The options this runtime reads (:class:`~ftx_triton.plan.options.OptionSection` dataclasses): options of
    ``ftx run`` and settings of ``ftx.toml``, read back with ``settings.options(Section)``."""

    # -- selection -------------------------------------------------------------------------

    def available(self, settings: RunSettings, store: ArtifactStore) -> Availability:
        """Whether this runtime can serve here (checked by ``--runtime auto``); cheap, no side effects.

        ``store`` is the run's (its ``home`` the user's FTX_HOME): a runtime that builds something once
        (the native backend) looks there, never at a store of its own."""
        return Availability(True, f"the {self.name} runtime is installed")

    def identity(self) -> Mapping[str, str]:
        """What this runtime serves with, beyond the Python packages (an image's pinned sources, a build's
        pins): ``ftx lock`` records it in ``[stack]`` and a replay compares it. Cheap, no side effects."""
        return {}

    # -- the plan ---------------------------------------------------------------------------

    def layout(self, settings: RunSettings, family: Family, hf_config: Mapping[str, object]) -> Layout:
        """``--tp auto`` for this model on this runtime: tp x pp and instances (``settings`` as the user gave
        them, with tp still auto). The default serves on one device, keeping ``--pp`` and ``--instances``."""
        return Layout(
            1, settings.configure.pp, settings.configure.instances, f"tp 1 (the {self.name} runtime runs on one device)"
        )

    # -- stages ----------------------------------------------------------------------------

    def describe(self, plan: DryRunPlan) -> list[str]:
        """``--dry-run`` lines for tune, configure and serve (each command exactly as it would run)."""
        return [f"serve     {self.name} runtime"]

    def tune_key(self, family: Family, spec: ModelSpec, settings: RunSettings) -> Mapping[str, object]:
        """What, beyond the settings core already keys on, determines this runtime's ``gemm_config.in``
        (GPU model, image or build id, tool arguments). Empty when the runtime does not tune."""
        return {}

    def tune(self, family: Family, spec: ModelSpec, dest: Path, ctx: StageContext) -> GemmConfig:
        """Write ``dest/gemm_config.in`` for ``spec``, or return an untuned record saying why."""
        from ftx_triton.plan.artifacts import GemmConfig

        return GemmConfig(None, False, f"the {self.name} runtime does not use gemm_config.in")

    def write_ft_model(self, model_dir: Path, options: FtModelOptions, family: Family) -> str:
        """Write the ``fastertransformer`` model (``config.pbtxt``, ``1/``) into ``model_dir``; return its backend."""
        raise NotImplementedError(f"runtime {self.name} does not write a fastertransformer model")

    def write_encoder_model(self, model_dir: Path, options: FtModelOptions, family: Family) -> str:
        """Write the ``encoder`` model (``--embeddings``: an encoder-decoder model's encoder alone) into
        ``model_dir``; return its backend."""
        from ftx_triton.errors import ConfigError

        raise ConfigError(f"the {self.name} runtime does not serve an encoder alone", hint="leave --embeddings out")

    def serve(self, repository: ModelRepository, gemm: GemmConfig, ctx: StageContext) -> Endpoint:
        """Start serving ``repository``; return once it answers (``Endpoint.handle`` stops it)."""
        raise NotImplementedError(f"runtime {self.name} cannot serve")

    def stop(self, endpoint: Endpoint) -> None:
        """Stop what ``serve`` started."""
        if endpoint.handle is not None:
            endpoint.handle.stop()


def runtime_names(runtimes: Sequence[Runtime]) -> list[str]:
    """Every value ``--runtime`` accepts for these runtimes (``auto`` first)."""
    names = ["auto"]
    for runtime in runtimes:
        for name in (runtime.name, *runtime.selects_as):
            if name not in names:
                names.append(name)
    return names


def option_sections(runtimes: Sequence[Runtime]) -> list[type[OptionSection]]:
    """The option sections these runtimes declare, each once, in registration order."""
    out: list[type[OptionSection]] = []
    for runtime in runtimes:
        out.extend(section for section in runtime.option_sections if section not in out)
    return out


__all__ = ["Availability", "DryRunPlan", "Layout", "Runtime", "option_sections", "runtime_names"]
