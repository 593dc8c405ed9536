#!/usr/bin/env python3
"""Cached runs and local-source conversion, as ratios measured in one run on one machine (issue 40).

1. A cached ``ftx -v run tiny-gptj --detach`` (the runtime ftx chooses, or ``--runtime``) to the point where it
   exits with the server ready, each run beside a ``python -c "import torch"`` (and ``import torch, transformers``)
   measured right before it, so that both see the same load: the ratio is the median of the per-run ratios. Steps
   come from ftx's own ``timeline total=…`` line (``-v``), else from the time each output line arrives; each
   model's load seconds from tritonserver's own log clock.
2. ``ftx convert`` of a GPT-J-shaped fp16 safetensors checkpoint (a fresh FTX_HOME) vs a read+write copy
   of the same bytes on the same disk (and the CPU seconds the first convert used: on a shared machine they
   move less with the load than its wall time), and a second ``ftx convert`` of the unchanged source: the
   seconds to decide "cached" (the fetch and convert lines) and the whole command.

    python benchmarks/bench_cached_run.py --repeat 3 --layers 4 --work /tmp/ftx-bench-cached   # 2.4 GB

On a GPU machine, ``--model``/``--run-args`` run another model (``--skip convert``), and ``--compare-loader`` runs
each repeat twice, with ftx's pinned weight loader and with upstream FasterTransformer's
(``FTX_FT_LOADER=upstream``), in alternating order: both timelines, the slowest GPU's weight loading from the
server log (``ftx: weights of rank …`` lines) and their ratios::

    python benchmarks/bench_cached_run.py --skip convert --repeat 3 --model CHECKPOINT --home "$FTX_HOME" \
        --runtime fastertransformer-native --run-args "--tp 2 --no-tune" --compare-loader

Another version of ftx is measured by putting its sources first on ``PYTHONPATH`` (its server processes inherit it;
the python runtime's stubs do not: give them ``FTX_STUB_PYTHON``, a python whose environment imports those sources).
``--variant NAME VAR=VALUE ...`` (twice or more) measures versions side by side: each repeat runs every one once,
in alternating order, after the same ``import torch``, and two variants are also compared run by run::

    python benchmarks/bench_cached_run.py --skip convert --repeat 12 --cpu --ftx ftx-script \
        --variant before PYTHONPATH=<export of main>/core/src:... --variant after PYTHONPATH=<export of this>/core/src:...
Before the measured runs, one run builds what is missing and one cached run serves once: a cached run's server is
started ahead by the next identical run (``server started ahead`` says whether each measured run took it, and how
many seconds before its serve stage it was started).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import plain_copy, write_checkpoint  # noqa: E402
from ftx_triton.runtime.fastertransformer.native.weight_load import weight_loads  # noqa: E402

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
HEAD_START = re.compile(
    r"^server\.head_start taken=(True|False).*?(?:ahead_s=([\d.]+))?(?: reason=(.*?))?(?: family=|$)"
)


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


LOADERS = {"pinned": {}, "upstream": {"FTX_FT_LOADER": "upstream"}}
"""ftx's pinned weight loader (the default) and upstream FasterTransformer's, chosen in the server's environment."""


def weights_loaded(log_path: str | None) -> dict[str, float]:
    """The slowest GPU's weight loading, from the native server log's ``ftx: weights of rank …`` lines (none: {})."""
    loads = weight_loads(Path(log_path).read_text(errors="replace")) if log_path else []
    if not loads:
        return {}
    return {
        "  weights: seconds in the loaders (slowest GPU)": max(w.seconds for w in loads),
        "  weights: GB/s (slowest GPU)": min(w.gb_per_s for w in loads),
        "  weights: GPU set-up with allocation (slowest)": max(w.total_s for w in loads),
    }


