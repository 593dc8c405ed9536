"""``scripts/serving-matrix.sh`` on CPU: a random GPT-J-layout checkpoint made by the script (the
``gptj-tiny`` shape, one character per token), two deployment variants each started with ``ftx run``
(python runtime, real tritonserver), loaded by ``bench_serving.py`` and stopped. Checks each variant's
figures count exactly the tokens asked for, that the variants really differ (streamed or not), and that
no server is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from python_runtime_support import SERVER_MARKS, own_ports

pytestmark = SERVER_MARKS

ROOT = Path(__file__).parents[3]
MAX_TOKENS, REQUESTS = 4, 4


def _matrix_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The script's environment: an FTX_HOME of its own, the CPU, this Python, and ``extra``."""
    home = {"FTX_HOME": str(tmp_path / "home"), "FTX_DEVICE": "cpu", "PYTHON": sys.executable}
    return {**os.environ, **home, **extra}


def _serving_matrix(env: dict[str, str], out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``scripts/serving-matrix.sh OUT ARGS…`` run to its end."""
    script = str(ROOT / "scripts" / "serving-matrix.sh")
    return subprocess.run(["bash", script, str(out), *args], capture_output=True, text=True, timeout=900, env=env)


def _assert_no_variant_left(env: dict[str, str]) -> None:
    """``ftx ps`` lists no deployment the script started."""
    ps = subprocess.run([sys.executable, "-m", "ftx_triton", "ps"], capture_output=True, text=True, env=env)
    assert ps.returncode == 0 and "bench-v" not in ps.stdout, ps.stdout + ps.stderr


def test_each_variant_is_served_measured_and_stopped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = _matrix_env(
        tmp_path,
        FTX_SERVING_VARIANTS="--streaming;--no-streaming",
        FTX_SERVING_BENCH=f"--concurrency 2 --max-tokens {MAX_TOKENS} --requests {REQUESTS} --raw-repeats 1",
    )
    done = _serving_matrix(env, out, "shape:gptj-tiny", "--runtime", "python")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "checkpoint-gptj-tiny" / "config.json").is_file()
    streamed = {}
    for tag, variant in (("serving-v1", "--streaming"), ("serving-v2", "--no-streaming")):
        assert (out / f"{tag}.args").read_text().split() == ["--runtime", "python", variant]
        report = json.loads((out / f"{tag}.json").read_text())
        streamed[tag] = report["streaming"]["text"]
        rows = [row for row in report["levels"] if row["path"] in ("text", "openai")]
        assert [row["path"] for row in rows] == ["text", "openai"]
        for row in rows:
            assert row["errors"] == 0, row["first_error"]
            assert (row["tokens"], row["short"], row["garbled"]) == (REQUESTS * MAX_TOKENS, 0, 0), row["path"]
        assert "| text | 2 |" in (out / f"{tag}.md").read_text()
    assert streamed == {"serving-v1": True, "serving-v2": False}
    _assert_no_variant_left(env)


def test_a_soak_runs_per_variant_with_its_environment_and_a_failed_variant_fails_the_script(tmp_path: Path) -> None:
    """FTX_SERVING_BENCH carries the soak's arguments; a variant's leading NAME=VALUE words are its `ftx run`'s
    environment (segmented generation here); files are named by FTX_SERVING_TAG; a variant that cannot start
    (an unknown option) is reported and the script ends with exit 1."""
    out = tmp_path / "out"
    env = _matrix_env(
        tmp_path,
        FTX_SERVING_TAG="serving-soak",
        FTX_SERVING_VARIANTS="FTX_SEGMENT_TOKENS=2 --streaming;--no-such-option",
        FTX_SERVING_BENCH=f"--soak-seconds 2 --soak-window 1 --concurrency 2 --paths openai,text "
        f"--max-tokens {MAX_TOKENS} --soak-max-growth-mb 1000",
    )
    done = _serving_matrix(env, out, "tiny-gptj", "--runtime", "python", *own_ports())
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "serving-soak-v1: FTX_SEGMENT_TOKENS=2 ftx run tiny-gptj --runtime python --http-port" in done.stdout
    assert "serving-soak-v2: the deployment did not start" in done.stdout
    soak = json.loads((out / "serving-soak-v1.json").read_text())["soak"]
    assert soak["summary"]["verdict"] == "PASS" and soak["summary"]["requests"] > 0
    assert soak["summary"]["tokens"] == soak["summary"]["requests"] * MAX_TOKENS
    assert "SOAK PASS" in (out / "serving-soak-v1.md").read_text()
    _assert_no_variant_left(env)
