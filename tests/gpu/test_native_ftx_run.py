"""``ftx run`` on the seeds' models at their published shapes ends on real FasterTransformer (``-m gpu``;
never in CI).

One command per model, the way a user types it on a GPU host without Docker: no runtime named, no build
step, no manual edit. ftx must pick its native FasterTransformer launcher, build or reuse the backend,
convert the weights, tune GEMMs (gpt_gemm, t5_gemm), configure, serve, answer ``--prompt`` and leave the
server running (``--detach``) for the checks, which ``ftx stop --all`` ends. The weights are random (no
download exists on the GPU machines; the shape is what matters) and the tokenizer trained for the test
knows a few hundred tokens, so generation is checked on the token ids the served model returns.

FTX_GPU_SHAPES picks the cases, ``NAME:TP`` separated by commas (names from ``benchmarks/seed_shapes.py``:
gptj, kogpt, gptneox, gptneox-20b, t5-3b); by default GPT-J-6B at FTX_GPU_6B_TP (1). FTX_GPU_SKIP_6B=1
leaves them all out. For each case, with FTX_GPU_RESULTS set, the figures go to
``ftx-run-<NAME>-tp<N>.json`` there: time from command to ready (cold, and with every stage cached),
GPU memory per GPU, greedy tokens/s at batch 1 and 8 (every row checked for its full length), and the
share of prompts whose first 16 greedy tokens equal ``transformers`` in fp16 on the same GPU (random
weights make near-ties common, so the share is reported; the first token must agree for most prompts,
which a wrong layout breaks).
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


def _cases() -> list[tuple[str, int]]:
    text = os.environ.get("FTX_GPU_SHAPES") or f"gptj:{os.environ.get('FTX_GPU_6B_TP', '1')}"
    cases = []
    for item in text.split(","):
        name, _, tp = item.strip().partition(":")
        cases.append((name, int(tp or 1)))
    return cases


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


def _raw_inputs(prompts: list[list[int]], new_tokens: int, end_id: int, t5: bool) -> dict[str, np.ndarray]:
    """The raw model's inputs for ``prompts`` (T5's or a decoder's names), ``end_id`` on every row."""
    from python_runtime_support import decoder_inputs, t5_inputs

    end = np.full((len(prompts), 1), end_id, np.uint32)
    return t5_inputs(prompts, new_tokens, end_id=end) if t5 else decoder_inputs(prompts, new_tokens, end_id=end)


def _generated(
    prompts: np.ndarray, answer: dict[str, np.ndarray], new_tokens: int, vocab: int, t5: bool
) -> list[list[int]]:
    """The generated ids of every row, checked: exactly ``new_tokens`` of them, each inside the vocabulary
    (end_id was set outside it, so nothing may stop early); a decoder's answer must echo its prompt."""
    from bench_native_ft import MeasurementFault, generated_tokens

    batch, prompt_len = prompts.shape
    ids = answer["output_ids"].reshape(batch, -1)
    if not t5:
        generated_tokens(prompts, answer["output_ids"], answer["sequence_length"], new_tokens, vocab + 7, vocab)
        return ids[:, prompt_len : prompt_len + new_tokens].tolist()
    lengths = answer["sequence_length"].reshape(batch)
    for row in range(batch):
        gen = ids[row, :new_tokens]
        if int(lengths[row]) < new_tokens or gen.size < new_tokens or bool((gen >= vocab).any()):
            raise MeasurementFault(f"row {row}: {int(lengths[row])} ids, expected {new_tokens} inside the vocabulary")
    return ids[:, :new_tokens].tolist()


def _rates(
    url: str, vocab: int, t5: bool, batches: tuple[int, ...] = (1, 8), new_tokens: int = 128
) -> dict[int, float]:
    """Greedy tokens/s of the raw model over gRPC: random 64-token prompts, end_id outside the vocabulary,
    every row checked to hold new_tokens generated ids (median of 3 after a warm-up)."""
    import statistics

    out = {}
    for batch in batches:
        rates = []
        for seed in range(4):
            prompts = np.random.default_rng(seed).integers(100, vocab - 1, size=(batch, 64)).astype(np.uint32)
            inputs = _raw_inputs(prompts.tolist(), new_tokens, vocab + 7, t5)
            t0 = time.perf_counter()
            answer = _infer_grpc(url, inputs)
            seconds = time.perf_counter() - t0
            tokens = batch * len(_generated(prompts, answer, new_tokens, vocab, t5)[0])
            if seed:
                rates.append(tokens / seconds)
        out[batch] = round(statistics.median(rates), 1)
    return out


AGREEMENT_PROMPTS = 32
"""Prompts (32 random tokens each) whose greedy continuations are compared with ``transformers``."""


