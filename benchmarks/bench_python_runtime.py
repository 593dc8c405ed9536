#!/usr/bin/env python
"""Benchmark of ftx's python runtime: tokens/s through the server vs transformers in-process,
plus the built-in default's time to first token and a fully cached ``ftx run``'s time to ready.

What it does, in one run:

1. builds a synthetic GPT-J (random weights, a small trained tokenizer) of the chosen size —
   by default ~1B parameters (16 layers x 2048, 16 heads, vocab 50400) saved in fp16;
2. runs the ftx pipeline on it (fetch → convert → tune → configure → serve, python runtime) and
   keeps the server up;
3. loads the same checkpoint with ``transformers`` in this process (same device and dtype);
4. for each batch size, alternates: one request of B prompts to the server's raw
   ``fastertransformer`` model over gRPC, then the same prompts through ``model.generate`` here —
   greedy, exactly ``--new-tokens`` tokens each (end_id is set out of the vocabulary) — and reports
   median tokens/s of both and their ratio; the generated tokens are compared as a sanity check;
5. in a fresh FTX_HOME: ``ftx run tiny-gptj --prompt … --max-tokens 1`` from the command to the
   printed token (builds the demo, converts, configures, starts), then ``ftx run tiny-gptj`` again
   (every stage cached) from the command to "Ctrl-C stops the server" (ready and printed).

With ``--modes eager,lean,graph,…`` it measures the python runtime's decoding modes instead
(``FTX_PYTHON_COMPILE``'s values) in this process, without a server: the same checkpoint loaded once,
ftx's ``Generator`` in each mode, per batch size a warm-up request (which captures or compiles) and
``--repeats`` timed ones, greedy; then one sampled request (top-k 40, temperature 0.8, seed 1) per mode.
Every mode's ids are compared with the eager mode's, and the figures are written to ``--json`` after
each mode, so a run cut short keeps what it measured.

Run on a GPU machine (``--device cuda`` is the default when torch sees CUDA)::

    python benchmarks/bench_python_runtime.py                  # ~1B fp16 GPT-J, batch 1 and 8
    python benchmarks/bench_python_runtime.py --json out.json  # also write the figures as JSON
    python benchmarks/bench_python_runtime.py --small          # a few-MB model on CPU (a smoke run)
    python benchmarks/bench_python_runtime.py --modes eager,lean,graph --layers 28 --hidden 4096 \
        --vocab 50400 --dtype fp16 --repeats 3 --json modes.json  # GPT-J-6B shape, decoding modes

The figures go into ``docs/benchmarks.md`` by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FULL = {
    "layers": 16,
    "hidden": 2048,
    "heads": 16,
    "rotary": 64,
    "vocab": 50400,
    "dtype": "fp16",
    "prompt_len": 64,
    "new_tokens": 128,
    "repeats": 5,
}
SMALL = {
    "layers": 2,
    "hidden": 256,
    "heads": 4,
    "rotary": 16,
    "vocab": 1024,
    "dtype": "fp32",
    "prompt_len": 16,
    "new_tokens": 32,
    "repeats": 3,
}


@dataclass
class BatchResult:
    batch: int
    server_tok_s: list[float] = field(default_factory=list)
    direct_tok_s: list[float] = field(default_factory=list)
    tokens_equal: bool = True

    @property
    def server_median(self) -> float:
        return statistics.median(self.server_tok_s)

    @property
    def direct_median(self) -> float:
        return statistics.median(self.direct_tok_s)

    @property
    def ratio(self) -> float:
        return self.server_median / self.direct_median


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the synthetic model


def build_synthetic_gptj(
    dest: Path, *, layers: int, hidden: int, heads: int, rotary: int, vocab: int, dtype: str, seed: int = 0
) -> Path:
    """A GPT-J with N(0, 0.02²) weights and a small BPE tokenizer (its <|endoftext|> is id 0)."""
    import torch
    from ftx_triton.runtime.python.hf_model import _no_init_weights
    from ftx_triton.tiny import END_OF_TEXT, train_bpe_tokenizer
    from transformers import GPTJConfig, GPTJForCausalLM

    no_init_weights = _no_init_weights()  # transformers 4 and 5 keep it in different modules

    if (dest / "config.json").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = train_bpe_tokenizer(tmp, vocab_size=400)
    eos = tokenizer.token_to_id(END_OF_TEXT)
    config = GPTJConfig(
        n_layer=layers,
        n_embd=hidden,
        n_head=heads,
        rotary_dim=rotary,
        vocab_size=vocab,
        n_positions=2048,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with no_init_weights():
        model = GPTJForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_f.weight")):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model.to(torch_dtype).save_pretrained(tmp, safe_serialization=True)  # type: ignore[arg-type]
    params = sum(p.numel() for p in model.parameters())
    (tmp / "bench.json").write_text(json.dumps({"parameters": params, "dtype": dtype}))
    os.replace(tmp, dest)
    return dest


# --------------------------------------------------------------------------- measuring


def build_preset_checkpoint(workdir: Path, preset: dict[str, Any]) -> Path:
    """The synthetic GPT-J of ``preset`` under ``workdir`` (its folder)."""
    say(
        f"building a synthetic GPT-J ({preset['layers']} x {preset['hidden']}, vocab {preset['vocab']}, "
        f"{preset['dtype']}) …"
    )
    return build_synthetic_gptj(
        workdir / "synthetic-gptj",
        layers=preset["layers"],
        hidden=preset["hidden"],
        heads=preset["heads"],
        rotary=preset["rotary"],
        vocab=preset["vocab"],
        dtype=preset["dtype"],
    )


def prompts(batch: int, length: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(1, min(vocab, 400), size=(batch, length), dtype=np.int64)


def server_generate(grpc_url: str, ids: np.ndarray, new_tokens: int, end_id: int) -> tuple[float, np.ndarray]:
    import tritonclient.grpc as grpcclient

    arrays = mode_request(ids, new_tokens, end_id, sampled=False)
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        inputs = []
        for name, value in arrays.items():
            tensor = grpcclient.InferInput(name, list(value.shape), "UINT32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        started = time.perf_counter()
        result = client.infer(
            "fastertransformer", inputs, outputs=[grpcclient.InferRequestedOutput("output_ids")], client_timeout=3600
        )
        seconds = time.perf_counter() - started
        return seconds, result.as_numpy("output_ids")[:, 0, ids.shape[1] :].astype(np.int64)
    finally:
        client.close()


def direct_generate(model: Any, ids: np.ndarray, new_tokens: int, end_id: int) -> tuple[float, np.ndarray]:
    import torch

    device = next(model.parameters()).device
    input_ids = torch.from_numpy(ids).to(device)
    attention = torch.ones_like(input_ids)
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=new_tokens,
            min_new_tokens=0,
            do_sample=False,
            num_beams=1,
            eos_token_id=end_id,
            pad_token_id=0,
        )
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return seconds, out[:, ids.shape[1] :].cpu().numpy()


def measure_throughput(
    grpc_url: str, model: Any, *, batches: list[int], prompt_len: int, new_tokens: int, repeats: int, vocab: int
) -> list[BatchResult]:
    end_id = vocab  # outside the vocabulary: every sequence generates exactly new_tokens tokens
    results = []
    for batch in batches:
        result = BatchResult(batch)
        ids = prompts(batch, prompt_len, vocab, seed=batch)
        # warm-up both paths at the measured length: a compiled server builds its graphs for this shape here
        server_generate(grpc_url, ids, new_tokens, end_id)
        direct_generate(model, ids, min(8, new_tokens), end_id)
        for r in range(repeats):
            s_seconds, s_tokens = server_generate(grpc_url, ids, new_tokens, end_id)
            d_seconds, d_tokens = direct_generate(model, ids, new_tokens, end_id)
            result.server_tok_s.append(batch * new_tokens / s_seconds)
            result.direct_tok_s.append(batch * new_tokens / d_seconds)
            result.tokens_equal &= bool(np.array_equal(s_tokens, d_tokens))
            say(
                f"  batch {batch} run {r + 1}/{repeats}: server {result.server_tok_s[-1]:8.1f} tok/s, "
                f"direct {result.direct_tok_s[-1]:8.1f} tok/s"
            )
        results.append(result)
    return results


# --------------------------------------------------------------------------- decoding modes (no server)


SAMPLED = {"runtime_top_k": 40, "temperature": 0.8, "random_seed": 1}


def mode_request(ids: np.ndarray, new_tokens: int, end_id: int, sampled: bool) -> dict[str, np.ndarray]:
    """A raw ``fastertransformer`` request of ``ids`` (every row generates exactly ``new_tokens``)."""
    batch, length = ids.shape
    inputs = {
        "input_ids": ids.astype(np.uint32),
        "input_lengths": np.full((batch, 1), length, np.uint32),
        "request_output_len": np.full((batch, 1), new_tokens, np.uint32),
        "end_id": np.full((batch, 1), end_id, np.uint32),
    }
    if sampled:
        inputs["runtime_top_k"] = np.full((batch, 1), SAMPLED["runtime_top_k"], np.uint32)
        inputs["temperature"] = np.full((batch, 1), SAMPLED["temperature"], np.float32)
        inputs["random_seed"] = np.full((batch, 1), SAMPLED["random_seed"], np.uint64)
    return inputs


def difference(got: np.ndarray, expected: np.ndarray) -> dict[str, Any]:
    """How far two [B, n] id arrays agree: equal rows, and the first differing (row, token), if any."""
    rows_equal = [bool(np.array_equal(a, b)) for a, b in zip(got, expected, strict=True)]
    where = np.argwhere(got != expected)
    first = None if where.size == 0 else [int(where[0][0]), int(where[0][1])]
    return {"rows_equal": f"{sum(rows_equal)}/{len(rows_equal)}", "first_difference_row_token": first}


def run_mode(generator: Any, inputs: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
    """Seconds and generated ids [B, n] of one request through ``generator`` (synchronised)."""
    import torch

    request = generator.parse(inputs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    results = generator.run(request.items)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return seconds, np.stack([r.tokens[0] for r in results])


def measure_modes(
    model: Any, modes: list[str], *, batches: list[int], preset: dict[str, Any], json_path: Path | None, report: dict
) -> list[dict[str, Any]]:
    """Each mode x batch: median tok/s of ``repeats`` greedy requests after a warm-up, ids against eager's."""
    from dataclasses import replace

    from ftx_triton.runtime.python.generation import Generator

    vocab, new_tokens = preset["vocab"], preset["new_tokens"]
    end_id = vocab  # outside the vocabulary: every sequence generates exactly new_tokens tokens
    base = Generator.for_model(model, end_id=end_id, start_id=0)
    rows: list[dict[str, Any]] = []
    reference: dict[tuple[int, bool], np.ndarray] = {}
    lean: dict[int, np.ndarray] = {}  # the lean loop's greedy ids: a graph replays its kernels, so they must match
    eager_median: dict[int, float] = {}
    for mode in modes:
        generator = replace(base, mode=mode)
        for batch in batches:
            ids = prompts(batch, preset["prompt_len"], vocab, seed=batch)
            row: dict[str, Any] = {"mode": mode, "batch": batch, "tok_s": []}
            fallbacks_before = len(generator.decoder.fallbacks) if generator.decoder is not None else 0
            try:
                started = time.perf_counter()
                run_mode(generator, mode_request(ids, new_tokens, end_id, sampled=False))  # warm-up: capture/compile
                row["warmup_s"] = round(time.perf_counter() - started, 2)
                equal = True
                for r in range(preset["repeats"]):
                    seconds, tokens = run_mode(generator, mode_request(ids, new_tokens, end_id, sampled=False))
                    row["tok_s"].append(round(batch * new_tokens / seconds, 1))
                    expected = reference.setdefault((batch, False), tokens)
                    equal &= bool(np.array_equal(tokens, expected))
                    say(f"  {mode} batch {batch} run {r + 1}/{preset['repeats']}: {row['tok_s'][-1]:8.1f} tok/s")
                row["median_tok_s"] = statistics.median(row["tok_s"])
                row["ids_equal_eager"] = equal
                row["ids_vs_eager"] = difference(tokens, reference[(batch, False)])
                if mode == "lean":
                    lean[batch] = tokens
                elif batch in lean:
                    row["ids_vs_lean"] = difference(tokens, lean[batch])
                _seconds, tokens = run_mode(generator, mode_request(ids, new_tokens, end_id, sampled=True))
                row["sampled_ids_equal_eager"] = bool(
                    np.array_equal(tokens, reference.setdefault((batch, True), tokens))
                )
                if mode == modes[0]:
                    eager_median[batch] = row["median_tok_s"]
                if batch in eager_median:
                    row["vs_first_mode"] = round(row["median_tok_s"] / eager_median[batch], 2)
            except Exception as error:  # one mode failing leaves the others measured
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                say(f"  {mode} batch {batch} failed: {row['error']}")
            if generator.decoder is not None and len(generator.decoder.fallbacks) > fallbacks_before:
                row["fallbacks"] = generator.decoder.fallbacks[fallbacks_before:]
            rows.append(row)
            if json_path is not None:
                json_path.write_text(json.dumps({**report, "modes": rows}, indent=2))
        generator.decoder = None  # free this mode's static caches and graphs before the next
        _free_gpu_memory()
    return rows


