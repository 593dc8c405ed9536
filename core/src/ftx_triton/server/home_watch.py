"""Whether the FTX_HOME a long-running process was started from is still there.

A detached server and its OpenAI endpoint are found by ``ftx ps``/``ftx stop`` through their records in
FTX_HOME. Once that directory is deleted (or replaced by a new one), no ``ftx stop`` can find them, so
each of them watches it with :class:`HomeWatch` and stops itself when it is gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

POLL_S = 1.0


class HomeWatch:
    """The identity (device, inode) of a directory at the start, compared with what is there now."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self.identity = self._identity()

    def _identity(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            found = self.path.stat()
        except OSError:
            return None
        return found.st_dev, found.st_ino

    def gone(self) -> bool:
        """True once the directory that was there at the start was removed or replaced by another."""
        return self.identity is not None and self._identity() != self.identity

    def on_gone(self, action: Callable[[], None], poll_s: float = POLL_S) -> None:
        """Call ``action`` once, from a daemon thread, when the directory is gone (never, if there was none)."""
        if self.identity is None:
            return

        def watch() -> None:
            while not self.gone():
                threading.Event().wait(poll_s)
            action()

        threading.Thread(target=watch, name="ftx-home-watch", daemon=True).start()


__all__ = ["HomeWatch"]
