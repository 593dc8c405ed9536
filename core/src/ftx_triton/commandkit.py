"""What every ftx command is built from, core's and a plugin's (a runtime's ``ftx image``): error rendering,
Ctrl-C, the global flags every command takes (``--log-format``, ``-v``), environment twins of every option,
grouped help, the user's store, human lines on stderr, and click options generated from an
:class:`~ftx_triton.plan.options.OptionSection`.

It sits below the engine and imports none of it, so a runtime's commands module may use it (a runtime never
imports the CLI); a command that runs the pipeline gets it through ``ftx_register_commands(cli, kit)``."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ftx_triton.errors import FtxError, file_system_error

if TYPE_CHECKING:
    from ftx_triton.engine.pipeline import RunResult
    from ftx_triton.plan.options import Declared, OptionSection
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.store.artifact_store import ArtifactStore

F = Callable[..., Any]

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
    from ftx_triton.interrupt import interrupted_line
    from ftx_triton.terminal import console as term

    term.say(interrupted_line())


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Turn FtxError into exit 1 and Ctrl-C into exit 130, each without a traceback; anything
    else keeps its traceback."""
    from ftx_triton.interrupt import EXIT_CODE, check

    try:
        yield
        check()  # a Ctrl-C Python swallowed while the command ran still ends it as one
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
"""The attribute of a click option naming the --help section it is listed under (set on each option by
:func:`section` and :func:`section_options`; options without it are listed under "Options"). Per option, not per
name: ``ftx generate --max-tokens`` is not ``ftx run``'s, nor ``ftx rm --dry-run`` a stage option."""


def set_help_section(param: click.Parameter, title: str) -> None:
    """List ``param`` under ``title`` in its command's --help."""
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
        with handle_errors():
            return super().invoke(ctx)

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


class AutoInt(click.IntRange):
    """An integer in a range, or ``auto`` (:data:`~ftx_triton.plan.settings.AUTO`: the plan decides, as ``--tp``)."""

    def __init__(self, low: int = 1, high: int = 64) -> None:
        super().__init__(low, high)
        self.name = f"{low}-{high}|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ftx_triton.plan.settings import is_auto

        if is_auto(value):
            from ftx_triton.plan.settings import AUTO

            return AUTO
        return super().convert(value, param, ctx)


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses ``nan`` and ``inf`` (click's range check lets NaN through, and an
    infinite timeout overflows the socket's)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def section(title: str, *decorators: F) -> Callable[[F], F]:
    """Apply click option decorators and list their options under ``title`` in --help."""

    def apply(func: F) -> F:
        before = len(getattr(func, "__click_params__", []))
        for decorator in reversed(decorators):
            func = decorator(func)
        for param in getattr(func, "__click_params__", [])[before:]:
            set_help_section(param, title)
        return func

    return apply


def click_option(name: str, default: object, declared: Declared) -> click.Option:
    """The command-line option of one declared setting (its flag, type, help and default)."""
    flag = declared.flag or "--" + name.replace("_", "-")
    kind = declared.kind
    param_type: click.ParamType | None = None
    if declared.choices:
        param_type = click.Choice(list(declared.choices))
    elif kind is int and declared.auto:
        param_type = AutoInt(int(declared.low or 1), int(declared.high or 64))
        default = str(default) if default is not None else None
    elif kind is int:
        low, high = (None if b is None else int(b) for b in (declared.low, declared.high))
        param_type = click.IntRange(low, high) if low is not None or high is not None else click.INT
    elif kind is float:
        param_type = FiniteFloatRange(declared.low, declared.high)
    elif kind is Path:
        param_type = click.Path(exists=declared.must_exist, dir_okay=declared.dir_okay, path_type=Path)
    kwargs: dict[str, Any] = {"help": declared.help, "show_default": declared.show_default}
    if declared.envvar:
        kwargs["envvar"] = list(declared.envvar)
    if kind is bool:
        opts = [f"{flag}/--no-{flag[2:]}" if declared.pair else flag]
        kwargs["default"] = default
        if not declared.pair:
            kwargs["is_flag"] = True
    else:
        opts = [flag]
        kwargs.update(type=param_type, multiple=declared.multiple, default=None if declared.multiple else default)
    return click.Option([*opts, name], **kwargs)


def section_options(
    section_cls: type[OptionSection],
    only: tuple[str, ...] = (),
    callbacks: Mapping[str, Callable[..., Any]] | None = None,
    helps: Mapping[str, str] | None = None,
) -> list[click.Option]:
    """New click options for the declared fields of ``section_cls`` (``only`` these names, when given, in that
    order), listed under its title (or a field's own ``group``) in --help; ``callbacks`` check a value further;
    ``helps`` words a field's help for this command (``ftx lock --runtime`` pins the runtime)."""
    declared = {name: (default, spec) for name, default, spec in section_cls.declarations()}
    names = [name for name in only if name in declared] if only else list(declared)
    options = []
    for name in names:
        default, spec = declared[name]
        if helps and name in helps:
            spec = replace(spec, help=helps[name])
        option = click_option(name, default, spec)
        option.show_envvar = True
        if callbacks and name in callbacks:
            option.callback = callbacks[name]
        set_help_section(option, spec.group or section_cls.title)
        options.append(option)
    return options


def options_of(
    section_cls: type[OptionSection],
    only: tuple[str, ...] = (),
    callbacks: Mapping[str, Callable[..., Any]] | None = None,
    helps: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """A decorator adding :func:`section_options` to a command (as ``@click.option`` would)."""

    def apply(func: F) -> F:
        params = getattr(func, "__click_params__", None)
        if params is None:
            params = func.__click_params__ = []  # type: ignore[attr-defined]
        params.extend(reversed(section_options(section_cls, only, callbacks, helps)))
        return func

    return apply


@dataclass(frozen=True)
class CommandKit:
    """What the CLI hands a plugin's commands (``ftx_register_commands(cli, kit)``): the parts that sit above the
    engine, so a runtime's commands use them without importing the CLI."""

    run: Callable[[RunSettings], RunResult]
    """Run the pipeline over the user's FTX_HOME as ``ftx run`` does (``ftx.toml``'s pins checked first)."""
    settings: Callable[..., RunSettings]
    """``settings(model, **options)``: RunSettings from a command's flat option values."""
    options: Mapping[str, Callable[[F], F]]
    """Core's option groups by name (``source``, ``conversion``, ``repository``, ``tune``, ``safety``)."""
