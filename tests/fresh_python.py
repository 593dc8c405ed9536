"""Code run in a fresh interpreter, for what only a process's first imports can show."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping


def fresh_report(code: str, env: Mapping[str, str] | None = None) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter (with ``env``, else this one's); the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(env) if env is not None else None,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
