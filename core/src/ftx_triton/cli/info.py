"""``ftx models`` and ``ftx plugins``: what is installed."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from ftx_triton.cli.common import FtxCommand, get_host, say

if TYPE_CHECKING:
    from ftx_triton.plugins import PluginHost


@click.command(cls=FtxCommand)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def models(as_json: bool) -> None:
    """List model families and presets."""
    from rich.table import Table

    from ftx_triton.terminal.console import results_console

    host = get_host()
    rows: list[dict[str, Any]] = []
    for family in sorted(host.families.values(), key=lambda f: f.name):
        rows.append(
            {
                "family": family.name,
                "title": family.title,
                "distribution": host.family_owner.get(family.name),
                "model_type": family.triton_model_type,
                "hf_model_types": list(family.hf_model_types),
                "presets": {
                    name: {"source": p.source, "revision": p.revision, "license": p.license}
                    for name, p in family.presets.items()
                },
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("family", "model type", "presets", "distribution", title="ftx models")
    for row in rows:
        presets = "\n".join(
            f"{n} → {p['source']}{'@' + p['revision'] if p['revision'] else ''}" for n, p in row["presets"].items()
        )
        table.add_row(row["family"], row["model_type"], presets or "-", row["distribution"] or "-")
    results_console().print(table)


@click.command(cls=FtxCommand)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--freeze", is_flag=True, help="Print name==version lines to pin this plugin set.")
@click.option(
    "--check",
    is_flag=True,
    help="For CI: no table; exit 1 naming each plugin that fails to load, else say how many loaded.",
)
def plugins(as_json: bool, freeze: bool, check: bool) -> None:
    """List plugins: distribution, version, hooks, families, and any load error (exit 1 if one failed to load)."""
    from rich.table import Table

    from ftx_triton.terminal.console import results_console, warn

    host = get_host(warn_broken=False)  # said here, once
    host.collect_families()  # each record lists its families
    records = host.records
    if check:
        _check(host)
        return
    if freeze:
        from ftx_triton.plugins import installed_distributions

        for name, version in installed_distributions():
            click.echo(f"{name}=={version}")
        return
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in records], indent=2))
    else:
        table = Table("name", "distribution", "version", "hooks", "families", "runtimes", "status", title="ftx plugins")
        for r in records:
            status = r.status if not r.error else f"[red]{r.status}: {r.error}[/red]"
            table.add_row(
                r.name,
                r.distribution,
                r.version,
                ", ".join(r.hooks) or "-",
                ", ".join(r.families) or "-",
                ", ".join(r.runtimes) or "-",
                status,
            )
        console = results_console()
        console.print(table)
        runtimes = Table("runtime", "--runtime", "priority", "from", "what", title="runtimes")
        for name, runtime in sorted(host.runtimes.items(), key=lambda item: -item[1].priority):
            runtimes.add_row(
                name,
                ", ".join((name, *runtime.selects_as)),
                str(runtime.priority),
                host.runtime_owner.get(name, "?"),
                runtime.description or "-",
            )
        console.print(runtimes)
    if host.broken:
        for record in host.broken:
            warn(f"plugin {record.name} ({record.distribution}) failed to load: {record.error}")
        raise SystemExit(1)


def _check(host: PluginHost) -> None:
    """``ftx plugins --check``: one error naming every plugin that failed to load, or one line of what loaded."""
    from ftx_triton.errors import PluginError

    if host.broken:
        raise PluginError(
            "; ".join(f"plugin {r.name} ({r.distribution} {r.version}) failed to load: {r.error}" for r in host.broken),
            hint="fix the import error (run `python -c 'import MODULE'` in this environment to see it whole), or "
            "disable the plugin with FTX_DISABLE_PLUGINS",
        )
    loaded = [r for r in host.records if r.status == "loaded"]
    say(f"{len(loaded)} plugins loaded: {', '.join(r.name for r in loaded)}; {len(host.families)} families")


commands = [models, plugins]
