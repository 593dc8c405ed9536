"""The command line as documented: every option has an FTX_ environment twin shown in --help,
`ftx run --help` is grouped, and help texts make no false claims."""

from __future__ import annotations

from pathlib import Path

import click
from ftx_triton.cli import cli


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out = []
    for name, command in sorted(group.commands.items()):
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
            if isinstance(param, click.Option) and param.name not in ("log_format", "verbose", "accept_license"):
                twin = f"FTX_{name.upper().replace(' ', '_')}_{param.name.upper()}"
                if twin not in help_text:
                    missing.append(f"{name} {param.opts[0]} ({twin})")
    assert not missing, missing


def test_environment_twins_set_options(ftx_cli, tiny_gptj_dir: Path) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", env={"FTX_RUN_TP": "2"})
    assert result.exit_code == 0, result.stderr
    assert Path(result.stdout.strip()).name == "2-gpu"
    json_logs = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", env={"FTX_LOG_FORMAT": "json"})
    assert json_logs.stderr.lstrip().startswith("{")


def test_run_help_is_grouped(ftx_cli) -> None:
    text = ftx_cli("run", "--help").stdout
    sections = [line.rstrip(":") for line in text.splitlines()
                if line and not line.startswith(" ") and line.endswith(":")]
    assert sections == ["Source", "Conversion", "Triton repository", "Stages and runtime", "Safety", "Serving",
                        "Try it", "FasterTransformer runtime (Docker)", "GEMM tuning", "Global options"]


def test_global_flags_work_after_the_subcommand(ftx_cli, tiny_gptj_dir: Path) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", "--log-format", "json", "-v")
    assert result.exit_code == 0
    assert all(line.startswith("{") for line in result.stderr.splitlines())


def test_help_texts_make_no_false_claims(ftx_cli) -> None:
    pull = " ".join(ftx_cli("pull", "--help").stdout.split())
    assert "lists presets" not in pull and "list presets" not in pull
    tune = " ".join(ftx_cli("tune", "--help").stdout.split())
    assert "--runtime" not in tune  # tune always tunes for the fastertransformer runtime
