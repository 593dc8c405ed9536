#!/usr/bin/env python
"""Where a burst of requests spreads before it reaches the ``fastertransformer`` model (issue 38), from Triton's trace.

Triton's dynamic batcher holds a batch's first request ``--batch-delay-us`` for others; requests sent together
that reach the model further apart than that are split into two batches, and a closed loop's two groups then take
turns for good. This benchmark finds where a burst spreads. It serves a configured repository (python runtime,
ftx's supervisor and fronts as ``ftx run`` starts them) with Triton's TIMESTAMPS trace on every request and the
OpenAI endpoint beside it, runs ``c`` closed-loop clients per path and level (``bench_serving``'s paths), stops the
server (Triton writes the trace as it shuts down) and reports for each level's first round (the ``c`` requests the
clients send at once):

* ``sent``: from the first to the last client's send (the load generator's own spread);
* ``entry``: from the first to the last reaching tritonserver (the ``text`` ensemble's request, or the
  ``fastertransformer`` request itself on the token route and the raw loop): the clients plus the fronts in between
  (the HTTP shield; the OpenAI endpoint, which tokenizes);
* ``at model``: from the first to the last reaching the ``fastertransformer`` model's queue: the above plus the
  ``preprocessing`` model of the ensemble, whose executions for that round are listed (requests each, and from the
  first execution's start to the last's end);
* after each execution that held every client, the spread of their next requests at the model's queue (a merged
  round that stays within the delay stays merged);
* the model's ``batch x executions`` over the whole level (Triton's statistics);
* the median latency, and for the ``openai`` path the OpenAI endpoint process's CPU time per request (user +
  system, every thread): what the endpoint itself costs, which a closed loop of ``c`` clients pays ``c`` times a
  round on its one event loop.

Triton's timestamps are the steady clock, which is Python's ``time.monotonic_ns`` on Linux. Make the repository with
``ftx configure`` (the deployment options under test), then::

    python benchmarks/bench_burst_spread.py --repository REPO --concurrency 16,32 --paths text,openai,raw-loop

``--standin-ms N`` serves a copy of the repository whose ``fastertransformer`` model is the python runtime's STAND-IN
(``ftx_triton.runtime.python.standin``): N ms of wall time per execution whatever the batch and no CPU, as a GPU's
generation, so that the batcher's steady state shows on a machine without one (docs/benchmarks.md, issue 38).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_serving import (  # noqa: E402
    DEFAULT_PROMPT,
    OpenAIPath,
    RawLoopPath,
    RawRoutePath,
    Target,
    TextPath,
    Tokens,
    closed_loop,
    model_costs,
    model_vocab,
    openai_model_id,
    percentile,
    triton_counters,
)

FT = "fastertransformer"


def traced_server(repository: Path, home: Path, trace_file: Path, device: str) -> Any:
    """tritonserver on ``repository`` as the python runtime serves it, tracing every request's timestamps."""
    from ftx_triton.runtime.python.triton_model import DEVICE_ENV
    from ftx_triton.server.tritonserver import TritonServer

    class Traced(TritonServer):
        def command(self, backends: Path, binary: Path, repository: Path | None = None) -> list[str]:
            flags = [f"triton,file={trace_file}", "level=TIMESTAMPS", "rate=1", "count=-1"]
            return super().command(backends, binary, repository) + [
                arg for flag in flags for arg in ("--trace-config", flag)
            ]

    return Traced(repository, home=home, env={DEVICE_ENV: device}, name="burst-spread", ready_timeout_s=900)


def read_trace(path: Path) -> list[dict[str, Any]]:
    """Triton's trace file as one record per request: id, parent_id, model and {timestamp name: ns}."""
    records: dict[int, dict[str, Any]] = defaultdict(lambda: {"times": {}})
    for entry in json.loads(path.read_text() or "[]"):
        record = records[int(entry["id"])]
        record["id"] = int(entry["id"])
        for key in ("model_name", "parent_id"):
            if key in entry:
                record[key] = entry[key]
        for stamp in entry.get("timestamps", ()):
            record["times"].setdefault(stamp["name"], int(stamp["ns"]))
    return [r for r in records.values() if "model_name" in r]


def first_round(
    records: list[dict[str, Any]], window: tuple[int, int], sends: list[int], c: int, path: str
) -> dict[str, Any]:
    """The spreads of the first ``c`` requests of a level (milliseconds) and the preprocessing executions for them."""
    inside = [r for r in records if window[0] <= r["times"].get("REQUEST_START", 0) <= window[1]]
    top = "text" if path == "text" else FT
    entries = sorted((r for r in inside if r["model_name"] == top and "parent_id" not in r), key=_start)[:c]
    ids = {r["id"] for r in entries}
    children = [r for r in inside if r.get("parent_id") in ids]
    models = entries if top == FT else [r for r in children if r["model_name"] == FT]
    pre = [r for r in children if r["model_name"] == "preprocessing"]
    executions: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in pre:
        executions[r["times"].get("COMPUTE_START", 0)].append(r)
    out: dict[str, Any] = {
        "sent_ms": _spread(sorted(sends)[:c]),
        "entry_ms": _spread([_start(r) for r in entries]),
        "model_ms": _spread([r["times"].get("QUEUE_START", _start(r)) for r in models]),
        "requests": len(entries),
    }
    if pre:
        out["preprocessing"] = [len(group) for _start_ns, group in sorted(executions.items())]
        ends = [r["times"].get("COMPUTE_END", 0) for r in pre]
        out["preprocessing_ms"] = (max(ends) - min(executions)) / 1e6
    return out


