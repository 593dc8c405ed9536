"""A Ctrl-C that Python swallows, on cue: a KeyboardInterrupt raised inside a weakref callback (as the SIGINT
handler raises it when the signal lands while an import lock's callback runs) is dropped by Python."""

from __future__ import annotations

import contextlib
import signal
import sys
import weakref
from collections.abc import Iterator


class _Held:
    pass


def _raise(exc: BaseException) -> object:
    def callback(_ref: object) -> None:
        raise exc

    return callback


def swallowed(exc: BaseException | None = None) -> None:
    """Raise ``exc`` (a KeyboardInterrupt by default) inside a weakref callback, where Python swallows it."""
    held = _Held()
    ref = weakref.ref(held, _raise(exc or KeyboardInterrupt()))  # type: ignore[arg-type]
    del held
    assert ref() is None


@contextlib.contextmanager
def ftx_interrupts_installed() -> Iterator[None]:
    """ftx's Ctrl-C handling installed in this process (as the console script does), undone afterwards."""
    from ftx_triton import interrupt

    hook, handler = sys.unraisablehook, signal.getsignal(signal.SIGINT)
    interrupt.install()
    try:
        yield
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGINT, handler)
        interrupt.reset()
