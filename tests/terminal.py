"""Run the real ``ftx`` command with stderr on a pseudo-terminal (python ``pty``), as a person's
terminal is, while stdout is a pipe, as in ``D=$(ftx convert ./ckpt -o out)``."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FTX = str(Path(sys.executable).parent / "ftx")


@dataclass
class TerminalRun:
    code: int
    stdout: str
    terminal: str
    """Everything written to the terminal (stderr), escape sequences included."""


def run_in_terminal(
    args: list[str],
    env: dict[str, str],
    *,
    timeout_s: float = 300.0,
    on_output: Callable[[str, subprocess.Popen], None] | None = None,
    cwd: Path | None = None,
) -> TerminalRun:
    """Run ``ftx ARGS`` with stderr (and stdin) on a 120x40 pseudo-terminal and stdout on a pipe.

    ``on_output(terminal_so_far, process)`` is called whenever the terminal gets output (a test
    may send a signal from there).
    """
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    full_env = {**env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    full_env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [FTX, *args], stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=full_env, cwd=cwd, start_new_session=True
    )
    os.close(slave)
    terminal = b""
    stdout = b""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    out_fd = proc.stdout.fileno()
    open_fds = {master, out_fd}
    try:
        while open_fds and time.monotonic() < deadline:
            ready, _, _ = select.select(list(open_fds), [], [], 0.2)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal closes with EIO when the process is gone
                    chunk = b""
                if not chunk:
                    open_fds.discard(fd)
                    continue
                if fd == master:
                    terminal += chunk
                    if on_output is not None:
                        on_output(terminal.decode("utf-8", "replace"), proc)
                else:
                    stdout += chunk
            if proc.poll() is not None and not ready:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return TerminalRun(code, stdout.decode("utf-8", "replace"), terminal.decode("utf-8", "replace"))