def returns(records: list[dict[str, Any]], window: tuple[int, int], c: int, path: str) -> list[float]:
    """After each execution of the model that held all ``c`` clients, the spread (ms) of their next ``c`` requests
    at the model's queue: whether a merged round stays merged."""
    inside = [r for r in records if window[0] <= r["times"].get("REQUEST_START", 0) <= window[1]]
    if path == "text":
        ids = {r["id"] for r in inside if r["model_name"] == "text" and "parent_id" not in r}
        models = [r for r in inside if r["model_name"] == FT and r.get("parent_id") in ids]
    else:
        models = [r for r in inside if r["model_name"] == FT and "parent_id" not in r]
    executions: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in models:
        executions[r["times"].get("COMPUTE_START", 0)].append(r)
    arrivals = sorted(r["times"].get("QUEUE_START", 0) for r in models)
    spreads = []
    for group in executions.values():
        if len(group) != c:
            continue
        end = max(r["times"].get("COMPUTE_END", 0) for r in group)
        following = [t for t in arrivals if t > end][:c]
        if len(following) == c:
            spreads.append(_spread(following))
    return spreads


def _start(record: dict[str, Any]) -> int:
    return int(record["times"].get("REQUEST_START", 0))


def _spread(stamps: Sequence[int]) -> float:
    return (max(stamps) - min(stamps)) / 1e6 if stamps else 0.0


