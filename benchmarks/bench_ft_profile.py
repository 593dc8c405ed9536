#!/usr/bin/env python
"""Where a FasterTransformer decoding step goes, and which server settings make it shorter.

For one model shape at one tp (default: GPT-J-6B shape, tp 2, fp16), in one run:

1. ``--prep``: the random checkpoint and its conversion (no backend needed: run it while the backend builds);
2. variants: the same converted model served under each setting of ``VARIANTS`` (custom all-reduce on or
   off, ``FTX_GPTJ_ONE_ALLREDUCE``, NCCL protocol, the decoding step in a CUDA graph: ``FTX_FT_CUDA_GRAPH``),
   untuned, measured like ``bench_native_ft.py`` (random 64-token prompts, exactly 128 new tokens, greedy,
   median of ``--repeats`` after a warm-up, every answer checked; speed and the sha256 of the generated ids
   compared with the first variant's, or a graph variant's with its eager twin's);
3. ``--trace-lib``: the first variant (or ``--trace-variant``) once more with ``benchmarks/native/cupti_trace.cc``
   injected into the server (CUDA_INJECTION64_PATH), one batch-1 request, and :func:`analyse` of its trace: per decoding step
   the GPU time of each kernel, how busy each GPU was, the CUDA calls the host made, and how long the host
   waited at the step's end for the GPU (FasterTransformer's length criterion spins on a pinned flag every
   step). A host that launches slower than the GPU runs shows as a GPU idle between kernels and a host that
   hardly waits.

    python benchmarks/bench_ft_profile.py --work /tmp/prof --prep
    python benchmarks/bench_ft_profile.py --work /tmp/prof --trace-lib libftx_cupti_trace.so --json prof.json

The figures go into ``docs/benchmarks.md`` by hand.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_native_ft as bn  # noqa: E402 - beside this script
from seed_shapes import SHAPES, random_checkpoint  # noqa: E402 - beside this script

# label -> (custom all-reduce, environment of the server)
VARIANTS: dict[str, tuple[bool, dict[str, str]]] = {
    "custom AR, 2 AR/layer": (True, {"FTX_GPTJ_ONE_ALLREDUCE": "0"}),
    "custom AR, 1 AR/layer": (True, {"FTX_GPTJ_ONE_ALLREDUCE": "1"}),
    "NCCL, 2 AR/layer": (False, {"FTX_GPTJ_ONE_ALLREDUCE": "0"}),
    "NCCL, 1 AR/layer": (False, {"FTX_GPTJ_ONE_ALLREDUCE": "1"}),
    "NCCL LL, 2 AR/layer": (False, {"FTX_GPTJ_ONE_ALLREDUCE": "0", "NCCL_PROTO": "LL"}),
    # GPT-J's decoder step captured in a CUDA graph and replayed (FTX_FT_CUDA_GRAPH=1); each is compared with
    # its eager twin, the same label without ", graph"
    "custom AR, 2 AR/layer, graph": (True, {"FTX_GPTJ_ONE_ALLREDUCE": "0", "FTX_FT_CUDA_GRAPH": "1"}),
    "custom AR, 1 AR/layer, graph": (True, {"FTX_GPTJ_ONE_ALLREDUCE": "1", "FTX_FT_CUDA_GRAPH": "1"}),
    "NCCL, 2 AR/layer, graph": (False, {"FTX_GPTJ_ONE_ALLREDUCE": "0", "FTX_FT_CUDA_GRAPH": "1"}),
}
GRAPH = ", graph"
SET_BY_VARIANTS = {
    "FTX_GPTJ_ONE_ALLREDUCE",
    "FTX_FT_CUDA_GRAPH",
    "NCCL_PROTO",
    "CUDA_INJECTION64_PATH",
    "FTX_CUPTI_OUT",
}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _short(name: str) -> str:
    """A kernel's name without templates and arguments (cuBLAS kernels keep their tile name)."""
    name = re.sub(r"\(.*", "", name.removeprefix("void "))
    name = re.sub(r"<.*", "", name)
    return name.split("::")[-1][:80]


