"""structlog configuration: console on a terminal, JSON otherwise.

Library code only calls ``structlog.get_logger(__name__)``; the CLI calls
:func:`configure_logging` once. Event names are ``noun.verb_past`` (``stage.finished``).
"""

from __future__ import annotations

import logging
import sys

import structlog

from ftx.redact import redact_log_event


def configure_logging(log_format: str = "auto", verbose: bool = False) -> None:
    """Configure structlog to render to stderr; ``auto`` picks console on a TTY, else JSON."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor
    if use_json:
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    # On a terminal the CLI prints one human line per stage, so events below WARNING show with -v;
    # JSON consumers (CI, log shippers) get every INFO event.
    level = logging.DEBUG if verbose else (logging.INFO if use_json else logging.WARNING)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_log_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
