#!/usr/bin/env python3
"""Conversion benchmark: a synthetic GPT-J-shaped fp16 safetensors checkpoint -> fp16 FT files.

Prints, for tp 1 and tp 4: seconds, GB/s (bytes read), the ratio to a plain copy of the same
bytes on the same disk measured in the same run (read the input, write as many bytes), and the
converter's peak RSS next to the target (500 MB + 3 x the largest tensor). Each conversion runs in
a fresh child process so its peak RSS is its own.

    python benchmarks/bench_convert.py --layers 28 --hidden 4096 --work /tmp/bench   # GPT-J-6B scale
    python benchmarks/bench_convert.py --layers 2 --hidden 1024                     # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHILD = """
import json, sys, time
from pathlib import Path
from ftx_triton.conversion.convert import convert_checkpoint
from ftx_triton.formats.checkpoint import open_checkpoint
from ftx_gptj.family import GPTJ
src, out, tp = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
family = GPTJ()
hf_config = family.read_hf_config(src)
t0 = time.perf_counter()
result = convert_checkpoint(family, open_checkpoint(src), hf_config, family.spec(hf_config), out, tp=tp,
                            weight_dtype="fp16")
print(json.dumps({"seconds": time.perf_counter() - t0, "read_s": result.read_seconds,
                  "stall_s": result.stall_seconds, "written": result.bytes_written}))
"""


def gptj_tensors(layers: int, hidden: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    inner = 4 * hidden
    names: list[tuple[str, tuple[int, ...]]] = [("transformer.wte.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"transformer.h.{i}"
        names += [(f"{p}.ln_1.weight", (hidden,)), (f"{p}.ln_1.bias", (hidden,))]
        names += [(f"{p}.attn.{x}_proj.weight", (hidden, hidden)) for x in ("q", "k", "v", "out")]
        names += [
            (f"{p}.mlp.fc_in.weight", (inner, hidden)),
            (f"{p}.mlp.fc_in.bias", (inner,)),
            (f"{p}.mlp.fc_out.weight", (hidden, inner)),
            (f"{p}.mlp.fc_out.bias", (hidden,)),
        ]
    names += [
        ("transformer.ln_f.weight", (hidden,)),
        ("transformer.ln_f.bias", (hidden,)),
        ("lm_head.weight", (vocab, hidden)),
        ("lm_head.bias", (vocab,)),
    ]
    return names


def write_checkpoint(dest: Path, layers: int, hidden: int, vocab: int) -> tuple[int, int]:
    """Stream a safetensors file tensor by tensor (random fp16 values); returns (bytes, largest tensor)."""
    dest.mkdir(parents=True, exist_ok=True)
    tensors = gptj_tensors(layers, hidden, vocab)
    header, offset = {}, 0
    for name, shape in tensors:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(0)
    chunk = (rng.standard_normal(1 << 22, dtype=np.float32) * 0.02).astype(np.float16)
    with (dest / "model.safetensors").open("wb") as fh:
        fh.write(len(blob).to_bytes(8, "little") + blob)
        for _name, shape in tensors:
            count = int(np.prod(shape))
            reps = -(-count // chunk.size)
            fh.write(np.tile(chunk, reps)[:count].tobytes() if reps > 1 else chunk[:count].tobytes())
    config = {
        "model_type": "gptj",
        "architectures": ["GPTJForCausalLM"],
        "n_embd": hidden,
        "n_head": hidden // 256,
        "n_layer": layers,
        "rotary_dim": 64,
        "vocab_size": vocab,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "n_inner": None,
    }
    (dest / "config.json").write_text(json.dumps(config))
    largest = max(int(np.prod(s)) * 2 for _, s in tensors)
    return offset, largest


def plain_copy(src: Path, dest: Path, chunk: int = 64 << 20) -> float:
    """Read the input and write the same bytes through user space, as any converter must."""
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    t0 = time.perf_counter()
    with src.open("rb", buffering=0) as fin, dest.open("wb", buffering=0) as fout:
        while n := fin.readinto(buffer):
            fout.write(view[:n])
    seconds = time.perf_counter() - t0
    dest.unlink()
    return seconds


def convert_in_child(src: Path, out: Path, tp: int, threads: int) -> tuple[dict, int]:
    if out.exists():
        shutil.rmtree(out)
    env = {**os.environ, **({"FTX_CONVERT_THREADS": str(threads)} if threads else {})}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(src), str(out), str(tp)], stdout=subprocess.PIPE, text=True, env=env
    )
    stdout = proc.stdout.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"conversion failed (status {status})")
    return json.loads(stdout.strip().splitlines()[-1]), usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=50400)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ftx-bench-convert"))
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[0],
        help="writer threads to compare (0 = ftx's default); sets FTX_CONVERT_THREADS",
    )
    args = parser.parse_args()

    src = args.work / "hf"
    total, largest = write_checkpoint(src, args.layers, args.hidden, args.vocab)
    print(
        f"checkpoint: {args.layers} layers, n_embd {args.hidden}, {total / 1e9:.2f} GB fp16, "
        f"largest tensor {largest / 1e6:.0f} MB; {os.cpu_count()} CPUs"
    )
    budget = 500e6 + 3 * largest
    print(
        f"{'what':<16}{'median s':>10}{'GB/s':>8}{'vs copy':>9}{'peak RSS MB':>13}{'RSS target MB':>15}"
        f"{'read s':>8}{'stall s':>9}"
    )
    for tp in args.tp:
        for threads in args.threads:
            copies, converts, rss, reads, stalls = [], [], [], [], []
            for _ in range(args.repeat):
                copies.append(plain_copy(src / "model.safetensors", args.work / "copy.bin"))
                stats, peak = convert_in_child(src, args.work / "ft", tp, threads)
                converts.append(stats["seconds"])
                reads.append(stats["read_s"])
                stalls.append(stats["stall_s"])
                rss.append(peak)
            copy_s, conv_s = statistics.median(copies), statistics.median(converts)
            label = f"tp={tp}" + (f" w={threads}" if threads else "")
            print(f"{'copy':<16}{copy_s:>10.2f}{total / copy_s / 1e9:>8.2f}{'1.00x':>9}")
            print(
                f"{label:<16}{conv_s:>10.2f}{total / conv_s / 1e9:>8.2f}{copy_s / conv_s:>8.2f}x"
                f"{max(rss) / 1e6:>13.0f}{budget / 1e6:>15.0f}{statistics.median(reads):>8.2f}"
                f"{statistics.median(stalls):>9.2f}"
            )
    shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
