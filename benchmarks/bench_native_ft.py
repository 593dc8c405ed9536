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
   outside the vocabulary), greedy; tokens/s = batch x new tokens / request time, median. Every answer
   is checked token by token (:func:`generated_tokens`): each row must echo its prompt and hold
   ``--new-tokens`` generated ids inside the vocabulary, none of them end_id — a row that stopped
   early is padded with end_id while sequence_length may still claim the full length, so a count
   from sequence_length alone can report tokens that were never generated;
5. measures the GPU's memory bandwidth twice (a device-to-device copy, bytes read + written, and a
   read-only reduction) and reports the HBM bound of decoding: batch x read bandwidth / bytes read per
   step per GPU (every weight but the input embedding table, of which a step gathers only a row per
   sequence). A figure above the bound is a measurement fault, not a result: it is refused
   (:func:`within_bound`) and the table prints it as such.

``--dtypes``, ``--custom-all-reduce on off`` and ``--no-tune`` select the comparisons (FasterTransformer's
custom all-reduce at tp > 1, per compute type).

Run on a GPU machine with the backend built (``ftx backend build``) or buildable::

    python benchmarks/bench_native_ft.py --json out.json
    python benchmarks/bench_native_ft.py --shapes gptj --tps 1 --batches 1 8   # a shorter run
    python benchmarks/bench_native_ft.py --shapes gptj --tps 2 --batches 1 8 --dtypes fp16 bf16 \
        --custom-all-reduce off on --no-tune --no-python                         # the all-reduce choice

The figures go into ``docs/benchmarks.md`` by hand.
"""

from __future__ import annotations

import argparse
import hashlib
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_shapes import SHAPES, random_checkpoint  # noqa: E402 - beside this script


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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


class MeasurementFault(RuntimeError):
    """A figure that cannot be true (tokens not generated, a rate above the HBM bound)."""


def generated_tokens(
    prompts: np.ndarray, output_ids: np.ndarray, lengths: np.ndarray, new_tokens: int, end_id: int, vocab: int
) -> int:
    """Generated tokens of one answer, checked row by row: the prompt echoed, ``new_tokens`` ids after it,
    each inside the vocabulary and none of them end_id (FasterTransformer pads a row that stopped with
    end_id); sequence_length must agree. Raises MeasurementFault naming the first row that differs."""
    batch, prompt_len = prompts.shape
    ids = output_ids.reshape(batch, -1)
    lengths = lengths.reshape(batch)
    for row in range(batch):
        if int(lengths[row]) != prompt_len + new_tokens:
            raise MeasurementFault(
                f"row {row}: sequence_length {int(lengths[row])}, expected {prompt_len} + {new_tokens}"
            )
        if ids.shape[1] < prompt_len + new_tokens or not np.array_equal(ids[row, :prompt_len], prompts[row]):
            raise MeasurementFault(f"row {row}: the answer does not start with its prompt")
        gen = ids[row, prompt_len : prompt_len + new_tokens]
        bad = np.flatnonzero((gen == end_id) | (gen >= vocab))
        if bad.size:
            raise MeasurementFault(
                f"row {row}: only {int(bad[0])} of {new_tokens} tokens were generated "
                f"(then id {int(gen[bad[0]])}: end_id or outside the vocabulary)"
            )
    return batch * new_tokens


def within_bound(rate: float, bound: float, what: str) -> float:
    """``rate`` if it is at most the HBM bound, else MeasurementFault (a rate above it cannot be true)."""
    if rate > bound:
        raise MeasurementFault(f"{what}: {rate:.1f} tok/s is {rate / bound:.2f}x the HBM bound of {bound:.1f} tok/s")
    return rate


def random_request(batch: int, prompt_len: int, new_tokens: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """The raw model's inputs for ``batch`` random prompts of ``prompt_len`` ids: exactly ``new_tokens``
    new tokens each, since ``end_id`` (:func:`end_id_for`) lies outside the vocabulary."""
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(100, vocab - 1, size=(batch, prompt_len)).astype(np.uint32),
        "input_lengths": np.full((batch, 1), prompt_len, np.uint32),
        "request_output_len": np.full((batch, 1), new_tokens, np.uint32),
        "end_id": np.full((batch, 1), end_id_for(vocab), np.uint32),
    }


def end_id_for(vocab: int) -> int:
    """An end id no generated token can equal (outside a vocabulary of ``vocab`` ids)."""
    return vocab + 7


def infer(http_url: str, batch: int, prompt_len: int, new_tokens: int, vocab: int, seed: int) -> tuple[float, int, str]:
    """One request of ``batch`` random prompts; (seconds, generated tokens, checked by generated_tokens, and
    the sha256 of the generated ids, which runs that must decode alike compare)."""
    columns = random_request(batch, prompt_len, new_tokens, vocab, seed)
    ids, end_id = columns["input_ids"], end_id_for(vocab)
    payload = {
        "inputs": [
            {"name": k, "shape": list(v.shape), "datatype": "UINT32", "data": v.flatten().tolist()}
            for k, v in columns.items()
        ],
        "outputs": [{"name": "output_ids"}, {"name": "sequence_length"}],
    }
    request = urllib.request.Request(
        f"http://{http_url}/v2/models/fastertransformer/infer",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    seconds = time.perf_counter() - t0
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer["outputs"]}
    tokens = generated_tokens(ids, out["output_ids"], out["sequence_length"], new_tokens, end_id, vocab)
    generated = out["output_ids"].reshape(batch, -1)[:, prompt_len : prompt_len + new_tokens]
    return seconds, tokens, hashlib.sha256(generated.astype(np.int64).tobytes()).hexdigest()


def measure(
    http_url: str, batches: list[int], args: argparse.Namespace, vocab: int, bound: Any = None
) -> dict[int, Any]:
    """Median tokens/s per batch size (one warm-up request each); ``bound(batch)``: the HBM bound, above
    which a figure is refused (recorded as ``{"refused": why}``). ``ids[batch]``: the sha256 of every
    request's generated ids, joined (two runs that must decode alike compare them)."""
    out: dict[Any, Any] = {"ids": {}}
    for batch in batches:
        infer(http_url, batch, args.prompt_len, args.new_tokens, vocab, seed=99)
        rates, digests = [], []
        for r in range(args.repeats):
            seconds, tokens, digest = infer(http_url, batch, args.prompt_len, args.new_tokens, vocab, seed=r)
            rates.append(tokens / seconds)
            digests.append(digest)
        out["ids"][batch] = hashlib.sha256("".join(digests).encode()).hexdigest()[:16]
        rate = statistics.median(rates)
        try:
            out[batch] = within_bound(rate, bound(batch), f"batch {batch}") if bound else rate
            say(f"bench       batch {batch}: {rate:.1f} tok/s")
        except MeasurementFault as fault:
            out[batch] = {"refused": str(fault)}
            say(f"bench       batch {batch}: REFUSED {fault}")
    return out


