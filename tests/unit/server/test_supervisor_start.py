"""What the supervisor does before tritonserver starts, and what it imports at all (a real supervisor process; the
program it starts as "tritonserver" is a Python one-liner that exits at once, as nothing here needs a model)."""

from __future__ import annotations

import json
import subprocess
import sys

from ftx_triton.server.ports import loopback_port


def _supervise_with_importtime() -> list[str]:
    """Run a supervisor with both fronts under ``-X importtime``; its output and import lines, in order."""
    ports: list[int] = []
    for _ in range(4):
        ports.append(loopback_port(avoid=ports))
    spec = {
        "command": [sys.executable, "-c", "import time; time.sleep(0.2)"],
        "shm_prefix": "",
        "exit_timeout_s": 1,
        "front": {"host": "127.0.0.1", "port": ports[0], "upstream_port": ports[1]},
        "grpc_front": {"host": "127.0.0.1", "port": ports[2], "upstream_port": ports[3]},
    }
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ftx_triton.server.supervisor", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert any("HTTP front on" in line for line in lines), done.stdout[-3000:]
    assert any("gRPC front on" in line for line in lines), done.stdout[-3000:]
    return lines


def _imported(lines: list[str], module: str) -> int | None:
    """The line at which ``module`` finished importing, None if it never was."""
    return next(
        (
            i
            for i, line in enumerate(lines)
            if line.startswith("import time:") and line.split("|")[-1].strip() == module
        ),
        None,
    )


def test_tritonserver_starts_before_the_logging_and_front_imports_and_nothing_heavy_is_imported() -> None:
    lines = _supervise_with_importtime()
    spawned = next(i for i, line in enumerate(lines) if "tritonserver started" in line)
    for module in ("structlog", "aiohttp", "grpc"):  # the models start loading before these 0.2-0.3 s of imports
        at = _imported(lines, module)
        assert at is not None and at > spawned, module
    # the fronts need none of these (the gRPC service's names are written out; the shield's depth count imports
    # numpy at the first nested body; the stub check does not import the backend installer)
    for module in (
        "numpy",
        "tritonclient.grpc",
        "google.protobuf",
        "zipfile",
        "ftx_triton.server.stub_env",
        "rich.console",
    ):
        assert _imported(lines, module) is None, module
