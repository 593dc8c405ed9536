"""From `ftx slurm run` to a submitted job: the request checked (ftx run's options, Slurm's own
``--test-only``, FTX_HOME shared), the records written, the job submitted and followed until it serves."""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ftx_triton.cluster.slurm import scheduler
from ftx_triton.cluster.slurm.records import JOB_FILE, SCRIPT_FILE, TOKEN_FILE, deployment_names, read_json, write_json
from ftx_triton.cluster.slurm.script import SlurmRequest, deployment_dir, render
from ftx_triton.errors import ConfigError, ServeError
from ftx_triton.plan.cluster import ClusterDeployment

REFUSED_RUN_OPTIONS = {
    "detach": "a Slurm deployment is always left running: `ftx stop NAME` ends it",
    "prompt": "ask the running deployment instead: `ftx generate NAME 'a prompt'`",
    "dry_run": "give --dry-run to `ftx slurm run` itself: it prints the batch script",
    "name": "give --name to `ftx slurm run` itself",
    "hosts": "Slurm chooses the nodes: ask for them with --nodes (and --partition)",
    "until": "the job prepares and serves; `ftx run --until …` runs on this machine",
    "lock_file": "give MODEL (the job replays no ftx.toml of this directory)",
}

LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "zfs", "f2fs", "vfat", "devtmpfs", "squashfs"}
)
"""File systems that live on one machine: an FTX_HOME there is not the compute nodes' FTX_HOME."""


def mount_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/self/mounts), or "" when unknown."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    best, kind = "", ""
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def this_machine(node: str) -> bool:
    names = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
    return node in names


def check_shared_home(home: Path, partition: str | None) -> None:
    """FTX_HOME must be the same directory on the nodes: refused when the partition has another machine and
    FTX_HOME is on a file system of this machine only (local disk, tmpfs)."""
    others = [n for n in scheduler.partition_nodes(partition) if not this_machine(n)]
    kind = mount_type(home)
    if others and kind in LOCAL_FILESYSTEMS:
        raise ConfigError(
            f"FTX_HOME={home} is on a {kind} file system of this machine, which node {others[0]} of "
            f"partition {partition or '(default)'} cannot see",
            hint="point FTX_HOME at storage every node mounts at the same path (NFS, Lustre, GPFS, BeeGFS …)",
        )


def choose_name(home: Path, model: str, wanted: str | None) -> str:
    """``wanted`` (refused when a live deployment has it) or one from MODEL, numbered -2, -3 … when taken."""
    from ftx_triton.server.smoke import server_name

    taken = set(deployment_names(home))
    if wanted:
        if wanted in taken:
            raise ConfigError(
                f"a Slurm deployment named {wanted!r} exists",
                hint=f"`ftx stop {wanted}` ends it, or choose another --name",
            )
        return wanted
    base = server_name(model)
    return next(n for n in (base, *(f"{base}-{i}" for i in range(2, 1000))) if n not in taken)


def absolute_model(model: str) -> str:
    """A local MODEL path made absolute (the job may start in another directory)."""
    return str(Path(model).resolve()) if "://" not in model and Path(model).exists() else model


def submit(request: SlurmRequest, token: str, runtime: str) -> str:
    """Check the request with Slurm, write the records, submit; return the job id. Nothing is left behind
    when Slurm refuses."""
    script = render(request, token)
    check_shared_home(request.home, request.partition)
    scheduler.test_only(script)
    directory = request.directory
    directory.mkdir(parents=True, exist_ok=True)
    try:
        (directory / SCRIPT_FILE).write_text(script)
        (directory / TOKEN_FILE).write_text(token + "\n")
        write_json(
            directory / JOB_FILE,
            {"name": request.name, "model": request.model, "runtime": runtime, "submitted_at": time.time()},
        )
        job_id = scheduler.submit(script)
    except BaseException:
        from ftx_triton.io.trees import remove_tree

        remove_tree(directory)
        raise
    write_json(directory / JOB_FILE, {**read_json(directory / JOB_FILE), "job_id": job_id})
    return job_id


def new_token() -> str:
    return secrets.token_hex(12)


def follow(
    home: Path,
    name: str,
    say: Callable[[str], None],
    find: Callable[[Path], list[ClusterDeployment]],
    timeout_s: float | None = None,
) -> ClusterDeployment:
    """Wait until the deployment serves (returned) or its job ends (a ServeError with the cause)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    said = ""
    while True:
        found = next((d for d in find(home) if d.name == name), None)
        if found is None:
            raise ServeError(f"the records of {name} are gone", hint="was it stopped (`ftx stop`) meanwhile?")
        if found.running:
            return found
        if found.state in ("ending", "ended"):
            log = deployment_dir(home, name)
            raise ServeError(
                f"the Slurm job of {name} ended: {found.cause}",
                hint=f"its log is under {log}; `ftx ps` shows it, `ftx stop {name}` removes its records",
            )
        line = f"{found.state}: {found.where}"
        if line != said:
            say(f"slurm     {line}")
            said = line
        if deadline is not None and time.monotonic() > deadline:
            raise ServeError(
                f"{name} is still {found.state} after {timeout_s:.0f} s ({found.where})",
                hint=f"it stays queued: `ftx ps` follows it, `ftx stop {name}` cancels it",
            )
        time.sleep(1.0)


def describe(deployment: ClusterDeployment) -> str:
    lines = [f"Triton HTTP  http://{deployment.http}", f"Triton gRPC  {deployment.grpc}"]
    if deployment.openai:
        lines.append(f"OpenAI       {deployment.openai}")
    lines.append(f'try it:      ftx generate {deployment.name} "Hello"')
    return "\n".join(lines)