def gpu_memory_mib() -> list[int]:
    """Memory in use per GPU (nvidia-smi), MiB."""
    import subprocess

    text = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [int(v) for v in text.split() if v.strip().isdigit()]


# --------------------------------------------------------------------------- the runs


def configured(
    source: Path,
    family: str,
    tp: int,
    runtime: str,
    home: Path,
    args: argparse.Namespace,
    dtype: str = "fp16",
    custom_all_reduce: bool | None = None,
) -> Any:
    """ftx's pipeline up to configure (no tuning: the benchmark tunes every batch size itself)."""
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore

    settings = RunSettings.of(
        str(source),
        runtime=runtime,
        tp=tp,
        weight_dtype=dtype,
        data_type=dtype,
        family=family,
        max_batch_size=max(args.batches),
        until="configure",
        tune=False,
        device="cuda",
        custom_all_reduce=custom_all_reduce,
    )
    result = Pipeline(load_host(), ArtifactStore(home), settings, say=say).run()
    return settings.replace(until="serve"), result


def step_bytes_per_gpu(checkpoint: Path, tp: int) -> tuple[int, int]:
    """(weight bytes, bytes a decoding step reads) per GPU: every weight file, and every one but the input
    embedding table (``model.wte.bin``: a step gathers one row of it per sequence)."""
    files = list(checkpoint.glob("*.bin"))
    total = sum(p.stat().st_size for p in files)
    embedding = sum(p.stat().st_size for p in files if p.name == "model.wte.bin")
    return total // tp, (total - embedding) // tp


