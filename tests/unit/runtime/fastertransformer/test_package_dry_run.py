"""`ftx package --dry-run`: the stages and the image that would be built, with no Docker daemon and nothing built."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_package_dry_run_says_what_it_would_build_and_builds_nothing(ftx_cli: Any, demo_ftx_home: Path) -> None:
    result = ftx_cli("package", "tiny-gptj", "--tag", "registry.example/tiny:1", "--dry-run", "--no-tune")
    assert result.exit_code == 0, result.stderr
    assert "package: would build registry.example/tiny:1 FROM ftx/triton-fastertransformer:" in result.stdout
    assert "no gemm_config.in (--no-tune)" in result.stdout
    assert "run it with: docker run --rm --init --gpus" in result.stdout and "registry.example/tiny:1" in result.stdout
    assert "4. configure" in result.stderr + result.stdout  # the pipeline's plan, as `ftx run --dry-run` prints it
    assert not (demo_ftx_home / "store" / "configure").exists()  # dry: nothing converted or configured
