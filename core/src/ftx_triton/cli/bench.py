"""``ftx bench``: load a running deployment and store the figures beside its deployment record."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ftx_triton.cli.common import FtxCommand, say
from ftx_triton.errors import ServeError


def _concurrency(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 or c > 1024 for c in levels):
        raise click.BadParameter("a comma-separated list of 1..1024, e.g. 1,2,4", param_hint="--concurrency")
    return levels


def _target(name: str | None, url: str | None):  # -> ServedModel
    from ftx_triton.cli.clusters import running_as_served
    from ftx_triton.paths import ftx_home
    from ftx_triton.server.processes import served_models

    served = served_models(ftx_home()) + running_as_served(ftx_home())
    if url:
        wanted = url.removeprefix("http://").rstrip("/")
        match = [s for s in served if s.http == wanted]
        if not match:
            raise ServeError(
                f"no ftx server of this FTX_HOME serves {url}",
                hint="`ftx ps` lists them; start one with `ftx run MODEL --detach`",
            )
        return match[0]
    chosen = [s for s in served if name is None or s.name == name or s.model == name]
    if len(chosen) == 1:
        return chosen[0]
    if not chosen:
        raise ServeError(
            "no running ftx server" + (f" named {name!r}" if name else ""),
            hint="start one with `ftx run MODEL --detach` (`ftx ps` lists them)",
        )
    raise ServeError(
        f"{len(chosen)} servers are running ({', '.join(s.name for s in chosen)}); which one?",
        hint="name one (NAME from `ftx ps`) or pass --url http://HOST:PORT",
    )


@click.command("bench", cls=FtxCommand)
@click.argument("name", required=False)
@click.option("--url", help="Triton's HTTP address of the deployment (default: the one running, see `ftx ps`).")
@click.option(
    "--tool",
    type=click.Choice(["auto", "perf_analyzer", "builtin"]),
    default="auto",
    show_default=True,
    help="perf_analyzer (Triton's tool, when installed) or ftx's own load generator; auto prefers perf_analyzer.",
)
@click.option("--concurrency", default="1,2,4", show_default=True, help="Concurrent clients, one run per level.")
@click.option(
    "--requests",
    type=click.IntRange(1, 100000),
    default=20,
    show_default=True,
    help="Requests measured per concurrency level.",
)
@click.option("--prompt", default="Once upon a time", show_default=True, help="The prompt every request sends.")
@click.option(
    "--max-tokens", type=click.IntRange(1, 4096), default=16, show_default=True, help="Tokens each request generates."
)
@click.option(
    "--via",
    type=click.Choice(["triton", "openai"]),
    default="triton",
    show_default=True,
    help="Load the ensemble over Triton's generate extension, or the OpenAI endpoint (streamed completions, "
    "with its own token metrics per level: time to first token, inter-token latency, rejections).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench(
    name: str | None,
    url: str | None,
    tool: str,
    concurrency: str,
    requests: int,
    prompt: str,
    max_tokens: int,
    via: str,
    as_json: bool,
) -> None:
    """Measure a running deployment's throughput and latency through its ensemble.

    The figures are appended, with the tool that measured them, to FTX_HOME/bench/<repository>.json:
    beside the store, never inside its verified artifacts.
    """
    from ftx_triton.paths import ftx_home
    from ftx_triton.server.bench import BenchResult, bench_load, store_result

    levels = _concurrency(concurrency)
    target = _target(name, url)
    load = bench_load(target, tool, via)
    result = BenchResult(load.tool, load.why, target.model, load.url, prompt, max_tokens)
    say(f"bench     {target.name} ({target.model}) {load.said}: {load.why}")
    result.points = load.run(target, prompt, max_tokens, levels, requests)
    stored = store_result(ftx_home(), Path(target.repository), result)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        rows = [[header for header, _ in load.columns]]
        rows += [[cell(p) for _, cell in load.columns] for p in result.points]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            click.echo("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    say(f"stored in {stored}")


commands = [bench]
