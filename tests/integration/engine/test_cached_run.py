"""A cached run: planning imports neither torch, transformers nor huggingface_hub, and ``-v`` names each step's seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ftx_triton.server.server_log import log_clock

_IMPORTED = """
import sys
from ftx_triton.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print("HEAVY=" + ",".join(m for m in ("torch", "transformers", "huggingface_hub") if m in sys.modules), "CODE=%s" % code)
"""


def test_planning_and_cached_stages_import_neither_torch_nor_transformers(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    first = ftx_cli("run", str(tiny_gptj_dir), "--until", "configure", "--runtime", "python")
    assert first.exit_code == 0, first.stderr
    # the last pass lets ftx choose the runtime: asking whether a GPU runtime could serve reads no torch either
    for until, runtime in (("configure", ["--runtime", "python"]), (None, ["--runtime", "python"]), (None, [])):
        args = ["run", str(tiny_gptj_dir), *runtime, "--log-format", "json", "-v"]
        args += ["--until", until] if until else ["--dry-run"]
        done = subprocess.run(
            [sys.executable, "-c", _IMPORTED, *args],
            capture_output=True,
            text=True,
            env={**os.environ, "FTX_HOME": str(ftx_home)},
            timeout=120,
            check=False,
        )
        assert "CODE=0" in done.stdout or "CODE=None" in done.stdout, done.stderr[-2000:]
        assert "HEAVY= " in done.stdout, done.stdout  # nothing heavy was imported
    steps = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [e["step"] for e in steps if e.get("event") == "timeline.step"][:2] == ["start", "plan"]


def test_verbose_names_each_step_and_its_seconds(ftx_cli, tiny_gptj_dir: Path) -> None:
    ftx_cli("run", str(tiny_gptj_dir), "--until", "configure", "--runtime", "python")
    cached = ftx_cli("-v", "run", str(tiny_gptj_dir), "--until", "configure", "--runtime", "python")
    assert cached.exit_code == 0, cached.stderr
    for step in ("plan", "fetch", "convert", "tune", "configure"):
        assert f"timeline.step step={step} seconds=" in cached.stderr
    assert "timeline.step step=convert seconds=" in cached.stderr and "cached=True" in cached.stderr


def test_model_load_seconds_come_from_the_server_log_clock() -> None:
    began = log_clock('I1126 23:59:59.500000 31106 model_lifecycle.cc:472] "loading: fastertransformer:1"')
    ended = log_clock("I1127 00:00:01.250000 31106 model_lifecycle.cc:839] \"successfully loaded 'x'\"")
    assert began is not None and ended is not None and round((ended - began) % 86400, 3) == 1.75
    assert log_clock("ftx-supervisor: tritonserver started (pid 1)") is None


def test_a_second_convert_reads_neither_the_source_nor_the_conversion_again(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """``-o`` hard-links the store's files (their ctime moves): the store records that, so the next cached
    convert does not re-hash the conversion (it did, every time)."""
    first = ftx_cli("convert", str(tiny_gptj_dir), "-o", str(tmp_path / "a"))
    assert first.exit_code == 0, first.stderr
    again = ftx_cli("-v", "convert", str(tiny_gptj_dir), "-o", str(tmp_path / "b"))
    assert again.exit_code == 0, again.stderr
    assert "convert   cached" in again.stderr and "cache.rehashed" not in again.stderr
