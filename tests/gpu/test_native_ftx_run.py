"""``ftx run`` on a GPT-J-6B-shaped checkpoint ends on real FasterTransformer (``-m gpu``; never in CI).

One command, the way a user types it on a GPU host without Docker: no runtime named, no build step, no
manual edit. ftx must pick its native FasterTransformer launcher, build or reuse the backend, convert
the 12 GB of fp16 weights, tune GEMMs, configure, serve, answer ``--prompt`` and leave the server
running (``--detach``) for the checks, which ``ftx stop --all`` ends. The weights are random (the shape
is what matters here) and the vocabulary has 50,400 rows while the tokenizer trained for the test knows
a few hundred tokens, so most generated ids decode to nothing: generation is checked on the token ids
the served model returns, not on the printed text. Set FTX_GPU_SKIP_6B=1 to leave this one out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (no nvidia-smi)"),
              pytest.mark.skipif(os.environ.get("FTX_GPU_SKIP_6B") == "1", reason="FTX_GPU_SKIP_6B=1")]

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parent.parent))

PROMPT = "Once upon a time"
NEW_TOKENS = 16


def _ftx(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from ftx_triton.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def _infer_grpc(url: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The raw fastertransformer model's output_ids and sequence_length, over gRPC (GPU images often
    lack gevent, which tritonclient's HTTP client needs)."""
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), "UINT32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer("fastertransformer", tensors, client_timeout=300,
                              outputs=[grpcclient.InferRequestedOutput(n) for n in ("output_ids", "sequence_length")])
    finally:
        client.close()
    return {n: result.as_numpy(n) for n in ("output_ids", "sequence_length")}


def test_ftx_run_serves_a_6b_shaped_checkpoint_on_native_fastertransformer(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from bench_native_ft import random_checkpoint
    from python_runtime_support import decoder_inputs
    from tokenizers import Tokenizer

    source = random_checkpoint("gptj", tmp_path / "gptj-6b-shaped")
    env = dict(os.environ, FTX_LOG_FORMAT="json")
    env.pop("FTX_RUN_RUNTIME", None)
    done = _ftx("run", str(source), "--prompt", PROMPT, "--max-tokens", str(NEW_TOKENS), "--detach",
                env=env, timeout=1500)
    try:
        log = done.stderr
        assert done.returncode == 0, log[-6000:]
        assert done.stdout.startswith(PROMPT) and "left running as" in done.stdout, done.stdout
        events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        ready = [e for e in events if e.get("event") == "serve.ready"]
        assert ready and ready[0]["runtime"] == "fastertransformer-native", log[-3000:]
        tuned = [e for e in events if e.get("event") in ("stage.finished", "cache.hit") and e.get("stage") == "tune"]
        assert tuned and not tuned[0].get("skipped"), tuned
        assert ready[0]["tuned"] is True, ready

        ids = Tokenizer.from_file(str(source / "tokenizer.json")).encode(PROMPT).ids
        out = _infer_grpc(ready[0]["grpc"], decoder_inputs([ids], NEW_TOKENS))
        length = int(out["sequence_length"][0, 0])
        assert out["output_ids"][0, 0, : len(ids)].tolist() == ids
        assert len(ids) < length <= len(ids) + NEW_TOKENS, (length, out["output_ids"].tolist())
    finally:
        stopped = _ftx("stop", "--all", env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
