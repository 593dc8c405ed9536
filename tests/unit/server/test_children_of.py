"""process_tree.children_of: a process's direct children from /proc, without reading every process's parent."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psutil
import pytest
from ftx_triton.server.process_tree import children_of


def test_children_of_lists_the_direct_children_only_and_reads_no_other_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child and its own child: only the first is this process's; psutil's children() (a read of every
    process on the machine) is not called where /proc lists children."""
    grandchildren: set[int] = set()
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"]
    )
    try:
        for _ in range(100):
            if psutil.Process(child.pid).children():
                break
            psutil.wait_procs([], timeout=0.05)
        grandchildren = {p.pid for p in psutil.Process(child.pid).children()}
        assert grandchildren, "the child did not start its own child"
        monkeypatch.setattr(psutil.Process, "children", lambda *a, **k: pytest.fail("read every process"))
        mine = {p.pid for p in children_of(os.getpid())}
        assert child.pid in mine and not mine & grandchildren
        assert {p.pid for p in children_of(child.pid)} == grandchildren
    finally:
        for pid in grandchildren:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        child.kill()
        child.wait()


def test_children_of_a_process_that_is_gone_is_empty() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert children_of(process.pid) == []
