#!/usr/bin/env python3
"""Cached runs and local-source conversion, as ratios measured in one run on one machine (issue 40).

1. A cached ``ftx -v run tiny-gptj --detach`` (the runtime ftx chooses, or ``--runtime``) to the point where it
   exits with the server ready, each run beside a ``python -c "import torch"`` (and ``import torch, transformers``)
   measured right before it, so that both see the same load: the ratio is the median of the per-run ratios. Steps
   come from ftx's own ``timeline total=…`` line (``-v``), else from the time each output line arrives; each
   model's load seconds from tritonserver's own log clock.
2. ``ftx convert`` of a GPT-J-shaped fp16 safetensors checkpoint (a fresh FTX_HOME) vs a read+write copy
   of the same bytes on the same disk, and a second ``ftx convert`` of the unchanged source: the seconds to
   decide "cached" (the fetch and convert lines) and the whole command.

    python benchmarks/bench_cached_run.py --repeat 3 --layers 4 --work /tmp/ftx-bench-cached   # 2.4 GB

Another version of ftx is measured by putting its sources first on ``PYTHONPATH`` (its server processes inherit it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import plain_copy, write_checkpoint  # noqa: E402

# (step name, the output line that ends it), in order
RUN_STEPS = (
    ("start (interpreter, imports, options)", re.compile(r".")),
    ("plan", re.compile(r"^fetch\s")),
    ("stages cached (fetch..configure)", re.compile(r"^configure\s")),
    ("to tritonserver spawned", re.compile(r"^starting tritonserver")),
    ("models loaded (server ready)", re.compile(r"^tritonserver ready")),
    ("smoke generation", re.compile(r"serve\.ready")),
    ("front, detach, exit", None),
)
GLOG = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*?(loading: ([^:\"]+):|successfully loaded '([^']+)')")
TIMELINE = re.compile(r"^timeline total=([\d.]+) (.*?) family=")
TIMELINE_STEP = re.compile(r"([a-z][a-z ]*?)=([\d.]+)")
LOADED_EVENT = re.compile(r"runtime\.model_loaded.*?(?:imports_s=([\d.]+))?.*?seconds=([\d.]+)")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, list[tuple[float, str]]]:
    """Run ``cmd``; its wall seconds and every output line with the seconds at which it arrived."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stdout]  # type: ignore[union-attr]
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n" + "\n".join(line for _, line in lines[-20:]))
    return time.monotonic() - t0, lines


def split_steps(total: float, lines: list[tuple[float, str]], steps: tuple) -> dict[str, float]:
    out, last, index = {}, 0.0, 0
    for at, line in lines:
        if index < len(steps) - 1 and steps[index][1].search(line):
            out[steps[index][0]] = at - last
            last, index = at, index + 1
    out[steps[-1][0]] = total - last
    return out


def model_loads(log_path: Path) -> dict[str, float]:
    """Each model's load seconds by tritonserver's clock; the python model's imports and build."""
    began: dict[str, float] = {}
    loads: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if match := GLOG.match(line):
            clock = int(match[1]) * 3600 + int(match[2]) * 60 + float(match[3])
            if match[5]:
                began[match[5]] = clock
            elif match[6] in began:
                loads[f"load {match[6]}"] = clock - began[match[6]]
        elif match := LOADED_EVENT.search(line):
            if match[1]:
                loads["  fastertransformer: torch + transformers imports"] = float(match[1])
            loads["  fastertransformer: load_model (imports + build)"] = float(match[2])
    return loads


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run.get(key, 0.0) for run in runs) for key in runs[0]}


def timeline_steps(lines: list[tuple[float, str]]) -> dict[str, float] | None:
    """The steps of ftx's ``timeline total=… start=… plan=…`` line (``-v``), None without one."""
    for _, line in lines:
        if match := TIMELINE.match(line):
            return {name.strip(): float(value) for name, value in TIMELINE_STEP.findall(match[2])}
    return None


