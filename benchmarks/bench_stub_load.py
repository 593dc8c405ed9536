#!/usr/bin/env python3
"""The python runtime's ``fastertransformer`` stub, step by step, in fresh interpreters (issue 40).

Each repeat starts ``python`` as Triton's Python backend starts the stub's model: import the model module
(``ftx_triton.runtime.python.triton_model``), build the model from a converted ``<tp>-gpu`` directory
(``FtModel.from_config``), answer one greedy request (the smoke generation's kind); beside it a
``python -c "import torch"``. Medians of the steps, their ratio to ``import torch``, and whether transformers
was imported by then::

    python benchmarks/bench_stub_load.py FT_DIR --family gptj --repeat 5

Another version of ftx is measured by putting its sources first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

STUB = """
import json, sys, time
t0 = time.perf_counter()
from ftx_triton.runtime.python.triton_model import FtModel
t1 = time.perf_counter()
import numpy as np
config = {{"name": "fastertransformer", "parameters": {{
    "model_checkpoint_path": {{"string_value": {path!r}}}, "ftx_family": {{"string_value": {family!r}}},
    "data_type": {{"string_value": "fp32"}}}}, "output": [{{"name": "output_ids", "data_type": "TYPE_UINT32"}}]}}
try:  # as the stub builds it (its own process: a small CPU model's threads); older versions lack the argument
    model = FtModel.from_config(config, device="cpu", own_process=True)
except TypeError:
    model = FtModel.from_config(config, device="cpu")
t2 = time.perf_counter()
loaded_transformers = "transformers" in sys.modules
reply = model.infer([{{"input_ids": np.array([[5, 6, 7, 8]], np.uint32),
    "input_lengths": np.array([[4]], np.uint32), "request_output_len": np.array([[8]], np.uint32)}}])[0]
t3 = time.perf_counter()
assert reply.error is None, reply.error
print(json.dumps({{"import model module": t1 - t0, "build the model": t2 - t1, "first greedy request": t3 - t2,
    "transformers at ready": loaded_transformers, "transformers after the request": "transformers" in sys.modules}}))
"""


def timed(args: list[str]) -> tuple[float, str, float]:
    """Wall seconds, output and CPU seconds (user + system: load disturbs them less) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, done.stdout, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ft_dir", help="a converted <tp>-gpu directory")
    parser.add_argument("--family", default="gptj")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    script = STUB.format(path=os.path.abspath(args.ft_dir), family=args.family)
    torch_runs, walls, steps, torch_cpu, cpus = [], [], [], [], []
    for _ in range(args.repeat):
        wall, _, cpu = timed([sys.executable, "-c", "import torch"])
        torch_runs.append(wall)
        torch_cpu.append(cpu)
        wall, out, cpu = timed([sys.executable, "-c", script])
        walls.append(wall)
        cpus.append(cpu)
        steps.append(json.loads(out.strip().splitlines()[-1]))
    torch_s = statistics.median(torch_runs)
    print(f"the python runtime's stub, median of {args.repeat}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for key in steps[0]:
        values = [s[key] for s in steps]
        shown = f"{statistics.median(values):.2f}" if isinstance(values[0], float) else str(sorted(set(values)))
        print(f"  {key:<40}{shown:>10}")
    print(f"  {'interpreter to answer (wall)':<40}{statistics.median(walls):>10.2f}")
    print(f"  {'python -c import torch':<40}{torch_s:>10.2f}")
    print(f"  ratio: {statistics.median(w / t for w, t in zip(walls, torch_runs, strict=True)):.2f}x import torch")
    print(f"  {'CPU s: the stub to its answer':<40}{statistics.median(cpus):>10.2f}")
    print(f"  {'CPU s: python -c import torch':<40}{statistics.median(torch_cpu):>10.2f}")
    ratio = statistics.median(c / t for c, t in zip(cpus, torch_cpu, strict=True))
    print(f"  CPU ratio: {ratio:.2f}x import torch")


if __name__ == "__main__":
    main()
