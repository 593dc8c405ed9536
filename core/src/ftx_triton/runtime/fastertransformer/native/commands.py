"""``ftx backend build|preflight``: the natively built FasterTransformer backend (the native launcher's commands,
registered through ``ftx_register_commands``)."""

from __future__ import annotations

from pathlib import Path

import click

from ftx_triton import hookimpl
from ftx_triton.commandkit import FtxGroup, command_store, say

SM_HELP = "GPU architectures to build for, e.g. 90 or 80,90 (default: this machine's GPUs)."
SOURCES_HELP = (
    "Upstream sources as a directory or archive in ftx's source layout, for machines without network "
    "(default: download the pinned public archives)."
)


@click.group("backend", cls=FtxGroup)
def backend() -> None:
    """Build FasterTransformer and its Triton backend from pinned sources (the native runtime)."""


@backend.command("preflight")
@click.option("--sm", default=None, help=SM_HELP)
def preflight_command(sm: str | None) -> None:
    """Check the host for everything the build and the runtime need; exit 1 listing what is missing."""
    from ftx_triton.runtime.fastertransformer.native.toolchain import preflight

    result = preflight(sm, need_gpu=sm is None)
    for check in result.checks:
        click.echo(f"{'ok ' if check.ok else 'MISSING'}  {check.name:<15} {check.detail}")
    result.raise_for_failures()


@backend.command("build")
# FTX_FT_*: the same variables the fastertransformer-native runtime reads when `ftx run` builds the backend
@click.option("--sm", default=None, envvar=["FTX_BACKEND_BUILD_SM", "FTX_FT_SM"], help=SM_HELP)
@click.option(
    "--sources",
    type=click.Path(exists=True, path_type=Path),
    envvar=["FTX_BACKEND_BUILD_SOURCES", "FTX_FT_SOURCES"],
    help=SOURCES_HELP,
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(1, 1024),
    envvar=["FTX_BACKEND_BUILD_JOBS", "FTX_FT_JOBS"],
    help="Parallel compile jobs [default: CPU count].",
)
@click.option("--force", is_flag=True, help="Build again even if a build for this toolchain and SM list exists.")
def build_command(sm: str | None, sources: Path | None, jobs: int | None, force: bool) -> None:
    """Build (or find) the backend for this toolchain and SM list; print the artifact's path."""
    from ftx_triton.runtime.fastertransformer.native.options import backend_for

    built = backend_for(command_store(), sm=sm, sources=sources, jobs=jobs, force=force, need_gpu=sm is None, say=say)
    say(f"backend   {'cached' if built.cached else 'built'}: SM {','.join(map(str, built.sm))}, key {built.key}")
    click.echo(str(built.path))


@hookimpl
def ftx_register_commands(cli: click.Group) -> None:
    """The native launcher's tools: ``ftx backend build|preflight``."""
    cli.add_command(backend)
