"""The ``ftx`` command line.

Each module in :data:`COMMAND_MODULES` exposes ``commands: list[click.Command]``; the group
adds them all. A module that fails to import is a bug and raises. Plugins add theirs through
``ftx_register_commands`` (the runtimes' ``ftx image``, ``ftx tune``, ``ftx package``, ``ftx backend``).
"""

from __future__ import annotations

import importlib

import click

from ftx_triton.cli.common import ENV_PREFIX, FtxRootGroup, global_options, handle_errors

COMMAND_MODULES = (
    "ftx_triton.cli.info",
    "ftx_triton.cli.run",
    "ftx_triton.cli.convert",
    "ftx_triton.cli.configure",
    "ftx_triton.cli.fetch",
    "ftx_triton.cli.servers",
    "ftx_triton.cli.pins",
    "ftx_triton.cli.serving",
    "ftx_triton.cli.store",
    "ftx_triton.cli.bench",
    "ftx_triton.cli.plugin",
    "ftx_triton.cli.verify",
)


def _version_text() -> str:
    from ftx_triton.plugins import installed_distributions

    lines = [f"{name} {version}" for name, version in installed_distributions()]
    return "\n".join(lines)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(_version_text())
    ctx.exit(0)


@click.group(
    cls=FtxRootGroup,
    params=global_options(),
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": ENV_PREFIX},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    allow_from_autoenv=False,
    show_envvar=False,
    help="Show ftx and every plugin distribution with its version.",
)
def cli() -> None:
    """Deploy language models on Triton with FasterTransformer: fetch, convert, tune, configure, serve.

    Every option can also be set in the environment: FTX_<COMMAND>_<OPTION> (shown in each
    command's --help), FTX_LOG_FORMAT and FTX_VERBOSE for the global flags, FTX_HOME for the store.
    """
    from ftx_triton.terminal.log import configure_logging

    meta = click.get_current_context().meta
    configure_logging(meta.get("log_format") or "human", bool(meta.get("verbose")))


def _add_commands() -> None:
    from ftx_triton.cli.run import command_kit

    for module_name in COMMAND_MODULES:
        module = importlib.import_module(module_name)
        for command in module.commands:
            cli.add_command(command)
    cli.make_kit = command_kit


_add_commands()


def main() -> None:
    """Console-script entry point."""
    from ftx_triton.interrupt import install

    install()  # Ctrl-C stops ftx even when started with SIGINT ignored, or when Python swallowed it
    with handle_errors():
        cli.main(prog_name="ftx", standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    main()
