"""The ``ftx`` command line's own helpers: the plugin host of this process, the commands and options plugins add.

What any command is built from (FtxCommand, the global flags, ``say``, the store) is :mod:`ftx_triton.commandkit`,
shared with the runtimes' commands; its names are re-exported here for core's command modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import click

from ftx_triton.commandkit import (
    ENV_PREFIX,
    GLOBAL_NAMES,
    FtxCommand,
    FtxGroup,
    apply_envvar_rule,
    command_store,
    global_options,
    handle_errors,
    option_envvar,
    print_error,
    say,
    set_help_section,
)

__all__ = [
    "ENV_PREFIX",
    "GLOBAL_NAMES",
    "set_help_section",
    "FtxCommand",
    "FtxGroup",
    "FtxRootGroup",
    "PluginOptionsCommand",
    "apply_envvar_rule",
    "command_store",
    "get_host",
    "global_options",
    "handle_errors",
    "option_envvar",
    "plugin_commands",
    "plugin_options",
    "pop_plugin_options",
    "print_error",
    "reset_host",
    "say",
]


def get_host(*, warn_broken: bool = True) -> PluginHost:
    """The plugin host for this process (loaded once); broken plugins are warned about, unless the caller reports
    them itself (``ftx plugins``: once)."""
    global _HOST
    if _HOST is None:
        from ftx_triton.plugins import load_host

        _HOST = load_host(families_when_asked=True)
        for record in _HOST.broken if warn_broken else ():
            from ftx_triton.terminal.console import warn

            warn(f"plugin {record.name} ({record.distribution}) failed to load: {record.error}")
    return _HOST


def reset_host() -> None:
    """Forget the loaded host (tests change the environment between invocations)."""
    global _HOST, _PLUGIN_COMMANDS, _PLUGIN_OPTIONS
    _HOST = _PLUGIN_COMMANDS = _PLUGIN_OPTIONS = None


PLUGIN_SECTION = "Plugin options"


class FtxRootGroup(FtxGroup):
    """The ``ftx`` group: core's commands, each imported with its module when asked for (``lazy_commands``: name
    to module), plus those plugins add (``ftx_register_commands``, built with the kit ``make_kit`` returns), looked
    up when asked for, so the plugins of this invocation's environment count."""

    make_kit: Callable[[], CommandKit] | None = None
    lazy_commands: Mapping[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        core = {*super().list_commands(ctx), *self.lazy_commands}
        return sorted({*core, *plugin_commands(core, self.make_kit)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            import importlib

            for command in importlib.import_module(self.lazy_commands[cmd_name]).commands:
                self.add_command(command)
        found = super().get_command(ctx, cmd_name)
        return found or plugin_commands({*self.commands, *self.lazy_commands}, self.make_kit).get(cmd_name)


class PluginOptionsCommand(FtxCommand):
    """A command that also takes the options the runtimes declare (``Runtime.option_sections``, under each
    section's title) and those plugins add (``ftx_add_options``, under "Plugin options")."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        extra = plugin_options({p.name for p in self.params if p.name})
        return [*params[:-1], *extra, params[-1]]  # the help option stays last


def plugin_commands(core: Iterable[str], make_kit: Callable[[], CommandKit] | None) -> dict[str, click.Command]:
    """Commands the loaded plugins add, by name (once per loaded host)."""
    global _PLUGIN_COMMANDS
    if _PLUGIN_COMMANDS is None:
        assert make_kit is not None, "the ftx group is given its kit when its commands are added"
        _PLUGIN_COMMANDS = get_host().commands(make_kit(), taken=core)
    return _PLUGIN_COMMANDS


def plugin_options(taken: set[str]) -> list[click.Option]:
    """Options the loaded runtimes and plugins add to ``ftx run`` (once per loaded host): each runtime's option
    sections, then ``ftx_add_options``; a name ``ftx run`` already has is an error naming it."""
    global _PLUGIN_OPTIONS
    if _PLUGIN_OPTIONS is None:
        from ftx_triton.commandkit import section_options
        from ftx_triton.errors import PluginError
        from ftx_triton.runtime.api import option_sections

        host = get_host()
        declared: list[click.Option] = []
        for section in option_sections(list(host.runtimes.values())):
            for option in section_options(section):
                if option.name in taken or any(o.name == option.name for o in declared):
                    raise PluginError(
                        f"{section.__qualname__} declares an option {option.name!r}, which `ftx run` already has",
                        hint="rename it in the runtime's option section",
                    )
                declared.append(option)
        added = host.run_options(taken={*taken, *(o.name for o in declared if o.name)})
        for option in added:
            option.show_envvar = True
            set_help_section(option, PLUGIN_SECTION)
        _PLUGIN_OPTIONS = [*declared, *added]
    return _PLUGIN_OPTIONS


def pop_plugin_options(opts: dict[str, Any]) -> dict[str, Any]:
    """Take the plugin options' values out of a command's keyword arguments (for ``RunSettings.plugin_options``)."""
    names = {option.name for option in _PLUGIN_OPTIONS or ()}
    return {name: value for name in list(opts) if name in names and (value := opts.pop(name)) not in (None, ())}


_HOST: PluginHost | None = None
_PLUGIN_COMMANDS: dict[str, click.Command] | None = None
_PLUGIN_OPTIONS: list[click.Option] | None = None

if TYPE_CHECKING:
    from ftx_triton.commandkit import CommandKit
    from ftx_triton.plugins import PluginHost
