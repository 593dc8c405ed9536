#!/usr/bin/env python3
"""ftx's own seconds of a cached ``fastertransformer-native`` start, on a machine without a GPU (issue 40).

A GPU host's cached ``ftx -v run CHECKPOINT --runtime fastertransformer-native --tp 2`` spends its time in ftx
(start, plan, the cached stages, the serve stage up to spawning tritonserver) and in tritonserver's model load.
This script reproduces ftx's part here: a stand-in ``nvidia-smi`` on ``PATH`` (two H200s), a stand-in backend
build published in the store under this host's real build key (this machine's nvcc, compiler and MPI are
probed for real), and a tiny fp16 GPT-J checkpoint. A first run fills the store; each repeat then runs the
same command, which goes through every cached stage and the serve stage's set-up until tritonserver is
spawned (it then fails to load the stand-in backend library, which ends the run). The steps come from ftx's
``timeline.step`` lines; "serve to spawn" is the arrival of the ``server.spawned`` line after ``configure``. The
OpenAI front's step is measured apart: a warm front process, left 5 s for its imports (the model's load on a GPU
host), handed the configured repository until its ``/health`` answers.

    python benchmarks/bench_native_start.py --repeat 5
    python benchmarks/bench_native_start.py --repeat 5 --version before=/tmp/old/core/src:/tmp/old/plugins/gptj/src

Each ``--version NAME=PYTHONPATH`` puts that version's sources first on ``PYTHONPATH`` (``this`` is the installed
one); the versions alternate within each repeat, so they see the same load. Bytecode goes to a cache under
the work folder (``PYTHONPYCACHEPREFIX``), as an installed package has its ``.pyc`` files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

NVIDIA_SMI = """#!/bin/sh
# stand-in for nvidia-smi (this machine has no GPU): two H200s
case "$*" in
  *driver_version*) echo 580.159.04; echo 580.159.04;;
  *compute_cap*) echo "0, NVIDIA H200, 9.0, GPU-0, 143771"; echo "1, NVIDIA H200, 9.0, GPU-1, 143771";;
  *) echo "0, NVIDIA H200, GPU-0, 143771"; echo "1, NVIDIA H200, GPU-1, 143771";;
esac
"""
FRONT = """
import sys, time
from pathlib import Path
from ftx_triton.openai_api.launch import WarmFront, start_openai
repository, home, wait_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
warm = WarmFront(detach=False)
warm.start()
time.sleep(wait_s)  # what the model's load gives it on a GPU host (seconds)
started = time.monotonic()
endpoint = start_openai("http://127.0.0.1:9", repository, "bench", home=home, triton_grpc="127.0.0.1:9", warm=warm)
print(time.monotonic() - started)
endpoint.stop()
"""
"""The OpenAI front's step: a warm front process started, given the model's load time, then handed its arguments
(a dead Triton address: ``/health`` answers 503, which counts as up) until it answers."""
STEP = re.compile(r"^timeline\.step step='?([a-z ]+?)'? seconds=([\d.]+)")
SPAWNED = re.compile(r"server\.spawned")


def prepare(work: Path) -> tuple[Path, dict[str, str]]:
    """The checkpoint, the stand-in nvidia-smi and an FTX_HOME holding a stand-in backend build."""
    from ftx_gptj.tiny import tiny_gptj
    from ftx_triton.runtime.fastertransformer.native import BACKEND_STAGE
    from ftx_triton.runtime.fastertransformer.native.build import MANIFEST, backend_key
    from ftx_triton.runtime.fastertransformer.native.toolchain import preflight
    from ftx_triton.store.artifact_store import ArtifactStore

    bin_dir, home, ckpt = work / "bin", work / "home", work / "ckpt"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(FTX_HOME=str(home), PATH=f"{bin_dir}:{env['PATH']}", PYTHONPYCACHEPREFIX=str(work / "pycache"))
    os.environ["PATH"] = env["PATH"]
    if not (ckpt / "config.json").exists():
        tiny_gptj(ckpt, dtype="float16", n_layer=4, n_embd=256)
    pre = preflight()

    def stand_in(tmp: Path) -> dict[str, object]:
        (tmp / "backends" / "fastertransformer").mkdir(parents=True)
        (tmp / "backends" / "fastertransformer" / "libtriton_fastertransformer.so").write_bytes(b"stand-in")
        (tmp / MANIFEST).write_text(json.dumps({"sm": list(pre.sm)}))
        return {}

    ArtifactStore(home).build(BACKEND_STAGE, backend_key(pre), stand_in, inputs={}, producer={})
    return ckpt, env


def one_run(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """The timeline's steps, serve's set-up to the spawn, and the command's wall seconds to that spawn."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out: dict[str, float] = {}
    configured = None
    tail: list[str] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        at = time.monotonic() - t0
        tail = [*tail[-20:], line]
        if match := STEP.match(line):
            out[match[1]] = float(match[2])
            if match[1] == "configure":
                configured = at
        elif SPAWNED.search(line) and configured is not None:
            out["serve to spawn"] = at - configured
            out["to spawn (wall)"] = at
    proc.wait()
    if "to spawn (wall)" not in out:
        raise SystemExit(f"{' '.join(cmd)} did not reach the spawn:\n{''.join(tail)}")
    return out


