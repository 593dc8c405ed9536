"""Hook specifications: the contract between ftx core and its plugins.

Every hook is called with keyword arguments; an implementation may accept any subset of the
documented arguments (pluggy passes only the ones it names), which lets hooks gain arguments
without breaking plugins. Stage hooks are ``firstresult``: the first implementation that
returns something other than None wins, and core's default is registered ``trylast``, so a
platform plugin (a mirror, a pre-tuned GEMM registry, a Kubernetes serve) overrides a stage
by returning a result, or declines by returning None.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import click

    from ftx_triton.conversion.family import Family, ModelSpec
    from ftx_triton.plan.artifacts import Checkpoint, Endpoint, GemmConfig, ModelRepository, Source, SourceRef
    from ftx_triton.plan.cluster import ClusterDeployment
    from ftx_triton.plan.context import StageContext
    from ftx_triton.runtime.api import Runtime

hookspec = pluggy.HookspecMarker("ftx")

# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------


@hookspec
def ftx_register_families() -> Sequence[type[Family]]:
    """Return the model families this plugin provides.

    Called once after all plugins are loaded. Results of all plugins are merged by
    ``Family.name``; a name returned by two plugins is a PluginError naming both.

    :returns: Family subclasses (not instances); an empty sequence is fine.
    """


@hookspec
def ftx_register_runtimes() -> Sequence[type[Runtime]]:
    """Return the runtimes this plugin provides (subclasses of :class:`ftx_triton.runtime.api.Runtime`).

    Called once after all plugins are loaded, like ``ftx_register_families``; a runtime name
    returned by two plugins is a PluginError naming both. Core's own runtimes (``python``,
    ``fastertransformer-docker``) are registered through this hook too.

    :returns: Runtime subclasses (not instances); an empty sequence is fine.
    """


@hookspec
def ftx_register_commands(cli: click.Group, kit: object) -> None:
    """Add this plugin's commands to the ``ftx`` command line: ``cli.add_command(command)``.

    A runtime brings its own tools this way (the Docker launcher's ``ftx image``, ``ftx tune`` and
    ``ftx package``, the native launcher's ``ftx backend``), built from :mod:`ftx_triton.commandkit`
    (``FtxCommand``, ``say``, ``options_of(Section)``). A command name another plugin or core
    already uses is a PluginError naming both.

    :param cli: a click group collecting this plugin's commands.
    :param kit: an :class:`ftx_triton.commandkit.CommandKit`, what a command needs from the CLI above it:
        ``kit.run(settings)`` runs the pipeline as
        ``ftx run`` does, ``kit.settings(model, **options)`` builds the settings, ``kit.options[name]``
        adds core's option groups (``source``, ``conversion``, ``repository``, ``tune``, ``safety``).
    :returns: nothing; the commands are added to ``cli``.
    """


@hookspec
def ftx_add_options() -> Sequence[click.Option]:
    """Return options this plugin adds to ``ftx run`` (a cluster runtime's ``--namespace``).

    They are listed in ``ftx run --help`` under "Plugin options", have environment twins like every
    option (``FTX_RUN_<NAME>``), and reach the stages as ``ctx.settings.plugin_option(name)``. A name
    ``ftx run`` already has is a PluginError.

    :returns: ``click.Option`` objects (new ones per call); an empty sequence is fine.
    """


@hookspec
def ftx_cluster_deployments(home: Path) -> Sequence[ClusterDeployment]:
    """Return the deployments this plugin runs on a cluster scheduler for ``home`` (its Slurm jobs, ...).

    `ftx ps` lists them, `ftx generate` and `ftx bench` reach the running ones by name, `ftx stop NAME`
    (or ``--all``) calls their ``stop``. Called on every such command: answer from records and one
    query of the scheduler, and return an empty sequence when the scheduler's tools are absent.

    :param home: the ``FTX_HOME`` whose deployments are asked for.
    :returns: :class:`ftx_triton.plan.cluster.ClusterDeployment` objects; an empty sequence is fine.
    """


# ---------------------------------------------------------------------------------------------
# Stages. Each: stops at the first non-None result; core's default runs last.
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def ftx_fetch(ref: SourceRef, revision: str, family: Family, dest: Path, ctx: StageContext) -> Source | None:
    """Materialise the checkpoint named by ``ref`` at ``revision``.

    Stops at the first non-None result. Return None to decline (e.g. a mirror that serves only
    some organisations).

    :param ref: where the checkpoint comes from (local path, ``hf://``, URL).
    :param revision: the resolved revision: a commit (hf), checksum or content fingerprint.
    :param family: the family the checkpoint is for; ``family.fetch_patterns`` lists the
        files it needs.
    :param dest: an empty directory owned by core; write only here. It is published
        atomically when the hook returns.
    :param ctx: stage settings, bound logger, progress display.
    :returns: the Source (its ``path`` may be ``dest`` or, for a local directory, the
        directory itself).

    Default: ``ftx_triton.engine.default_plugins.fetch`` (local directory, Hugging Face Hub, URL), trylast.
    """


@hookspec(firstresult=True)
def ftx_convert(family: Family, source: Source, spec: ModelSpec, dest: Path, ctx: StageContext) -> Checkpoint | None:
    """Write the FasterTransformer checkpoint for ``source`` into ``dest/<tp>-gpu``.

    Stops at the first non-None result. ``ctx.settings.convert`` carries ``tp`` and ``weight_dtype``.

    :param family: the model family (tensor table, config.ini).
    :param source: the fetched checkpoint.
    :param spec: FT hyper-parameters computed by ``family.spec``.
    :param dest: an empty directory owned by core.
    :param ctx: stage settings, bound logger, progress display.
    :returns: the Checkpoint written.

    Default: ``ftx_triton.engine.default_plugins.convert``, which streams ``family.tensors``; trylast.
    """


@hookspec(firstresult=True)
def ftx_tune(family: Family, spec: ModelSpec, dest: Path, ctx: StageContext, runtime: Runtime) -> GemmConfig | None:
    """Produce ``gemm_config.in`` for ``spec`` on the target GPUs.

    Stops at the first non-None result. Weights are deliberately not an input, so every
    fine-tune of one architecture shares the result.

    :param family: the model family (its ``gemm_tool`` and ``gemm_args``).
    :param spec: FT hyper-parameters.
    :param dest: an empty directory owned by core; write ``gemm_config.in`` here.
    :param ctx: stage settings (``ctx.settings.tune``: batch, beam, max input; the data type, tp), logger.
    :param runtime: the chosen runtime; its ``tune`` runs the GEMM tool where it serves.
    :returns: the GemmConfig, untuned (``path=None``) where the runtime needs no tuning or with ``--no-tune``.

    Default: ``ftx_triton.engine.default_plugins.tune`` (``runtime.tune`` when the runtime uses gemm_config.in),
    trylast. The cache key is computed by core from the tune settings, the GEMM shapes and
    ``runtime.tune_key``, whichever plugin tunes.
    """


@hookspec(firstresult=True)
def ftx_configure(
    family: Family,
    spec: ModelSpec,
    source: Source,
    checkpoint: Checkpoint,
    gemm: GemmConfig,
    dest: Path,
    ctx: StageContext,
    runtime: Runtime,
) -> ModelRepository | None:
    """Lay out a Triton model repository in ``dest``.

    Stops at the first non-None result.

    :param family: the model family (Triton model type, I/O kind, tokenizer).
    :param spec: FT hyper-parameters.
    :param source: the fetched checkpoint (its tokenizer files, its origin for the deployment record).
    :param checkpoint: the converted ``<tp>-gpu`` directory the model points at.
    :param gemm: the tuning result to place next to the server.
    :param dest: an empty directory owned by core.
    :param ctx: stage settings (``ctx.settings.configure``: batching, data type, tokenizer), the keys of the
        artifacts built so far, the producing plugins, logger.
    :param runtime: the chosen runtime; its ``write_ft_model`` writes the ``fastertransformer`` model.
    :returns: the ModelRepository.

    Default: ``ftx_triton.engine.default_plugins.configure``, trylast.
    """


@hookspec(firstresult=True)
def ftx_serve(repository: ModelRepository, gemm: GemmConfig, ctx: StageContext, runtime: Runtime) -> Endpoint | None:
    """Start serving ``repository`` and return once it reports ready.

    Stops at the first non-None result. Never cached.

    :param repository: the model repository to serve.
    :param gemm: the tuning result (its ``gemm_config.in`` goes into the server's working dir).
    :param ctx: stage settings (``ctx.settings.serve``: host, ports, detach; ``launch``), logger.
    :param runtime: the runtime the repository was written for.
    :returns: the Endpoint; its ``handle`` stops a local server.

    Default: ``ftx_triton.engine.default_plugins.serve`` (``runtime.serve``), trylast.
    """