def native_runs(
    name: str,
    source: Path,
    tp: int,
    home: Path,
    args: argparse.Namespace,
    built: Any,
    read_bw: float,
    dtype: str = "fp16",
    custom_all_reduce: bool | None = None,
) -> dict[str, Any]:
    from ftx_triton.plan.artifacts import GemmConfig
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.fastertransformer.native.serve import serve_native
    from ftx_triton.runtime.fastertransformer.native.tune import run_gemm_tool

    s = SHAPES[name]
    settings, result = configured(
        source, s["family"], tp, "fastertransformer-native", home, args, dtype, custom_all_reduce
    )
    weight_bytes, step_bytes = step_bytes_per_gpu(result.checkpoint.path, tp)
    family = load_host().family(s["family"])
    out: dict[str, Any] = {
        "weight_bytes": weight_bytes * tp,
        "step_bytes_per_gpu": step_bytes,
        "dtype": dtype,
        "tp": tp,
        "custom_all_reduce": custom_all_reduce,
    }
    runs = [("untuned", GemmConfig(None, False, "benchmark: untuned"))]
    if args.tune:
        gemm_dir = Path(tempfile.mkdtemp(prefix=f"gemm-{name}-tp{tp}-", dir=home))
        tune_s = 0.0
        for i, batch in enumerate(args.batches):
            t0 = time.perf_counter()
            run_gemm_tool(
                built,
                family.gemm_tool,
                family.gemm_args(
                    result.spec, batch=batch, beam=1, max_input_len=args.prompt_len, data_type=dtype, tp=tp
                ),
                gemm_dir,
                0,
                append=i > 0,
            )
            tune_s += time.perf_counter() - t0
        out["tune_seconds"] = round(tune_s, 1)
        runs.append(("tuned", GemmConfig(gemm_dir / "gemm_config.in", True, "benchmark: every batch size")))
    for label, gemm in runs:
        say(f"bench     {name} tp={tp} {dtype} custom all-reduce {custom_all_reduce} FasterTransformer {label}")
        t0 = time.perf_counter()
        endpoint = serve_native(result.repository, gemm, settings, built, home=home, say=say)
        out[f"ready_seconds_{label}"] = round(time.perf_counter() - t0, 1)
        out["memory_mib"] = gpu_memory_mib()
        try:
            out[label] = measure(
                endpoint.http_url, args.batches, args, s["vocab"], bound=lambda batch: batch * read_bw / step_bytes
            )
        finally:
            _stop(endpoint)
        if args.json:  # what is measured so far survives a run cut short
            args.json.with_suffix(".partial.json").write_text(json.dumps(out, indent=2))
    return out


def _stop(endpoint: Any) -> None:
    """Stop the server behind ``endpoint`` (every endpoint a runtime returns has one)."""
    assert endpoint.handle is not None, "an endpoint without its server"
    endpoint.handle.stop()


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
        _stop(endpoint)


