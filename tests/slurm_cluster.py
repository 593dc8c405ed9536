"""A real one-node Slurm cluster for the Slurm launcher's tests: Debian's ``slurm-wlm`` and ``munge``.

``SlurmCluster`` writes a munge key and a ``slurm.conf`` under one temporary directory and starts ``munged``,
``slurmctld`` and ``slurmd`` on 127.0.0.1 (free ports, their own state, spool, pid and log files); the node
is this machine, under its own hostname, in the default partition ``debug``. A second partition ``far``
holds a node ``ghost`` that never runs (DOWN), so a request for it can be refused as a real cluster would.
Commands reach it through ``SLURM_CONF`` (:attr:`env`). ``stop`` cancels every job, waits for them,
stops the daemons and kills the step daemons (``slurmstepd``) they leave, then removes the directory.
A killed test run's daemons get SIGTERM through PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ftx_triton.server.ports import loopback_port

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str | None:
    """Why no cluster can start here (None when it can)."""
    absent = [
        d for d in (*DAEMONS, "sbatch", "srun") if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()
    ]
    if absent:
        return f"no {', '.join(absent)} (apt-get install slurm-wlm munge; scripts/setup.sh --dev does)"
    if os.geteuid() != 0:
        return "slurmd must run as root"
    return None


def _die_with_parent() -> None:
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """slurmctld + slurmd + munged on this machine, owned by the tests."""

    def __init__(self, cpus: int = 2) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ftx-slurm-"))
        self.root.chmod(0o755)  # munged wants its socket's directories searchable
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen[bytes]] = []

    def _write_config(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        munge.chmod(0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir()
        r = self.root
        ctld_port = loopback_port()
        self.conf.write_text(
            f"""ClusterName=ftxtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={loopback_port(avoid={ctld_port})}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=3
MinJobAge=3600
InactiveLimit=0
MessageTimeout=10
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
NodeName=ghost NodeAddr=192.0.2.1 CPUs=2 State=DOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
PartitionName=far Nodes=ghost MaxTime=INFINITE State=UP
"""
        )

    def _spawn(self, argv: list[str], log: str) -> None:
        with (self.root / "log" / log).open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            )

    def start(self, timeout_s: float = 60.0) -> None:
        self._write_config()
        m = self.root / "munge"
        self._spawn(
            [
                _binary("munged"),
                "-F",
                "-f",
                f"--key-file={m / 'munge.key'}",
                f"--socket={self.socket}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
            "munged.out",
        )
        self._wait(lambda: self.socket.exists(), timeout_s, "munged")
        self._spawn([_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        self._wait(lambda: self.run("scontrol", "ping").returncode == 0, timeout_s, "slurmctld")
        self._spawn([_binary("slurmd"), "-D", "-f", str(self.conf), "-N", self.node], "slurmd.out")
        self._wait(self._node_idle, timeout_s, "slurmd")

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-n", self.node, "-o", "%t").stdout.strip()
        return out.startswith(("idle", "mix", "alloc"))

    def _wait(self, ready: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.2)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((self.root / "log").glob("*"))
        )
        self.stop()
        raise RuntimeError(f"{what} did not start:\n{logs}")

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def jobs(self) -> list[str]:
        """Lines of squeue: ``id state`` of every job the cluster still runs or queues."""
        return self.run("squeue", "-h", "-o", "%i %T").stdout.split("\n")[:-1]

    def step_daemons(self) -> list[int]:
        """slurmstepd processes of this cluster (their environment names its slurm.conf)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if Path(entry, "comm").read_text().strip() != "slurmstepd":
                    continue
                if f"SLURM_CONF={self.conf}".encode() in Path(entry, "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "-u", "root")
            deadline = time.monotonic() + 20
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.3)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.step_daemons():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------- the fixture


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The one-node cluster, started once per session (about 2 s) and stopped at its end."""
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
