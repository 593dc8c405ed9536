"""What an interrupted run leaves behind on purpose, so that Ctrl-C can say so in one line.

Long steps that keep partial work for the next run (a resumable download) wrap themselves in
:func:`keeping`; when a ``KeyboardInterrupt`` passes through, the description is recorded and the
CLI prints it with the ``interrupted`` line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

EXIT_CODE = 130
"""128 + SIGINT, as shells report a Ctrl-C."""

_KEPT: list[str] = []


@contextlib.contextmanager
def keeping(describe: Callable[[], str | None]) -> Iterator[None]:
    """If Ctrl-C interrupts the block, remember ``describe()`` (e.g. "12 MB of x.tar in x.tar.part")."""
    try:
        yield
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            text = describe()
            if text:
                _KEPT.append(text)
        raise


def kept() -> list[str]:
    """Descriptions recorded by interrupted :func:`keeping` blocks, oldest first."""
    return list(_KEPT)


def interrupted_line() -> str:
    """The one line ftx prints on Ctrl-C."""
    if not _KEPT:
        return "interrupted (finished stages stay in the store; an unfinished one starts over next time)"
    return "interrupted; kept " + "; ".join(_KEPT)


def reset() -> None:
    _KEPT.clear()


__all__ = ["EXIT_CODE", "interrupted_line", "keeping", "kept", "reset"]
