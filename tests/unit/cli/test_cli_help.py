"""The command line as documented: every option has an FTX_ environment twin shown in --help,
`ftx run --help` is grouped, and help texts make no false claims."""

from __future__ import annotations

from pathlib import Path

import click
from ftx_triton.cli import cli


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    """Every command under ``group`` (core's are imported when listed, plugins' included), by its full name."""
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        out.append((f"{prefix}{name}", command))
        if isinstance(command, click.Group):
            out += _commands(command, f"{prefix}{name} ")
    return out


def test_every_option_of_every_command_shows_its_environment_twin(ftx_cli) -> None:
    missing = []
    for name, command in _commands(cli):
        help_text = " ".join(ftx_cli(*name.split(), "--help").stdout.split())
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and "env var: FTX_" not in help_text:
                missing.append(f"{name} {param.opts[0]}")
            if isinstance(param, click.Option) and param.name not in ("log_format", "verbose"):
                twin = _twin(name, param)
                if twin not in help_text:
                    missing.append(f"{name} {param.opts[0]} ({twin})")
    assert not missing, missing


def _twin(command: str, param: click.Option) -> str:
    """The documented rule, spelled independently of ftx's code: FTX_<COMMAND>_<OPTION>, OPTION the first long flag."""
    flag = next(o for o in param.opts if o.startswith("--"))
    return f"FTX_{command.upper().replace(' ', '_').replace('-', '_')}_{flag[2:].upper().replace('-', '_')}"


def test_every_option_of_every_command_reads_its_twin_by_the_rule(monkeypatch) -> None:
    """Walk the click tree: for every option of every command, FTX_<COMMAND>_<OPTION> (named by the flag the
    user types, not the Python name behind it) sets that option; no two options of a command share a twin."""
    from click.core import ParameterSource

    checked, wrong = 0, []
    for name, command in _commands(cli):
        if isinstance(command, click.Group):
            continue
        options = [p for p in command.params if isinstance(p, click.Option) and p.name not in ("log_format", "verbose")]
        twins = [_twin(name, p) for p in options]
        assert len(set(twins)) == len(twins), (name, twins)
        for param, twin in zip(options, twins, strict=True):
            with monkeypatch.context() as env:
                env.setenv(twin, "1")
                parent = click.Context(cli, info_name="ftx", auto_envvar_prefix="FTX")
                for part in name.split()[:-1]:
                    group = parent.command.get_command(parent, part)  # type: ignore[attr-defined]
                    parent = click.Context(group, info_name=part, parent=parent)
                ctx = click.Context(command, info_name=name.split()[-1], parent=parent, resilient_parsing=True)
                command.parse_args(ctx, [])
                if ctx.get_parameter_source(param.name or "") is not ParameterSource.ENVIRONMENT:
                    wrong.append(f"{name} {param.opts[0]}: {twin} ignored")
                checked += 1
    assert not wrong, wrong
    assert checked > 100


def test_ps_json_twin_is_named_by_the_flag(ftx_cli, tmp_path: Path) -> None:
    """`ftx ps --json` is FTX_PS_JSON (it was FTX_PS_AS_JSON, after the Python name); the old name is not a twin."""
    assert ftx_cli("ps", env={"FTX_PS_JSON": "1"}).stdout.strip() == "[]"
    assert ftx_cli("ps", env={"FTX_PS_AS_JSON": "1"}).stdout.strip() != "[]"


def test_environment_twins_set_options(ftx_cli, tiny_gptj_dir: Path) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", env={"FTX_RUN_TP": "2"})
    assert result.exit_code == 0, result.stderr
    assert Path(result.stdout.strip()).name == "2-gpu"
    json_logs = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", env={"FTX_LOG_FORMAT": "json"})
    assert json_logs.stderr.lstrip().startswith("{")


def test_run_help_is_grouped(ftx_cli) -> None:
    text = ftx_cli("run", "--help").stdout
    sections = [
        line.rstrip(":") for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")
    ]
    assert sections == [
        "Source",
        "Conversion",
        "Triton repository",
        "Stages and runtime",
        "Safety",
        "Serving",
        "Try it",
        "GEMM tuning",
        "FasterTransformer runtime (Docker)",  # declared by the runtimes (Runtime.option_sections)
        "Global options",
    ]


def test_global_flags_work_after_the_subcommand(ftx_cli, tiny_gptj_dir: Path) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", "--log-format", "json", "-v")
    assert result.exit_code == 0
    assert all(line.startswith("{") for line in result.stderr.splitlines())


def test_help_texts_make_no_false_claims(ftx_cli) -> None:
    pull = " ".join(ftx_cli("pull", "--help").stdout.split())
    assert "lists presets" not in pull and "list presets" not in pull
    tune = " ".join(ftx_cli("tune", "--help").stdout.split())
    assert "--runtime" not in tune  # tune always tunes for the fastertransformer runtime


def _section_of(help_text: str, option: str) -> str:
    """The --help section heading an option is listed under."""
    heading = ""
    for line in help_text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
        elif line.strip().startswith(option):
            return heading
    raise AssertionError(f"{option} not in help")


def test_help_sections_belong_to_each_commands_own_options(ftx_cli) -> None:
    """Sections were looked up by option name across commands: `ftx rm --dry-run` sat under "Stages and
    runtime" (ftx run's), `ftx generate --max-tokens` under "Try it"."""
    assert _section_of(ftx_cli("rm", "--help").stdout, "--dry-run") == "Options"
    assert _section_of(ftx_cli("generate", "--help").stdout, "--max-tokens") == "Options"
    run_help = ftx_cli("run", "--help").stdout
    assert _section_of(run_help, "--max-tokens") == "Try it" and _section_of(run_help, "--dry-run") != "Options"


def test_tables_are_not_cut_when_piped(ftx_cli) -> None:
    """`ftx plugins | cat` cut every row at 80 columns (…); piped, a table takes the width it needs."""
    result = ftx_cli("plugins")
    assert result.exit_code == 0 and "…" not in result.stdout
    assert any("ftx-triton-gptneox" in line and "ftx_register_families" in line for line in result.stdout.splitlines())
