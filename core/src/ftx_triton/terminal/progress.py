"""Byte progress bars for long byte-counted work (downloads, extraction, conversion): bytes, rate, ETA.

The one progress helper of ftx. Drawn with rich on the shared stderr console (:mod:`ftx_triton.terminal.console`,
so log lines print above a live bar) when stderr is a terminal and JSON logs were not asked for;
stdout stays for results. Silent (a no-op) otherwise, so JSON logs and CI output stay clean; rich.progress is
imported only when a bar is drawn.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ftx_triton.terminal.console import console, is_terminal

if TYPE_CHECKING:  # rich.progress is imported when a bar is drawn (a cached run draws none)
    from rich.progress import Progress, TaskID


def progress_enabled(requested: bool = True) -> bool:
    """True when bars were asked for, stderr is a terminal and the logs are not JSON."""
    return requested and is_terminal()


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
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console(),
        transient=False,
        redirect_stdout=False,  # stdout is for results, never drawn into the bar
        redirect_stderr=False,  # every stderr line goes through the same console (above the bar)
    )
    with progress:
        task = progress.add_task(description, total=total, completed=completed)
        yield ByteProgress(progress, task)
