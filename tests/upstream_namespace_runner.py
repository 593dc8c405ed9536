"""Inside a private network namespace: serve one repository on Triton's fixed ports, run client commands.

Usage: ``python upstream_namespace_runner.py PLAN.json`` under ``unshare -n`` (``-rn`` when not root).
fastertransformer_backend's clients hard-code localhost:8000 (HTTP) and :8001 (gRPC); in a namespace of
its own the server takes those ports without touching other servers on the machine. PLAN names the
repository, FTX_HOME, and the commands ({"name", "argv", "cwd", "env"}), run one after another against
the one server; each command's exit status, stdout and stderr go to PLAN's ``results`` file as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    from ftx_triton.server.ports import ServerPorts
    from ftx_triton.server.tritonserver import TritonServer

    results = []
    with TritonServer(
        Path(plan["repository"]),
        home=Path(plan["home"]),
        ports=ServerPorts(8000, 8001, 8002),
        env={"FTX_DEVICE": "cpu"},
        name=plan.get("name", "upstream-clients"),
    ):
        for command in plan["commands"]:
            started = time.monotonic()
            try:
                done = subprocess.run(
                    command["argv"],
                    cwd=command["cwd"],
                    capture_output=True,
                    text=True,
                    env={**os.environ, **command.get("env", {})},
                    timeout=command.get("timeout", 600),
                )
                results.append(
                    {
                        "name": command["name"],
                        "rc": done.returncode,
                        "stdout": done.stdout,
                        "stderr": done.stderr,
                        "seconds": round(time.monotonic() - started, 1),
                    }
                )
            except subprocess.TimeoutExpired as exc:
                results.append(
                    {
                        "name": command["name"],
                        "rc": -1,
                        "stdout": str(exc.stdout or ""),
                        "stderr": f"timed out after {exc.timeout}s",
                    }
                )
    Path(plan["results"]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
