"""Many users at once (issue 38), on the python runtime: a streaming tiny-gptj deployed with a stream interval
of 3 and a bounded queue of 1 (`ftx run --streaming --stream-interval 3 --max-queue-size 1`), real
tritonserver, real HTTP and gRPC."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_runtime_support import SERVER_MARKS, detached_run, post_json

pytestmark = SERVER_MARKS

FTX = [str(Path(sys.executable).parent / "ftx")]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
LONG = 200
"""Tokens of the request that keeps the model busy (the tiny model's context is 256)."""


class Served:
    def __init__(self, home: Path, stdout: str) -> None:
        self.home = home
        self.openai = re.search(r"OpenAI\s+(http://\S+/v1)", stdout).group(1)
        self.http = re.search(r"HTTP\s+(http://\S+)", stdout).group(1)
        self.metrics = self.openai.removesuffix("/v1") + "/metrics"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, built_demo: Path) -> Iterator[Served]:
    from fetch_helpers import seed_demo

    home = tmp_path_factory.mktemp("many-users-home")
    seed_demo(home, built_demo)
    args = ["--streaming", "--stream-interval", "3", "--max-queue-size", "1"]
    with detached_run(home, "tiny-gptj", *args) as (run, _env):
        yield Served(home, run.stdout)


def _stats(served: Served, model: str) -> int:
    with _OPENER.open(f"{served.http}/v2/models/{model}/stats", timeout=60) as response:
        return int(json.loads(response.read())["model_stats"][0]["execution_count"])


def _metrics(served: Served) -> dict[str, float]:
    from ftx_triton.server.front_metrics import read_metrics

    return read_metrics(served.metrics)


def test_the_text_models_stream_every_third_step_and_lose_nothing(served: Served) -> None:
    """Triton's text ensemble with the stream interval: postprocessing runs once per third token, and the
    joined text equals the OpenAI endpoint's (token route) for the same greedy request."""
    from ftx_triton.client.text_client import HttpTriton, pieces, text_interface

    server = HttpTriton(served.http)
    iface = text_interface(server, "text")
    before = _stats(served, "postprocessing")
    events = list(server.generate_stream(iface, {"prompt": "Once upon a time", "max_tokens": 9, "stream": True}))
    text = "".join(pieces(iter(events), iface, "Once upon a time")).removeprefix("Once upon a time")
    assert _stats(served, "postprocessing") - before <= 4  # 3 streamed responses (+ the final), not 9
    assert len([e for e in events if e]) <= 4
    status, _headers, body = post_json(served.openai + "/completions", {"prompt": "Once upon a time", "max_tokens": 9})
    assert status == 200 and json.loads(body)["choices"][0]["text"] == text


