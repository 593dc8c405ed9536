"""The LeaderWorkerSet leader's entrypoint run for real as a "pod": two network namespaces joined by a veth
pair, each pod's DNS name in its namespace's /etc/hosts (``ip netns exec`` mounts /etc/netns/NAME/hosts),
the environment LWS gives its containers (``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``).
The leader finds its worker by the name LWS gives it, waits for its sshd port, writes the group's hosts file
and becomes ``ftx run … --hosts FILE``. STAND-INS: the worker's sshd is a plain TCP listener (no sshd here)
and ``ftx`` on the leader's PATH is a script printing what it was given (FasterTransformer needs GPUs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SUFFIX = f"{os.getpid() % 100000}"
LEADER, WORKER = f"ftxl{SUFFIX}", f"ftxw{SUFFIX}"
NAMES = {"10.231.7.1": "gptj-0.gptj.ml", "10.231.7.2": "gptj-0-1.gptj.ml"}
STANDIN_FTX = '#!/bin/sh\necho "ftx $*"\nwhile [ $# -gt 0 ]; do [ "$1" = --hosts ] && cat "$2"; shift; done\n'
LISTENER = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 2222)); s.listen(); print('listening', flush=True)\n"
    "while True:\n    s.accept()[0].close()\n"
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def pods() -> Iterator[None]:
    """Two namespaces, 10.231.7.1 (leader) and .2 (worker), the group's names in the leader's /etc/hosts."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    etc = Path("/etc/netns") / LEADER
    try:
        _ip("netns", "add", LEADER)
        _ip("netns", "add", WORKER)
        _ip("link", "add", f"vl{SUFFIX}", "type", "veth", "peer", "name", f"vw{SUFFIX}")
        for ns, dev, addr in ((LEADER, f"vl{SUFFIX}", "10.231.7.1"), (WORKER, f"vw{SUFFIX}", "10.231.7.2")):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        etc.mkdir(parents=True)
        (etc / "hosts").write_text("".join(f"{a} {n}\n" for a, n in NAMES.items()) + "127.0.0.1 localhost\n")
        yield
    finally:
        for ns in (LEADER, WORKER):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        shutil.rmtree(etc, ignore_errors=True)
        if Path("/etc/netns").is_dir() and not any(Path("/etc/netns").iterdir()):
            Path("/etc/netns").rmdir()


def _leader(tmp_path: Path, wait_s: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ftx").write_text(STANDIN_FTX)
    (bin_dir / "ftx").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "TMPDIR": str(tmp_path),
        "LWS_LEADER_ADDRESS": "gptj-0.gptj.ml",
        "LWS_GROUP_SIZE": "2",
        "LWS_WORKER_INDEX": "0",
        "FTX_GPUS_PER_NODE": "8",
        "FTX_WORKER_WAIT_S": wait_s,
        "HOME": str(tmp_path),
    }
    argv = ["ip", "netns", "exec", LEADER, sys.executable, "-m", "ftx_triton.cluster.kubernetes.entry", "leader"]
    argv += ["--", "gptj", "--tp", "8", "--pp", "2"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_leader_finds_its_worker_by_its_lws_name_and_runs_ftx_over_the_group(pods: None, tmp_path: Path) -> None:
    worker = subprocess.Popen(
        ["ip", "netns", "exec", WORKER, sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "listening"
        result = _leader(tmp_path, "20")
    finally:
        worker.kill()
        worker.wait()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ftx run gptj --tp 8 --pp 2 --hosts ") and lines[0].endswith(" --ssh-port 2222")
    assert lines[1:] == ["gptj-0.gptj.ml gpus=8", "gptj-0-1.gptj.ml gpus=8"]  # the leader first (rank 0)


def test_a_worker_pod_that_never_comes_is_named(pods: None, tmp_path: Path) -> None:
    result = _leader(tmp_path, "2")
    assert result.returncode == 1
    assert "error: worker pod gptj-0-1.gptj.ml never came (no sshd on port 2222 after 2 s)" in result.stderr
    assert "hint:" in result.stderr and "ftx run" not in result.stdout
