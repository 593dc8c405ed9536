"""``ftx ls``, ``ftx rm`` and ``ftx prune``: what the artifact store holds, and freeing it."""

from __future__ import annotations

import json
import time

import click

from ftx_triton.cli.common import FtxCommand, command_store, say
from ftx_triton.errors import ConfigError


def _age(seconds: float) -> str:
    seconds = max(seconds, 0.0)  # a clock set back, or a time written in the future
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _table(entries: list) -> None:  # list[StoreEntry]
    from rich.table import Table

    from ftx_triton.plan.resources import human_bytes
    from ftx_triton.terminal.console import results_console

    now = time.time()
    table = Table("STAGE", "KEY", "SIZE", "USED", "SOURCE", "", box=None, pad_edge=False)
    for e in entries:
        table.add_row(
            e.stage,
            e.key[:12],
            human_bytes(e.size),
            f"{_age(now - e.last_used)} ago",
            e.source,
            "in use" if e.in_use else "",
        )
    results_console().print(table)


@click.command("ls", cls=FtxCommand)
@click.option("--stage", type=click.Choice(["fetch", "convert", "tune", "configure"]), help="Only this stage.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def ls_command(stage: str | None, as_json: bool) -> None:
    """List the artifacts in the store: stage, key, size, source, last use, and whether a server or an ftx command uses it."""
    from ftx_triton.plan.resources import human_bytes
    from ftx_triton.store.housekeeping import inventory

    store = command_store()
    entries = [e for e in inventory(store) if stage is None or e.stage == stage]
    if as_json:
        click.echo(json.dumps([e.as_dict() for e in entries], indent=2))
        return
    if not entries:
        say(f"the store at {store.root} is empty")
        return
    _table(entries)
    say(f"{len(entries)} artifacts, {human_bytes(sum(e.size for e in entries))} in {store.root}")


def _remove(
    store,
    chosen: list,
    dry_run: bool,
    *,
    skip_busy: bool = False,  # StoreEntry list
    summary: bool = True,
) -> None:
    """Remove ``chosen``; with ``skip_busy`` an artifact a running ftx took up since the listing is kept."""
    from ftx_triton.plan.resources import human_bytes
    from ftx_triton.store.housekeeping import ArtifactInUse, remove_entry

    freed = 0
    removed = 0
    for entry in chosen:
        if dry_run:
            say(f"would remove {entry.ref} ({human_bytes(entry.size)}, {entry.source})")
            continue
        try:
            freed += remove_entry(store, entry)
        except ArtifactInUse:
            if not skip_busy:
                raise
            say(f"kept {entry.ref}: another running ftx process uses or builds it")
            continue
        removed += 1
        click.echo(entry.ref)
    if not summary:
        return
    verb = "would free" if dry_run else "freed"
    count = len(chosen) if dry_run else removed
    say(f"{verb} {human_bytes(sum(e.size for e in chosen) if dry_run else freed)} ({count} artifacts)")


@click.command("rm", cls=FtxCommand)
@click.argument("artifacts", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True, help="Say what would be removed, remove nothing.")
def rm_command(artifacts: tuple[str, ...], dry_run: bool) -> None:
    """Remove ARTIFACTS from the store: a model by its SOURCE (`ftx rm tiny-gptj`: its fetch, conversions and
    repositories), keys (4+ characters), STAGE/KEY or paths, as `ftx ls` shows them.

    Repositories built on a removed checkpoint or GEMM config are removed with it (they point at
    it); an artifact a running server uses is refused.
    """
    from ftx_triton.store.housekeeping import dependents, find, inventory

    store = command_store()
    entries = inventory(store)
    chosen = []
    for text in artifacts:
        found = find(entries, text)
        if not found:
            raise ConfigError(f"no artifact {text!r} in the store", hint="`ftx ls` lists them")
        chosen += [e for e in found if e not in chosen]
    follow = dependents(chosen, entries)
    for entry in follow:
        say(f"{entry.ref} is a repository built on it: removed too")
    chosen += follow
    busy = [e for e in chosen if e.in_use]
    if busy:
        raise ConfigError(
            f"{', '.join(e.ref for e in busy)} is in use by a running server or ftx process",
            hint="stop the server first (`ftx ps`, `ftx stop`), or let the ftx command finish",
        )
    _remove(store, chosen, dry_run)


@click.command("prune", cls=FtxCommand)
@click.option("--unused", is_flag=True, help="Artifacts nothing else builds on and no running server uses.")
@click.option("--older-than", help="Artifacts not used for this long, e.g. 30d, 12h, 2w.")
@click.option("--to-size", help="Remove least recently used artifacts until the store is at most this size, e.g. 50GB.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed, remove nothing.")
def prune_command(unused: bool, older_than: str | None, to_size: str | None, dry_run: bool) -> None:
    """Free the store: leftovers of killed builds and old downloads always, old server logs beyond the
    newest 20, and the artifacts chosen by --unused, --older-than or --to-size.

    Never removes what a running server or ftx command uses; a repository whose checkpoint goes goes with it.
    """
    from ftx_triton.plan.resources import human_bytes
    from ftx_triton.store.housekeeping import (
        inventory,
        leftovers,
        parse_age,
        parse_size,
        prune_selection,
        remove_path,
        rotate_logs,
    )

    store = command_store()
    age = parse_age(older_than) if older_than is not None else None
    limit = parse_size(to_size) if to_size is not None else None
    for path in leftovers(store):
        if dry_run:
            say(f"would remove leftover {path}")
        else:
            say(f"removed leftover {path} ({human_bytes(remove_path(path))})")
    if not dry_run:
        for old in rotate_logs(store.home):
            say(f"removed old server log {old.name}")
    entries = inventory(store)
    damaged = [e for e in entries if e.damaged and not e.in_use]  # never used again: a lookup rebuilds them
    for entry in damaged if not dry_run else ():  # a dry run names them with their source, "damaged: …"
        say(f"removing damaged {entry.ref} ({human_bytes(entry.size)}): its provenance is missing or unreadable")
    _remove(store, damaged, dry_run, skip_busy=True, summary=False)
    if not (unused or age is not None or limit is not None):
        say("no artifacts selected (use --unused, --older-than or --to-size)")
        return
    sound = [e for e in entries if not e.damaged]
    _remove(store, prune_selection(sound, unused=unused, older_than_s=age, to_size=limit), dry_run, skip_busy=True)


commands = [ls_command, rm_command, prune_command]
