"""ftx's pytest plugin (registered through the ``pytest11`` entry point): fixtures and the
family conformance kit for plugin authors.

Fixtures: ``ftx_home`` (a temporary FTX_HOME), ``ftx_cli`` (run the CLI in-process),
``log_events`` (captured structlog events), ``plugin_host`` (a fresh host from installed
entry points). Heavy imports (torch, transformers) happen inside fixtures only.
"""

from __future__ import annotations

from ftx_triton.testing.conformance import checkpoint, converted
from ftx_triton.testing.fixtures import CliResult, ftx_cli, ftx_home, log_events, plugin_host

__all__ = ["CliResult", "checkpoint", "converted", "ftx_cli", "ftx_home", "log_events", "plugin_host"]
