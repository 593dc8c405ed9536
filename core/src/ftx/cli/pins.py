"""``ftx lock``: pin the installed plugin versions and the resolved model source into ftx.toml."""

from __future__ import annotations

from pathlib import Path

import click

from ftx.cli.common import FtxCommand, get_host, say
from ftx.settings import RunSettings
from ftx.sources import resolve_source
from ftx.manifest import MANIFEST_NAME, write_lock
from ftx.plugins import installed_distributions


@click.command(cls=FtxCommand)
@click.argument("model")
@click.option("--revision", help="Branch, tag or commit to resolve (Hugging Face sources).")
@click.option("--family", help="Model family, if it cannot be detected.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path(MANIFEST_NAME),
              show_default=True, help="The deployment file to write.")
def lock(model: str, revision: str | None, family: str | None, output: Path) -> None:
    """Write ftx.toml: exact versions of ftx and every plugin, and MODEL resolved to a commit."""
    from ftx.fetching.refs import resolve_revision

    host = get_host()
    ref, preset_family = resolve_source(RunSettings.of(model, revision=revision, family=family), host)
    resolved = resolve_revision(ref)
    loaded = {r.distribution for r in host.records if r.status == "loaded"} | {"ftx"}
    requires = [f"{name}=={version}" for name, version in installed_distributions() if name in loaded]
    source = ref.uri if ref.kind != "local" else ref.uri
    write_lock(output, requires, {"source": source, "revision": resolved if ref.kind == "hf" else None,
                                  "family": family or preset_family, "preset": ref.preset})
    say(f"pinned {len(requires)} distributions and {ref.display} -> {resolved}")
    click.echo(str(output))


commands = [lock]
