"""Assertions and runs shared by the CLI tests."""

from __future__ import annotations

import json
from pathlib import Path


def assert_clean_failure(result, *needles: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert result.exception is None, result.exception  # an FtxError, not a bug
    assert "Traceback" not in result.stderr
    assert "error:" in result.stderr and "hint:" in result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def run_until_configure(ftx_cli, source: Path, *extra: str):
    result = ftx_cli("--log-format", "json", "run", str(source), "--until", "configure", "--runtime", "python", *extra)
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    return result


def events(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
