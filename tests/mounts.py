"""Real file systems for fault tests: a tiny tmpfs (full disk) and a read-only tmpfs.

Mounting needs root (these tests run as root here); where ``mount`` fails the test is skipped
and says so. A read-only *directory* is no test for root, who writes through permission bits.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, *, size: str = "1m", read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``path`` (created) for the block; skip the test if mounting fails."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=False, capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
