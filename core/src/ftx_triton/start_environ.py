"""The environment the ``ftx`` command started with, before any import could add to it.

Libraries write to the process's environment as they are imported (``torch._dynamo`` sets
``TORCHINDUCTOR_CACHE_DIR``). A server spawned by a run that imported them would inherit what they wrote, one
spawned by a run that did not (a cached run imports no torch), not: the same request would spawn two different
servers, and the head start of the next run could never match the run that built. The console script remembers
the environment first thing; the servers ftx spawns inherit that one, plus what ftx gives them explicitly.
In-process callers (tests, code driving ftx) remember nothing and pass the live environment on, as before.
"""

from __future__ import annotations

import os

_started_with: dict[str, str] | None = None


def remember() -> None:
    """Called once by the console script before anything else is imported."""
    global _started_with
    if _started_with is None:
        _started_with = dict(os.environ)


def inherited() -> dict[str, str]:
    """What a child process of ftx inherits: the environment ftx started with when the console script remembered
    it, else the live one."""
    return dict(os.environ if _started_with is None else _started_with)
