"""Start-up cost of the ``ftx`` command line against a bare interpreter start, measured in one run.

Each round starts ``python -c pass`` and ``python -m ftx_triton --help`` (and ``ftx run --help``, which also
lists the options the runtimes declare) as fresh processes, interleaved so both see the same machine load;
the medians of wall time and of CPU time (user + system, which a loaded machine inflates less) are printed.
The rule: ``ftx --help`` within 0.6 s on the development machine
(no numpy, ml_dtypes, torch or transformers import: ``tests/unit/cli/test_cli_start.py``).
Usage: ``python benchmarks/bench_cli_start.py [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "bare interpreter": [sys.executable, "-c", "pass"],
    "ftx --help": [sys.executable, "-m", "ftx_triton", "--help"],
    "ftx run --help": [sys.executable, "-m", "ftx_triton", "run", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, command in COMMANDS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - began)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    bare, bare_cpu = statistics.median(times["bare interpreter"]), statistics.median(cpu["bare interpreter"])
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, {args.rounds} rounds (medians)")
    for name in COMMANDS:
        wall, used = statistics.median(times[name]), statistics.median(cpu[name])
        print(
            f"{name:<18} wall {wall:6.3f} s (x{wall / bare:5.1f} the bare start)   "
            f"CPU {used:6.3f} s (x{used / bare_cpu:5.1f})"
        )


if __name__ == "__main__":
    main()
