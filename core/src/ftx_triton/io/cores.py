"""How many CPUs this process may run on: the affinity mask (``taskset``, a container's cpuset), not the
machine's count, so that thread pools sized from it neither starve a many-core host nor crowd a small one."""

from __future__ import annotations

import functools
import os


@functools.cache
def usable_cpus() -> int:
    """CPUs this process may be scheduled on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this system
        return max(1, os.cpu_count() or 1)
