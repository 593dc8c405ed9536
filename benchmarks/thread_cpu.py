#!/usr/bin/env python3
"""The CPU seconds of each thread of one ``ftx`` command, by its Python thread name: runs ftx in this process with a
sampler thread that reads ``/proc/self/task/*/stat`` every 50 ms (the last sample of a thread that ended counts),
then prints, per kind of thread (the name without its number: ``ftx-writer``, ``ftx-split``, ``ftx-hash``, …),
how many there were, their CPU seconds in all and the busiest one's, and the process's wall and CPU seconds
(``/proc/self/stat``: every thread, the ended ones included). On a machine of few cores it shows which thread
carries what, not how a many-core host overlaps them::

    FTX_HOME=/tmp/h python benchmarks/thread_cpu.py -v convert CKPT --tp 1 --weight-dtype fp16 -o OUT

Another version of ftx is measured by putting its sources first on ``PYTHONPATH``. The sampler costs ~1% of a core.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
_NUMBER = re.compile(r"[-_]?\d+$")


def _cpu(stat: str) -> float:
    """User + system seconds from a ``stat`` file's text."""
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Sampler:
    """Samples every thread's CPU seconds until stopped; names come from :mod:`threading`'s native ids."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        for thread in threading.enumerate():
            if thread.native_id is not None:
                self.names.setdefault(thread.native_id, thread.name)
        for task in Path("/proc/self/task").iterdir():
            try:
                self.cpu[int(task.name)] = _cpu((task / "stat").read_text())
            except OSError:  # ended since the listing
                continue

    def report(self) -> None:
        self._stop.set()
        self.sample()
        groups: dict[str, list[float]] = {}
        for tid, seconds in self.cpu.items():
            name = self.names.get(tid, "(unnamed)")
            groups.setdefault(_NUMBER.sub("", name), []).append(seconds)
        process = Path("/proc/self/stat").read_text()
        started = int(process.rpartition(")")[2].split()[19]) / TICK
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        print(f"\n{'thread kind':<24}{'threads':>8}{'CPU s':>9}{'busiest':>9}", file=sys.stderr)
        for kind, values in sorted(groups.items(), key=lambda item: -sum(item[1])):
            print(f"{kind:<24}{len(values):>8}{sum(values):>9.2f}{max(values):>9.2f}", file=sys.stderr)
        print(
            f"process: wall {uptime - started:.2f} s, CPU {_cpu(process):.2f} s (every thread), "
            f"load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
            file=sys.stderr,
        )


def main() -> None:
    sampler = Sampler(0.05)
    atexit.register(sampler.report)  # ftx's exit runs atexit handlers, then ends the process at once
    sys.argv = ["ftx", *sys.argv[1:]]
    from ftx_triton.entry import main as ftx_main

    ftx_main()


if __name__ == "__main__":
    main()
