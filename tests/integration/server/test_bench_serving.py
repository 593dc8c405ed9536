"""``benchmarks/bench_serving.py`` against a real deployment: the built-in tiny-gptj served by the python
runtime on CPU (``ftx run --streaming --detach`` in a temporary FTX_HOME, real tritonserver, real OpenAI
endpoint), at concurrency 1 and 2 with a few requests. Checks that every figure is measured (positive),
that the tokens counted are the tokens asked for, and that no request's first text came after its end;
the figures' sizes are not checked (the machine may be busy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from python_runtime_support import SERVER_MARKS, detached_run

pytestmark = SERVER_MARKS

ROOT = Path(__file__).parents[3]
FTX = str(Path(sys.executable).parent / "ftx")
MAX_TOKENS, REQUESTS, LEVELS = 6, 2, (1, 2)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("bench-serving-home")
    with detached_run(home, "tiny-gptj", "--streaming") as (_run, env):
        yield env


def _bench(env: dict[str, str], tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    out = tmp_path / "serving.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_serving.py"),
            "--concurrency",
            ",".join(map(str, LEVELS)),
            "--requests",
            str(REQUESTS),
            "--max-tokens",
            str(MAX_TOKENS),
            "--raw-repeats",
            "1",
            "--json",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return done, json.loads(out.read_text()) if out.is_file() else None


def test_the_table_measures_the_text_model_the_openai_endpoint_and_the_raw_model(
    env: dict[str, str], tmp_path: Path
) -> None:
    done, report = _bench(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert report["streaming"] == {"raw-loop": True, "text": True, "openai": True}
    assert [(row["path"], row["concurrency"]) for row in report["levels"]] == [
        (path, c) for c in LEVELS for path in ("raw-loop", "text", "openai")
    ]
    for row in report["levels"]:
        assert row["errors"] == 0, row["first_error"]
        assert row["requests"] == REQUESTS and len(row["samples"]) == REQUESTS
        assert row["tokens"] == REQUESTS * MAX_TOKENS and row["short"] == 0
        assert all(s["tokens"] == MAX_TOKENS for s in row["samples"])
        for key in ("requests_per_s", "tokens_per_s", "ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms"):
            assert row[key] > 0, key
        assert row["raw_tokens_per_s"] > 0 and row["vs_raw"] > 0
        assert all(0 < s["ttft_s"] <= s["latency_s"] for s in row["samples"])
        assert all(s["events"] > 1 for s in row["samples"])  # streamed: more than one event per answer
        assert row["ttft_p50_ms"] <= row["latency_p50_ms"] and row["ttft_p90_ms"] <= row["latency_p90_ms"]
        assert row["goodput_rps"] <= row["requests_per_s"]
        # Triton's own statistics over the level: a text request went once through each step model; the raw loop
        # and the OpenAI endpoint (its token route reads the raw model's ids itself) ran the raw model alone
        steps = (
            ["preprocessing", "fastertransformer", "postprocessing"] if row["path"] == "text" else ["fastertransformer"]
        )
        assert list(row["models"]) == steps, row["path"]
        assert row["models"]["fastertransformer"]["requests"] == REQUESTS
        # the executions by batch size (Triton's batch_stats): one row per request, every execution counted once
        ft = row["models"]["fastertransformer"]
        assert sum(int(size) * n for size, n in ft["batches"].items()) == REQUESTS, ft
        assert sum(ft["batches"].values()) == ft["executions"], ft
        assert all(cost["compute_ms"] > 0 and cost["mean_batch"] >= 1 for cost in row["models"].values())
        if row["path"] != "raw-loop":
            assert row["vs_loop"] > 0
    table = done.stdout.split("\n\n")[0].splitlines()
    assert table[0].startswith("| path | concurrency") and len(table) == 2 + len(report["levels"])
    assert "| batch x executions |" in done.stdout.split("\n\n")[1].splitlines()[0]


def test_open_loop_levels_send_poisson_arrivals_and_count_goodput(env: dict[str, str], tmp_path: Path) -> None:
    """An open level sends its requests at their arrival times, not when earlier ones end; goodput counts the
    requests within the targets (an unreachable TTFT target: none)."""
    done, report = _bench(
        env, tmp_path, "--paths", "openai,raw-loop", "--concurrency", "1", "--rates", "4", "--slo-ttft-ms", "0.001"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    open_rows = [row for row in report["levels"] if row["rate"]]
    assert [(row["path"], row["rate"]) for row in open_rows] == [("raw-loop", 4.0), ("openai", 4.0)]
    for row in open_rows:
        assert row["errors"] == 0 and len(row["samples"]) == row["requests"] == REQUESTS
        assert row["goodput_rps"] == 0 and row["requests_per_s"] > 0
    closed = [row for row in report["levels"] if not row["rate"]]
    assert all(row["goodput_rps"] == 0 for row in closed)
    assert "4/s open" in done.stdout


def test_goodput_counts_requests_within_both_targets() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_serving import Sample, meets

    fast = Sample(ttft_s=0.1, latency_s=1.1, tokens=11, events=11)  # ITL 100 ms
    assert meets(fast, ttft_ms=200, itl_ms=150, streams=True)
    assert not meets(fast, ttft_ms=50, itl_ms=150, streams=True)
    assert not meets(fast, ttft_ms=200, itl_ms=50, streams=True)
    assert meets(fast, ttft_ms=200, itl_ms=50, streams=False)  # no stream: no ITL to judge


def test_a_name_no_server_has_is_an_error_with_a_hint(tmp_path: Path) -> None:
    env = {**os.environ, "FTX_HOME": str(tmp_path / "home")}
    done, report = _bench(env, tmp_path, "no-such-server")
    assert done.returncode == 1 and report is None
    assert "error: no running ftx server named 'no-such-server'" in done.stderr
    assert "hint: " in done.stderr


def test_a_raw_answer_that_fails_its_check_gives_no_figure(env: dict[str, str], tmp_path: Path) -> None:
    """Told a vocabulary smaller than the model's (--vocab 200), the raw answers hold ids outside it: the
    check refuses them and the table shows no raw figure rather than a false one."""
    done, report = _bench(env, tmp_path, "--paths", "raw", "--vocab", "200")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["raw_tokens_per_s"] for row in report["levels"]] == [None, None]
    assert set(report["raw_refused"]) == {"1", "2"}
    assert "outside the vocabulary" in report["raw_refused"]["1"]


def test_a_request_the_deployment_refuses_is_an_error_with_the_servers_reason(
    env: dict[str, str], tmp_path: Path
) -> None:
    done, report = _bench(env, tmp_path, "--max-tokens", "100000", "--paths", "text")
    assert done.returncode == 1 and report is None
    assert "error: the text path's first request failed: RuntimeError: HTTP 400: " in done.stderr
    assert "exceeds the limit of" in done.stderr and "hint: choose a --prompt and --max-tokens" in done.stderr


def test_a_text_longer_than_asked_is_counted_as_garbled_not_as_tokens() -> None:
    """A stream whose whole-text answers arrive out of order reads as the text repeated (seen on two GPUs
    with several postprocessing instances): such a request counts --max-tokens, not its inflated count."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_serving import Level, Sample, summarize

    level = Level("text", concurrency=2, requests=3)
    samples = [Sample(0.1, 1.0, 6, 6), Sample(0.1, 1.0, 6, 6), Sample(0.1, 1.0, 40, 6)]
    summarize(level, samples, [], wall=1.0, max_tokens=MAX_TOKENS, streams=True)
    assert (level.tokens, level.garbled, level.short, level.tokens_per_s) == (18, 1, 0, 18.0)


def test_the_raw_route_path_sends_the_token_routes_inputs(env: dict[str, str], tmp_path: Path) -> None:
    """``raw-route``: the raw loop with every other input the OpenAI endpoint's token route sends (its preprocessing
    code's) and the log probabilities asked for; each answer is checked to hold exactly --max-tokens new ids."""
    done, report = _bench(env, tmp_path, "--paths", "raw-loop,raw-route", "--concurrency", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["path"]: row for row in report["levels"]}
    assert set(rows) == {"raw-loop", "raw-route"}
    assert rows["raw-route"]["errors"] == 0 and len(rows["raw-route"]["samples"]) == REQUESTS
    assert rows["raw-route"]["vs_loop"] > 0
