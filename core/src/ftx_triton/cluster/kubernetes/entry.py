"""What a LeaderWorkerSet's pods run (``python -m ftx_triton.cluster.kubernetes.entry leader|worker``).

LWS gives every container of a group ``LWS_LEADER_ADDRESS`` (``<set>-<group>.<subdomain>.<namespace>``, the
leader pod's DNS name), ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX``; worker *i* is ``<set>-<group>-<i>`` under
the same subdomain. The leader writes the hosts file of its group (itself first, ``gpus=`` the GPUs per pod),
waits until every worker's sshd answers (a worker pod that never comes is an error naming it: the pod
exits, and ``RecreateGroupOnPodRestart`` starts the group again), then becomes ``ftx run … --hosts FILE``,
whose FasterTransformer runtime starts one rank per pod through mpirun and ftx's rank launcher. A worker
runs sshd on ``SSH_PORT`` with the key of the ``<name>-ssh`` Secret, for the leader's mpirun.
Imports only the standard library and ftx's ports: it starts once per pod.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SSH_PORT = 2222
WAIT_S = 600.0
"""How long the leader waits for its workers' sshd (``FTX_WORKER_WAIT_S`` overrides)."""
KEY_DIR = Path("/etc/ftx-ssh")


def group_hosts(environ: Mapping[str, str]) -> list[str]:
    """The group's pods, leader first, from LWS's variables."""
    leader = environ.get("LWS_LEADER_ADDRESS", "")
    size_text = environ.get("LWS_GROUP_SIZE", "")
    if not leader or not size_text.isdigit() or int(size_text) < 1:
        raise ValueError("LWS_LEADER_ADDRESS and LWS_GROUP_SIZE are not set: is this pod part of a LeaderWorkerSet?")
    first, dot, rest = leader.partition(".")
    return [leader, *(f"{first}-{i}{dot}{rest}" for i in range(1, int(size_text)))]


def hosts_text(hosts: Sequence[str], gpus: str) -> str:
    suffix = f" gpus={gpus}" if gpus.isdigit() and int(gpus) > 0 else ""
    return "".join(f"{host}{suffix}\n" for host in hosts)


def wait_for_workers(hosts: Sequence[str], port: int, timeout_s: float) -> str | None:
    """None once every host answers on ``port``; else the first that did not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    waiting = list(hosts)
    while waiting:
        try:
            with socket.create_connection((waiting[0], port), timeout=2):
                waiting.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            return waiting[0]
        time.sleep(1.0)
    return None


def _fail(message: str, hint: str) -> int:
    print(f"error: {message}\nhint: {hint}", file=sys.stderr, flush=True)
    return 1


def leader(run_args: Sequence[str], environ: Mapping[str, str], work: Path) -> int:
    try:
        hosts = group_hosts(environ)
    except ValueError as exc:
        return _fail(str(exc), "run `ftx run` directly outside a LeaderWorkerSet")
    timeout = float(environ.get("FTX_WORKER_WAIT_S", WAIT_S))
    missing = wait_for_workers(hosts[1:], SSH_PORT, timeout)
    if missing is not None:
        return _fail(
            f"worker pod {missing} never came (no sshd on port {SSH_PORT} after {timeout:.0f} s)",
            "`kubectl get pods -l leaderworkerset.sigs.k8s.io/name` shows it: pending for GPUs, image pull, or the "
            "ssh Secret missing; the group restarts (RecreateGroupOnPodRestart)",
        )
    work.mkdir(parents=True, exist_ok=True)
    hostfile = work / "hosts"
    hostfile.write_text(hosts_text(hosts, environ.get("FTX_GPUS_PER_NODE", "")))
    _install_key(Path.home() / ".ssh")
    argv = ["ftx", "run", *run_args, "--hosts", str(hostfile), "--ssh-port", str(SSH_PORT)]
    print(f"ftx: leader of {len(hosts)} pods: {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)
    return 0  # not reached


def _install_key(ssh: Path) -> None:
    """The group's key (the Secret) as this user's ssh identity, host keys not pinned (pods are recreated)."""
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    if (KEY_DIR / "id").is_file():
        shutil.copyfile(KEY_DIR / "id", ssh / "id_ed25519")
        (ssh / "id_ed25519").chmod(0o600)
    (ssh / "config").write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")


def worker() -> int:
    """sshd in the foreground with the Secret's public key (the leader's mpirun starts the rank here)."""
    ssh = Path.home() / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (KEY_DIR / "id.pub").is_file():
        return _fail(
            f"no {KEY_DIR}/id.pub: the group's ssh Secret is not mounted",
            "create it: ssh-keygen -t ed25519 -N '' -f id && kubectl create secret generic NAME-ssh "
            "--from-file=id --from-file=id.pub",
        )
    shutil.copyfile(KEY_DIR / "id.pub", ssh / "authorized_keys")
    (ssh / "authorized_keys").chmod(0o600)
    os.system("ssh-keygen -A >/dev/null")  # noqa: S605 - host keys of this pod
    Path("/run/sshd").mkdir(exist_ok=True)
    argv = ["/usr/sbin/sshd", "-D", "-e", "-p", str(SSH_PORT)]
    os.execv(argv[0], argv)
    return 0  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftx_triton.cluster.kubernetes.entry")
    parser.add_argument("role", choices=("leader", "worker"))
    parser.add_argument("run_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.role == "worker":
        return worker()
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    return leader(run_args, os.environ, Path(tempfile.gettempdir()) / f"ftx-lws-{os.getpid()}")  # the pod's own


if __name__ == "__main__":
    sys.exit(main())
