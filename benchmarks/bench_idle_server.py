#!/usr/bin/env python3
"""CPU that a detached deployment uses while nobody sends it anything, per process.

Each repeat starts ``ftx run tiny-gptj --detach`` (cached after the first), lets it settle, reads the CPU seconds of
the supervisor, tritonserver, each Python-backend stub and the OpenAI endpoint over ``--seconds``, then stops it.
``--variant NAME VAR=VALUE ...`` (twice or more) measures versions side by side, in alternating order, e.g. an
export of another commit first on ``PYTHONPATH`` (its supervisor and endpoint inherit it)::

    python benchmarks/bench_idle_server.py --repeat 3 --seconds 30 \
        --variant before PYTHONPATH=<export of main>/core/src --variant after PYTHONPATH=
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cached_run import deployment_cpu  # noqa: E402

NAME = "bench-idle"


def _cpu(home: str) -> dict[str, float]:
    """CPU seconds so far of each process of the deployment under ``home``, by role."""
    return {k.removeprefix("cpu: "): v for k, v in deployment_cpu(home).items() if k.startswith("cpu: ")}


def measure(ftx: str, env: dict[str, str], seconds: float, settle: float) -> dict[str, float]:
    """Percent of one core per process role over ``seconds`` of idling."""
    subprocess.run([ftx, "run", "tiny-gptj", "--detach", "--name", NAME], env=env, check=True, capture_output=True)
    try:
        time.sleep(settle)
        before = _cpu(env["FTX_HOME"])
        time.sleep(seconds)
        after = _cpu(env["FTX_HOME"])
        return {role: (used - before.get(role, 0.0)) / seconds * 100 for role, used in after.items()}
    finally:
        subprocess.run([ftx, "stop", NAME], env=env, check=False, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each deployment idles while measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after ready before measuring")
    parser.add_argument("--ftx", default=str(Path(sys.executable).with_name("ftx")))
    parser.add_argument("--variant", nargs="+", action="append", metavar=("NAME", "VAR=VALUE"), default=[])
    args = parser.parse_args()
    variants = [(v[0], dict(item.split("=", 1) for item in v[1:])) for v in args.variant] or [("this", {})]
    home = Path(tempfile.mkdtemp(prefix="ftx-bench-idle-"))
    try:
        results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
        for repeat in range(args.repeat):
            order = variants if repeat % 2 == 0 else variants[::-1]
            for name, extra in order:
                env = {**os.environ, "FTX_HOME": str(home / name), **extra}
                results[name].append(measure(args.ftx, env, args.seconds, args.settle))
                print(f"repeat {repeat + 1} {name}: load {os.getloadavg()[0]:.2f}", file=sys.stderr)
        roles = sorted({k for runs in results.values() for run in runs for k in run})
        print(f"\nidle detached tiny-gptj, % of one core over {args.seconds:g} s, median of {args.repeat}")
        print(f"{'process':<40}" + "".join(f"{name:>12}" for name, _ in variants))
        for role in [*roles, "all"]:
            cells = []
            for name, _ in variants:
                values = [sum(run.values()) if role == "all" else run.get(role, 0.0) for run in results[name]]
                cells.append(f"{statistics.median(values):>12.2f}")
            print(f"{role:<40}" + "".join(cells))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
