"""Pytest fixtures shared by ftx's own tests and by plugin authors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class CliResult:
    """What one in-process CLI invocation produced."""

    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None


@pytest.fixture
def ftx_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh, empty FTX_HOME for one test (and a fresh plugin host)."""
    from ftx_triton.cli.common import reset_host

    home = tmp_path / "ftx-home"
    home.mkdir()
    monkeypatch.setenv("FTX_HOME", str(home))
    reset_host()
    yield home
    reset_host()


@pytest.fixture
def ftx_cli(ftx_home: Path) -> Callable[..., CliResult]:
    """Run ``ftx <args>`` in-process with click's CliRunner; stdout and stderr kept apart."""
    from click.testing import CliRunner

    from ftx_triton.cli import cli
    from ftx_triton.cli.common import reset_host

    def invoke(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> CliResult:
        reset_host()
        runner = CliRunner()
        result = runner.invoke(cli, list(args), env=env, input=input, catch_exceptions=True)
        exc = result.exception if not isinstance(result.exception, SystemExit) else None
        return CliResult(result.exit_code, result.stdout, result.stderr, exc)

    return invoke


@pytest.fixture
def log_events() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog event emitted during the test, as dicts (whatever level an earlier CLI run set)."""
    import structlog.testing

    saved = structlog.get_config()
    structlog.reset_defaults()
    try:
        with structlog.testing.capture_logs() as events:
            yield events
    finally:
        structlog.configure(**saved)


@pytest.fixture
def plugin_host(ftx_home: Path) -> Any:
    """A plugin host loaded from the installed entry points."""
    from ftx_triton.plugins import load_host

    return load_host()
