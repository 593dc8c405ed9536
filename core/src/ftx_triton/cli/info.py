"""``ftx models`` and ``ftx plugins``: what is installed."""

from __future__ import annotations

import json
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, get_host


@click.command(cls=FtxCommand)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def models(as_json: bool) -> None:
    """List model families and presets."""
    from rich.console import Console
    from rich.table import Table

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
    Console().print(table)


@click.command(cls=FtxCommand)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--freeze", is_flag=True, help="Print name==version lines to pin this plugin set.")
def plugins(as_json: bool, freeze: bool) -> None:
    """List plugins: distribution, version, hooks, families, and any load error."""
    from rich.console import Console
    from rich.table import Table

    host = get_host()
    host.collect_families()  # each record lists its families
    records = host.records
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
        console = Console()
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
        raise SystemExit(1)


commands = [models, plugins]
