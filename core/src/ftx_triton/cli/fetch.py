"""``ftx pull``: the fetch stage alone (download, verify, publish to the store)."""

from __future__ import annotations

from typing import Any

import click

from ftx_triton.cli.common import FtxCommand
from ftx_triton.cli.options import safety_options, source_options
from ftx_triton.cli.run import run_pipeline, settings_from_options


@click.command(cls=FtxCommand)
@click.argument("model")
@source_options
@safety_options
@click.option("--force", "force", multiple=True, type=click.Choice(["fetch"]), help="Fetch again even if cached.")
def pull(model: str, **opts: Any) -> None:
    """Fetch MODEL (a preset, hf://org/name[@revision], a URL or a path) into the store; print its path."""
    result = run_pipeline(settings_from_options(model, until="fetch", **opts))
    assert result.source is not None
    click.echo(str(result.source.path))


commands = [pull]
