"""`ftx --help` starts light: no numpy, ml_dtypes, torch or transformers (nor structlog and rich, which only a
running command needs) is imported to print it. The figures are in benchmarks/bench_cli_start.py."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("numpy", "ml_dtypes", "torch", "transformers", "tritonclient", "structlog", "rich")

PROBE = """
import json, sys
sys.argv = ["ftx", "--help"]
from ftx_triton.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})), file=sys.stderr)
"""


def test_ftx_help_imports_no_heavy_module() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Commands:" in run.stdout and "run" in run.stdout  # the help was printed, plugins' commands too
    assert "image" in run.stdout and "backend" in run.stdout
    loaded = set(json.loads(run.stderr.strip().splitlines()[-1]))
    assert not loaded & set(HEAVY), f"`ftx --help` imported {sorted(loaded & set(HEAVY))}"


def test_each_core_command_is_listed_with_the_module_that_defines_it() -> None:
    import importlib

    from ftx_triton.cli import COMMANDS

    defined = {
        command.name: module
        for module in set(COMMANDS.values())
        for command in importlib.import_module(module).commands
    }
    assert defined == COMMANDS


RUN_PROBE = """
import json, sys
sys.argv = ["ftx", "run", "--help"]
from ftx_triton.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(name for name in sys.modules if name.startswith("ftx_triton.cli."))), file=sys.stderr)
"""


def test_ftx_run_imports_no_other_command_module() -> None:
    """`ftx run` parses its options with its own command module imported, not the other eleven (``ls``, ``bench`` …)."""
    run = subprocess.run([sys.executable, "-c", RUN_PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    loaded = set(json.loads(run.stderr.strip().splitlines()[-1]))
    from ftx_triton.cli import COMMANDS

    others = {module for module in COMMANDS.values() if module != "ftx_triton.cli.run"}
    assert "ftx_triton.cli.run" in loaded and not loaded & others, sorted(loaded & others)
