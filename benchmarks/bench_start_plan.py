"""Start and plan of one ``ftx`` command, two versions interleaved run by run (issue 40).

Each version is a ``git archive`` export run through ``benchmarks/ftx-of-export.sh`` with an ``FTX_HOME`` of its own
(``<work>/home-<name>``; make the command cached in each before measuring). Per run: the ``timeline.step`` seconds of
``start`` and ``plan`` that ``ftx -v`` prints, the wall time to exit and the CPU seconds of the command (user + system
of the waited-for processes: a detached server is not among them). Medians and the ratio after / before are printed.
Both exports are byte-compiled first, as an installed ftx is: an export run with ``PYTHONDONTWRITEBYTECODE=1`` (set
on some machines) would compile its sources again in every measured run (0.1 CPU-s of a convert's start and plan).
Usage::

    python benchmarks/bench_start_plan.py --before /tmp/x-main --after /tmp/x-head --work /tmp/x --rounds 15 -- \\
        convert SRC --tp 1 --weight-dtype fp16 -o '{work}/out-{version}'
    python benchmarks/bench_start_plan.py ... --after-each 'stop --all' -- run tiny-gptj --detach --runtime python

``--fresh`` makes every run a first one (its ``FTX_HOME`` and ``{work}/out-*`` removed before it, not timed): with a
small checkpoint, the wall time is then the fixed part of a first convert (start, plan, the store's commit, the
output's placement, the exit) beside a conversion of a few milliseconds.
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

EXPORT = Path(__file__).resolve().parent / "ftx-of-export.sh"
STEP = re.compile(r"timeline\.step step=(\w+) seconds=([\d.]+)")


def ftx(root: str, home: Path, args: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``ftx ARGS`` of the export at ``root``: the result, its wall seconds and its CPU seconds."""
    env = {**os.environ, "FTX_BEFORE_ROOT": root, "FTX_HOME": str(home)}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    before, began = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(["sh", str(EXPORT), *args], capture_output=True, text=True, env=env)
    wall, after = time.perf_counter() - began, resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="export of the version to compare against")
    parser.add_argument("--after", required=True, help="export of the version measured")
    parser.add_argument("--work", type=Path, required=True, help="folder of the FTX_HOMEs (home-before, home-after)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--after-each", default="", help="ftx arguments run after each measured run (not timed)")
    parser.add_argument("--fresh", action="store_true", help="remove the FTX_HOME and outputs before each run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the ftx arguments ({work}, {version})")
    args = parser.parse_args()
    command = [a for a in args.command if a != "--"]
    versions = {"before": args.before, "after": args.after}
    for root in versions.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", root], check=True, stdout=subprocess.DEVNULL)
    figures: dict[str, dict[str, list[float]]] = {v: {"start": [], "plan": [], "wall": [], "cpu": []} for v in versions}
    for round_ in range(args.rounds):
        for name in list(versions)[:: 1 if round_ % 2 == 0 else -1]:
            home = args.work / f"home-{name}"
            argv = [a.format(work=args.work, version=name) for a in command]
            if args.fresh:
                for path in (home, *args.work.glob(f"out-{name}*")):
                    shutil.rmtree(path, ignore_errors=True)
            done, wall, cpu = ftx(versions[name], home, ["-v", *argv])
            if done.returncode != 0:
                sys.exit(f"error: {name} exited {done.returncode}:\n{done.stderr[-2000:]}")
            if args.after_each:
                ftx(versions[name], home, shlex.split(args.after_each))
            steps = dict(STEP.findall(done.stderr + done.stdout))
            for key, value in (("start", float(steps["start"])), ("plan", float(steps["plan"])), ("wall", wall)):
                figures[name][key].append(value)
            figures[name]["cpu"].append(cpu)
    print(
        f"ftx {' '.join(command)}: {args.rounds} rounds, load average {' '.join(open('/proc/loadavg').read().split()[:3])}"
    )
    for key in ("start", "plan", "wall", "cpu"):
        before, after = (statistics.median(figures[v][key]) for v in versions)
        print(f"  {key:<6} before {before:6.3f} s  after {after:6.3f} s  after/before {after / before:5.2f}")


if __name__ == "__main__":
    main()
