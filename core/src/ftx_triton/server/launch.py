"""One supervised tritonserver process as it is spawned: the command, environment, folder and log file.

:class:`~ftx_triton.server.tritonserver.TritonServer` describes each start as a :class:`Launch` and spawns it
here; :mod:`ftx_triton.server.head_start` spawns the same description early. Standard library only: this
module is imported while the ``ftx`` command is starting.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

SHM_PREFIX = "triton_python_backend_shm_region_"
FTX_SHM_PREFIX = SHM_PREFIX + "ftx-"
LEASH_FLAG = "--leash"
"""Supervisor flag: stop the server when stdin ends before it says ``release`` (see :mod:`~ftx_triton.server.supervisor`)."""
RELEASE = b"r"


def new_shm_prefix() -> str:
    """A fresh prefix for one server's Python-backend shared memory."""
    return f"{FTX_SHM_PREFIX}{secrets.token_hex(6)}-"


def is_ftx_shm_prefix(prefix: str) -> bool:
    """Whether ``prefix`` names one ftx server's shared memory (a prefix ftx made, not its common start, which
    every ftx server's regions share)."""
    return prefix.startswith(FTX_SHM_PREFIX) and prefix != FTX_SHM_PREFIX


def log_file_name(name: str, shm_prefix: str) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>-<6 hex of the shm prefix>.log``: a server's log, unique per start."""
    return f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{shm_prefix[-7:-1]}.log"


def parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when this process dies (Linux only)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass(frozen=True)
class Launch:
    """Everything one spawn of the supervisor is: two equal launches start the same server (the random parts,
    shared-memory prefix, internal ports and log file, are in it too)."""

    argv: tuple[str, ...]
    """``python -m ftx_triton.server.supervisor SPEC``."""
    env: Mapping[str, str] = field(hash=False)
    cwd: str
    log_path: str
    header: str
    """The line written to the log before the server's own output (``# ftx: <tritonserver command>``)."""
    die_with_parent: bool

    @property
    def spec(self) -> dict[str, Any]:
        """The supervisor's SPEC (the last argument)."""
        return dict(json.loads(self.argv[-1]))

    @property
    def internal_ports(self) -> tuple[int | None, int | None]:
        """tritonserver's own HTTP and gRPC ports behind the supervisor's fronts (None: that front is off)."""
        spec = self.spec
        return (spec.get("front") or {}).get("upstream_port"), (spec.get("grpc_front") or {}).get("upstream_port")

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": self.cwd,
            "log_path": self.log_path,
            "header": self.header,
            "die_with_parent": self.die_with_parent,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Launch:
        return cls(
            argv=tuple(str(a) for a in data["argv"]),
            env={str(k): str(v) for k, v in dict(data["env"]).items()},
            cwd=str(data["cwd"]),
            log_path=str(data["log_path"]),
            header=str(data["header"]),
            die_with_parent=bool(data["die_with_parent"]),
        )

    def spawn(self, *, leash: bool = False) -> tuple[subprocess.Popen[bytes], int]:
        """Start the supervisor in a session of its own, its output appended to the log; the process and the log
        offset where this start's output begins. ``leash``: its stdin is a pipe from this process, and it stops
        the server when that ends before :func:`release` (instead of dying with this process by a signal)."""
        log_path = Path(self.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [*self.argv[:-1], LEASH_FLAG, self.argv[-1]] if leash else list(self.argv)
        with log_path.open("ab") as out:
            out.write(f"{self.header}\n".encode())
            out.flush()
            offset = out.tell()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if leash else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(self.env),
                cwd=self.cwd,
                start_new_session=True,
                # only prctl/getppid/kill run between fork and exec
                preexec_fn=parent_death_signal() if self.die_with_parent and not leash else None,  # noqa: PLW1509
            )
        return proc, offset


def release(leash: IO[bytes] | None) -> None:
    """Let a leashed supervisor outlive this process (a detached server)."""
    if leash is None or leash.closed:
        return
    try:
        leash.write(RELEASE)
        leash.close()
    except OSError:  # it already stopped: nothing to release
        pass


__all__ = [
    "FTX_SHM_PREFIX",
    "LEASH_FLAG",
    "Launch",
    "log_file_name",
    "is_ftx_shm_prefix",
    "new_shm_prefix",
    "parent_death_signal",
    "release",
]