def analyse(trace: Path, steps: int = 100) -> dict[str, Any]:
    """Per-step figures of the last ``steps`` decoding steps in a cupti_trace file (see the module doc)."""
    kernels: dict[int, list[tuple[int, int, int, str]]] = defaultdict(list)
    apis: dict[int, list[tuple[int, int, int, str]]] = defaultdict(list)
    launch_of: dict[int, tuple[int, int, int]] = {}
    for line in trace.read_text(errors="replace").splitlines():
        f = line.split("\t")
        if f[0] == "K" and len(f) >= 7:
            kernels[int(f[1])].append((int(f[3]), int(f[4]), int(f[5]), f[6]))
        elif f[0] == "A" and len(f) >= 6:
            thread, start, end, corr = int(f[1]), int(f[2]), int(f[3]), int(f[4])
            apis[thread].append((start, end, corr, f[5]))
            launch_of[corr] = (thread, start, end)
    for calls_of in apis.values():
        calls_of.sort()
    starts = {thread: [a[0] for a in calls_of] for thread, calls_of in apis.items()}
    out: dict[str, Any] = {"devices": {}}
    for dev, ks in sorted(kernels.items()):
        ks.sort()
        marks = [k for k in ks if "length_criterion" in k[3]]
        if len(marks) < steps + 1:
            out["devices"][dev] = {"error": f"{len(marks)} length_criterion kernels, fewer than {steps + 1}"}
            continue
        marks = marks[-(steps + 1) :]
        t0, t1 = marks[0][1], marks[-1][1]
        window = [k for k in ks if k[0] >= t0 and k[1] <= t1]
        durations = [b[1] - a[1] for a, b in zip(marks, marks[1:], strict=False)]
        per_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        busy, last_end = 0, t0
        for start, end, _corr, name in window:
            entry = per_name[_short(name)]
            entry[0] += end - start
            entry[1] += 1
            busy += max(0, end - max(start, last_end))
            last_end = max(last_end, end)
        span = t1 - t0
        top = sorted(per_name.items(), key=lambda kv: -kv[1][0])
        # the host: its wait at each step's end (from the length criterion's launch to its next CUDA call)
        waits, host_spans = [], []
        for prev, mark in zip(marks, marks[1:], strict=False):
            launch = launch_of.get(mark[2])
            prev_launch = launch_of.get(prev[2])
            if launch is None or prev_launch is None:
                continue
            thread, _s, launched = launch
            at = bisect.bisect_left(starts[thread], launched)
            if at < len(starts[thread]):
                waits.append(starts[thread][at] - launched)
            host_spans.append(launched - prev_launch[2])
        last = launch_of.get(marks[-1][2])
        calls: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        if last is not None:
            for start, end, _corr, name in apis[last[0]]:
                if t0 <= start <= t1:
                    calls[name][0] += end - start
                    calls[name][1] += 1
        out["devices"][dev] = {
            "steps": steps,
            "step_us_median": statistics.median(durations) / 1e3,
            "kernels_per_step": len(window) / steps,
            "gpu_busy_fraction": busy / span,
            "gpu_idle_us_per_step": (span - busy) / steps / 1e3,
            "host_wait_at_step_end_us_median": statistics.median(waits) / 1e3 if waits else None,
            "host_launch_span_us_median": statistics.median(host_spans) / 1e3 if host_spans else None,
            # the host's own time per step: the span from one step's end to the next, less its wait there
            "host_launching_us_median": (
                statistics.median(host_spans) / 1e3 - statistics.median(waits) / 1e3 if host_spans and waits else None
            ),
            "kernels": [
                {"name": n, "us_per_step": t / steps / 1e3, "per_step": c / steps, "share": t / span}
                for n, (t, c) in top[:25]
            ],
            "host_calls": [
                {"name": n, "us_per_step": t / steps / 1e3, "per_step": c / steps}
                for n, (t, c) in sorted(calls.items(), key=lambda kv: -kv[1][0])[:12]
            ],
        }
    return out


