"""Which zombie children of tritonserver the supervisor takes for a dead model stub (and stops the server for).

Real processes: the "tritonserver" is a Python process that starts the given programs and never reaps them, so
each stays a zombie once it ends; the "stubs" are system programs run through a link named as the Python backend's
stub, so their process name and command line are a stub's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from ftx_triton.server.process_tree import STUB_NAME
from ftx_triton.server.supervisor import Supervisor, zombie_status

_PARENT = """
import json, subprocess, sys, time
children = [subprocess.Popen(cmd) for cmd in json.loads(sys.argv[1])]
print(" ".join(str(c.pid) for c in children), flush=True)
time.sleep(120)
"""


def _stub_link(tmp_path: Path, program: str) -> str:
    """A link named as the stub, to ``program`` (a new directory per program: the names are equal)."""
    folder = tmp_path / program
    folder.mkdir()
    link = folder / STUB_NAME
    found = shutil.which(program)
    assert found is not None, f"{program} is not installed"
    link.symlink_to(found)
    return str(link)


StartTriton = Callable[..., tuple[Supervisor, list[int]]]


@pytest.fixture
def triton_with() -> Iterator[StartTriton]:
    started: list[subprocess.Popen[str]] = []

    def start(*commands: list[str]) -> tuple[Supervisor, list[int]]:
        parent = subprocess.Popen(
            [sys.executable, "-c", _PARENT, json.dumps(list(commands))], stdout=subprocess.PIPE, text=True
        )
        started.append(parent)
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        supervisor = Supervisor({"command": []})
        supervisor.triton = parent  # type: ignore[assignment]
        return supervisor, pids

    yield start
    for parent in started:
        parent.kill()
        parent.wait()


def _wait_exec(pid: int) -> None:
    """Until ``pid`` shows its command line: the kernel sets it a moment after the exec that ``Popen`` waits for."""
    deadline = time.monotonic() + 10
    while not psutil.Process(pid).cmdline():
        assert time.monotonic() < deadline, f"process {pid} shows no command line"
        time.sleep(0.01)


def _wait_zombie(pid: int) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return zombie_status(pid) or "exit code 0"
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not end")


def test_the_stub_programs_probe_run_is_no_dead_stub(triton_with: StartTriton, tmp_path: Path) -> None:
    """tritonserver runs the stub program once with no arguments and it exits 1: while that zombie waits to be
    reaped, the supervisor must not stop a healthy server (it did: a server gone right after it was ready)."""
    supervisor, (probe,) = triton_with([_stub_link(tmp_path, "false")])
    assert _wait_zombie(probe) == "exit code 1"
    assert psutil.Process(probe).name() == STUB_NAME[:15]
    assert supervisor._dead_stub() is None


def test_a_model_stub_that_ends_or_is_killed_is_a_dead_stub(triton_with: StartTriton, tmp_path: Path) -> None:
    """A stub seen serving (arguments on its command line) that exits 1, and one never seen that a signal
    ended, both count."""
    sh = _stub_link(tmp_path, "sh")
    go = tmp_path / "go"  # the stub exits 1 once told, so the supervisor surely sees it alive first
    supervisor, (crashing,) = triton_with([sh, "-c", f"until [ -e '{go}' ]; do sleep 0.02; done; exit 1"])
    _wait_exec(crashing)
    assert supervisor._dead_stub() is None  # alive: seen, with its arguments
    assert crashing in supervisor.seen_stubs
    go.touch()
    assert _wait_zombie(crashing) == "exit code 1"
    assert "exit code 1" in (supervisor._dead_stub() or "")

    supervisor, (killed,) = triton_with([_stub_link(tmp_path, "sleep"), "30"])
    os.kill(killed, signal.SIGKILL)
    assert _wait_zombie(killed).startswith("killed")
    assert f"(pid {killed})" in (supervisor._dead_stub() or "")


def test_a_stub_seen_alive_is_checked_without_listing_tritonservers_children(
    triton_with: StartTriton, tmp_path: Path
) -> None:
    """Between the scans of tritonserver's children (one read per thread of it), the checks look at the stubs seen
    alive only: one that a signal ends is found at the next check."""
    supervisor, (stub,) = triton_with([_stub_link(tmp_path, "sleep"), "30"])
    _wait_exec(stub)
    assert supervisor._dead_stub(scan=True) is None
    assert stub in supervisor.seen_stubs
    os.kill(stub, signal.SIGKILL)
    assert _wait_zombie(stub).startswith("killed")
    assert "killed by SIGKILL" in (supervisor._dead_stub(scan=False) or "")
