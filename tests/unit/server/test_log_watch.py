"""The ready wait looks again as soon as the server log grows (``LogWatch.wait``), not a poll interval later."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ftx_triton.server.server_log import LogWatch


def test_wait_returns_once_a_line_is_written(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("I1127 started\npartial")
    watch = LogWatch(log, 0)
    assert watch.new_lines() == ["I1127 started"]
    assert watch.wait(0.05) is False  # nothing new (the partial line was read already)

    def append() -> None:
        time.sleep(0.1)
        with log.open("a") as fh:
            fh.write(" line\nI1127 successfully loaded 'text'\n")

    writer = threading.Thread(target=append)
    began = time.monotonic()
    writer.start()
    assert watch.wait(30.0) is True
    waited = time.monotonic() - began
    writer.join()
    assert waited < 5.0  # woken by the growth, not the 30 s limit
    assert watch.new_lines() == ["partial line", "I1127 successfully loaded 'text'"]


def test_wait_on_a_missing_log_times_out(tmp_path: Path) -> None:
    began = time.monotonic()
    assert LogWatch(tmp_path / "not-yet.log", 0).wait(0.05) is False
    assert time.monotonic() - began >= 0.05
