"""The ``ftx`` console script ends its process as ``sys.exit`` would (code, message, atexit handlers, flushed
output), without the interpreter's teardown; a thread still running is waited for as usual."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import atexit, sys, threading, time
from ftx_triton.entry import end
atexit.register(lambda: print("atexit ran"))
if {thread}:
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
print("said", end=" ")
end({code!r})
print("never")
"""


@pytest.mark.parametrize(
    ("code", "status", "stderr"), [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("error: boom", 1, "error: boom\n")]
)
@pytest.mark.parametrize("thread", [False, True])
def test_the_console_script_ends_as_sys_exit_would(code: object, status: int, stderr: str, thread: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code, thread=thread)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == status
    assert done.stderr == stderr
    expected = ["said", "atexit", "ran"] if not thread else ["said", "thread", "done", "atexit", "ran"]
    assert done.stdout.split() == expected
