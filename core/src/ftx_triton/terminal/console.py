"""The one terminal channel of ftx: stderr, shared by human lines, log events and live progress bars.

stdout carries only a command's result (a path, generated text, a table asked for). Everything
else goes through :func:`console` (a rich ``Console`` on stderr) so that a line printed while a
bar is live lands above the bar instead of inside it. With ``--log-format json`` every human line
becomes a JSON event instead, so a machine reading stderr never sees the two mixed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sys
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.text import Text

_STATE: dict[str, Any] = {"json": False, "console": None, "stderr": None, "held": None}


def console() -> Console:
    """The stderr console (made again when ``sys.stderr`` was replaced, as test runners do)."""
    if _STATE["console"] is None or _STATE["stderr"] is not sys.stderr:
        _STATE["console"] = Console(stderr=True, soft_wrap=True, highlight=False)
        _STATE["stderr"] = sys.stderr
    return _STATE["console"]


PIPED_WIDTH = 10_000
"""The width tables are laid out in when stdout is no terminal: their natural width, never cut at 80 columns."""


def results_console() -> Console:
    """A console for results on stdout (tables): the terminal's width on a terminal; piped or redirected
    (``ftx plugins | cat``), as wide as the table needs, so no cell is cut or wrapped."""
    out = Console(highlight=False)
    return out if out.is_terminal else Console(width=PIPED_WIDTH, highlight=False)


def set_json(enabled: bool) -> None:
    """Render human lines as JSON events (``--log-format json``)."""
    _STATE["json"] = enabled


def json_mode() -> bool:
    return bool(_STATE["json"])


def is_terminal() -> bool:
    """Whether stderr is a terminal a person watches (and not a JSON consumer)."""
    return not json_mode() and sys.stderr.isatty()


@contextlib.contextmanager
def held_back() -> Iterator[list[str]]:
    """Hold the human lines said inside back (a one-shot ``ftx run --prompt`` prints a summary instead); they
    are printed after all when the block fails, so an error still comes with what led to it. Warnings and
    errors are never held."""
    held: list[str] = []
    _STATE["held"] = held
    try:
        yield held
    except BaseException:
        _STATE["held"] = None
        for text in held:
            say(text)
        raise
    finally:
        _STATE["held"] = None


def say(text: str, *, style: str | None = None) -> None:
    """One human line on stderr (above any live bar); a ``message`` event in JSON mode."""
    if _STATE["held"] is not None:
        _STATE["held"].append(text)
        return
    if json_mode():
        emit_json({"event": "message", "level": "info", "text": text})
        return
    console().print(Text(text, style=style or ""), soft_wrap=True)


def warn(text: str) -> None:
    """A ``warning: …`` line (yellow on a terminal); a warning event in JSON mode."""
    if json_mode():
        emit_json({"event": "message", "level": "warning", "text": text})
        return
    line = Text("warning: ", style="yellow")
    line.append(text)
    console().print(line, soft_wrap=True)


def timestamp() -> str:
    """Now, as every JSON event carries it (ISO 8601, UTC, as structlog's ``TimeStamper(fmt="iso", utc=True)``)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def emit_json(event: dict[str, Any]) -> None:
    """One JSON line on stderr, written directly (never wrapped or styled), with its ``timestamp``."""
    sys.stderr.write(json.dumps({"timestamp": timestamp(), **event}, sort_keys=True, default=str) + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def status(text: str) -> Iterator[None]:
    """Say what a long, quiet step is doing (a spinner on a terminal, one line otherwise)."""
    if is_terminal():
        with console().status(text):
            yield
        return
    say(text)
    yield


__all__ = ["console", "emit_json", "results_console", "is_terminal", "json_mode", "say", "set_json", "status", "warn"]
