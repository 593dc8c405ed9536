"""``ftx plugin new``: start a family plugin from the template that ships with ftx."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from ftx_triton.cli.common import FtxGroup, get_host, say
from ftx_triton.cli.options import CPU_TORCH


@click.group("plugin", cls=FtxGroup)
def plugin() -> None:
    """Write family plugins (see also `ftx plugins` for the installed ones)."""


@plugin.command("new")
@click.argument("slug")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the project [default: ./ftx-triton-SLUG].",
)
def new_command(slug: str, directory: Path | None) -> None:
    """Write a new family plugin project named SLUG (a GPT-2 family to adapt); print its path."""
    from ftx_triton.cli.scaffold import check_slug, new_plugin

    check_slug(slug, set(get_host().families))
    dest = (directory or Path.cwd() / f"ftx-triton-{slug}").absolute()
    dest, caveats = new_plugin(slug, dest)
    say(f"plugin    ftx-triton-{slug} written: package ftx_{slug}, entry point {slug!r}, family {slug!r}")
    for caveat in caveats:
        say(f"  note: {caveat}")
    say(f"next      {next_step(dest)}")
    click.echo(str(dest))


def next_step(dest: Path) -> str:
    """The commands that install the new plugin with its test extra (pytest and the kit's dependencies: torch,
    transformers) and run the conformance kit; torch's CPU build first (the default wheel is the CUDA one,
    several GB, that the kit does not need)."""
    return (
        f"{CPU_TORCH} && pip install -e {shlex.quote(f'{dest}[test]')} && pytest {shlex.quote(str(dest / 'tests'))}"
        "   (torch's CPU build first; the test extra brings pytest and transformers for the conformance kit)"
    )


commands: list[click.Command] = [plugin]
