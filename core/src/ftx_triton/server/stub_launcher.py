"""The Python-backend stub program as ftx installs it: a ``sh`` launcher in the stub's place that runs tritonserver's
stub (installed beside it, in ``ftx-stub/``), in a session of its own for the models named in
:data:`OWN_SESSION_ENV`.

Why a session: where the kernel schedules by session (``/proc/sys/kernel/sched_autogroup_enabled``, on in most
distributions' kernels), each session's processes share one equal part of the CPUs. A server's stubs start in its
session beside the supervisor and the other models' stubs, so the python runtime's model, whose stub imports torch
and is what a cached ``ftx run`` waits for, got 20-50% of a core for its first second on two cores (0.5 s of
waiting for a CPU). In a session of its own it has a group's part to itself from its exec on (on two busy cores,
its wait 0.5-1.4 s shorter, the server ready 0.5-1 s sooner); where the kernel does not group by session, or the
cores are idle, nothing changes.

The stub keeps its pid (the launcher and ``setsid`` exec it; ``setsid`` forks only a process group leader, which
the launcher checks a stub forked by tritonserver is not), its program name and arguments
(:func:`~ftx_triton.server.process_tree.is_stub`) and tritonserver as its parent (tritonserver watches it, the
supervisor's stop ends it as ever). It is outside the server's process group, though: the stop paths that kill that
group also kill the server's processes by its shared-memory prefix, which every stub's arguments carry
(:func:`~ftx_triton.server.process_tree.kill_processes_of`).

A shell script rather than a Python one: it runs before every stub, and an interpreter's start would add ~20 ms where
``sh`` and ``setsid`` take ~2 ms. With no arguments it runs the stub as is: tritonserver runs the program once that
way and expects the stub's exit status 1 (any other, it makes the file owner-execute only, which ``sh`` then
cannot read).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ftx_triton.server.process_tree import STUB_NAME

OWN_SESSION_ENV = "FTX_STUB_OWN_SESSION"
"""In a server's environment: the models (space-separated names) whose stubs run in a session of their own."""

REAL_DIR = "ftx-stub"
"""Where tritonserver's stub program is installed, under the Python backend's directory (its file name kept)."""

LAUNCHER = f"""#!/bin/sh
# ftx: runs tritonserver's Python-backend stub, in a session of its own for the models named in ${OWN_SESSION_ENV}
# (ftx_triton.server.stub_launcher). tritonserver runs it by its path, <repository>/<model>/<version>/model.py first.
stub="${{0%/*}}/{REAL_DIR}/{STUB_NAME}"
own_session() {{
    [ -n "$1" ] || return 1
    case " ${{{OWN_SESSION_ENV}-}} " in *" $1 "*) ;; *) return 1 ;; esac
    command -v setsid >/dev/null 2>&1 || return 1
    read -r stat < /proc/$$/stat || return 1
    set -- ${{stat##*\\)}}
    [ "$3" != "$$" ]  # not a process group leader: setsid(1) then makes the session in this process, no fork
}}
model="${{1%/*/*}}"
if own_session "${{model##*/}}"; then
    exec setsid "$stub" "$@"
fi
exec "$stub" "$@"
"""


def install(directory: Path, stub: Path) -> None:
    """Put tritonserver's ``stub`` program in ``directory/ftx-stub/`` and the launcher in its place
    (``directory/triton_python_backend_stub``); ``directory`` is the Python backend's, not yet published."""
    real = directory / REAL_DIR / STUB_NAME
    real.parent.mkdir(exist_ok=True)
    shutil.copy2(stub, real)
    launcher = directory / STUB_NAME
    launcher.unlink(missing_ok=True)
    launcher.write_text(LAUNCHER)
    os.chmod(launcher, 0o755)


def version() -> str:
    """What identifies the launcher in a prepared backends directory's stamp: a changed launcher is installed again."""
    return hashlib.sha256(LAUNCHER.encode()).hexdigest()[:16]


__all__ = ["LAUNCHER", "OWN_SESSION_ENV", "REAL_DIR", "install", "version"]
