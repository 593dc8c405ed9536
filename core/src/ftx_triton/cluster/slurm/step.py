"""The steps of a Slurm deployment's job (``python -m ftx_triton.cluster.slurm.step``), run on the nodes.

``check-shared``: the token file the login node wrote must be here (FTX_HOME shared at the same path).
``prepare``: ``ftx run MODEL … --until configure`` (fetch, convert, tune, configure into the shared store).
``serve``: ``ftx run MODEL …`` in the foreground on rank 0's node, on ports chosen here, its address and
state recorded in ``endpoint.json`` for the login node (`ftx ps`, `ftx generate`, `ftx bench`, `ftx stop`);
SIGTERM from Slurm (scancel, the time limit) stops the server cleanly; an error line of ftx's becomes the
deployment's recorded cause.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from ftx_triton.cluster.slurm.records import TOKEN_FILE, update_endpoint
from ftx_triton.cluster.slurm.script import deployment_dir

READY_POLL_S = 0.5


def _ftx(*args: str) -> list[str]:
    return [sys.executable, "-m", "ftx_triton", *args]


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE``/``--name=VALUE`` in ``ftx run``'s arguments (the last one given)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def check_shared(home: Path, name: str, token: str) -> int:
    path = deployment_dir(home, name) / TOKEN_FILE
    try:
        found = path.read_text().strip()
    except OSError:
        found = ""
    if found != token:
        node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
        print(
            f"error: FTX_HOME={home} is not the submitting machine's on node {node} ({path} is missing there)\n"
            "hint: put FTX_HOME on storage every node mounts at the same path (NFS, Lustre, GPFS …)",
            file=sys.stderr,
            flush=True,
        )
        return 3
    return 0


def prepare(home: Path, name: str, run_args: Sequence[str]) -> int:
    update_endpoint(home, name, state="preparing", job_id=os.environ.get("SLURM_JOB_ID", ""))
    printed: list[str] = []
    code = _supervise(home, name, _ftx("run", *run_args, "--until", "configure"), ready=None, stdout=printed)
    if code == 0 and printed:  # `ftx run --until configure` prints the model repository's path
        update_endpoint(home, name, repository=printed[-1])
    return code


def serve(home: Path, name: str, run_args: Sequence[str]) -> int:
    from ftx_triton.server.ports import ServerPorts, client_host, free_ports

    host = _option(run_args, "--host") or "0.0.0.0"
    given = {k: _option(run_args, f"--{k}-port") for k in ("http", "grpc", "metrics", "openai")}
    free = free_ports(client_host(host).strip("[]"))  # not Triton's 8000-8002: a shared node's may be taken meanwhile
    ports = ServerPorts(
        *(int(given[k]) if given[k] else getattr(free, k) for k in ("http", "grpc", "metrics"))  # type: ignore[arg-type]
    )
    openai = "--no-openai" not in run_args
    openai_host = _option(run_args, "--openai-host") or "0.0.0.0"
    openai_port = int(given["openai"]) if given["openai"] else free_ports(client_host(openai_host).strip("[]")).http
    argv = ["run", *run_args, "--host", host, "--name", name, *_job_hosts(home, name)]
    argv += ["--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics)]
    if openai:
        argv += ["--openai-host", openai_host, "--openai-port", str(openai_port)]
    update_endpoint(
        home,
        name,
        state="starting",
        node=os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        job_id=os.environ.get("SLURM_JOB_ID", ""),
        http_port=ports.http,
        grpc_port=ports.grpc,
        metrics_port=ports.metrics,
        openai_port=openai_port if openai else None,
    )
    ready = [f"http://{client_host(host)}:{ports.http}/v2/health/ready"]
    if openai:
        ready.append(f"http://{client_host(openai_host)}:{openai_port}/v1/models")
    return _supervise(home, name, _ftx(*argv), ready=ready)


def _job_hosts(home: Path, name: str) -> list[str]:
    """With several nodes: ``--hosts FILE`` listing the job's nodes, rank 0 (this one) first, ``gpus=N`` each;
    the FasterTransformer runtime starts one rank per node over them (tp = GPUs per node, pp = nodes)."""
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1)
    if nodes < 2:
        return []
    listed = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    ).stdout.split()
    here = os.environ.get("SLURMD_NODENAME", "")
    ordered = sorted(listed, key=lambda n: n != here)
    gpus = os.environ.get("SLURM_GPUS_PER_NODE", "").rpartition(":")[2]
    suffix = f" gpus={gpus}" if gpus.isdigit() else ""
    path = deployment_dir(home, name) / f"hosts-{os.environ.get('SLURM_JOB_ID', '0')}"
    path.write_text("".join(f"{node}{suffix}\n" for node in ordered))
    return ["--hosts", str(path)]


def _supervise(home: Path, name: str, argv: list[str], ready: list[str] | None, stdout: list[str] | None = None) -> int:
    """Run ``argv``, its stderr copied to ours (the job log) with its last error kept (its stdout lines kept in
    ``stdout`` when given); record readiness and the end (exit status, cause); SIGTERM and SIGINT are passed
    on so the server stops cleanly."""
    child = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE if stdout is not None else None,
        text=True,
        errors="replace",
    )
    errors: list[str] = []
    signalled: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        signalled.append(signum)
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    reader = threading.Thread(target=_copy_errors, args=(child.stderr, errors), daemon=True)
    reader.start()
    if ready is not None:
        _await_ready(home, name, child, ready)
    if stdout is not None and child.stdout is not None:
        for line in child.stdout:
            sys.stdout.write(line)
            if line.strip():
                stdout.append(line.strip())
    code = child.wait()
    reader.join(timeout=5)
    if code == 0 and ready is None:
        return 0
    if signalled:
        cause = f"stopped by Slurm ({signal.Signals(signalled[0]).name}: scancel, `ftx stop`, or the time limit)"
    else:
        cause = " ".join(errors[-2:]) or f"ftx exited with status {code}"
    update_endpoint(home, name, state="ended", exit_code=code, cause=cause, ended_at=time.time())
    return code or (0 if signalled else 1)


def _copy_errors(stream: IO[str] | None, errors: list[str]) -> None:
    for line in stream or ():
        sys.stderr.write(line)
        sys.stderr.flush()
        text = line.strip()
        if text.startswith("error:"):
            errors[:] = [text]
        elif text.startswith("hint:") and errors:
            errors.append(text)


def _await_ready(home: Path, name: str, child: subprocess.Popen[str], urls: list[str]) -> None:
    """Record ``running`` once every URL answers (Triton ready, then the OpenAI endpoint if any)."""
    from ftx_triton.server.ports import http_ok

    while child.poll() is None:
        if all(http_ok(url) for url in urls):
            update_endpoint(home, name, state="running", pid=os.getpid(), ready_at=time.time())
            return
        time.sleep(READY_POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name if __spec__ else 'step'}")
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("step", choices=("check-shared", "prepare", "serve"))
    parser.add_argument("--token", default="")
    parser.add_argument("run_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    if args.step == "check-shared":
        return check_shared(args.home, args.name, args.token)
    if args.step == "prepare":
        return prepare(args.home, args.name, run_args)
    return serve(args.home, args.name, run_args)


if __name__ == "__main__":
    sys.exit(main())
