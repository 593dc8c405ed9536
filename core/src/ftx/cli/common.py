"""Helpers shared by CLI command modules: error rendering and common options."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from ftx.errors import FtxError, file_system_error


def print_error(exc: FtxError) -> None:
    """Render an FtxError as ``error: …`` / ``hint: …`` on stderr."""
    click.secho(f"error: {exc.message}", fg="red", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Turn FtxError into exit 1 without a traceback; anything else keeps its traceback."""
    try:
        yield
    except FtxError as exc:
        print_error(exc)
        sys.exit(1)
    except OSError as exc:
        print_error(_file_system_error_or_raise(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


class FtxCommand(click.Command):
    """A click command whose FtxErrors print as error/hint and exit 1 (also under CliRunner)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except FtxError as exc:
            print_error(exc)
            ctx.exit(1)
        except OSError as exc:
            print_error(_file_system_error_or_raise(exc))
            ctx.exit(1)


def _file_system_error_or_raise(exc: OSError) -> FtxError:
    """A full or read-only disk is the user's to fix (error/hint); any other OSError is a bug and re-raised."""
    error = file_system_error(exc)
    if error is None:
        raise exc
    return error


class FtxGroup(click.Group):
    """A click group whose subcommands are FtxCommands."""

    command_class = FtxCommand


def get_host() -> "PluginHost":
    """The plugin host for this process (loaded once); broken plugins are warned about."""
    global _HOST
    if _HOST is None:
        from ftx.plugins import load_host

        _HOST = load_host()
        for record in _HOST.broken:
            click.secho(f"warning: plugin {record.name} ({record.distribution}) failed to load: {record.error}",
                        fg="yellow", err=True)
    return _HOST


def reset_host() -> None:
    """Forget the loaded host (tests change the environment between invocations)."""
    global _HOST
    _HOST = None


def say(text: str) -> None:
    """A human line on stderr (stdout is kept for results)."""
    click.echo(text, err=True)


_HOST: "PluginHost | None" = None

if TYPE_CHECKING:
    from ftx.plugins import PluginHost