def _overload_burst(served: Served) -> tuple[dict[str, tuple[float, int, dict[str, str], str]], float, float]:
    """One long streamed request, then, once it generates, four OpenAI and four Triton requests at once: their
    (seconds, status, headers, body) by key, when the long one ended and when the last of the burst started."""
    from ftx_triton.client.text_client import HttpError, HttpTriton, text_interface

    results: dict[str, tuple[float, int, dict[str, str], str]] = {}
    started: list[float] = []
    ended: list[float] = []
    generating = threading.Event()

    def busy() -> None:  # a stream: its first piece says the model is generating
        body = {"prompt": "Once upon a time", "max_tokens": LONG, "stream": True}
        request = urllib.request.Request(
            served.openai + "/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with _OPENER.open(request, timeout=300) as response:
            for line in response:
                if line.startswith(b"data: {"):
                    generating.set()
            ended.append(time.monotonic())
            results["busy"] = (0.0, response.status, {}, "")

    def openai(key: str) -> None:
        began = time.monotonic()
        started.append(began)
        status, headers, body = post_json(
            served.openai + "/completions", {"prompt": "Once upon a time", "max_tokens": 4}
        )
        results[key] = (time.monotonic() - began, status, headers, body)

    def triton(key: str) -> None:
        server = HttpTriton(served.http)
        iface = text_interface(server, "text")
        began = time.monotonic()
        started.append(began)
        try:
            list(server.generate_stream(iface, {"prompt": "Once upon a time", "max_tokens": 4, "stream": True}))
            results[key] = (time.monotonic() - began, 200, {}, "")
        except HttpError as exc:
            results[key] = (time.monotonic() - began, exc.status, {}, exc.message)

    first = threading.Thread(target=busy)
    first.start()
    assert generating.wait(120)
    burst = [threading.Thread(target=openai, args=(f"openai{i}",)) for i in range(4)]
    burst += [threading.Thread(target=triton, args=(f"triton{i}",)) for i in range(4)]
    for thread in burst:
        thread.start()
    for thread in [first, *burst]:
        thread.join(300)
    return results, (ended or [0.0])[0], max(started)


def test_an_overloaded_model_answers_429_with_retry_after_and_triton_its_own_error_fast(served: Served) -> None:
    """While one request generates, a burst of OpenAI and Triton (text ensemble) requests meets a queue of one:
    the OpenAI endpoint answers 429 with Retry-After, Triton its own queue error, both at once; whatever the
    queue took completes, and the endpoint's metrics count the rejections."""
    for _attempt in range(5):  # a loaded machine can finish the busy request before the burst reaches it
        before = _metrics(served)
        results, busy_ended, burst_started = _overload_burst(served)
        if busy_ended > burst_started:
            break
    assert results["busy"][1] == 200, results
    refused_openai = [r for k, r in results.items() if k.startswith("openai") and r[1] == 429]
    refused_triton = [r for k, r in results.items() if k.startswith("triton") and r[1] != 200]
    assert refused_openai and refused_triton, results
    assert all(r[1] in (200, 429) for k, r in results.items() if k.startswith("openai")), results
    for seconds, _status, headers, body in refused_openai:
        assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
        assert int(headers["Retry-After"]) >= 1 and seconds < 2.0
    for seconds, _status, _headers, message in refused_triton:
        assert "maximum queue size" in message.lower() and seconds < 2.0, results
    after = _metrics(served)
    rejected = after["ftx_requests_rejected_total"] - before.get("ftx_requests_rejected_total", 0)
    completed = after["ftx_requests_total{outcome=ok}"] - before["ftx_requests_total{outcome=ok}"]
    assert rejected == len(refused_openai) and completed == 5 - len(refused_openai)


def test_metrics_count_tokens_time_to_first_token_and_inter_token_latency(served: Served) -> None:
    from ftx_triton.server.front_metrics import level_figures

    before = _metrics(served)
    began = time.monotonic()
    for stream in (True, False):
        status, _headers, _body = post_json(
            served.openai + "/completions", {"prompt": "Once upon a time", "max_tokens": 12, "stream": stream}
        )
        assert status == 200
    after = _metrics(served)
    figures = level_figures(before, after, time.monotonic() - began)
    assert after["ftx_output_tokens_total"] - before["ftx_output_tokens_total"] == 24
    assert after["ftx_time_to_first_token_seconds_count"] - before["ftx_time_to_first_token_seconds_count"] == 2
    assert after["ftx_inter_token_latency_seconds_count"] - before["ftx_inter_token_latency_seconds_count"] == 2
    assert figures["completed"] == 2 and figures["rejected"] == 0 and figures["errors"] == 0
    assert 0 < figures["ttft_avg_ms"] and 0 < figures["itl_avg_ms"] and figures["output_tokens_per_s"] > 0
    assert after["ftx_requests_in_flight"] == 0 and after["ftx_requests_queued"] == 0


def test_the_dashboard_plots_only_series_the_endpoint_exposes(served: Served) -> None:
    """Every query of the Grafana dashboard names series /metrics really has (a renamed series breaks this)."""
    with _OPENER.open(served.metrics, timeout=30) as response:
        exposed = response.read().decode()
    names = set(re.findall(r"^(ftx_\w+)", exposed, flags=re.M))
    dashboard = json.loads((Path(__file__).parents[3] / "docs" / "grafana" / "ftx-serving.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", ())]
    assert queries
    for query in queries:
        used = set(re.findall(r"\b(ftx_\w+)", query))
        assert used and used <= names, (query, used - names)


def test_bench_via_openai_reads_the_endpoints_metrics_per_level(served: Served) -> None:
    env = {**os.environ, "FTX_HOME": str(served.home)}
    done = subprocess.run(
        [*FTX, "bench", "--via", "openai", "--concurrency", "1,2", "--requests", "4", "--max-tokens", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["url"] == served.openai and "--via openai" in result["why"]
    for point, c in zip(result["points"], (1, 2), strict=True):
        front = point["front"]
        assert point["concurrency"] == c and point["requests"] == front["completed"] >= 1
        # two clients against a queue of one: a request can find it full (429), which the load counts and survives
        assert front["completed"] + front["rejected"] == 4 and front["errors"] == 0
        assert front["rejected"] == 0 or c == 2
        assert front["ttft_avg_ms"] > 0 and front["itl_avg_ms"] > 0 and front["output_tokens_per_s"] > 0
    refused = subprocess.run(
        [*FTX, "bench", "--via", "openai", "--tool", "perf_analyzer"], capture_output=True, text=True, env=env
    )
    assert refused.returncode == 1 and "no OpenAI service kind" in refused.stderr
