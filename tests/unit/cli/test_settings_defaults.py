"""`RunSettings.of(MODEL)` from Python and `ftx run MODEL` from the shell mean the same run: every setting the
command line leaves at its default is the dataclass default (tp auto, weights auto …), so a library caller and a
shell user get the same plan."""

from __future__ import annotations

from typing import Any

from ftx_triton.cli.common import pop_plugin_options
from ftx_triton.cli.run import run, settings_from_options
from ftx_triton.plan.settings import AUTO, RunSettings

NOT_SETTINGS = ("model", "prompt", "max_tokens", "lock_file", "allow_drift")


def test_ftx_run_defaults_are_run_settings_defaults() -> None:
    ctx = run.make_context("run", ["some-model"], resilient_parsing=True)
    opts: dict[str, Any] = {k: v for k, v in ctx.params.items() if k not in NOT_SETTINGS}
    plugin_values = pop_plugin_options(opts)
    from_shell = settings_from_options("some-model", plugin_options=plugin_values, **opts)
    from_python = RunSettings.of("some-model")
    assert from_shell == from_python
    assert (from_python.convert.tp, from_python.convert.weight_dtype) == (AUTO, "auto")


def test_run_and_lock_take_one_declaration_of_a_setting() -> None:
    """`--http-port` of `ftx run` and of `ftx lock` come from ServeSettings' one declaration (help, type, range)."""
    from ftx_triton.cli.pins import lock

    def option(command: Any, name: str) -> Any:
        return next(p for p in command.params if p.name == name)

    for name in ("http_port", "host", "device"):
        mine, theirs = option(run, name), option(lock, name)
        assert (mine.help, repr(mine.type), mine.default) == (theirs.help, repr(theirs.type), theirs.default)


def test_every_declared_setting_is_an_option_of_ftx_run_with_its_default() -> None:
    """Each row of the settings table is an option of `ftx run` whose default, parsed as the shell would, is what
    RunSettings.of(MODEL) holds in that field."""
    from ftx_triton.plan.settings import settings_table

    ctx = run.make_context("run", ["some-model"], resilient_parsing=True)
    python = RunSettings.of("some-model")
    params = {p.name: p for p in run.params}
    for key, flag, _default, field in settings_table():
        assert flag.split("/")[0] in params[key].opts, key
        held: Any = python
        for part in field.split("."):
            held = getattr(held, part)
        shell = ctx.params[key]
        assert RunSettings.of("some-model", **{key: shell}) == python, (key, shell, held)


def test_docs_list_the_settings_table() -> None:
    """docs/architecture.md's settings table is the one the code declares (a new setting shows up in the docs)."""
    from pathlib import Path

    from ftx_triton.plan.settings import settings_table

    text = (Path(__file__).parents[3] / "docs" / "architecture.md").read_text()
    block = text.split("<!-- settings-table -->")[1].split("<!-- /settings-table -->")[0]
    rows = block.strip().splitlines()[2:]
    assert rows == [f"| `{key}` | `{flag}` | {default} | `{field}` |" for key, flag, default, field in settings_table()]