class Sending:
    """A path that remembers when each request was sent (the steady clock, as Triton's trace)."""

    def __init__(self, path: Any) -> None:
        self.path, self.name, self.sends = path, path.name, list[int]()

    async def __call__(self, session: Any) -> Any:
        self.sends.append(time.monotonic_ns())
        return await self.path(session)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds process ``pid`` has used so far (0 without one)."""
    import psutil

    if pid is None:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def measure(
    args: argparse.Namespace, target: Target, pids: dict[str, int] | None = None, other: str = ""
) -> list[dict[str, Any]]:
    """Every level of every path; ``pids``: the endpoint process of each OpenAI path (its CPU time is read),
    ``other``: the base URL of a second endpoint (``--other-endpoint``), measured after ``openai`` as ``openai-other``."""
    import aiohttp

    pids = pids or {}

    tokens = Tokens(target.repository)
    prompt_len = tokens.prompt(args.prompt)
    paths: list[Any] = []
    for name in args.paths:
        if name == "text":
            paths.append(TextPath(target.http, args.prompt, args.max_tokens, tokens))
        elif name == "openai":
            model = await openai_model_id(target.openai)
            paths.append(OpenAIPath(target.openai, args.prompt, args.max_tokens, tokens, model))
            if other:
                paths.append(OpenAIPath(other, args.prompt, args.max_tokens, tokens, model))
                paths[-1].name = "openai-other"
        elif name in ("raw-loop", "raw-route"):
            vocab = model_vocab(target.http)
            if name == "raw-loop":
                paths.append(RawLoopPath(target, prompt_len, args.max_tokens, vocab, decoupled=args.streaming))
            else:
                paths.append(RawRoutePath(target, prompt_len, args.max_tokens, vocab, args.streaming, args.prompt))
    for path in paths:  # warm-up
        async with aiohttp.ClientSession() as session:
            await path(session)
    levels = []
    for c in args.concurrency:
        for path in paths:
            sending = Sending(path)
            before = triton_counters(target.http)
            cpu_before = cpu_seconds(pids.get(path.name))
            began = time.monotonic_ns()
            samples, errors, wall = await closed_loop(sending, c, args.rounds * c, args.timeout)
            ended = time.monotonic_ns()
            cpu = cpu_seconds(pids.get(path.name)) - cpu_before
            await asyncio.sleep(0.5)  # Triton counts a request once its response left
            costs = model_costs(before, triton_counters(target.http))
            levels.append(
                {
                    "path": path.name,
                    "c": c,
                    "window": (began, ended),
                    "sends": sending.sends,
                    "errors": errors,
                    "tok_s": sum(s.tokens for s in samples) / wall if wall else 0.0,
                    "p50_ms": percentile([s.latency_s for s in samples], 50) * 1e3 if samples else 0.0,
                    "endpoint_cpu_ms": cpu / len(samples) * 1e3 if path.name in pids and samples else None,
                    "batches": costs.get(FT, {}).get("batches", {}),
                    "pre_batches": costs.get("preprocessing", {}).get("batches", {}),
                }
            )
            level = levels[-1]
            cost = (
                "" if level["endpoint_cpu_ms"] is None else f", endpoint CPU {level['endpoint_cpu_ms']:.2f} ms/request"
            )
            say(
                f"{path.name} c={c}: {level['tok_s']:.0f} tok/s, p50 {level['p50_ms']:.0f} ms{cost}, "
                f"{_batches(level['batches'])}"
            )
    return levels


@contextmanager
def _pythonpath(source: Path) -> Iterator[None]:
    """Processes started inside import ``ftx_triton`` from ``source`` first."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(source.resolve()) + (os.pathsep + before if before else "")
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _batches(batches: dict[Any, int]) -> str:
    return " ".join(f"{size}x{n}" for size, n in sorted(batches.items(), key=lambda item: int(item[0]))) or "-"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, required=True, help="A repository `ftx configure` wrote.")
    parser.add_argument("--concurrency", default="16,32", help="Levels (clients), default 16,32.")
    parser.add_argument("--paths", default="text,openai,raw-loop", help="Default text,openai,raw-loop.")
    parser.add_argument("--rounds", type=int, default=3, help="Requests per client (default 3).")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--device", default=os.environ.get("FTX_DEVICE", "cpu"))
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    parser.add_argument("--keep-trace", type=Path, help="Copy Triton's trace file here.")
    parser.add_argument(
        "--other-endpoint",
        type=Path,
        help="A directory holding another ftx_triton package (e.g. `git archive COMMIT core/src | tar -x -C DIR`, then "
        "DIR/core/src): a second OpenAI endpoint runs from it and is measured as path openai-other right after openai "
        "at each level, an A/B of the endpoint's code in one run.",
    )
    parser.add_argument(
        "--standin-ms",
        type=float,
        help="Serve a copy of the repository whose fastertransformer model is the STAND-IN "
        "(ftx_triton.runtime.python.standin): N ms of wall time per execution whatever the batch, no CPU.",
    )
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]

    from ftx_triton.openai_api.launch import start_openai
    from ftx_triton.paths import ftx_home
    from ftx_triton.repository.model_config import parse_config

    repository = args.repository.resolve()
    args.streaming = bool(parse_config(repository / FT / "config.pbtxt").model_transaction_policy.decoupled)
    home = ftx_home()
    with tempfile.TemporaryDirectory(prefix="ftx-trace-") as tmp:
        if args.standin_ms is not None:
            from ftx_triton.runtime.python.standin import use_standin

            shutil.copytree(repository, Path(tmp) / "repository")
            repository = Path(tmp) / "repository"
            use_standin(repository, args.standin_ms)
        trace_file = Path(tmp) / "trace.json"
        server = traced_server(repository, home, trace_file, args.device)
        server.start()
        endpoints: dict[str, Any] = {}
        try:
            if "openai" in args.paths:
                start = partial(
                    start_openai,
                    f"http://{server.http_url}",
                    repository,
                    "burst-spread",
                    home=home,
                    triton_grpc=server.grpc_url,
                    watch_pid=server.pid,
                )
                endpoints["openai"] = start()
                if args.other_endpoint:
                    with _pythonpath(args.other_endpoint):
                        endpoints["openai-other"] = start()
            url = endpoints["openai"].url if endpoints else ""
            target = Target(server.http_url, server.grpc_url, url, repository, "")
            pids = {name: e.process.pid for name, e in endpoints.items()}
            other = endpoints["openai-other"].url if "openai-other" in endpoints else ""
            levels = asyncio.run(measure(args, target, pids, other))
        finally:
            for endpoint in endpoints.values():
                endpoint.stop()
            server.stop()
        for _ in range(100):  # tritonserver writes the trace as it exits
            if trace_file.is_file() and trace_file.stat().st_size:
                break
            time.sleep(0.1)
        records = read_trace(trace_file)
        if args.keep_trace:
            shutil.copyfile(trace_file, args.keep_trace)
    report = []
    print(
        "| path | clients | sent ms | entry ms | at model ms | preprocessing executions (requests) | "
        "preprocessing ms | merged rounds' returns at model ms | model batch x executions | tok/s | p50 ms | "
        "endpoint CPU ms/request |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---|---|---:|---:|---:|")
    for level in levels:
        first = first_round(records, level["window"], level["sends"], level["c"], level["path"])
        later = returns(records, level["window"], level["c"], level["path"])
        report.append({**{k: v for k, v in level.items() if k != "sends"}, "first_round": first, "returns_ms": later})
        pre = first.get("preprocessing")
        print(
            f"| {level['path']} | {level['c']} | {first['sent_ms']:.1f} | {first['entry_ms']:.1f} | "
            f"{first['model_ms']:.1f} | {' '.join(map(str, pre)) if pre else '-'} | "
            f"{first.get('preprocessing_ms', 0.0):.1f} | {' '.join(f'{v:.1f}' for v in later) or '-'} | "
            f"{_batches(level['batches'])} | {level['tok_s']:.0f} | {level['p50_ms']:.0f} | "
            f"{'-' if level['endpoint_cpu_ms'] is None else format(level['endpoint_cpu_ms'], '.2f')} |"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
