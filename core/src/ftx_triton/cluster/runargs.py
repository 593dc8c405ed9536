"""`ftx run`'s options as a cluster launcher passes them on: parsed here first, as `ftx run` would."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ftx_triton.errors import ConfigError


def check_run_args(model: str, run_args: Sequence[str], refused: Mapping[str, str]) -> dict[str, object]:
    """Parse ``ftx run MODEL run_args`` as `ftx run` would (types, ranges, choices) before anything leaves this
    machine; an option in ``refused`` (name -> why) that is set is an error. Returns the parsed values."""
    import click

    from ftx_triton.cli.run import run

    try:
        ctx = run.make_context("ftx run", [model, *run_args])
    except click.ClickException as exc:
        raise ConfigError(
            f"ftx run would refuse these options: {exc.format_message()}",
            hint="the options after MODEL are `ftx run`'s (see `ftx run --help`)",
        ) from None
    for key, why in refused.items():
        value = ctx.params.get(key)
        if value not in (None, False, "serve", ()):
            raise ConfigError(f"`ftx run --{key.replace('_', '-')}` has no meaning here", hint=why)
    return dict(ctx.params)