def head_start(lines: list[tuple[float, str]]) -> dict[str, float]:
    """Whether the run took the server ftx started ahead of need (1/0), and how many seconds before its serve stage
    that server was started (0 without one); a server started ahead and dropped is said."""
    for _, line in lines:
        if match := HEAD_START.match(line):
            if match[1] == "False":
                print(f"  (server started ahead was dropped: {match[3]})")
            return {
                "server started ahead (taken 1/0)": float(match[1] == "True"),
                "  seconds ahead": float(match[2] or 0),
            }
    return {"server started ahead (taken 1/0)": 0.0, "  seconds ahead": 0.0}


def deployment_role(argv: list[str]) -> str:
    """What a process of a deployment is, from its command line: the supervisor, the OpenAI front, a model's stub
    (``stub <model>``), else its program's name (``tritonserver``, ``ftx``)."""
    if "ftx_triton.server.supervisor" in argv:
        return "supervisor (fronts, readiness probes)"
    if "ftx_triton.openai_api" in argv:
        return "OpenAI front"
    if Path(argv[0]).name == "triton_python_backend_stub":
        model = Path(argv[1]).parts if len(argv) > 1 else ()
        return f"stub {model[-3]}" if len(model) >= 3 else "stub"  # <repository>/<model>/<version>/model.py
    return Path(argv[0]).name


def deployment_cpu(home: str) -> dict[str, float]:
    """CPU seconds (user + system) each live process of the deployment under ``home`` has spent so far (the
    processes whose ``FTX_HOME`` is it: the supervisor, tritonserver, each model's stub, the OpenAI front), and the
    seconds each one's main thread was runnable but waited for a CPU (``/proc/<pid>/schedstat``)."""
    import psutil

    cpu: dict[str, float] = {}
    waits: dict[str, float] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid() or proc.environ().get("FTX_HOME") != home:
                continue
            times = proc.cpu_times()
            waited = int(Path(f"/proc/{proc.pid}/schedstat").read_text().split()[1]) / 1e9
        except (psutil.Error, OSError, IndexError, ValueError):
            continue
        name = deployment_role(proc.info["cmdline"] or [""])
        cpu[f"cpu: {name}"] = cpu.get(f"cpu: {name}", 0.0) + times.user + times.system
        waits[f"waited for a CPU: {name}"] = waits.get(f"waited for a CPU: {name}", 0.0) + waited
    return {**cpu, **waits}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run.get(key, 0.0) for run in runs) for key in runs[0]}


def timeline_steps(lines: list[tuple[float, str]]) -> dict[str, float] | None:
    """The steps of ftx's ``timeline total=… start=… plan=…`` line (``-v``), None without one."""
    for _, line in lines:
        if match := TIMELINE.match(line):
            return {name.strip(): float(value) for name, value in TIMELINE_STEP.findall(match[2])}
    return None


