"""The orphan sweep at a server's start must never remove the region of a server that starts while it reads the
process table (CI saw a stub fail "Unable to initialize shared memory key … No such file or directory" when a
neighbour's sweep listed the regions after reading the processes). STAND-IN /dev/shm (a temporary folder) and a
process table whose reading a new server's start interleaves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ftx_triton.server import process_tree
from ftx_triton.server.launch import FTX_SHM_PREFIX


def test_a_region_made_while_the_processes_are_read_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_tree, "SHM_DIR", tmp_path)
    stale = tmp_path / f"{FTX_SHM_PREFIX}0123456789ab-stale"
    stale.write_bytes(b"x")
    newcomer = tmp_path / f"{FTX_SHM_PREFIX}fedcba987654-region"

    def process_table() -> Iterator[Any]:
        newcomer.write_bytes(b"x")  # a server started after this process was read: its tritonserver is not seen
        return iter(())

    monkeypatch.setattr(process_tree.psutil, "process_iter", process_table)
    swept = process_tree.sweep_orphans()
    assert stale.name in swept and not stale.exists()
    assert newcomer.exists() and newcomer.name not in swept
