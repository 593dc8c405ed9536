"""Load a served ensemble and measure it: Triton's ``perf_analyzer`` when it is installed, else a
built-in load generator; the figures are stored beside the deployment record.

``perf_analyzer`` is Triton's own tool. The PyPI ``perf-analyzer``/``genai-perf`` packages do not
bring a binary that installs here (the newest ``perf-analyzer`` on the index this project uses is a
placeholder without one); the binary ships in the ``tritonclient`` 2.41 manylinux wheel and needs
``libb64`` and ``libcudart`` (``scripts/setup.sh --dev`` installs all three beside the venv, without
touching the environment's own packages). Without it, ftx's own closed loop
(:func:`ftx_triton.client.load.closed_loop`, N concurrent clients) drives the same requests and measures
throughput and latency percentiles itself; :class:`BenchResult` says which tool ran and why.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from ftx_triton.client.load import LevelWatch, Point, Sender, closed_loop, openai_sender, triton_sender
from ftx_triton.client.text_client import HttpTriton, text_interface
from ftx_triton.errors import ConfigError, ServeError, ToolError
from ftx_triton.io.atomic_file import write_json_atomic
from ftx_triton.repository.io import TEXT_MODEL_NAME
from ftx_triton.server.front_metrics import level_figures, read_metrics

PERF_ANALYZER_ENV = "FTX_PERF_ANALYZER"


@dataclass
class BenchResult:
    tool: str
    why: str
    model: str
    url: str
    prompt: str
    max_tokens: int
    points: list[Point] = field(default_factory=list)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def as_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "points"}, "points": [asdict(p) for p in self.points]}


class FrontMetricsWatch:
    """What the OpenAI endpoint's ``/metrics`` counted over each load level (``ftx bench --via openai``)."""

    def __init__(self, base: str) -> None:
        self.url = base.rstrip("/").removesuffix("/v1") + "/metrics"
        self.before: dict[str, float] = {}

    def begin(self) -> None:
        self.before = read_metrics(self.url)

    def end(self, seconds: float) -> dict[str, Any]:
        return level_figures(self.before, read_metrics(self.url), seconds)


def find_perf_analyzer() -> Path | None:
    """``$FTX_PERF_ANALYZER``, else ``perf_analyzer`` on PATH or beside this interpreter."""
    explicit = os.environ.get(PERF_ANALYZER_ENV)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    here = Path(sys.executable).parent / "perf_analyzer"
    found = shutil.which("perf_analyzer")
    return Path(found) if found else (here if here.is_file() else None)


ANY_WINDOW_PERCENT = 10**9
"""perf_analyzer's --stability-percentage that accepts any three windows (max/min up to 10 million): under
load one window can take 20 times another, and the old 1000 % made perf_analyzer give up."""


