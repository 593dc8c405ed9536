"""Fixtures shared by tests/ and plugins/*/tests: tiny offline checkpoints built once per session (fixtures of the ftx
pytest plugin — ftx_home, ftx_cli, log_events, plugin_host — come from ``ftx_triton.testing``)."""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "tests" / "golden"
"""Inputs and manifests (sha256 of every file upstream wrote) of FasterTransformer's own converters
on tiny checkpoints; the outputs themselves are not stored, only their manifests."""

EXCLUSIVE = {"docker": ("docker_client", "standin_image", "pytest.mark.docker"), "slurm": ("slurm_cluster",)}
"""Names whose use in a test file means the file needs a machine-wide resource (one dockerd, one Slurm node named
after this host): under pytest-xdist all such files run on one worker, so each resource starts once."""


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-n N`` (pytest-xdist) schedules whole files, and files sharing an exclusive resource, per worker."""
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "loadgroup"


def scheduling_group(nodeid: str, root: Path) -> str:
    """The scheduling unit of a test under ``--dist loadgroup``: its ``xdist_group`` when it has one, the
    resource of :data:`EXCLUSIVE` its file uses, else its file (module- and session-scoped servers then start
    once per file, not once per worker)."""
    if "@" in nodeid and nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    path = nodeid.split("::", 1)[0]
    try:
        text = (root / path).read_text(errors="replace")
    except OSError:
        return path
    return next((group for group, names in EXCLUSIVE.items() if any(name in text for name in names)), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's ``loadgroup`` scheduler, grouping by :func:`scheduling_group` (xdist's own ``xdist_group``
    suffix is not applied under pytest 9, so the grouping is done here, from the node ids alone)."""
    if config.option.dist != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    root = config.rootpath
    groups: dict[str, str] = {}  # file -> group, each file read once

    class FileGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            key = nodeid if "@" in nodeid else nodeid.split("::", 1)[0]
            if key not in groups:
                groups[key] = scheduling_group(nodeid, root)
            return groups[key]

    return FileGroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _fresh_logging():
    """Each test starts from structlog's defaults and human (not JSON) output: a CLI run in an earlier test
    configures both, and under xdist the earlier test on a worker is not the one a serial run has."""
    import structlog
    from ftx_triton.terminal.console import set_json

    set_json(False)
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