def front_seconds(repository: Path, home: Path, env: dict[str, str]) -> float:
    """Seconds from handing the warm front its arguments to its first ``/health`` answer."""
    out = subprocess.run(
        [sys.executable, "-c", FRONT, str(repository), str(home), "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ftx-bench-native-start"))
    parser.add_argument("--version", action="append", default=[], help="NAME=PYTHONPATH (repeatable)")
    args = parser.parse_args()
    ckpt, env = prepare(args.work)
    ftx = [sys.executable, "-c", "from ftx_triton.cli import main; main()"]
    cmd = [*ftx, "-v", "run", str(ckpt), "--runtime", "fastertransformer-native", "--tp", "2", "--no-tune"]
    versions = {"this": ""} if not args.version else dict(v.split("=", 1) for v in args.version)
    envs = {
        name: {**env, "PYTHONPATH": os.pathsep.join(p for p in (path, env.get("PYTHONPATH", "")) if p)}
        for name, path in versions.items()
    }
    for name in versions:  # fills the store (and the bytecode cache) for each version
        one_run([*cmd, "--name", f"bench-{name}"], envs[name])
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    loads = []
    for i in range(args.repeat):
        order = list(versions) if i % 2 == 0 else list(reversed(versions))
        for name in order:
            loads.append(os.getloadavg()[0])
            runs[name].append(one_run([*cmd, "--name", f"bench-{name}"], envs[name]))
            repository = next((Path(envs[name]["FTX_HOME"]) / "store" / "configure").iterdir())
            runs[name][-1]["openai front (arguments to /health)"] = front_seconds(
                repository, Path(envs[name]["FTX_HOME"]), envs[name]
            )
    keys = list(runs[next(iter(versions))][0])
    print(
        f"cached native start to tritonserver spawned, median of {args.repeat} (load average {min(loads):.1f}-"
        f"{max(loads):.1f}, {os.cpu_count()} CPUs)"
    )
    print(f"| step | {' | '.join(f'{n} s' for n in versions)} |" + (" ratio |" if len(versions) == 2 else ""))
    for key in keys:
        values = [statistics.median(r.get(key, 0.0) for r in runs[n]) for n in versions]
        ratio = (
            f" {values[0] / values[1]:.2f}x |" if len(values) == 2 and values[1] else (" |" if len(values) == 2 else "")
        )
        print(f"| {key} | {' | '.join(f'{v:.3f}' for v in values)} |{ratio}")


if __name__ == "__main__":
    main()