def read_bandwidth_gbs() -> float:
    """A read-only reduction over 4 GiB, bytes read per second (median of 10 after 3 warm-ups): what
    decoding's weight reads can reach, so the bound built on it is a ceiling."""
    import torch

    a = torch.ones(1 << 31, dtype=torch.float16, device="cuda")
    times = []
    for i in range(13):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a.sum(dtype=torch.float32)
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    del a
    torch.cuda.empty_cache()
    return (1 << 32) / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["gptj", "gptneox"], choices=list(SHAPES))
    parser.add_argument("--tps", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--dtypes", nargs="+", default=["fp16"], choices=["fp16", "bf16"])
    parser.add_argument(
        "--custom-all-reduce",
        nargs="+",
        default=["default"],
        choices=["default", "on", "off"],
        help="FasterTransformer's custom all-reduce at tp > 1: each value is a run.",
    )
    parser.add_argument("--no-tune", dest="tune", action="store_false", help="Untuned runs only (no gpt_gemm).")
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
    from ftx_triton.store.artifact_store import ArtifactStore

    built = backend_for(ArtifactStore(home), sm=options.sm, sources=options.sources, say=say, show_progress=False)
    bandwidth, read_bw = hbm_bandwidth_gbs(), read_bandwidth_gbs()
    say(f"bench     device-to-device copy: {bandwidth:.0f} GB/s (read + write); read-only: {read_bw:.0f} GB/s")
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": len(gpus),
        "bandwidth_gbs": round(bandwidth, 1),
        "read_bandwidth_gbs": round(read_bw, 1),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "batches": args.batches,
        "build": built.key,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "argv": sys.argv[1:],
        "shapes": {},
    }
    choice = {"default": None, "on": True, "off": False}
    for name in args.shapes:
        source = random_checkpoint(name, work / f"hf-{name}")
        entry: dict[str, Any] = {"shape": SHAPES[name], "native": {}}
        report["shapes"][name] = entry
        for dtype in args.dtypes:
            for tp in args.tps:
                for car in args.custom_all_reduce if tp > 1 else ["default"]:
                    key = f"{dtype} tp{tp}" + (f" all-reduce {car}" if car != "default" else "")
                    try:
                        entry["native"][key] = native_runs(
                            name, source, tp, home, args, built, read_bw * 1e9, dtype, choice[car]
                        )
                    except Exception as exc:  # noqa: BLE001 - the table says which run failed and why
                        entry["native"][key] = {"error": str(exc).splitlines()[0][:300] if str(exc) else repr(exc)}
                        say(f"bench     {key} failed: {entry['native'][key]['error']}")
                    if args.json:
                        args.json.write_text(json.dumps(report, indent=2))
        if not args.no_python:
            try:
                entry["python"] = python_runs(name, source, home, args)
            except Exception as exc:  # noqa: BLE001 - the table says why the column is empty
                entry["python_error"] = str(exc).splitlines()[0][:300]
                say(f"bench     {name} python runtime failed: {entry['python_error']}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    report["ids_equal"] = ids_equal(report)
    print(markdown(report))
    for line in report["ids_equal"]:
        print(line)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def ids_equal(report: dict[str, Any]) -> list[str]:
    """For each run with custom all-reduce on and its run with it off: whether every request's generated
    ids were the same (untuned runs, per batch size)."""
    lines = []
    for name, entry in report["shapes"].items():
        runs = entry["native"]
        for key, run in runs.items():
            off = runs.get(key.replace("all-reduce on", "all-reduce off")) if key.endswith("all-reduce on") else None
            if not off or "error" in run or "error" in off:
                continue
            mine, theirs = run["untuned"].get("ids", {}), off["untuned"].get("ids", {})
            for batch in report["batches"]:
                same = mine.get(batch) is not None and mine.get(batch) == theirs.get(batch)
                lines.append(
                    f"{name} {key} batch {batch}: token ids {'EQUAL to' if same else 'DIFFER from'} all-reduce off"
                )
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, (int, float)):
        return f"{value:.1f}"
    if isinstance(value, dict) and "refused" in value:
        return "refused (over the bound)"
    return "-"


def markdown(report: dict[str, Any]) -> str:
    """The table for docs/benchmarks.md (a refused figure is printed as refused, never as a number)."""
    bw = report.get("read_bandwidth_gbs", report["bandwidth_gbs"]) * 1e9
    header = (
        "| shape | run | batch | FT untuned tok/s | FT tuned tok/s | tuned / untuned | python tok/s | FT / python "
        "| HBM bound tok/s | FT / bound | GPU memory MiB |"
    )
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, entry in report["shapes"].items():
        python = entry.get("python") or {}
        for key, run in entry["native"].items():
            if "error" in run:
                lines.append(f"| {name} | {key} | - | failed: {run['error']} | | | | | | | |")
                continue
            tp = int(run.get("tp", key.split("tp")[-1].split()[0]))
            per_gpu = run.get("step_bytes_per_gpu") or run["weight_bytes"] / tp
            for batch in report["batches"]:
                un, tu = run.get("untuned", {}).get(batch, run.get("untuned", {}).get(str(batch))), None
                if "tuned" in run:
                    tu = run["tuned"].get(batch, run["tuned"].get(str(batch)))
                best = tu if isinstance(tu, (int, float)) else un
                bound = batch * bw / per_gpu
                py = python.get(batch, python.get(str(batch))) if tp == 1 else None
                ratio = f"{tu / un:.2f}x" if isinstance(tu, (int, float)) and isinstance(un, (int, float)) else "-"
                vs_py = f"{best / py:.1f}x" if isinstance(py, (int, float)) and isinstance(best, (int, float)) else "-"
                vs_bound = f"{best / bound:.2f}" if isinstance(best, (int, float)) else "-"
                memory = "/".join(map(str, run.get("memory_mib", []))) or "-"
                lines.append(
                    f"| {name} | {key} | {batch} | {_cell(un)} | {_cell(tu)} | {ratio} | {_cell(py)} | {vs_py} "
                    f"| {bound:.0f} | {vs_bound} | {memory} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
