"""Rich progress bars for long byte-counted work (conversion, copies): bytes, rate, ETA.

Shown only on a terminal; elsewhere the structlog events tell the story.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)


@contextlib.contextmanager
def byte_progress(description: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """Yield ``update(done_bytes, total_bytes)``; a no-op when not on a terminal."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda done, total: None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), transient=False,
    )
    with progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update
