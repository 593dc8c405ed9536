#!/usr/bin/env python3
"""Who has the CPU while a cached run's model loads: the CPU seconds of each process of one ``ftx run``, in bins.

Reads ``/proc/<pid>/stat`` of every process of the deployment (the ``ftx`` command, the supervisor, tritonserver,
each Python-backend stub, the OpenAI front: those whose ``FTX_HOME`` is the run's) every 30 ms while ``ftx -v run
MODEL --detach`` runs, and prints the CPU seconds each spent in every bin (0.25 s by default) from the command's
start, and the seconds the ``fastertransformer`` stub was runnable but waited for a CPU (``schedstat``); then it
stops the server. The session (scheduling autogroup) of each process is printed too: where the kernel groups by
session (``/proc/sys/kernel/sched_autogroup_enabled``), processes share their group's part of the CPU.
Run it twice: the first run records the launch that the second starts ahead::

    FTX_HOME=/tmp/bench-home python benchmarks/cpu_timeline.py --ftx .venv/bin/ftx --model tiny-gptj

The sampler costs a few percent of a core itself; compare bins, not totals, with ``bench_cached_run.py --cpu``.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import time
from pathlib import Path

from bench_cached_run import deployment_role
from ftx_triton.server.process_tree import stat_fields

TICK = os.sysconf("SC_CLK_TCK")
WAITS = "stub fastertransformer"
ROLES = ("supervisor", "OpenAI front", "tritonserver", "stub ")
"""The deployment's own processes (:func:`deployment_role`'s names start so); others under its FTX_HOME are not."""


def role(pid: str, home: str, command: int) -> str | None:
    """What a process is in the deployment under ``home`` (its ``FTX_HOME``), or None when it is none of it."""
    if int(pid) == command:
        return "ftx"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if f"FTX_HOME={home}".encode() not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            return None
    except OSError:
        return None
    name = deployment_role(argv)
    return name if name.startswith(ROLES) else None


def cpu_wait_session(pid: str) -> tuple[float, float, int] | None:
    """CPU seconds, seconds runnable but waiting for a CPU (``schedstat``), session id."""
    fields = stat_fields(int(pid))
    try:
        waited = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK, waited, int(fields[3])


def sample(home: str, command: int) -> dict[str, tuple[float, float, int]]:
    """CPU seconds, runqueue wait and session id of each role now (processes of one role summed)."""
    found: dict[str, tuple[float, float, int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        name = role(pid, home, command)
        got = cpu_wait_session(pid) if name else None
        if name and got:
            cpu, waited, session = found.get(name, (0.0, 0.0, got[2]))
            found[name] = (cpu + got[0], waited + got[1], session)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ftx", default="ftx")
    parser.add_argument("--model", default="tiny-gptj")
    parser.add_argument("--bin", type=float, default=0.25, help="seconds per bin")
    args = parser.parse_args()
    home = os.environ.get("FTX_HOME", "")
    if not home:
        raise SystemExit("set FTX_HOME (the run's home; its stubs are told apart by it)")
    name = "cpu-timeline"
    started = time.monotonic()
    proc = subprocess.Popen(
        [args.ftx, "-v", "run", args.model, "--detach", "--name", name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    best: dict[str, float] = collections.defaultdict(float)
    sessions: dict[str, int] = {}
    series: list[tuple[float, dict[str, float]]] = []
    while True:
        done = proc.poll() is not None
        for key, (cpu, waited, session) in sample(home, proc.pid).items():
            best[key] = max(best[key], cpu)  # a process that ended keeps what it spent
            best[f"{key} wait"] = max(best[f"{key} wait"], waited)
            sessions.setdefault(key, session)
        series.append((time.monotonic() - started, dict(best)))
        if done:
            break
        time.sleep(0.03)
    subprocess.run([args.ftx, "stop", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    names = sorted(n for n in best if not n.endswith(" wait")) + [f"{WAITS} wait"]
    print("CPU seconds per bin; columns: " + ", ".join(f"{n} (session {sessions[n]})" for n in names[:-1]))
    print(f"last column: seconds the {WAITS} stub was runnable but waited for a CPU (/proc/<pid>/schedstat)")
    print(f"{'until s':>8} " + " ".join(f"{n[:14]:>14}" for n in names))
    last: dict[str, float] = {}
    edge = args.bin
    for index, (at, spent) in enumerate(series):
        if at >= edge or index == len(series) - 1:
            print(f"{at:8.2f} " + " ".join(f"{spent.get(n, 0) - last.get(n, 0):14.2f}" for n in names))
            last, edge = spent, edge + args.bin
    print(
        f"{'total':>8} " + " ".join(f"{best[n]:14.2f}" for n in names) + f"   (the command took {series[-1][0]:.2f} s)"
    )


if __name__ == "__main__":
    main()