def _environment(extra: dict[str, str]) -> None:
    for name in SET_BY_VARIANTS:
        os.environ.pop(name, None)
    os.environ.update(extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="gptj", choices=list(SHAPES))
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--work", type=Path, required=True, help="Checkpoint and FTX_HOME (kept between --prep and the run)."
    )
    parser.add_argument("--prep", action="store_true", help="Only make and convert the checkpoint.")
    parser.add_argument("--trace-lib", type=Path, help="libftx_cupti_trace.so: also profile the first variant.")
    parser.add_argument("--trace-after", type=int, default=2, help="Trace after this many variants have run.")
    parser.add_argument(
        "--trace-variant", choices=list(VARIANTS), help="The variant to trace (default: the first of --variants)."
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.tune = False

    home = Path(os.environ.get("FTX_HOME") or args.work / "home")
    source = args.work / f"hf-{args.shape}"
    if not (source / "config.json").exists():
        t0 = time.perf_counter()
        random_checkpoint(args.shape, source)
        say(f"profile   checkpoint {time.perf_counter() - t0:.1f} s")
    if args.prep:
        t0 = time.perf_counter()
        bn.configured(
            source, SHAPES[args.shape]["family"], args.tp, "fastertransformer-native", home, args, args.dtype, True
        )
        say(f"profile   converted and configured {time.perf_counter() - t0:.1f} s")
        return

    import torch
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.fastertransformer.native.options import NativeOptions, backend_for
    from ftx_triton.store.artifact_store import ArtifactStore

    options = NativeOptions.from_settings(RunSettings.of("x"))
    built = backend_for(ArtifactStore(home), sm=options.sm, sources=options.sources, say=say, show_progress=False)
    read_bw = bn.read_bandwidth_gbs()
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "read_bandwidth_gbs": round(read_bw, 1),
        "shape": args.shape,
        "tp": args.tp,
        "dtype": args.dtype,
        "batches": args.batches,
        "repeats": args.repeats,
        "variants": {},
    }
    bn_args = argparse.Namespace(**{**vars(args), "json": None})
    for n, label in enumerate(args.variants):
        custom, env = VARIANTS[label]
        _environment(env)
        say(f"profile   {label}")
        try:
            run = bn.native_runs(args.shape, source, args.tp, home, bn_args, built, read_bw * 1e9, args.dtype, custom)
            report["variants"][label] = run
        except Exception as exc:  # noqa: BLE001 - the report says which variant failed and why
            report["variants"][label] = {"error": str(exc).splitlines()[0][:300] if str(exc) else repr(exc)}
            say(f"profile   {label} failed: {report['variants'][label]['error']}")
        if args.trace_lib and n + 1 == min(args.trace_after, len(args.variants)):
            report["trace"] = traced_run(args, bn_args, source, home, built, read_bw)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    _environment({})
    report["table"] = table(report)
    print(report["table"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def traced_run(
    args: argparse.Namespace, bn_args: argparse.Namespace, source: Path, home: Path, built: Any, read_bw: float
) -> dict[str, Any]:
    """The first variant served with the CUPTI tracer injected, one batch-1 request, and its analysis."""
    label = args.trace_variant or args.variants[0]
    custom, env = VARIANTS[label]
    trace = args.work / "trace.tsv"
    _environment({**env, "CUDA_INJECTION64_PATH": str(args.trace_lib.resolve()), "FTX_CUPTI_OUT": str(trace)})
    traced = argparse.Namespace(**{**vars(bn_args), "batches": [1], "repeats": 1})
    try:
        bn.native_runs(args.shape, source, args.tp, home, traced, built, read_bw * 1e9, args.dtype, custom)
        time.sleep(0.5)
        return {"variant": label, **analyse(trace)}
    except Exception as exc:  # noqa: BLE001 - the report says why the trace is missing
        return {"error": str(exc).splitlines()[0][:300] if str(exc) else repr(exc)}
    finally:
        _environment({})


def _twin(label: str, variants: dict[str, Any], first: str) -> str:
    """What a variant is compared with: a graph variant's eager twin where it ran, else the first variant."""
    eager = label.removesuffix(GRAPH)
    return eager if label.endswith(GRAPH) and "error" not in variants.get(eager, {"error": ""}) else first


def table(report: dict[str, Any]) -> str:
    """Markdown: tok/s, fraction of the HBM bound, and speed and ids against the variant each is compared with
    (a graph variant's eager twin, else the first variant), per variant and batch."""
    lines = [
        "| variant | batch | tok/s | HBM bound tok/s | / bound | compared with | speed ratio | generated ids |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    variants = report["variants"]
    ran = [label for label, run in variants.items() if "error" not in run]
    bw = report["read_bandwidth_gbs"] * 1e9
    for label, run in variants.items():
        if "error" in run:
            lines.append(f"| {label} | - | failed: {run['error']} | | | | | |")
            continue
        twin = _twin(label, variants, ran[0])
        other = variants[twin]
        for batch in report["batches"]:
            rate = run["untuned"].get(batch)
            base = other["untuned"].get(batch)
            bound = batch * bw / run["step_bytes_per_gpu"]
            same = run["untuned"]["ids"].get(batch) == other["untuned"]["ids"].get(batch)
            if isinstance(rate, (int, float)) and isinstance(base, (int, float)):
                lines.append(
                    f"| {label} | {batch} | {rate:.1f} | {bound:.0f} | {rate / bound:.2f} | {twin} | "
                    f"{rate / base:.3f} | {'equal' if same else 'differ'} |"
                )
            else:
                lines.append(f"| {label} | {batch} | {rate} | {bound:.0f} | - | {twin} | - | - |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
