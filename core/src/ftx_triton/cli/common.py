"""Helpers shared by CLI command modules: error rendering, Ctrl-C, the global flags every command
takes (``--log-format``, ``-v``), environment twins of every option and grouped help."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import click

from ftx_triton.errors import FtxError, file_system_error

ENV_PREFIX = "FTX"
"""Every option has an environment twin: ``FTX_<COMMAND>_<OPTION>``, COMMAND the command's path (``BACKEND_BUILD``)
and OPTION its first long flag (``--json`` -> ``JSON``, never the Python name behind it), and the global flags
``FTX_LOG_FORMAT`` / ``FTX_VERBOSE``."""


def option_envvar(prefix: str, param: click.Option) -> str:
    """The environment twin of ``param`` under a command whose prefix is ``prefix`` (``FTX_PS``):
    its first long flag, upper case, ``-`` as ``_``."""
    flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return f"{prefix}_{flag.lstrip('-').replace('-', '_').upper()}"


def apply_envvar_rule(command: click.Command, prefix: str) -> None:
    """Give every option of ``command`` its ``FTX_<COMMAND>_<OPTION>`` twin first; a name an option
    already declared (``FTX_ACCEPT_LICENSE``, ``FTX_FT_SOURCES``) stays as a second one."""
    for param in command.params:
        if (
            not isinstance(param, click.Option)
            or param.name in GLOBAL_NAMES
            or not (param.allow_from_autoenv or param.envvar)
        ):
            continue
        rule = option_envvar(prefix, param)
        declared = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
        param.envvar = [rule, *(name for name in declared if name != rule)] if declared else rule
        param.allow_from_autoenv = False  # click's own twin is named after the Python name (FTX_PS_AS_JSON)


def print_error(exc: FtxError) -> None:
    """Render an FtxError as ``error: …`` / ``hint: …`` on stderr (one JSON event with --log-format json)."""
    from ftx_triton.terminal import console as term

    if term.json_mode():
        term.emit_json(
            {"event": "error", "level": "error", "error": exc.message, "hint": exc.hint, "type": type(exc).__name__}
        )
        return
    click.secho(f"error: {exc.message}", fg="red", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)


def print_interrupted() -> None:
    """The one line a Ctrl-C prints: that it stopped, and what was kept for the next run."""
    from ftx_triton.plan.interrupt import interrupted_line
    from ftx_triton.terminal import console as term

    term.say(interrupted_line())


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Turn FtxError into exit 1 and Ctrl-C into exit 130, each without a traceback; anything
    else keeps its traceback."""
    from ftx_triton.plan.interrupt import EXIT_CODE

    try:
        yield
    except FtxError as exc:
        print_error(exc)
        sys.exit(1)
    except OSError as exc:
        print_error(_file_system_error_or_raise(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        print_interrupted()
        sys.exit(EXIT_CODE)


# --------------------------------------------------------------------------- global flags


def _apply_logging(ctx: click.Context, param: click.Parameter, value: object) -> object:
    """Record a global flag (on the group or after the subcommand) and (re)configure logging."""
    if ctx.resilient_parsing:
        return value
    meta = ctx.find_root().meta
    source = ctx.get_parameter_source(param.name or "")
    if value is not None and (source is not click.core.ParameterSource.DEFAULT or param.name not in meta):
        if param.name == "verbose":
            meta["verbose"] = bool(value) or bool(meta.get("verbose"))
        else:
            meta[param.name] = value
    from ftx_triton.terminal.log import configure_logging

    configure_logging(meta.get("log_format") or "human", bool(meta.get("verbose")))
    return value


def global_options() -> list[click.Option]:
    """``--log-format`` and ``-v``: accepted before and after the subcommand."""
    return [
        click.Option(
            ["--log-format"],
            type=click.Choice(["human", "json", "console", "auto"]),
            default=None,
            envvar="FTX_LOG_FORMAT",
            show_envvar=True,
            expose_value=False,
            is_eager=True,
            callback=_apply_logging,
            help="Log rendering on stderr: human lines [default], or JSON events only (json).",
        ),
        click.Option(
            ["-v", "--verbose"],
            is_flag=True,
            default=None,
            envvar="FTX_VERBOSE",
            show_envvar=True,
            expose_value=False,
            is_eager=True,
            callback=_apply_logging,
            help="Show info and debug events.",
        ),
    ]


# --------------------------------------------------------------------------- commands


GLOBAL_NAMES = ("log_format", "verbose")

HELP_SECTION_ATTR = "ftx_help_section"
"""The attribute of a click option naming the --help section it is listed under (set by the option groups in
:mod:`ftx_triton.cli.options` on each option they make; options without it are listed under "Options"). Per
option, not per name: ``--max-tokens`` of ``ftx generate`` is not ``ftx run``'s, nor ``ftx rm --dry-run`` a
stage option."""


def set_help_section(param: click.Parameter, title: str) -> None:
    setattr(param, HELP_SECTION_ATTR, title)


class FtxCommand(click.Command):
    """A click command: FtxErrors print as error/hint and exit 1, Ctrl-C prints one line and exits 130,
    the global flags are accepted here too, every option shows its environment twin, and the
    options are listed in sections."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.params.extend(global_options())
        for param in self.params:
            if isinstance(param, click.Option):
                param.show_envvar = True

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if ctx.auto_envvar_prefix:  # known only now: the prefix holds the command's path
            apply_envvar_rule(self, ctx.auto_envvar_prefix)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        from ftx_triton.plan.interrupt import EXIT_CODE

        try:
            return super().invoke(ctx)
        except FtxError as exc:
            print_error(exc)
            ctx.exit(1)
        except OSError as exc:
            print_error(_file_system_error_or_raise(exc))
            ctx.exit(1)
        except KeyboardInterrupt:
            print_interrupted()
            ctx.exit(EXIT_CODE)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is None:
                continue
            title = getattr(param, HELP_SECTION_ATTR, "Options")
            if param.name in GLOBAL_NAMES or param is self.get_help_option(ctx):
                title = "Global options"
            sections.setdefault(title, []).append(record)
        order = sorted(sections, key=lambda t: (t == "Global options", t != "Options", _section_rank(t)))
        for title in order:
            with formatter.section(title):
                formatter.write_dl(sections[title])


def _file_system_error_or_raise(exc: OSError) -> FtxError:
    """A full or read-only disk is the user's to fix (error/hint); any other OSError is a bug and re-raised."""
    error = file_system_error(exc)
    if error is None:
        raise exc
    return error


SECTION_ORDER = (
    "Source",
    "Conversion",
    "Triton repository",
    "Stages and runtime",
    "Safety",
    "Serving",
    "Try it",
    "FasterTransformer runtime (Docker)",
    "GEMM tuning",
)


def _section_rank(title: str) -> int:
    return SECTION_ORDER.index(title) if title in SECTION_ORDER else len(SECTION_ORDER)


class FtxGroup(click.Group):
    """A click group whose subcommands are FtxCommands."""

    command_class = FtxCommand

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        for param in self.params:
            if isinstance(param, click.Option):
                param.show_envvar = True


def get_host(*, warn_broken: bool = True) -> PluginHost:
    """The plugin host for this process (loaded once); broken plugins are warned about, unless the caller reports
    them itself (``ftx plugins``: once)."""
    global _HOST
    if _HOST is None:
        from ftx_triton.plugins import load_host

        _HOST = load_host()
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
    """The ``ftx`` group: core's commands plus those plugins add (``ftx_register_commands``), looked up
    when asked for, so the plugins of this invocation's environment are the ones that count."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *plugin_commands(self.commands)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name) or plugin_commands(self.commands).get(cmd_name)


class PluginOptionsCommand(FtxCommand):
    """A command that also takes the options plugins add (``ftx_add_options``), under "Plugin options"."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        extra = plugin_options({p.name for p in self.params if p.name})
        return [*params[:-1], *extra, params[-1]]  # the help option stays last


def plugin_commands(core: Mapping[str, click.Command]) -> dict[str, click.Command]:
    """Commands the loaded plugins add, by name (once per loaded host)."""
    global _PLUGIN_COMMANDS
    if _PLUGIN_COMMANDS is None:
        _PLUGIN_COMMANDS = get_host().commands(taken=core)
    return _PLUGIN_COMMANDS


def plugin_options(taken: set[str]) -> list[click.Option]:
    """Options the loaded plugins add to ``ftx run`` (once per loaded host)."""
    global _PLUGIN_OPTIONS
    if _PLUGIN_OPTIONS is None:
        _PLUGIN_OPTIONS = get_host().run_options(taken=taken)
        for option in _PLUGIN_OPTIONS:
            option.show_envvar = True
            set_help_section(option, PLUGIN_SECTION)
    return _PLUGIN_OPTIONS


def pop_plugin_options(opts: dict[str, Any]) -> dict[str, Any]:
    """Take the plugin options' values out of a command's keyword arguments (for ``RunSettings.plugin_options``)."""
    names = {option.name for option in _PLUGIN_OPTIONS or ()}
    return {name: opts.pop(name) for name in list(opts) if name in names and opts[name] is not None}


def command_store() -> ArtifactStore:
    """The store of the user's FTX_HOME for this command: the artifacts it uses stay leased (kept from
    `ftx rm`/`ftx prune` of other processes) until the command ends."""
    from ftx_triton.paths import ftx_home
    from ftx_triton.store.artifact_store import ArtifactStore

    store = ArtifactStore(ftx_home())
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(store.close)
    return store


def say(text: str) -> None:
    """A human line on stderr (stdout is kept for results; above live bars; JSON with --log-format json)."""
    from ftx_triton.terminal.console import say as console_say

    console_say(text)


_HOST: PluginHost | None = None
_PLUGIN_COMMANDS: dict[str, click.Command] | None = None
_PLUGIN_OPTIONS: list[click.Option] | None = None

if TYPE_CHECKING:
    from ftx_triton.plugins import PluginHost
    from ftx_triton.store.artifact_store import ArtifactStore
