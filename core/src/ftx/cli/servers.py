"""``ftx ps`` and ``ftx stop``: the tritonservers ftx left running (detached)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ftx.cli.common import FtxCommand


def _home() -> Path:
    """FTX_HOME or the user cache dir (imported lazily so `ftx --help` stays fast)."""
    from ftx.paths import ftx_home

    return ftx_home()


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


@click.command("ps", cls=FtxCommand)
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
def ps_command(as_json: bool) -> None:
    """List tritonservers started with --detach (name, pid, ports, repository, state)."""
    from ftx.triton.server import list_servers

    records = list_servers(_home())
    if as_json:
        data = [{**json.loads(r.to_json()), "alive": r.alive, "http_url": r.http_url, "grpc_url": r.grpc_url}
                for r in records]
        click.echo(json.dumps(data, indent=2))
        return
    if not records:
        click.echo("no detached servers")
        return
    rows = [["NAME", "PID", "HTTP", "GRPC", "STATE", "MODELS", "REPOSITORY"]]
    rows += [[r.name, str(r.pid), r.http_url, r.grpc_url, "running" if r.alive else "dead",
              ",".join(r.models) or "-", r.repository] for r in records]
    click.echo(_table(rows))


@click.command("stop", cls=FtxCommand)
@click.argument("name", required=False)
@click.option("--all", "all_servers", is_flag=True, help="Stop every detached server.")
def stop_command(name: str | None, all_servers: bool) -> None:
    """Stop a detached tritonserver (NAME, the only one running, or --all)."""
    from ftx.triton.server import stop_server

    if name and all_servers:
        raise click.UsageError("give a NAME or --all, not both")
    handled = stop_server(_home(), name, all_servers=all_servers)
    if not handled:
        click.echo("no detached servers")
    for record in handled:
        if record.alive:
            click.echo(f"stopped {record.name} (pid {record.pid})")
        else:
            click.echo(f"removed record of {record.name} (pid {record.pid} was no longer running)")


commands: list[click.Command] = [ps_command, stop_command]