def _free_gpu_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_modes(
    workdir: Path,
    preset: dict[str, Any],
    batches: list[int],
    device: str,
    modes: list[str],
    args: Any,
    report: dict[str, Any],
) -> list[dict[str, Any]]:
    import torch
    from transformers import GPTJForCausalLM

    src = build_preset_checkpoint(workdir, preset)
    report["parameters"] = json.loads((src / "bench.json").read_text())["parameters"]
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[preset["dtype"]]
    model = GPTJForCausalLM.from_pretrained(src, dtype=dtype).to(device).eval()
    say(
        f"measuring modes {', '.join(modes)} (greedy, prompt {preset['prompt_len']}, {preset['new_tokens']} new tokens) …"
    )
    return measure_modes(model, modes, batches=batches, preset=preset, json_path=args.json, report=report)


def print_modes(rows: list[dict[str, Any]]) -> None:
    first = rows[0]["mode"] if rows else "?"
    print(
        f"{'mode':>12}  {'batch':>5}  {'tok/s':>8}  {'x ' + first:>9}  {'warm-up s':>9}  ids = eager  sampled = eager"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:>12}  {r['batch']:>5}  failed: {r['error'][:200]}")
            continue
        print(
            f"{r['mode']:>12}  {r['batch']:>5}  {r['median_tok_s']:>8.1f}  {r.get('vs_first_mode', float('nan')):>9.2f}  "
            f"{r['warmup_s']:>9.2f}  {'yes' if r['ids_equal_eager'] else 'NO':>11}  "
            f"{'yes' if r['sampled_ids_equal_eager'] else 'NO':>14}"
        )
        if not r["ids_equal_eager"]:
            print(f"{'':>12}  against eager: {r['ids_vs_eager']}")
        if "ids_vs_lean" in r:
            print(f"{'':>12}  against lean: {r['ids_vs_lean']}")
        for reason in r.get("fallbacks", []):
            print(f"{'':>12}  fell back to eager steps: {reason[:300]}")


