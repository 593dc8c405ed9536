"""``ftx ps`` and ``ftx stop``: the tritonservers ftx left running (detached)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ftx_triton.cli.common import FtxCommand, say


def _home() -> Path:
    """FTX_HOME or the user cache dir (imported lazily so `ftx --help` stays fast)."""
    from ftx_triton.paths import ftx_home

    return ftx_home()


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


@click.command("ps", cls=FtxCommand)
@click.option("--json", "as_json", is_flag=True, help="Print the servers as JSON.")
def ps_command(as_json: bool) -> None:
    """List running tritonservers: name, model, runtime, device, memory, uptime and endpoints.

    Every tritonserver on this machine is listed (foreground, detached or in a container); a
    detached one has its name (`ftx stop NAME`). Records of detached servers that died are shown too.
    """
    from ftx_triton.cli.clusters import cluster_deployments
    from ftx_triton.plan.resources import human_bytes
    from ftx_triton.server.processes import served_models
    from ftx_triton.server.records import list_servers
    from ftx_triton.server.server_log import last_exit_cause

    records = list_servers(_home())  # read once: a malformed record is reported once
    served = served_models(_home(), records)
    dead = [r for r in records if not r.alive]
    clusters = cluster_deployments(_home())
    if as_json:
        data = [{**s.as_dict(), "alive": True} for s in served] + [d.as_dict() for d in clusters]
        data += [
            {
                "name": r.name,
                "pid": r.pid,
                "alive": False,
                "repository": r.repository,
                "cause": last_exit_cause(Path(r.log_path)) if r.log_path else None,
            }
            for r in dead
        ]
        click.echo(json.dumps(data, indent=2))
        return
    if not served and not dead and not clusters:
        say("no tritonserver is running")
        return
    rows = [["NAME", "STATE", "MODEL", "RUNTIME", "DEVICE", "MEMORY", "UPTIME", "HTTP", "OPENAI", "PID"]]
    rows += [
        [
            s.name,
            "running",
            s.model,
            s.runtime,
            s.device,
            human_bytes(s.memory_bytes),
            _uptime(s.uptime_s),
            f"http://{s.http}",
            s.openai or "-",
            str(s.pid),
        ]
        for s in served
    ]
    rows += [[r.name, "dead", "-", "-", "-", "-", "-", "-", "-", str(r.pid)] for r in dead]
    rows += [
        [
            d.name,
            d.state,
            d.model,
            d.runtime,
            d.where,
            "-",
            "-",
            f"http://{d.http}" if d.http else "-",
            d.openai or "-",
            "-",
        ]
        for d in clusters
    ]
    click.echo(_table(rows))
    for deployment in clusters:
        if deployment.cause:
            say(f"{deployment.name} ({deployment.where}): {deployment.cause}")
    for record in dead:
        cause = last_exit_cause(Path(record.log_path)) if record.log_path else None
        if cause:
            say(f"{record.name} stopped by itself: {cause} (log: {record.log_path})")
    if dead:
        say("dead servers' records are removed by `ftx stop NAME` (or `ftx stop --all`)")


def _uptime(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


@click.command("stop", cls=FtxCommand)
@click.argument("name", required=False)
@click.option("--all", "all_servers", is_flag=True, help="Stop every detached server.")
def stop_command(name: str | None, all_servers: bool) -> None:
    """Stop a detached tritonserver (NAME, the only one running, or --all), or a deployment on a cluster
    (NAME as `ftx ps` lists it: its job is cancelled and its records removed).

    Malformed records (`ftx ps` warns about them) are removed by NAME (their file's) or --all.
    """
    if name and all_servers:
        raise click.UsageError("give a NAME or --all, not both")
    from ftx_triton.cli.clusters import cluster_deployments
    from ftx_triton.server.front_records import FOREGROUND_PREFIX, read_records, remove_malformed_fronts, stop_record
    from ftx_triton.server.records import remove_malformed_servers, stop_server

    removed = (
        remove_malformed_servers(_home(), name) + remove_malformed_fronts(_home(), name) if name or all_servers else []
    )
    clusters = [d for d in cluster_deployments(_home()) if all_servers or (name is not None and d.name == name)]
    for deployment in clusters:  # ended on its cluster, records removed
        click.echo(deployment.stop())
    if clusters and not all_servers:
        return
    handled = stop_server(_home(), name, all_servers=all_servers, missing_ok=bool(removed) or bool(clusters))
    names = {r.name for r in handled} | ({name} if name else set())
    for front in read_records(_home()):
        if front["name"] in names or all_servers and not front["name"].startswith(FOREGROUND_PREFIX):
            stop_record(front)
    for bad in removed:
        click.echo(f"removed malformed record {bad.path} ({bad.problem})")
    if not handled and not removed and not clusters:
        click.echo("no detached servers")
    for record in handled:
        if record.alive:
            click.echo(f"stopped {record.name} (pid {record.pid})")
        else:
            click.echo(f"removed record of {record.name} (pid {record.pid} was no longer running)")


commands: list[click.Command] = [ps_command, stop_command]