def bench_cached_run(
    ftx: str,
    env: dict[str, str],
    repeat: int,
    runtime: str | None,
    model: str,
    run_args: list[str],
    variants: dict[str, dict[str, str]],
    cpu: bool = False,
) -> None:
    """``variants``: name -> the environment it adds (the loaders, or the versions of ``--variant``); each repeat runs
    every variant once, in alternating order, after one ``import torch`` that all of them are compared with."""
    loaders = list(variants)
    python = [sys.executable, "-c"]
    name = "bench-cached"
    run = [ftx, "-v", "run", model, "--detach", "--name", name, *(["--runtime", runtime] if runtime else []), *run_args]
    stop = [ftx, "stop", name]
    for extra in variants.values():  # another server of the home would share the CPUs and be counted as the run's
        home = {**env, **extra}["FTX_HOME"]
        if cpu and deployment_cpu(home):
            raise SystemExit(f"servers are running under {home}: stop them (FTX_HOME={home} ftx stop --all) first")
    for _ in range(2):  # builds what is missing; then a cached run, whose server the measured runs start ahead
        for extra in variants.values():
            timed(run, {**env, **extra})
            timed(stop, {**env, **extra})
    totals: dict[str, list[float]] = {loader: [] for loader in loaders}
    steps: dict[str, list[dict[str, float]]] = {loader: [] for loader in loaders}
    torch_runs, both_runs = [], []
    ratios: dict[str, list[float]] = {loader: [] for loader in loaders}
    for index in range(repeat):
        torch_runs.append(timed([*python, "import torch"], env)[0])
        both_runs.append(timed([*python, "import torch, transformers"], env)[0])
        for loader in loaders if index % 2 == 0 else loaders[::-1]:  # alternating: neither always runs first
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall, lines = timed(run, {**env, **variants[loader]})
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            log = next((m[1] for _, line in lines if (m := re.search(r"\(log: (\S+)\)", line))), None)
            used: dict[str, float] = {}
            if cpu:  # the command's own (it is this script's only child meanwhile), then each server process's
                used = {"cpu: ftx (the command)": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime}
                used.update(deployment_cpu({**env, **variants[loader]}["FTX_HOME"]))  # a variant may have its own
                used["cpu: all"] = sum(v for k, v in used.items() if k.startswith("cpu: "))
            timed(stop, {**env, **variants[loader]})
            totals[loader].append(wall)
            found = timeline_steps(lines) or split_steps(wall, lines, RUN_STEPS)
            loads = model_loads(Path(log)) if log else {}
            steps[loader].append({**found, **loads, **weights_loaded(log), **head_start(lines), **used})
        for loader in loaders:
            ratios[loader].append(totals[loader][-1] / torch_runs[-1])
        each = ", ".join(f"{loader} {totals[loader][-1]:.2f} s = {ratios[loader][-1]:.2f}x" for loader in loaders)
        pair = (
            f", {loaders[1]} / {loaders[0]} {totals[loaders[1]][-1] / totals[loaders[0]][-1]:.2f}x"
            if len(loaders) == 2
            else ""
        )
        print(
            f"repeat {index + 1} (load average {os.getloadavg()[0]:.2f}): import torch {torch_runs[-1]:.2f} s, {each}{pair}",
            flush=True,
        )
    torch_s, both_s = statistics.median(torch_runs), statistics.median(both_runs)
    print(f"\ncached `{' '.join(run[1:])}`, median of {repeat}; {os.cpu_count()} CPUs")
    print(f"{'step':<52}" + "".join(f"{loader + ' s':>14}" for loader in loaders))
    medians = {loader: median_of(steps[loader]) for loader in loaders}
    for key in dict.fromkeys(k for loader in loaders for k in medians[loader]):
        print(f"{key:<52}" + "".join(f"{medians[loader].get(key, float('nan')):>14.2f}" for loader in loaders))
    total = {loader: statistics.median(totals[loader]) for loader in loaders}
    print(f"{'total to ready (the command, wall)':<52}" + "".join(f"{total[loader]:>14.2f}" for loader in loaders))
    for label, seconds in (("import torch", torch_s), ("import torch, transformers", both_s)):
        print(f"{'python -c ' + repr(label):<52}{seconds:>14.2f}")
    for loader in loaders:
        print(
            f"ratio ({loader}): {statistics.median(ratios[loader]):.2f}x import torch (median of per-run ratios; target "
            f"<= 1.3x), {total[loader] / both_s:.2f}x import torch+transformers"
        )
    if len(loaders) == 2 and loaders != ["pinned", "upstream"]:
        first, second = loaders
        paired = [b / a for a, b in zip(totals[first], totals[second], strict=True)]
        print(
            f"{second} / {first}: total to ready {statistics.median(paired):.2f}x (median of the repeats' ratios, "
            f"{min(paired):.2f}-{max(paired):.2f})"
        )
    if loaders == ["pinned", "upstream"]:
        key = "  weights: seconds in the loaders (slowest GPU)"
        pinned, upstream = medians["pinned"].get(key), medians["upstream"].get(key)
        print(f"pinned / upstream loader: total to ready {total['pinned'] / total['upstream']:.2f}x", end="")
        print(f", weight loading {pinned / upstream:.2f}x" if pinned and upstream else "")