# --------------------------------------------------------------------------- the built-in default


def _ftx() -> str:
    return str(Path(sys.executable).parent / "ftx")


def _read_until(proc: subprocess.Popen, predicate: Any, timeout_s: float) -> tuple[str | None, float]:
    """Read proc.stdout lines until one satisfies ``predicate``; (line, seconds since the call)."""
    found: list[tuple[str, float]] = []
    started = time.perf_counter()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if predicate(line):
                found.append((line, time.perf_counter() - started))
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return found[0] if found else (None, time.perf_counter() - started)


def measure_default(home: Path, prompt: str = "Once upon a time") -> dict[str, Any]:
    """The README's first command in a fresh FTX_HOME: command → first token (``--max-tokens 1``);
    then the same ``ftx run`` with every stage cached: command → ready ("Ctrl-C stops the server")."""
    env = {**os.environ, "FTX_HOME": str(home)}
    cmd = [_ftx(), "run", "tiny-gptj", "--runtime", "python"]
    started = time.perf_counter()
    first = subprocess.Popen(
        [*cmd, "--prompt", prompt, "--max-tokens", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    output, _ = _read_until(first, lambda text: text.startswith(prompt), 900)
    to_first_token = time.perf_counter() - started
    _, err = first.communicate(timeout=120)
    if first.returncode != 0 or output is None:
        raise RuntimeError(f"ftx run --prompt failed ({first.returncode}):\n{err[-3000:]}")
    started = time.perf_counter()
    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    ready, _ = _read_until(second, lambda text: "Ctrl-C stops the server" in text, 900)
    to_ready = time.perf_counter() - started
    second.send_signal(signal.SIGINT)
    _, err = second.communicate(timeout=120)
    if ready is None:
        raise RuntimeError(f"the cached ftx run never became ready:\n{err[-3000:]}")
    stages = {
        s: ("cached" if f"{s:<9} cached" in err else "redone" if f"{s:<9} done" in err else "?")
        for s in ("fetch", "convert", "tune", "configure")
    }
    return {
        "first_run_command_to_first_token_s": round(to_first_token, 2),
        "first_run_output": output.strip(),
        "cached_run_command_to_ready_s": round(to_ready, 2),
        "cached_run_stages": stages,
        "cached_run_exit_code": second.returncode,
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="a tiny model on CPU (a quick smoke run)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--dtype", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--prompt-len", type=int)
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--workdir", type=Path, help="where the model and FTX_HOME go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-default", action="store_true", help="skip the built-in default's timings")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--modes",
        help="comma-separated FTX_PYTHON_COMPILE modes to compare in-process, the first being the baseline "
        "(e.g. eager,lean,graph,cudagraphs,inductor); no server, no built-in default",
    )
    args = parser.parse_args(argv)

    import torch
    from ftx_triton.terminal.log import configure_logging

    configure_logging("console")  # events to stderr; the report alone goes to stdout
    preset = dict(SMALL if args.small else FULL)
    for key in ("layers", "hidden", "heads", "vocab", "dtype", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
    if device == "cpu" and preset["dtype"] == "fp16":
        say("note: fp16 on CPU runs as fp32 in the python runtime; using fp32 for both paths")
        preset["dtype"] = "fp32"
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ftx-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "cpus": os.cpu_count(),
        },
        "device": device,
        "model": preset,
        "batches": batches,
    }
    if args.modes:
        from ftx_triton.runtime.python.decode_loop import MODES

        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = sorted(set(modes) - set(MODES))
        if unknown:
            parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
        try:
            report["modes"] = run_modes(workdir, preset, batches, device, modes, args, report)
        finally:
            if not args.keep and args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        print_report(report)
        print_modes(report["modes"])
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        return 0
    try:
        if not args.skip_throughput:
            report["throughput"] = run_throughput(workdir, preset, batches, device)
        if not args.skip_default:
            say("built-in default: fresh FTX_HOME, then a fully cached second run …")
            report["default"] = measure_default(workdir / "default-home")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def run_throughput(workdir: Path, preset: dict[str, Any], batches: list[int], device: str) -> dict[str, Any]:
    import torch
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore
    from transformers import GPTJForCausalLM

    src = build_preset_checkpoint(workdir, preset)
    params = json.loads((src / "bench.json").read_text())["parameters"]
    home = workdir / "bench-home"
    home.mkdir(exist_ok=True)
    settings = RunSettings.of(
        str(src),
        runtime="python",
        weight_dtype=preset["dtype"],
        data_type=preset["dtype"],
        max_batch_size=max(batches),
        device=device,
    )
    say("ftx pipeline (python runtime) …")
    started = time.perf_counter()
    result = Pipeline(load_host(), ArtifactStore(home), settings, say=say).run()
    pipeline_s = time.perf_counter() - started
    assert result.endpoint is not None and result.endpoint.handle is not None, "the pipeline served nothing"
    endpoint, server = result.endpoint, result.endpoint.handle
    try:
        say("loading the same checkpoint with transformers in this process …")
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[preset["dtype"]]
        model = GPTJForCausalLM.from_pretrained(src, dtype=dtype).to(device).eval()
        say(
            f"measuring (greedy, prompt {preset['prompt_len']}, {preset['new_tokens']} new tokens, "
            f"{preset['repeats']} repeats) …"
        )
        results = measure_throughput(
            endpoint.grpc_url,
            model,
            batches=batches,
            prompt_len=preset["prompt_len"],
            new_tokens=preset["new_tokens"],
            repeats=preset["repeats"],
            vocab=preset["vocab"],
        )
    finally:
        server.stop()
    return {
        "parameters": params,
        "pipeline_to_ready_s": round(pipeline_s, 2),
        "results": [
            {
                **asdict(r),
                "server_median_tok_s": round(r.server_median, 1),
                "direct_median_tok_s": round(r.direct_median, 1),
                "ratio": round(r.ratio, 3),
            }
            for r in results
        ],
    }


def print_report(report: dict[str, Any]) -> None:
    machine = report["machine"]
    print(
        f"ftx python runtime benchmark — device {report['device']}"
        f"{' (' + machine['gpu'] + ')' if machine.get('gpu') else ''}, torch {machine['torch']}, "
        f"{machine['cpus']} CPUs"
    )
    if "throughput" in report:
        t = report["throughput"]
        m = report["model"]
        print(
            f"synthetic GPT-J: {t['parameters'] / 1e9:.2f} B parameters ({m['layers']} x {m['hidden']}, "
            f"vocab {m['vocab']}, {m['dtype']}); prompt {m['prompt_len']}, {m['new_tokens']} new tokens, "
            f"greedy, median of {m['repeats']}"
        )
        print(f"pipeline to ready (convert, configure, start, load): {t['pipeline_to_ready_s']} s")
        print(f"{'batch':>5}  {'server tok/s':>12}  {'direct tok/s':>12}  {'server/direct':>13}  same tokens")
        for r in t["results"]:
            print(
                f"{r['batch']:>5}  {r['server_median_tok_s']:>12.1f}  {r['direct_median_tok_s']:>12.1f}  "
                f"{r['ratio']:>13.3f}  {'yes' if r['tokens_equal'] else 'NO'}"
            )
    if "default" in report:
        d = report["default"]
        print(
            f"built-in default (tiny-gptj), fresh FTX_HOME: command → first token "
            f"{d['first_run_command_to_first_token_s']} s ({d['first_run_output']!r})"
        )
        stages = ", ".join(f"{k} {v}" for k, v in d["cached_run_stages"].items())
        print(f"second ftx run, all stages cached: command → ready {d['cached_run_command_to_ready_s']} s ({stages})")


if __name__ == "__main__":
    sys.exit(main())
