"""Load a served ensemble and measure it: Triton's ``perf_analyzer`` when it is installed, else a
built-in load generator; the figures are stored beside the deployment record.

``perf_analyzer`` is Triton's own tool. The PyPI ``perf-analyzer``/``genai-perf`` packages do not
bring a binary that installs here (the newest ``perf-analyzer`` on the index this project uses is a
placeholder without one); the binary ships in the ``tritonclient`` 2.41 manylinux wheel and needs
``libb64`` and ``libcudart`` (``scripts/setup.sh --dev`` installs all three beside the venv, without
touching the environment's own packages). Without it, :func:`builtin_load` drives the same requests
(closed loop, N concurrent clients over the generate extension) and measures throughput and
latency percentiles itself; :func:`run_bench` says which tool ran and why.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ftx_triton.errors import ToolError

PERF_ANALYZER_ENV = "FTX_PERF_ANALYZER"


@dataclass(frozen=True)
class Point:
    """One concurrency level's figures."""

    concurrency: int
    requests: int
    throughput_rps: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    latency_avg_ms: float
    tokens_per_s: float | None = None
    front: dict[str, Any] | None = None
    """What the OpenAI endpoint's own metrics said over the level (``--via openai``: mean TTFT and ITL, output
    tokens/s, completed, rejected and failed requests; ``ftx_triton.openai_api.metrics.level_figures``)."""


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


def find_perf_analyzer() -> Path | None:
    """``$FTX_PERF_ANALYZER``, else ``perf_analyzer`` on PATH or beside this interpreter."""
    explicit = os.environ.get(PERF_ANALYZER_ENV)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    here = Path(sys.executable).parent / "perf_analyzer"
    found = shutil.which("perf_analyzer")
    return Path(found) if found else (here if here.is_file() else None)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def builtin_load(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    concurrency: Sequence[int],
    requests: int,
    count_tokens: Any = None,
) -> list[Point]:
    """Closed loop: ``c`` clients each sending requests back to back until ``requests`` are done."""
    from ftx_triton.server.text_client import HttpError, HttpTriton, text_interface

    server = HttpTriton(url)
    iface = text_interface(server, model)
    values = {"prompt": prompt, "max_tokens": max_tokens, **({"stream": True} if iface.decoupled else {})}
    try:  # warm up, and find out whether the model takes this request at all
        server.generate(iface, values) if not iface.decoupled else list(server.generate_stream(iface, values))
    except HttpError as exc:
        raise ToolError(
            f"the server refused the benchmark's request: {exc.message}",
            hint="choose a --prompt and --max-tokens the model accepts (try them with `ftx generate`)",
        ) from None

    def send() -> str:
        return server.generate(iface, values) if not iface.decoupled else "".join(server.generate_stream(iface, values))

    return closed_loop(send, concurrency, requests, count_tokens, prompt)


def openai_load(
    base: str, model: str, prompt: str, max_tokens: int, concurrency: Sequence[int], requests: int, count_tokens: Any
) -> list[Point]:
    """The same closed loop through the OpenAI endpoint (``base`` = ``http://host:port/v1``, streamed completions),
    each level with what the endpoint's ``/metrics`` counted over it (:attr:`Point.front`)."""
    import urllib.error
    import urllib.request

    from ftx_triton.openai_api.metrics import level_figures, read_metrics

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    metrics_url = base.rstrip("/").removesuffix("/v1") + "/metrics"

    def send() -> str:
        request = urllib.request.Request(
            base.rstrip("/") + "/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with opener.open(request, timeout=600) as response:
                text = []
                for raw in response:
                    line = raw.decode("utf-8", "replace").strip()
                    if line.startswith("data:") and line != "data: [DONE]":
                        event = json.loads(line[len("data:") :])
                        if "error" in event:
                            raise ToolError(f"the stream sent an error: {event['error']}")
                        text.append(str(event["choices"][0].get("text", "")))
                return prompt + "".join(text)
        except urllib.error.HTTPError as exc:
            if exc.code == 429:
                raise Rejected from None
            raise ToolError(f"the OpenAI endpoint answered {exc.code}: {exc.read()[:300]!r}") from None

    try:
        send()  # warm up, and find out whether the endpoint takes this request at all
    except (ToolError, OSError) as exc:
        raise ToolError(
            f"the OpenAI endpoint refused the benchmark's request: {exc}",
            hint="choose a --prompt and --max-tokens the model accepts (try them with `ftx generate`)",
        ) from None
    points = []
    for c in concurrency:
        before, began = read_metrics(metrics_url), time.perf_counter()
        (point,) = closed_loop(send, [c], requests, count_tokens, prompt)
        figures = level_figures(before, read_metrics(metrics_url), time.perf_counter() - began)
        points.append(replace(point, front=figures))
    return points


class Rejected(Exception):
    """A request the deployment's bounded queue refused (HTTP 429): the load goes on."""


def closed_loop(send: Any, concurrency: Sequence[int], requests: int, count_tokens: Any, prompt: str) -> list[Point]:
    """``c`` clients each calling ``send()`` (-> the text, starting with the prompt) back to back until
    ``requests`` are done, per level."""
    points = []
    for c in concurrency:
        latencies: list[float] = []
        tokens: list[int] = []
        lock = threading.Lock()
        left = [requests]
        errors: list[BaseException] = []

        def client(
            lock: threading.Lock,
            left: list[int],
            errors: list[BaseException],
            latencies: list[float],
            tokens: list[int],
        ) -> None:
            while True:
                with lock:
                    if left[0] <= 0 or errors:
                        return
                    left[0] -= 1
                began = time.perf_counter()
                try:
                    text = send()
                except Rejected:  # the bounded queue refused it: counted by the endpoint's metrics, not a fault
                    continue
                except BaseException as exc:  # noqa: BLE001 - reported after the threads stop
                    with lock:
                        errors.append(exc)
                    return
                took = time.perf_counter() - began
                with lock:
                    latencies.append(took)
                    if count_tokens is not None:
                        tokens.append(count_tokens(text.removeprefix(prompt)))

        started = time.perf_counter()
        threads = [
            threading.Thread(target=client, args=(lock, left, errors, latencies, tokens), daemon=True) for _ in range(c)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        if errors:
            raise ToolError(f"a benchmark request failed: {errors[0]}", hint="check the server with `ftx ps`")
        ms = [x * 1000 for x in latencies]
        points.append(
            Point(
                c,
                len(ms),
                len(ms) / wall,
                _percentile(ms, 50),
                _percentile(ms, 90),
                _percentile(ms, 99),
                statistics.fmean(ms),
                sum(tokens) / wall if tokens else None,
            )
        )
    return points


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(runs, indent=2))
    os.replace(tmp, path)
    return path


__all__ = [
    "BenchResult",
    "Point",
    "builtin_load",
    "find_perf_analyzer",
    "run_perf_analyzer",
    "results_path",
    "store_result",
]
