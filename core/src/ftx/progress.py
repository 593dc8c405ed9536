"""Byte progress bars for long byte-counted work (downloads, extraction, conversion): bytes, rate, ETA.

The one progress helper of ftx. Drawn with rich on stderr when it is a terminal (stdout stays
for results); silent (a no-op) otherwise, so JSON logs and CI output stay clean.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


def progress_enabled(requested: bool = True) -> bool:
    """True when bars were asked for and stderr is a terminal."""
    return requested and sys.stderr.isatty()


class ByteProgress:
    """One task's byte counter; every method is a no-op when the bar is disabled."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, nbytes: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, nbytes)

    def update(self, done: int, total: int | None = None) -> None:
        """Set the absolute position (a callback shape: ``update(done_bytes, total_bytes)``)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total)

    def reset(self, *, completed: int = 0, total: int | None = None) -> None:
        """Start over (server ignored a Range request) or learn the total late."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed, total=total)

    def describe(self, description: str) -> None:
        """Change the phase shown at the left (``downloading`` → ``verifying sha256``)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=description)


@contextmanager
def byte_progress(
    description: str, total: int | None = None, *, completed: int = 0, enabled: bool = True
) -> Iterator[ByteProgress]:
    """Show one byte bar while the block runs; yield a :class:`ByteProgress` to feed it."""
    if not progress_enabled(enabled):
        yield ByteProgress()
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total, completed=completed)
        yield ByteProgress(progress, task)
