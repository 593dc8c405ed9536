"""structlog configuration: one human renderer, or JSON when asked — never both.

Library code only calls ``structlog.get_logger(__name__)``; the CLI calls :func:`configure_logging`
once. Event names are ``noun.verb_past`` (``stage.finished``).

- ``human`` (the default, terminal or pipe): warnings and errors (everything with ``-v``) as
  ``warning: cache.corrupt stage=convert file=…`` lines printed through the shared stderr console
  (:mod:`ftx_triton.terminal.console`), so they land above live progress bars; no timestamps, colour only on a
  terminal.
- ``json`` (``--log-format json`` or ``FTX_LOG_FORMAT=json``): every INFO event as one JSON line,
  and the human lines of the CLI as ``message`` events; no progress bars.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from rich.text import Text

from ftx_triton.terminal import console as term
from ftx_triton.terminal.redact import redact_log_event

LOG_FORMATS = ("human", "json")
ENV_LOG_FORMAT = "FTX_LOG_FORMAT"
_ALIASES = {"auto": "human", "console": "human"}
_LEVEL_STYLE = {"warning": "yellow", "error": "red", "critical": "red", "exception": "red"}
_HIDDEN_KEYS = ("event", "level", "timestamp")


def normalise_format(log_format: str | None) -> str:
    """``human`` or ``json`` (``auto``/``console`` are older spellings of ``human``)."""
    name = (log_format or "human").strip().lower()
    name = _ALIASES.get(name, name)
    if name not in LOG_FORMATS:
        from ftx_triton.errors import ConfigError

        raise ConfigError(f"unknown log format {log_format!r}", hint=f"use one of: {', '.join(LOG_FORMATS)}")
    return name


def _value(value: Any) -> str:
    text = str(value)
    return repr(text) if (" " in text or not text) else text


def render_human(event: dict[str, Any]) -> Text:
    """``warning: noun.verb_past key=value …`` (keys in the order they were given)."""
    level = str(event.get("level", "info"))
    line = Text()
    if level in _LEVEL_STYLE:
        line.append(f"{'error' if level in ('critical', 'exception') else level}: ", style=_LEVEL_STYLE[level])
    elif level == "debug":
        line.append("debug: ", style="dim")
    line.append(str(event.get("event", "")), style="bold" if level in _LEVEL_STYLE else "")
    extras = " ".join(f"{k}={_value(v)}" for k, v in event.items() if k not in _HIDDEN_KEYS)
    if extras:
        line.append(" " + extras, style="dim")
    return line


class _HumanLogger:
    """Prints rendered events through the shared console (above live bars)."""

    def msg(self, message: Any) -> None:
        term.console().print(message, soft_wrap=True)

    log = debug = info = warning = warn = error = err = critical = exception = fatal = msg


class _JsonLogger:
    def msg(self, message: Any) -> None:
        term.emit_json(message)

    log = debug = info = warning = warn = error = err = critical = exception = fatal = msg


def _human_factory(*_args: Any) -> _HumanLogger:
    return _HumanLogger()


def _json_factory(*_args: Any) -> _JsonLogger:
    return _JsonLogger()


def _to_text(_logger: Any, _name: str, event: dict[str, Any]) -> Any:
    return (render_human(event),), {}  # structlog passes a (args, kwargs) tuple through to the logger


def _to_json(_logger: Any, _name: str, event: dict[str, Any]) -> Any:
    return (event,), {}


def configure_logging(log_format: str | None = "human", verbose: bool = False) -> None:
    """Configure structlog (and :mod:`ftx_triton.terminal.console`) for ``human`` or ``json`` output on stderr."""
    use_json = normalise_format(log_format) == "json"
    term.set_json(use_json)
    # A person reads one line per stage from the CLI, so events below WARNING show with -v;
    # JSON consumers (CI, log shippers) get every INFO event.
    level = logging.DEBUG if verbose else (logging.INFO if use_json else logging.WARNING)
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        redact_log_event,
    ]
    if use_json:
        processors += [structlog.processors.TimeStamper(fmt="iso", utc=True), _to_json]
    else:
        processors.append(_to_text)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_json_factory if use_json else _human_factory,
        cache_logger_on_first_use=False,
    )
