"""Inside a private network namespace: serve one repository on Triton's fixed ports, run client scripts.

Usage: ``python upstream_namespace_runner.py PLAN.json`` under ``unshare -n`` (``-rn`` when not root);
``python upstream_namespace_runner.py --probe`` only brings the namespace's loopback up (exit 0 when
that works). fastertransformer_backend's clients hard-code localhost:8000 (HTTP) and :8001 (gRPC); in a
namespace of its own the server takes those ports without touching other servers on the machine. PLAN
names the repository, FTX_HOME, the clients' interpreter and ``launcher`` (``upstream_client_launcher.py``)
and its ``jobs`` file, run once against the one server.

The loopback is brought up with the ``SIOCSIFFLAGS`` ioctl rather than ``ip link``, so the namespace
needs nothing beyond util-linux's ``unshare`` (iproute2 is not on every minimal system).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH14s"  # struct ifreq: the interface name, then ifr_flags (padded to the union's size)


def loopback_up() -> None:
    """``ip link set lo up``: a new network namespace starts with its loopback down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        current = fcntl.ioctl(sock, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0, b""))
        flags = struct.unpack(_IFREQ, current)[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP, b""))


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server on the way out
    loopback_up()
    if sys.argv[1] == "--probe":
        return
    plan = json.loads(Path(sys.argv[1]).read_text())
    from ftx_triton.server.ports import ServerPorts
    from ftx_triton.server.tritonserver import TritonServer

    # One torch thread per process: the test runs two servers and several scripts at once, and torch's
    # default (a thread per core) spins against them (a tiny model's request took 5-10x longer).
    threads = {"OMP_NUM_THREADS": "1"}
    with TritonServer(
        Path(plan["repository"]),
        home=Path(plan["home"]),
        ports=ServerPorts(8000, 8001, 8002),
        env={"FTX_DEVICE": "cpu", **threads},
        name=plan.get("name", "upstream-clients"),
    ):
        subprocess.run(
            [plan["python"], plan["launcher"], plan["jobs"]],
            check=True,
            timeout=plan["timeout"],
            env={**os.environ, **threads},
        )


if __name__ == "__main__":
    main()
