"""``ftx run`` on a GPT-J-6B-shaped checkpoint ends on real FasterTransformer (``-m gpu``; never in CI).

One command, the way a user types it on a GPU host without Docker: no runtime named, no build step, no
manual edit. ftx must pick its native FasterTransformer launcher, build or reuse the backend, convert
the 12 GB of fp16 weights, tune GEMMs, configure, serve, answer ``--prompt`` and leave the server
running (``--detach``) for the checks, which ``ftx stop --all`` ends. The weights are random (the shape
is what matters here) and the vocabulary has 50,400 rows while the tokenizer trained for the test knows
a few hundred tokens, so most generated ids decode to nothing: generation is checked on the token ids
the served model returns, not on the printed text. Set FTX_GPU_SKIP_6B=1 to leave this one out,
FTX_GPU_6B_TP=2 to serve it over two GPUs (``--tp 2``). With FTX_GPU_RESULTS set, the figures (time from
command to ready, cold and with every stage cached; GPU memory per GPU; greedy tokens/s at batch 1 and
8, every row checked for its full length) are written there as ``ftx-run-6b-tp<N>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (no nvidia-smi)"),
    pytest.mark.skipif(os.environ.get("FTX_GPU_SKIP_6B") == "1", reason="FTX_GPU_SKIP_6B=1"),
]

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parent.parent))

PROMPT = "Once upon a time"
NEW_TOKENS = 16


def _ftx(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from ftx_triton.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


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
        result = client.infer(
            "fastertransformer",
            tensors,
            client_timeout=300,
            outputs=[grpcclient.InferRequestedOutput(n) for n in ("output_ids", "sequence_length")],
        )
    finally:
        client.close()
    return {n: result.as_numpy(n) for n in ("output_ids", "sequence_length")}


def _rates(url: str, vocab: int, batches: tuple[int, ...] = (1, 8), new_tokens: int = 128) -> dict[int, float]:
    """Greedy tokens/s of the raw model over gRPC: random 64-token prompts, end_id outside the vocabulary,
    every row checked to hold new_tokens generated ids (median of 3 after a warm-up)."""
    import statistics

    import numpy as np
    from bench_native_ft import generated_tokens
    from python_runtime_support import decoder_inputs

    out = {}
    for batch in batches:
        rates = []
        for seed in range(4):
            prompts = np.random.default_rng(seed).integers(100, vocab - 1, size=(batch, 64)).astype(np.uint32)
            inputs = decoder_inputs(prompts.tolist(), new_tokens, end_id=np.full((batch, 1), vocab + 7, np.uint32))
            t0 = time.perf_counter()
            answer = _infer_grpc(url, inputs)
            seconds = time.perf_counter() - t0
            tokens = generated_tokens(
                prompts, answer["output_ids"], answer["sequence_length"], new_tokens, vocab + 7, vocab
            )
            if seed:
                rates.append(tokens / seconds)
        out[batch] = round(statistics.median(rates), 1)
    return out


def _memory_mib() -> list[int]:
    text = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [int(v) for v in text.split() if v.strip().isdigit()]


def test_ftx_run_serves_a_6b_shaped_checkpoint_on_native_fastertransformer(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from bench_native_ft import random_checkpoint
    from python_runtime_support import decoder_inputs
    from tokenizers import Tokenizer

    tp = int(os.environ.get("FTX_GPU_6B_TP", "1"))
    if torch.cuda.device_count() < tp:
        pytest.skip(f"tp {tp} needs {tp} GPUs")
    source = random_checkpoint("gptj", tmp_path / "gptj-6b-shaped")
    env = dict(os.environ, FTX_LOG_FORMAT="json")
    env.pop("FTX_RUN_RUNTIME", None)
    argv = (
        "run",
        str(source),
        "--prompt",
        PROMPT,
        "--max-tokens",
        str(NEW_TOKENS),
        "--detach",
        *(("--tp", str(tp)) if tp > 1 else ()),
    )
    figures: dict[str, object] = {"tp": tp}
    t0 = time.perf_counter()
    done = _ftx(*argv, env=env, timeout=1500)
    figures["ready_cold_s"] = round(time.perf_counter() - t0, 1)
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
        figures["memory_mib"] = _memory_mib()
        figures["tok_s"] = _rates(ready[0]["grpc"], 50400)
    finally:
        stopped = _ftx("stop", "--all", env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    # again, every stage cached: the time a user waits for a model ftx has prepared before
    t0 = time.perf_counter()
    again = _ftx(*argv, env=env, timeout=900)
    figures["ready_cached_s"] = round(time.perf_counter() - t0, 1)
    _ftx("stop", "--all", env=env, timeout=120)
    assert again.returncode == 0, again.stderr[-4000:]
    hits = [json.loads(line) for line in again.stderr.splitlines() if line.startswith("{")]
    figures["cached_stages"] = sorted({e.get("stage") for e in hits if e.get("event") == "cache.hit"} - {None})
    print("ftx-run figures:", json.dumps(figures))
    if os.environ.get("FTX_GPU_RESULTS"):
        Path(os.environ["FTX_GPU_RESULTS"], f"ftx-run-6b-tp{tp}.json").write_text(json.dumps(figures, indent=2))
