"""Fixtures shared by tests/ and plugins/*/tests: tiny offline checkpoints built once per session (fixtures of the ftx
pytest plugin — ftx_home, ftx_cli, log_events, plugin_host — come from ``ftx_triton.testing``)."""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "tests" / "golden"
"""Inputs and manifests (sha256 of every file upstream wrote) of FasterTransformer's own converters
on tiny checkpoints; the outputs themselves are not stored, only their manifests."""


@pytest.fixture(autouse=True)
def _fresh_logging():
    """Each test starts from structlog's defaults (a CLI run in an earlier test configures it)."""
    import structlog

    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture(scope="session")
def golden() -> Path:
    return GOLDEN


@pytest.fixture(scope="session")
def tiny_gptj_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random GPT-J with a trained tokenizer (safetensors)."""
    from ftx_gptj.tiny import tiny_gptj

    return tiny_gptj(tmp_path_factory.mktemp("tiny-gptj"))


@pytest.fixture(scope="session")
def built_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in tiny-gptj, built once per session: an FTX_HOME builds it on first use (about 10 s),
    so tests whose subject is not that build start from a copy (``fetch_helpers.seed_demo``)."""
    from fetch_helpers import ensure_demo_checkpoint

    return ensure_demo_checkpoint(tmp_path_factory.mktemp("demo-once"))


@pytest.fixture
def demo_ftx_home(ftx_home: Path, built_demo: Path) -> Path:
    """:func:`ftx_triton.testing.fixtures.ftx_home` with the built-in tiny-gptj already built."""
    from fetch_helpers import seed_demo

    seed_demo(ftx_home, built_demo)
    return ftx_home
