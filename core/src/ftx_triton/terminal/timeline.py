"""A run's timeline: each step's seconds, since the process started (interpreter and imports included).

:func:`step` logs ``timeline.step step=NAME seconds=S at=T`` (``S`` since the previous step, ``T`` since the
process started), shown with ``-v`` and in every JSON log; :func:`summary` logs one ``timeline`` line with
every step, so users and the benchmarks read where a run's seconds went.
"""

from __future__ import annotations

import os
import time

import structlog

log = structlog.get_logger(__name__)


def _process_started() -> float:
    """The ``time.monotonic()`` value at which this process started (Linux: from /proc), else now."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in ticks since boot
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - max(age, 0.0)


_STARTED = _process_started()
_steps: list[tuple[str, float]] = []
_last = _STARTED


def restart() -> None:
    """Forget the steps so far and count from now (a second run in one process: tests, ``ftx bench``)."""
    global _last
    _steps.clear()
    _last = time.monotonic()


def step(name: str, **fields: object) -> float:
    """Close the step ``name`` now; its seconds since the previous step."""
    global _last
    now = time.monotonic()
    seconds = now - _last
    _last = now
    _steps.append((name, seconds))
    log.info("timeline.step", step=name, seconds=round(seconds, 3), at=round(now - _STARTED, 3), **fields)
    return seconds


def summary() -> dict[str, float]:
    """Log (and return) every step's seconds so far and their total."""
    steps = {name: round(seconds, 3) for name, seconds in _steps}
    log.info("timeline", total=round(sum(s for _, s in _steps), 3), **steps)
    return steps
