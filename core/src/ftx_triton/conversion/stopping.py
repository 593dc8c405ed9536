"""Stopping a conversion that is no longer needed, from another thread.

A first run converts a local source while its digest is still being computed; when the digest shows that the
store already holds that conversion (the same files under another path, or files whose times moved), the
conversion in progress is stopped at its next tensor instead of running to its end.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar

_stop: ContextVar[threading.Event | None] = ContextVar("ftx_conversion_stop", default=None)


class ConversionStopped(Exception):
    """The conversion was stopped (its result is in the store already); nothing it wrote is kept."""


@contextlib.contextmanager
def stoppable(event: threading.Event) -> Iterator[None]:
    """Conversions run in this context stop (:class:`ConversionStopped`) once ``event`` is set."""
    token = _stop.set(event)
    try:
        yield
    finally:
        _stop.reset(token)


def check_stopped() -> None:
    """Raise :class:`ConversionStopped` when the conversion running in this context was asked to stop."""
    event = _stop.get()
    if event is not None and event.is_set():
        raise ConversionStopped
