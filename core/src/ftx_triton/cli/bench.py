"""``ftx bench``: load a running deployment and store the figures beside its deployment record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, say
from ftx_triton.errors import ConfigError, ServeError
from ftx_triton.repository.io import TEXT_MODEL_NAME


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
    from ftx_triton.cli.processes import served_models
    from ftx_triton.paths import ftx_home

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
    from ftx_triton.server.bench import BenchResult, builtin_load, find_perf_analyzer, run_perf_analyzer, store_result

    levels = _concurrency(concurrency)
    target = _target(name, url)
    if via == "openai":
        _bench_openai(target, tool, levels, requests, prompt, max_tokens, as_json)
        return
    binary = find_perf_analyzer()
    if tool == "perf_analyzer" and binary is None:
        raise ConfigError(
            "perf_analyzer is not installed",
            hint="scripts/setup.sh --dev installs it beside the venv, or set FTX_PERF_ANALYZER=PATH; "
            "--tool builtin uses ftx's own load generator",
        )
    use_pa = binary is not None and tool in ("auto", "perf_analyzer")
    why = (
        f"perf_analyzer at {binary}"
        if use_pa
        else "requested with --tool builtin"
        if tool == "builtin"
        else "perf_analyzer is not installed (no binary on PATH or FTX_PERF_ANALYZER); ftx's own closed-loop "
        "load generator over the generate extension"
    )
    result = BenchResult(
        "perf_analyzer" if use_pa else "builtin", why, target.model, f"http://{target.http}", prompt, max_tokens
    )
    say(f"bench     {target.name} ({target.model}) with {result.tool}: {why}")
    if use_pa and binary is not None:
        from ftx_triton.server.text_client import HttpTriton, text_interface

        streaming = text_interface(HttpTriton(f"http://{target.http}"), TEXT_MODEL_NAME).decoupled
        result.points = run_perf_analyzer(
            binary, target.grpc, TEXT_MODEL_NAME, prompt, max_tokens, levels, requests, streaming=streaming
        )
    else:
        from ftx_triton.repository.textproc import load_codec

        codec = load_codec(Path(target.repository) / "preprocessing" / "1")
        result.points = builtin_load(
            f"http://{target.http}",
            TEXT_MODEL_NAME,
            prompt,
            max_tokens,
            levels,
            requests,
            count_tokens=lambda text: len(codec.encode(text, prompt=False)),
        )
    stored = store_result(ftx_home(), Path(target.repository), result)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        rows = [["CONCURRENCY", "REQ/S", "P50 MS", "P90 MS", "P99 MS", "TOKENS/S"]]
        rows += [
            [
                str(p.concurrency),
                f"{p.throughput_rps:.2f}",
                f"{p.latency_p50_ms:.1f}",
                f"{p.latency_p90_ms:.1f}",
                f"{p.latency_p99_ms:.1f}",
                f"{p.tokens_per_s:.1f}" if p.tokens_per_s else "-",
            ]
            for p in result.points
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            click.echo("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    say(f"stored in {stored}")


def _bench_openai(
    target: Any, tool: str, levels: list[int], requests: int, prompt: str, max_tokens: int, as_json: bool
) -> None:
    """``--via openai``: ftx's load generator through the OpenAI endpoint, and the endpoint's metrics per level."""
    from ftx_triton.paths import ftx_home
    from ftx_triton.repository.textproc import load_codec
    from ftx_triton.server.bench import BenchResult, openai_load, store_result

    if tool == "perf_analyzer":
        raise ConfigError(
            "perf_analyzer has no OpenAI service kind", hint="leave --tool out (or --tool builtin) with --via openai"
        )
    if not target.openai:
        raise ServeError(
            f"{target.name} has no OpenAI endpoint (started with --no-openai?)",
            hint="restart it without --no-openai, or bench it with --via triton",
        )
    why = "ftx's own closed-loop load generator through the OpenAI endpoint (--via openai)"
    result = BenchResult("builtin", why, target.model, target.openai, prompt, max_tokens)
    say(f"bench     {target.name} ({target.model}) through {target.openai}: {why}")
    codec = load_codec(Path(target.repository) / "preprocessing" / "1")
    result.points = openai_load(
        target.openai,
        target.model,
        prompt,
        max_tokens,
        levels,
        requests,
        count_tokens=lambda text: len(codec.encode(text, prompt=False)),
    )
    stored = store_result(ftx_home(), Path(target.repository), result)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        rows = [["CONCURRENCY", "REQ/S", "P50 MS", "TOKENS/S", "TTFT MS", "ITL MS", "REJECTED"]]
        for p in result.points:
            front = p.front or {}
            rows.append(
                [
                    str(p.concurrency),
                    f"{p.throughput_rps:.2f}",
                    f"{p.latency_p50_ms:.1f}",
                    f"{front.get('output_tokens_per_s') or 0:.1f}",
                    _ms(front.get("ttft_avg_ms")),
                    _ms(front.get("itl_avg_ms")),
                    str(front.get("rejected", 0)),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            click.echo("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    say(f"stored in {stored}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


commands = [bench]
