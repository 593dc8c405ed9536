"""``ftx run`` on a GPT-J-6B-shaped checkpoint ends on real FasterTransformer (``-m gpu``; never in CI).

One command, the way a user types it on a GPU host without Docker: no runtime named, no build step, no
manual edit. ftx must pick its native FasterTransformer launcher, build or reuse the backend, convert
the 12 GB of fp16 weights, tune GEMMs, configure, serve, answer ``--prompt`` and stop. The weights are
random (the shape is what matters here), so the text is checked for being generated, not for meaning.
Set FTX_GPU_SKIP_6B=1 to leave this one out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (no nvidia-smi)"),
              pytest.mark.skipif(os.environ.get("FTX_GPU_SKIP_6B") == "1", reason="FTX_GPU_SKIP_6B=1")]

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "benchmarks"))


def test_ftx_run_serves_a_6b_shaped_checkpoint_on_native_fastertransformer(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from bench_native_ft import random_checkpoint

    source = random_checkpoint("gptj", tmp_path / "gptj-6b-shaped")
    env = dict(os.environ, FTX_LOG_FORMAT="json")
    env.pop("FTX_RUN_RUNTIME", None)
    done = subprocess.run([sys.executable, "-c", "from ftx.cli import main; main()", "run", str(source),
                           "--prompt", "Once upon a time", "--max-tokens", "16"],
                          capture_output=True, text=True, env=env, timeout=1500)
    log = done.stderr
    assert done.returncode == 0, log[-6000:]
    assert done.stdout.startswith("Once upon a time") and len(done.stdout.strip()) > len("Once upon a time"), done.stdout
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    ready = [e for e in events if e.get("event") == "serve.ready"]
    assert ready and ready[0]["runtime"] == "fastertransformer-native", log[-3000:]
    tuned = [e for e in events if e.get("event") in ("stage.finished", "cache.hit") and e.get("stage") == "tune"]
    assert tuned and not tuned[0].get("skipped"), tuned