@pytest.mark.parametrize(("shape", "tp"), _cases(), ids=[f"{n}-tp{t}" for n, t in _cases()])
def test_ftx_run_serves_the_seed_shape_on_native_fastertransformer(shape: str, tp: int, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    if torch.cuda.device_count() < tp:
        pytest.skip(f"tp {tp} needs {tp} GPUs")
    import seed_shapes
    from bench_native_ft import gpu_memory_mib
    from tokenizers import Tokenizer

    spec = seed_shapes.SHAPES[shape]
    t5, vocab = spec["family"] == "t5", spec["vocab"]
    source = tmp_path / f"{shape}-shaped"
    # transformers' greedy continuations first, on the GPU the model is made on, then the checkpoint
    model = seed_shapes.random_model(shape, source)
    prompts = np.random.default_rng(11).integers(100, vocab - 1, size=(AGREEMENT_PROMPTS, 32)).astype(np.uint32)
    reference = seed_shapes.greedy_ids(model, prompts.tolist(), NEW_TOKENS)
    seed_shapes.save(model, source)
    del model
    torch.cuda.empty_cache()

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
        "--tp",
        str(tp),
        *(("--family", "kogpt", "--accept-license") if spec["family"] == "kogpt" else ()),
    )
    weights = sum(f.stat().st_size for f in source.glob("*.safetensors"))
    figures: dict[str, object] = {"shape": shape, "tp": tp, "weights_gb": round(weights / 1e9, 2)}
    results = Path(os.environ["FTX_GPU_RESULTS"]) if os.environ.get("FTX_GPU_RESULTS") else None

    def record() -> None:  # what is measured so far survives a failing step
        print("ftx-run figures:", json.dumps(figures))
        if results:
            (results / f"ftx-run-{shape}-tp{tp}.json").write_text(json.dumps(figures, indent=2))

    t0 = time.perf_counter()
    done = _ftx(*argv, env=env, timeout=1500)
    figures["ready_cold_s"] = round(time.perf_counter() - t0, 1)
    try:
        log = done.stderr
        assert done.returncode == 0, log[-6000:]
        assert "left running as" in done.stdout, done.stdout
        events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        ready = [e for e in events if e.get("event") == "serve.ready"]
        assert ready and ready[0]["runtime"] == "fastertransformer-native", log[-3000:]
        tuned = [e for e in events if e.get("event") in ("stage.finished", "cache.hit") and e.get("stage") == "tune"]
        assert tuned and not tuned[0].get("skipped"), tuned
        assert ready[0]["tuned"] is True, ready
        grpc = ready[0]["grpc"]
        figures["memory_mib"] = gpu_memory_mib()

        if not t5:  # the prompt of --prompt, through the raw model: echoed, then new ids
            ids = Tokenizer.from_file(str(source / "tokenizer.json")).encode(PROMPT).ids
            out = _infer_grpc(grpc, _raw_inputs([ids], NEW_TOKENS, vocab + 7, t5))
            assert out["output_ids"][0, 0, : len(ids)].tolist() == ids
            assert int(out["sequence_length"][0, 0]) == len(ids) + NEW_TOKENS

        served = []
        for row in prompts:
            answer = _infer_grpc(grpc, _raw_inputs([row.tolist()], NEW_TOKENS, vocab + 7, t5))
            served += _generated(row[None, :], answer, NEW_TOKENS, vocab, t5)
        figures["agree_16"] = sum(a == b for a, b in zip(served, reference)) / len(prompts)
        figures["agree_first"] = sum(a[0] == b[0] for a, b in zip(served, reference)) / len(prompts)
        figures["agree_tokens"] = sum(x == y for a, b in zip(served, reference) for x, y in zip(a, b)) / (
            len(prompts) * NEW_TOKENS
        )
        record()
        figures["tok_s"] = _rates(grpc, vocab, t5)
        record()
    finally:
        stopped = _ftx("stop", "--all", env=env, timeout=180)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    # a wrong layout gives unrelated tokens from the first step on; random weights only flip near-ties
    assert float(figures["agree_first"]) >= 0.5, figures  # type: ignore[arg-type]
    # again, every stage cached: the time a user waits for a model ftx has prepared before
    t0 = time.perf_counter()
    again = _ftx(*argv, env=env, timeout=900)
    figures["ready_cached_s"] = round(time.perf_counter() - t0, 1)
    _ftx("stop", "--all", env=env, timeout=180)
    assert again.returncode == 0, again.stderr[-4000:]
    hits = [json.loads(line) for line in again.stderr.splitlines() if line.startswith("{")]
    figures["cached_stages"] = sorted({e.get("stage") for e in hits if e.get("event") == "cache.hit"} - {None})
    record()
    # the next shape needs the disk: this one's store entries and checkpoint go
    _ftx("rm", str(source), env=env, timeout=300)
    shutil.rmtree(source, ignore_errors=True)