def bench_cached_run(ftx: str, env: dict[str, str], repeat: int, runtime: str | None) -> None:
    python = [sys.executable, "-c"]
    run = [ftx, "-v", "run", "tiny-gptj", "--detach", *(["--runtime", runtime] if runtime else [])]
    stop = [ftx, "stop", "tiny-gptj"]
    timed(run, env)  # builds what is missing
    timed(stop, env)
    totals, torch_runs, both_runs, steps, loads = [], [], [], [], []
    for _ in range(repeat):
        torch_runs.append(timed([*python, "import torch"], env)[0])
        both_runs.append(timed([*python, "import torch, transformers"], env)[0])
        total, lines = timed(run, env)
        log = next((m[1] for _, line in lines if (m := re.search(r"\(log: (\S+)\)", line))), None)
        timed(stop, env)
        totals.append(total)
        steps.append(timeline_steps(lines) or split_steps(total, lines, RUN_STEPS))
        loads.append(model_loads(Path(log)) if log else {})
    total, torch_s, both_s = (statistics.median(x) for x in (totals, torch_runs, both_runs))
    ratio = statistics.median(t / s for t, s in zip(totals, torch_runs, strict=True))
    print(f"\ncached `{' '.join(run[1:])}`, median of {repeat}; {os.cpu_count()} CPUs")
    print(f"{'step':<52}{'seconds':>9}")
    for name, seconds in {**median_of(steps), **median_of(loads)}.items():
        print(f"{name:<52}{seconds:>9.2f}")
    print(f"{'total to ready (the command, wall)':<52}{total:>9.2f}")
    for label, seconds in (("import torch", torch_s), ("import torch, transformers", both_s)):
        print(f"{'python -c ' + repr(label):<52}{seconds:>9.2f}")
    print(
        f"ratio: {ratio:.2f}x import torch (median of per-run ratios; target <= 1.3x), "
        f"{total / both_s:.2f}x import torch+transformers"
    )


def bench_convert(ftx: str, env: dict[str, str], work: Path, layers: int, hidden: int, repeat: int) -> None:
    src = work / "hf"
    total, _ = write_checkpoint(src, layers, hidden, 50400)
    time.sleep(2.5)  # files just written are hashed again on the next run (their times may yet move)
    copies, firsts, decides, keyed, seconds = [], [], [], [], []
    for _ in range(repeat):
        home = work / "home"
        shutil.rmtree(home, ignore_errors=True)
        run_env = {**env, "FTX_HOME": str(home)}
        cmd = [ftx, "-v", "convert", str(src), "--tp", "1", "--weight-dtype", "fp16", "-o", str(work / "out")]
        copies.append(plain_copy(src / "model.safetensors", work / "copy.bin"))
        firsts.append(timed([*cmd, "--overwrite"], run_env)[0])
        again, lines = timed([*cmd, "--overwrite"], run_env)
        index = next(i for i, (_, line) in enumerate(lines) if line.startswith("fetch "))
        convert_at, convert_line = next((at, line) for at, line in lines if line.startswith("convert "))
        if "cached" not in convert_line:
            raise SystemExit("the second convert was not cached")
        keyed.append(convert_at - (lines[index - 1][0] if index else 0.0))
        decides.append(convert_at)
        seconds.append(again)
    copy_s, first_s = statistics.median(copies), statistics.median(firsts)
    print(f"\nftx convert of a GPT-J-shaped checkpoint: {layers} layers x {hidden}, {total / 1e9:.2f} GB fp16 -> fp16")
    print(f"{'what':<52}{'seconds':>9}")
    print(f"{'read+write copy of the same bytes (bound)':<52}{copy_s:>9.2f}")
    print(f"{'ftx convert, first run (fresh FTX_HOME)':<52}{first_s:>9.2f}   {first_s / copy_s:.2f}x copy")
    print(f"{'second ftx convert: fetch + convert lines (keying)':<52}{statistics.median(keyed):>9.2f}")
    print(f"{'second ftx convert: start to convert cached':<52}{statistics.median(decides):>9.2f}")
    print(f"{'second ftx convert: whole command':<52}{statistics.median(seconds):>9.2f}")
    shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4, help="GPT-J layers of the convert checkpoint (4: 2.4 GB)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ftx-bench-cached"))
    parser.add_argument("--skip", choices=("run", "convert"), help="leave one part out")
    parser.add_argument("--runtime", help="pass --runtime to ftx run (default: the one ftx chooses)")
    args = parser.parse_args()
    ftx = shutil.which("ftx", path=str(Path(sys.executable).parent)) or "ftx"
    env = {**os.environ, "FTX_HOME": str(args.work / "run-home")}
    args.work.mkdir(parents=True, exist_ok=True)
    if args.skip != "run":
        bench_cached_run(ftx, env, args.repeat, args.runtime)
    if args.skip != "convert":
        bench_convert(ftx, env, args.work, args.layers, args.hidden, args.repeat)


if __name__ == "__main__":
    main()