def run_perf_analyzer(
    binary: Path,
    grpc_url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    concurrency: Sequence[int],
    requests: int,
    *,
    streaming: bool = False,
) -> list[Point]:
    """``perf_analyzer`` over gRPC with the prompt as input data, one CSV row per concurrency
    (``--streaming`` for a decoupled model: latency is then the time to the first response)."""
    with tempfile.TemporaryDirectory(prefix="ftx-bench-") as tmp:
        data = Path(tmp) / "input.json"
        request = {"text_input": [prompt], "max_tokens": [max_tokens], **({"stream": [True]} if streaming else {})}
        data.write_text(json.dumps({"data": [request]}))
        report = Path(tmp) / "report.csv"
        points = []
        # one run per level; any windows are accepted as stable (ANY_WINDOW_PERCENT): the figures are what was
        # measured, and a busy machine must not make the tool give up
        for c in concurrency:
            cmd = [
                str(binary),
                "-m",
                model,
                "-u",
                grpc_url.removeprefix("grpc://"),
                "-i",
                "grpc",
                "--input-data",
                str(data),
                "--concurrency-range",
                f"{c}:{c}",
                "--measurement-mode",
                "count_windows",
                "--measurement-request-count",
                str(requests),
                "--stability-percentage",
                str(ANY_WINDOW_PERCENT),
                "--max-trials",
                "3",
                "-f",
                str(report),
                *(["--streaming"] if streaming else []),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
            if done.returncode != 0 or not report.is_file():
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
                raise ToolError(
                    f"perf_analyzer failed (exit {done.returncode}):\n{tail}",
                    hint="run with --tool builtin to use ftx's own load generator",
                )
            for row in csv.DictReader(io.StringIO(report.read_text())):
                us = [float(row[k]) for k in ("p50 latency", "p90 latency", "p99 latency")]
                avg = sum(
                    float(row[k])
                    for k in row
                    if k not in ("Concurrency", "Inferences/Second")
                    and not k.startswith("p")
                    and row[k] not in ("", None)
                )
                points.append(
                    Point(
                        int(row["Concurrency"]),
                        requests,
                        float(row["Inferences/Second"]),
                        us[0] / 1000,
                        us[1] / 1000,
                        us[2] / 1000,
                        avg / 1000,
                    )
                )
            report.unlink()
    return points


def results_path(home: Path, repository: Path) -> Path:
    """Where the figures of the deployment served from ``repository`` are kept: ``FTX_HOME/bench/<name>.json``.

    Beside the store, never inside the repository: a store artifact is content-addressed and verified on
    every use, so a file added to it would make the next run call it corrupt and rebuild it.
    """
    repository = Path(repository).resolve()
    digest = hashlib.sha256(str(repository).encode()).hexdigest()[:12]
    return Path(home) / "bench" / f"{repository.name[:40]}-{digest}.json"


def store_result(home: Path, repository: Path, result: BenchResult) -> Path:
    """Append ``result`` to the deployment's results file (:func:`results_path`); return its path."""
    path = results_path(home, repository)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        runs = json.loads(path.read_text())
    except (OSError, ValueError):
        runs = []
    if not isinstance(runs, list):
        runs = []  # a damaged record of ftx's own: started again
    runs.append({**result.as_dict(), "repository": str(Path(repository).resolve())})
    write_json_atomic(path, runs, indent=2)
    return path


Column = tuple[str, Callable[[Point], str]]
_COMMON: list[Column] = [
    ("CONCURRENCY", lambda p: str(p.concurrency)),
    ("REQ/S", lambda p: f"{p.throughput_rps:.2f}"),
    ("P50 MS", lambda p: f"{p.latency_p50_ms:.1f}"),
]


class BenchTarget(Protocol):
    """A running deployment as ``ftx bench`` finds it (``ftx ps``'s view)."""

    name: str
    model: str
    http: str
    grpc: str
    openai: str | None
    repository: str


@dataclass(frozen=True)
class BenchLoad:
    """How ``ftx bench`` loads the target: the tool, why, where, how and which columns it prints."""

    tool: str
    why: str
    url: str
    said: str
    run: Callable[[Any, str, int, list[int], int], list[Point]]
    columns: list[Column]


def _token_counter(target: BenchTarget) -> Callable[[str], int]:
    """Counts a text's tokens with the deployment's own tokenizer."""
    from ftx_triton.repository.textproc import load_codec

    codec = load_codec(Path(target.repository) / "preprocessing" / "1")
    return lambda text: len(codec.encode(text, prompt=False))


def _builtin(
    sender: Callable[..., Sender], base: str, model: str, watch: LevelWatch | None = None
) -> Callable[..., list[Point]]:
    """ftx's own closed loop through ``sender`` (its requests for ``model`` to ``base``)."""

    def run(target: BenchTarget, prompt: str, max_tokens: int, levels: list[int], requests: int) -> list[Point]:
        send = sender(base, model, prompt, max_tokens)
        return closed_loop(send, levels, requests, _token_counter(target), prompt, watch)

    return run


def bench_load(target: BenchTarget, tool: str, via: str) -> BenchLoad:
    """The load of ``ftx bench --tool TOOL --via VIA`` on ``target``."""
    return _openai_load(target, tool) if via == "openai" else _triton_load(target, tool)


def _triton_load(target: BenchTarget, tool: str) -> BenchLoad:
    """perf_analyzer when installed (and not --tool builtin), else the closed loop over the generate extension."""
    binary = find_perf_analyzer()
    if tool == "perf_analyzer" and binary is None:
        raise ConfigError(
            "perf_analyzer is not installed",
            hint="scripts/setup.sh --dev installs it beside the venv, or set FTX_PERF_ANALYZER=PATH; "
            "--tool builtin uses ftx's own load generator",
        )
    base = f"http://{target.http}"
    columns = [
        *_COMMON,
        ("P90 MS", lambda p: f"{p.latency_p90_ms:.1f}"),
        ("P99 MS", lambda p: f"{p.latency_p99_ms:.1f}"),
        ("TOKENS/S", lambda p: f"{p.tokens_per_s:.1f}" if p.tokens_per_s else "-"),
    ]
    if binary is not None and tool in ("auto", "perf_analyzer"):
        run = _perf_analyzer(binary)
        return BenchLoad("perf_analyzer", f"perf_analyzer at {binary}", base, "with perf_analyzer", run, columns)
    why = (
        "requested with --tool builtin"
        if tool == "builtin"
        else "perf_analyzer is not installed (no binary on PATH or FTX_PERF_ANALYZER); ftx's own closed-loop "
        "load generator over the generate extension"
    )
    return BenchLoad("builtin", why, base, "with builtin", _builtin(triton_sender, base, TEXT_MODEL_NAME), columns)


def _perf_analyzer(binary: Path) -> Callable[..., list[Point]]:
    def run(target: BenchTarget, prompt: str, max_tokens: int, levels: list[int], requests: int) -> list[Point]:
        streaming = text_interface(HttpTriton(f"http://{target.http}"), TEXT_MODEL_NAME).decoupled
        return run_perf_analyzer(
            binary, target.grpc, TEXT_MODEL_NAME, prompt, max_tokens, levels, requests, streaming=streaming
        )

    return run


def _openai_load(target: BenchTarget, tool: str) -> BenchLoad:
    """``--via openai``: ftx's load generator through the OpenAI endpoint, and the endpoint's metrics per level."""
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
    columns = [
        *_COMMON,
        ("TOKENS/S", lambda p: f"{(p.front or {}).get('output_tokens_per_s') or 0:.1f}"),
        ("TTFT MS", lambda p: _ms((p.front or {}).get("ttft_avg_ms"))),
        ("ITL MS", lambda p: _ms((p.front or {}).get("itl_avg_ms"))),
        ("REJECTED", lambda p: str((p.front or {}).get("rejected", 0))),
    ]
    run = _builtin(openai_sender, target.openai, target.model, FrontMetricsWatch(target.openai))
    return BenchLoad("builtin", why, target.openai, f"through {target.openai}", run, columns)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


__all__ = [
    "BenchLoad",
    "BenchResult",
    "BenchTarget",
    "FrontMetricsWatch",
    "bench_load",
    "find_perf_analyzer",
    "run_perf_analyzer",
    "results_path",
    "store_result",
]
