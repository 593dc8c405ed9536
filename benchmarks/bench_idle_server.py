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
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

NAME = "bench-idle"


def _kind(process: psutil.Process, supervisor: int) -> str:
    if process.pid == supervisor:
        return "supervisor"
    args = process.cmdline()
    if not args:
        return "?"
    program = Path(args[0]).name
    if program == "tritonserver":
        return "tritonserver"
    if program == "triton_python_backend_stub" and len(args) > 1:
        return f"stub {Path(args[1]).parent.parent.name}"
    if "ftx_triton.openai_api" in args:
        return "OpenAI endpoint"
    return program


def _processes(supervisor: int, openai_port: int | None) -> dict[str, psutil.Process]:
    root = psutil.Process(supervisor)
    found = {_kind(p, supervisor): p for p in [root, *root.children(recursive=True)]}
    if openai_port is not None:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == openai_port and conn.status == psutil.CONN_LISTEN and conn.pid:
                found["OpenAI endpoint"] = psutil.Process(conn.pid)
    return found


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(ftx: str, env: dict[str, str], seconds: float, settle: float) -> dict[str, float]:
    """Percent of one core per process kind over ``seconds`` of idling."""
    subprocess.run([ftx, "run", "tiny-gptj", "--detach", "--name", NAME], env=env, check=True, capture_output=True)
    try:
        listing = subprocess.run([ftx, "ps", "--json"], env=env, check=True, capture_output=True, text=True).stdout
        record = next(r for r in json.loads(listing) if r["name"] == NAME)
        port = int(record["openai"].rsplit(":", 1)[1].split("/")[0]) if record.get("openai") else None
        time.sleep(settle)
        processes = _processes(int(record["pid"]), port)
        before = {kind: _cpu(p) for kind, p in processes.items()}
        time.sleep(seconds)
        return {kind: (_cpu(p) - before[kind]) / seconds * 100 for kind, p in processes.items()}
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
        kinds = sorted({k for runs in results.values() for run in runs for k in run})
        print(f"\nidle detached tiny-gptj, % of one core over {args.seconds:g} s, median of {args.repeat}")
        print(f"{'process':<34}" + "".join(f"{name:>12}" for name, _ in variants))
        for kind in [*kinds, "all"]:
            cells = []
            for name, _ in variants:
                values = [sum(run.values()) if kind == "all" else run.get(kind, 0.0) for run in results[name]]
                cells.append(f"{statistics.median(values):>12.2f}")
            print(f"{kind:<34}" + "".join(cells))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
