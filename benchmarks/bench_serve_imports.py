#!/usr/bin/env python3
"""CPU seconds of a cached run's serve-stage imports in ftx's own process, two versions interleaved (issue 40).

Each round runs both versions (``git archive`` exports, their sources first on ``PYTHONPATH``) once, in alternating
order, each in a fresh interpreter: it imports what ftx has imported by its serve stage (structlog, the CLI, the
pipeline), then what the python runtime's serve stage imports (its serve module, the smoke generation with its
imports ahead, tritonserver's manager, the model gate, the stubs' numpy check, the deployment and the endpoint's
description), and prints the CPU seconds since, and whether numpy and tritonclient were imported. Medians, their
ratio and the load average::

    python benchmarks/bench_serve_imports.py --before /tmp/ftx-before --after /tmp/ftx-after --rounds 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = """
import resource, sys


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


import structlog, ftx_triton.cli, ftx_triton.engine.pipeline  # what ftx has imported by its serve stage
start = cpu()
from ftx_triton.runtime.python import serve
from ftx_triton.server import smoke, tritonserver
from ftx_triton.front.model_gate import gate_spec
smoke.import_while_loading().join()
from ftx_triton.server.stub_env import needed
needed()
import ftx_triton.engine.deployment, ftx_triton.cli.serving
print(cpu() - start, int("numpy" in sys.modules), int("tritonclient" in sys.modules))
"""
PACKAGES = ("core/src", "plugins/gptj/src", "plugins/gptneox/src", "plugins/kogpt/src", "plugins/t5/src")


def measure(root: Path) -> tuple[float, bool, bool]:
    """One fresh interpreter on the export at ``root``: CPU seconds, numpy imported, tritonclient imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / p) for p in PACKAGES)}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    seconds, numpy, tritonclient = done.stdout.split()
    return float(seconds), numpy == "1", tritonclient == "1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="export of the version before")
    parser.add_argument("--after", type=Path, required=True, help="export of the version after")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, bool, bool]]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
        for name in order:
            runs[name].append(measure(getattr(args, name)))
    print(f"serve-stage imports in ftx's process, {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}")
    medians = {}
    for name, found in runs.items():
        seconds = [s for s, _, _ in found]
        medians[name] = statistics.median(seconds)
        print(
            f"  {name:<7} CPU s median {medians[name]:.3f} (range {min(seconds):.3f}-{max(seconds):.3f}); "
            f"numpy {any(n for _, n, _ in found)}, tritonclient {any(t for _, _, t in found)}"
        )
    print(f"  after / before: {medians['after'] / medians['before']:.2f}x")


if __name__ == "__main__":
    main()
