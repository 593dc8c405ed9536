"""Ctrl-C: the one place that makes it stop ftx, and the one line it prints (exit 130).

:func:`install` (the console script calls it first) makes SIGINT raise ``KeyboardInterrupt`` and records a
Ctrl-C that Python swallowed: one that lands while a weakref callback, a ``__del__`` or the garbage collector
runs (an import lock's callback, say) is printed as "Exception ignored in …" and dropped by Python, so the run
would go on and finish as if nothing was pressed. :func:`check` raises it again at the next safe point: before
any build is published (:func:`ftx_triton.io.atomic.swap_in`), in the foreground serve loop, and when a command
ends. A second Ctrl-C stops at once, as the first one does when nothing swallows it.

Long steps that keep partial work for the next run (a resumable download) wrap themselves in :func:`keeping`;
when a ``KeyboardInterrupt`` passes through, the description is recorded and the CLI prints it with the
``interrupted`` line.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

EXIT_CODE = 130
"""128 + SIGINT, as shells report a Ctrl-C."""

_KEPT: list[str] = []
_SWALLOWED = threading.Event()
"""Set when Python dropped a KeyboardInterrupt (see :func:`install`); cleared when :func:`check` raises it."""
_next_hook: Callable[[sys.UnraisableHookArgs], object] = sys.__unraisablehook__


def _on_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """``sys.unraisablehook``: remember a swallowed Ctrl-C (no "Exception ignored" traceback); pass the rest on."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        _SWALLOWED.set()
        return
    _next_hook(unraisable)


def install() -> None:
    """Make Ctrl-C stop ftx: SIGINT raises ``KeyboardInterrupt`` even when ftx was started with it ignored (a
    background job of a script), and one Python swallows is kept for :func:`check`. Idempotent."""
    global _next_hook
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.unraisablehook is not _on_unraisable:
        _next_hook = sys.unraisablehook
        sys.unraisablehook = _on_unraisable


def check() -> None:
    """Raise ``KeyboardInterrupt`` if Python swallowed a Ctrl-C since the last call (a safe point). Only in the
    main thread, where Python delivers Ctrl-C: a worker thread's check leaves it to the main thread's next one."""
    if _SWALLOWED.is_set() and threading.current_thread() is threading.main_thread():
        _SWALLOWED.clear()
        raise KeyboardInterrupt


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
    _SWALLOWED.clear()


__all__ = ["EXIT_CODE", "check", "install", "interrupted_line", "keeping", "kept", "reset"]
