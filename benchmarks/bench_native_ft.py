#!/usr/bin/env python
"""Benchmark of the native FasterTransformer runtime against ftx's python runtime and the HBM bound.

What it does, in one run, for each model shape (GPT-J-6B-shaped, and a GPT-NeoX shape):

1. builds a random fp16 Hugging Face checkpoint of that shape on the GPU (default init, saved with
   ``save_pretrained``; a small trained tokenizer rides along for the repository's text models);
2. for each tp: converts and configures it with ftx (``--runtime fastertransformer-native``, fp16
   weights and compute), serves it untuned, then runs ``gpt_gemm`` for every batch size (appending to
   one ``gemm_config.in``, prompt length as the context length) and serves it again tuned;
3. serves it with the python runtime (transformers in the embedded tritonserver, one GPU);
4. sends the raw ``fastertransformer`` model ``--repeats`` requests per batch size (after one warm-up):
   random prompts of ``--prompt-len`` tokens, exactly ``--new-tokens`` new tokens each (end_id is set
   outside the vocabulary), greedy; tokens/s = batch x new tokens / request time, median;
5. measures the GPU's memory bandwidth (a device-to-device copy, bytes read + written) and reports the
   HBM bound of decoding: batch x bandwidth / weight bytes per GPU (every weight is read once per step).

Run on a GPU machine with the backend built (``ftx backend build``) or buildable::

    python benchmarks/bench_native_ft.py --json out.json
    python benchmarks/bench_native_ft.py --shapes gptj --tps 1 --batches 1 8   # a shorter run

The figures go into ``docs/benchmarks.md`` by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

SHAPES: dict[str, dict[str, Any]] = {
    # GPT-J-6B: 28 layers x 4096, 16 heads of 256, rotary 64, vocab 50400
    "gptj": {"family": "gptj", "layers": 28, "hidden": 4096, "heads": 16, "rotary": 64, "vocab": 50400,
             "inter": 16384},
    # GPT-NeoX-architecture 6.9B (Pythia-6.9B's shape): 32 layers x 4096, 32 heads of 128, rotary 25%, vocab 50432
    "gptneox": {"family": "gptneox", "layers": 32, "hidden": 4096, "heads": 32, "rotary_pct": 0.25, "vocab": 50432,
                "inter": 16384},
}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the model


def random_checkpoint(name: str, dest: Path) -> Path:
    """A random fp16 checkpoint of ``SHAPES[name]`` made on the GPU, plus a small trained tokenizer."""
    import torch
    import transformers
    from ftx_triton.fetching.tiny import train_bpe_tokenizer

    s = SHAPES[name]
    tok = train_bpe_tokenizer(dest)
    eos = tok.token_to_id("<|endoftext|>")
    if s["family"] == "gptj":
        config = transformers.GPTJConfig(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"],
                                         rotary_dim=s["rotary"], vocab_size=s["vocab"], n_inner=s["inter"],
                                         n_positions=2048, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=False)
        cls = transformers.GPTJForCausalLM
    else:
        config = transformers.GPTNeoXConfig(num_hidden_layers=s["layers"], hidden_size=s["hidden"],
                                            num_attention_heads=s["heads"], rotary_pct=s["rotary_pct"],
                                            vocab_size=s["vocab"], intermediate_size=s["inter"],
                                            max_position_embeddings=2048, use_parallel_residual=True,
                                            bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=False)
        cls = transformers.GPTNeoXForCausalLM
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device("cuda"):
        model = cls(config).to(torch.float16)
    model.save_pretrained(dest, safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    say(f"bench     {name}: random checkpoint in {time.perf_counter() - started:.1f} s -> {dest}")
    return dest


def hbm_bandwidth_gbs() -> float:
    """Device-to-device copy of 4 GiB, bytes read + written per second (median of 10 after 3 warm-ups)."""
    import torch

    n = 1 << 31  # fp16 elements: 4 GiB
    a = torch.empty(n, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    times = []
    for i in range(13):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 2 / statistics.median(times) / 1e9


# --------------------------------------------------------------------------- requests


def infer(http_url: str, batch: int, prompt_len: int, new_tokens: int, vocab: int, seed: int) -> tuple[float, int]:
    """One request of ``batch`` random prompts; (seconds, generated tokens counted from sequence_length)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(100, vocab - 1, size=(batch, prompt_len)).astype(np.uint32)
    columns = {"input_ids": ids, "input_lengths": np.full((batch, 1), prompt_len, np.uint32),
               "request_output_len": np.full((batch, 1), new_tokens, np.uint32),
               "end_id": np.full((batch, 1), vocab + 7, np.uint32)}
    payload = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "UINT32", "data": v.flatten().tolist()}
                          for k, v in columns.items()],
               "outputs": [{"name": "sequence_length"}]}
    request = urllib.request.Request(f"http://{http_url}/v2/models/fastertransformer/infer",
                                     data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    seconds = time.perf_counter() - t0
    lengths = np.array(answer["outputs"][0]["data"])
    return seconds, int((lengths - prompt_len).sum())


def measure(http_url: str, batches: list[int], args: argparse.Namespace, vocab: int) -> dict[int, float]:
    """Median tokens/s per batch size (one warm-up request each)."""
    out = {}
    for batch in batches:
        infer(http_url, batch, args.prompt_len, args.new_tokens, vocab, seed=99)
        rates = []
        for r in range(args.repeats):
            seconds, tokens = infer(http_url, batch, args.prompt_len, args.new_tokens, vocab, seed=r)
            if tokens != batch * args.new_tokens:
                raise RuntimeError(f"expected {batch * args.new_tokens} new tokens, got {tokens}")
            rates.append(tokens / seconds)
        out[batch] = statistics.median(rates)
        say(f"bench       batch {batch}: {out[batch]:.1f} tok/s")
    return out


# --------------------------------------------------------------------------- the runs


def configured(source: Path, family: str, tp: int, runtime: str, home: Path, args: argparse.Namespace) -> Any:
    """ftx's pipeline up to configure (no tuning: the benchmark tunes every batch size itself)."""
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore

    settings = RunSettings.of(str(source), runtime=runtime, tp=tp, weight_dtype="fp16", data_type="fp16",
                              family=family, max_batch_size=max(args.batches), until="configure", tune=False,
                              device="cuda")
    result = Pipeline(load_host(), ArtifactStore(home), settings, say=say).run()
    return settings.replace(until="serve"), result


def native_runs(name: str, source: Path, tp: int, home: Path, args: argparse.Namespace, built: Any) -> dict[str, Any]:
    from ftx_triton.plan.artifacts import GemmConfig
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.fastertransformer.native.serve import serve_native
    from ftx_triton.runtime.fastertransformer.native.tune import run_gemm_tool

    s = SHAPES[name]
    settings, result = configured(source, s["family"], tp, "fastertransformer-native", home, args)
    weight_bytes = sum(p.stat().st_size for p in result.checkpoint.path.glob("*.bin"))
    family = load_host().family(s["family"])
    out: dict[str, Any] = {"weight_bytes": weight_bytes}
    gemm_dir = Path(tempfile.mkdtemp(prefix=f"gemm-{name}-tp{tp}-", dir=home))
    tune_s = 0.0
    for i, batch in enumerate(args.batches):
        t0 = time.perf_counter()
        run_gemm_tool(built, family.gemm_tool, family.gemm_args(result.spec, batch=batch, beam=1,
                                                                  max_input_len=args.prompt_len, data_type="fp16",
                                                                  tp=tp), gemm_dir, 0, append=i > 0)
        tune_s += time.perf_counter() - t0
    out["tune_seconds"] = round(tune_s, 1)
    for label, gemm in (("untuned", GemmConfig(None, False, "benchmark: untuned")),
                        ("tuned", GemmConfig(gemm_dir / "gemm_config.in", True, "benchmark: every batch size"))):
        say(f"bench     {name} tp={tp} FasterTransformer {label}")
        t0 = time.perf_counter()
        endpoint = serve_native(result.repository, gemm, settings, built, home=home, say=say)
        out[f"ready_seconds_{label}"] = round(time.perf_counter() - t0, 1)
        try:
            out[label] = measure(endpoint.http_url, args.batches, args, s["vocab"])
        finally:
            endpoint.handle.stop()
    return out


def python_runs(name: str, source: Path, home: Path, args: argparse.Namespace) -> dict[int, float]:
    from ftx_triton.plan.context import StageContext
    from ftx_triton.runtime.python.serve import serve_python
    from ftx_triton.store.artifact_store import ArtifactStore

    s = SHAPES[name]
    settings, result = configured(source, s["family"], 1, "python", home, args)
    say(f"bench     {name} python runtime")
    ctx = StageContext(settings=settings, store=ArtifactStore(home), home=home)
    endpoint = serve_python(result.repository, ctx)
    try:
        return measure(endpoint.http_url, args.batches, args, s["vocab"])
    finally:
        endpoint.handle.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tps", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-python", action="store_true", help="Skip the python runtime.")
    parser.add_argument("--work", type=Path, help="Where checkpoints and FTX_HOME go (default: a temp dir).")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    args = parser.parse_args()

    import torch
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.fastertransformer.gpus import local_gpus
    from ftx_triton.runtime.fastertransformer.native.options import NativeOptions, backend_for

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-native-"))
    home = Path(os.environ.get("FTX_HOME") or work / "home")
    gpus = local_gpus()
    args.tps = [tp for tp in args.tps if tp <= len(gpus)]
    options = NativeOptions.from_settings(RunSettings.of("x"))
    built = backend_for(sm=options.sm, sources=options.sources, home=home, say=say, show_progress=False)
    bandwidth = hbm_bandwidth_gbs()
    say(f"bench     device-to-device copy: {bandwidth:.0f} GB/s (read + write)")
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0), "gpus": len(gpus), "bandwidth_gbs": round(bandwidth, 1),
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats,
        "batches": args.batches, "build": built.key, "torch": torch.__version__, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"), "shapes": {},
    }
    for name in args.shapes:
        source = random_checkpoint(name, work / f"hf-{name}")
        entry: dict[str, Any] = {"shape": SHAPES[name], "native": {}}
        for tp in args.tps:
            entry["native"][tp] = native_runs(name, source, tp, home, args, built)
        if not args.no_python:
            try:
                entry["python"] = python_runs(name, source, home, args)
            except Exception as exc:  # noqa: BLE001 - the table says why the column is empty
                entry["python_error"] = str(exc).splitlines()[0][:300]
                say(f"bench     {name} python runtime failed: {entry['python_error']}")
        report["shapes"][name] = entry
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def markdown(report: dict[str, Any]) -> str:
    """The table for docs/benchmarks.md."""
    bw = report["bandwidth_gbs"] * 1e9
    header = ("| shape | tp | batch | FT untuned tok/s | FT tuned tok/s | tuned / untuned | python tok/s | FT / python "
              "| HBM bound tok/s | FT / bound |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, entry in report["shapes"].items():
        python = entry.get("python") or {}
        for tp, run in entry["native"].items():
            per_gpu = run["weight_bytes"] / int(tp)
            for batch in report["batches"]:
                un, tu = run["untuned"][batch], run["tuned"][batch]
                bound = batch * bw / per_gpu
                py = python.get(batch) if int(tp) == 1 else None
                lines.append(f"| {name} | {tp} | {batch} | {un:.1f} | {tu:.1f} | {tu / un:.2f}x | "
                             f"{f'{py:.1f}' if py else '-'} | {f'{tu / py:.1f}x' if py else '-'} | {bound:.0f} | "
                             f"{tu / bound:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