def bench_convert(
    ftx: str, env: dict[str, str], work: Path, layers: int, hidden: int, repeat: int, *, sync: bool = False
) -> None:
    """``sync``: write every dirty page out before each timed copy and convert, so each starts as on a machine
    whose disk caught up (without it, the writeback of what the step before wrote throttles this step's writes)."""
    src = work / "hf"
    total, _ = write_checkpoint(src, layers, hidden, 50400)
    time.sleep(2.5)  # files just written are hashed again on the next run (their times may yet move)
    settle = os.sync if sync else (lambda: None)
    copies, firsts, cpus, users, decides, keyed, seconds = [], [], [], [], [], [], []
    for _ in range(repeat):
        home = work / "home"
        shutil.rmtree(home, ignore_errors=True)
        run_env = {**env, "FTX_HOME": str(home)}
        cmd = [ftx, "-v", "convert", str(src), "--tp", "1", "--weight-dtype", "fp16", "-o", str(work / "out")]
        settle()
        copies.append(plain_copy(src / "model.safetensors", work / "copy.bin"))
        settle()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        firsts.append(timed([*cmd, "--overwrite"], run_env)[0])
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        users.append(after.ru_utime - before.ru_utime)
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
    pairs = [f / c for f, c in zip(firsts, copies, strict=True)]
    print(f"{'  pair by pair (convert / the copy before it)':<52}{min(pairs):>9.2f}x to {max(pairs):.2f}x")
    cpu_s = statistics.median(cpus)
    print(f"{'  its CPU seconds (user + system, all threads)':<52}{cpu_s:>9.2f}   {cpu_s / first_s:.2f} CPUs busy")
    user_s, system_s = statistics.median(users), statistics.median(c - u for c, u in zip(cpus, users, strict=True))
    print(f"{'  of which user (ftx: numpy, sha256, Python)':<52}{user_s:>9.2f}   system (kernel) {system_s:.2f}")
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
    parser.add_argument(
        "--sync",
        action="store_true",
        help="convert part: write dirty pages out (sync) before each timed copy and convert, so that neither is "
        "throttled by the writeback of what the step before wrote",
    )
    parser.add_argument("--runtime", help="pass --runtime to ftx run (default: the one ftx chooses)")
    parser.add_argument("--model", default="tiny-gptj", help="what ftx run serves (a preset or a checkpoint)")
    parser.add_argument(
        "--home", type=Path, help="the FTX_HOME of the runs (default: WORK/run-home; a GPU's holds the built backend)"
    )
    parser.add_argument("--ftx", type=Path, help="the ftx command to measure (default: the one beside this python)")
    parser.add_argument("--run-args", default="", help='more ftx run arguments, e.g. "--tp 2 --no-tune"')
    parser.add_argument(
        "--compare-loader",
        action="store_true",
        help="run each repeat with ftx's pinned weight loader and with upstream's (FTX_FT_LOADER=upstream)",
    )
    parser.add_argument(
        "--variant",
        nargs="+",
        action="append",
        metavar=("NAME", "VAR=VALUE"),
        help="a version to measure beside the others, each repeat running every one in alternating order: its name and "
        "the environment it adds, e.g. --variant before PYTHONPATH=<export of main> --variant after PYTHONPATH=<this>",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also the CPU seconds of the command and of each server process at ready (on a shared machine they "
        "move less with the load than wall time)",
    )
    args = parser.parse_args()
    ftx = str(args.ftx) if args.ftx else shutil.which("ftx", path=str(Path(sys.executable).parent)) or "ftx"
    env = {**os.environ, "FTX_HOME": str(args.home or args.work / "run-home")}
    args.work.mkdir(parents=True, exist_ok=True)
    if args.skip != "run":
        if args.variant:
            variants = {name: dict(pair.split("=", 1) for pair in pairs) for name, *pairs in args.variant}
        else:
            variants = LOADERS if args.compare_loader else {"pinned": {}}
        bench_cached_run(
            ftx, env, args.repeat, args.runtime, args.model, shlex.split(args.run_args), variants, cpu=args.cpu
        )
    if args.skip != "convert":
        bench_convert(ftx, env, args.work, args.layers, args.hidden, args.repeat, sync=args.sync)


if __name__ == "__main__":
    main()
