"""``benchmarks/bench_serving.py --soak-seconds``: a few seconds of soak against the built-in tiny-gptj served by the
python runtime on CPU (``ftx run --streaming --detach``, real tritonserver, real OpenAI endpoint). A healthy
deployment passes with every field of the summary measured; a deployment whose tritonserver is killed mid-soak
gives errors, a FAIL and exit 1 within the request timeout, never a hang. The memory rule is checked on its own
with made-up samples (a real leak cannot be made to order)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from python_runtime_support import SERVER_MARKS, detached_run, own_ports

ROOT = Path(__file__).parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving_soak import MemorySample, Soak, Tally, Window, judge_answer, summarize  # noqa: E402

FTX = str(Path(sys.executable).parent / "ftx")
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("soak-home")
    with detached_run(home, "tiny-gptj", "--streaming", *own_ports()) as (_run, env):
        yield env


def _command(out: Path, seconds: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_serving.py"),
        "--soak-seconds",
        str(seconds),
        "--concurrency",
        "2",
        "--paths",
        "text,openai",
        "--max-tokens",
        str(MAX_TOKENS),
        "--soak-window",
        "1",
        "--soak-sample",
        "0.25",
        "--json",
        str(out),
        *extra,
    ]


pytestmark = SERVER_MARKS


def _soak_until_first_window(
    env: dict[str, str], out: Path, seconds: float, timeout: float
) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """A soak started in the background, once its first window has ended (load is on), and the tritonserver
    processes of the deployment (found first: the soak must still be running when they are acted on)."""
    ps = subprocess.run([FTX, "ps", "--json"], capture_output=True, text=True, env=env, timeout=60)
    (served,) = json.loads(ps.stdout)
    tritons = [p for p in psutil.Process(served["pid"]).children(recursive=True) if p.name() == "tritonserver"]
    assert tritons
    bench = subprocess.Popen(
        _command(out, seconds, "--timeout", str(timeout)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert bench.stderr is not None
    seen = []
    for line in bench.stderr:
        seen.append(line)
        if line.startswith("soak      window 1 "):
            break
    else:
        pytest.fail("the soak printed no window: " + "".join(seen)[-3000:])
    return bench, tritons


class TestSoak:
    def test_a_healthy_deployment_passes_with_every_figure_measured(self, env: dict[str, str], tmp_path: Path) -> None:
        out = tmp_path / "soak.json"
        # the memory limit is wide: a busy CI machine's allocator is no leak; the rule itself is tested below
        done = subprocess.run(
            _command(out, 3, "--soak-max-growth-mb", "1000"), capture_output=True, text=True, timeout=300, env=env
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        soak = json.loads(out.read_text())["soak"]
        s = soak["summary"]
        assert s["verdict"] == "PASS" and s["reasons"] == []
        assert (s["errors"], s["hangs"], s["garbled"], s["incomplete"]) == (0, 0, 0, 0)
        assert s["requests"] > 0 and s["tokens"] == s["requests"] * MAX_TOKENS and s["tokens_per_s"] > 0
        assert all(soak["per_path"][p]["requests"] > 0 for p in ("text", "openai"))  # both paths at once
        assert len(soak["windows"]) >= 2 and sum(w["tally"]["requests"] for w in soak["windows"]) == s["requests"]
        # the deployment's memory: supervisor, tritonserver, its stubs and the OpenAI front
        assert all(m["rss_mb"] > 50 and m["processes"] >= 4 for m in soak["memory"])
        assert s["rss_first_mb"] > 0 and s["rss_max_mb"] >= s["rss_last_mb"]
        assert s["rss_growth_mb"] is not None and s["rss_slope_mb_per_min"] is not None
        assert "SOAK PASS" in done.stdout and "| window |" in done.stdout and "per path: text " in done.stdout
        assert "soak      window 1 " in done.stderr

    def test_a_server_that_stops_answering_mid_soak_gives_hangs_and_a_fail_within_the_timeout(
        self, env: dict[str, str], tmp_path: Path
    ) -> None:
        """The tritonserver is frozen (SIGSTOP) after the first window: requests get no answer, each is cut at
        the request timeout and counted as a hang; the run ends, FAILs and exits 1. It is thawed afterwards."""
        out = tmp_path / "soak.json"
        started = time.monotonic()
        bench, tritons = _soak_until_first_window(env, out, seconds=6, timeout=3)
        for proc in tritons:
            proc.send_signal(signal.SIGSTOP)
        try:
            stdout, stderr = bench.communicate(timeout=120)
        finally:
            for proc in tritons:
                proc.send_signal(signal.SIGCONT)
        assert bench.returncode == 1, stdout[-2000:] + stderr[-3000:]
        assert time.monotonic() - started < 6 + 3 + 60  # the soak, one request timeout, the start
        s = json.loads(out.read_text())["soak"]
        assert s["summary"]["verdict"] == "FAIL" and s["summary"]["hangs"] > 0
        assert any(r.endswith(" hangs") for r in s["summary"]["reasons"])
        assert "no answer within 3 s" in s["first_error"] and "SOAK FAIL" in stdout

    def test_a_server_killed_mid_soak_is_a_fail_with_errors_not_a_hang(
        self, env: dict[str, str], tmp_path: Path
    ) -> None:
        """Last in this file: it kills the module's deployment."""
        out = tmp_path / "soak.json"
        started = time.monotonic()
        bench, killed = _soak_until_first_window(env, out, seconds=6, timeout=5)
        for proc in killed:
            proc.send_signal(signal.SIGKILL)
        stdout, stderr = bench.communicate(timeout=120)
        assert bench.returncode == 1, stdout[-2000:] + stderr[-3000:]
        assert time.monotonic() - started < 6 + 5 + 60  # the soak, one request timeout, the start: no hang
        s = json.loads(out.read_text())["soak"]["summary"]
        assert s["verdict"] == "FAIL" and s["errors"] + s["hangs"] > 0
        assert any("errors" in r or "hangs" in r for r in s["reasons"])
        assert "SOAK FAIL" in stdout


def _soak(rss: list[float]) -> Soak:
    """A soak of two one-second windows whose memory samples are ``rss`` (MB), four per second."""
    soak = Soak(["text"], 1, 2, 10, MAX_TOKENS, max_growth_mb=32)
    soak.total = Tally(requests=10, tokens=10 * MAX_TOKENS)
    soak.wall_s = 2
    soak.memory = [MemorySample(i / 4, mb, 5, None) for i, mb in enumerate(rss)]
    soak.windows = [
        Window(1, 1.0, Tally(), 0, rss[4], max(rss[:5]), 5, None),
        Window(2, 2.0, Tally(), 0, rss[-1], 0, 5, None),
    ]
    return soak


def test_memory_that_keeps_growing_after_the_warm_up_fails_the_soak() -> None:
    warm = [100, 180, 200, 195, 200]  # the first window: pools filling up
    flat = summarize(_soak([*warm, 198, 201, 199, 200]))
    assert flat["verdict"] == "PASS" and flat["rss_growth_mb"] == -0.5
    leak = summarize(_soak([*warm, 220, 230, 240, 250]))
    assert leak["verdict"] == "FAIL" and leak["rss_growth_mb"] == 35
    assert leak["reasons"] == ["RSS grew 35.0 MB (limit 32 MB)"]
    assert leak["rss_slope_mb_per_min"] > 0 and (leak["rss_first_mb"], leak["rss_max_mb"]) == (100, 250)


def test_an_answer_is_complete_short_garbled_or_incomplete() -> None:
    assert judge_answer(MAX_TOKENS, "length", MAX_TOKENS) == "complete"
    assert judge_answer(MAX_TOKENS + 3, "length", MAX_TOKENS) == "garbled"
    assert judge_answer(2, "stop", MAX_TOKENS) == "short"  # an honest stop
    assert judge_answer(2, "", MAX_TOKENS) == "short"  # a path that does not say why it stopped
    assert judge_answer(2, "length", MAX_TOKENS) == "incomplete"
    assert judge_answer(0, "stop", MAX_TOKENS) == "incomplete"


def test_a_soak_of_several_levels_is_refused_with_the_reason(tmp_path: Path) -> None:
    done = subprocess.run(
        [*_command(tmp_path / "x.json", 5), "--concurrency", "1,2"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "a soak runs one level" in done.stderr
