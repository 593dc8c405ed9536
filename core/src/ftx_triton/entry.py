"""The ``ftx`` console script.

Before the command line is even imported, a cached ``ftx run``'s server is started ahead
(:mod:`ftx_triton.server.head_start`), then structlog is imported without rich's tracebacks
(:mod:`ftx_triton.plain_structlog`: ftx's renderers never use them, and on a small machine their 0.05-0.1 CPU-s
run beside that server's model load); once the command is done and its output flushed, the process ends at once
instead of tearing its interpreter down (grpc, protobuf and the rest of what a run loaded: 0.1-0.2 s after the
last line). In-process callers use :func:`ftx_triton.cli.main`, which exits as any Python program does.
"""

from __future__ import annotations

import sys


def main() -> None:
    from ftx_triton import start_environ

    start_environ.remember()  # before any import can write to the environment
    ahead = "run" in sys.argv[1:]  # only a run is started ahead (head_start.begin's test): others skip its imports
    if ahead:
        from ftx_triton.server import head_start

        head_start.begin(sys.argv[1:])  # a cached run's server starts loading now; adopted only if it is the run's
    from ftx_triton.plain_structlog import import_structlog

    import_structlog()  # without rich's tracebacks and pretty-printer, which ftx's renderers never use
    try:
        from ftx_triton.cli import main as cli_main

        cli_main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        if ahead:
            from ftx_triton.server import head_start

            head_start.end()
    end(code)


def end(code: object) -> None:
    """Exit with ``code`` as ``sys.exit`` would, without the interpreter's teardown: atexit handlers run and the
    output is flushed first; while another thread runs, the exit waits for it as the usual exit does.

    The wait is the interpreter's own (``threading._shutdown``, the first step of its exit: the pools' shutdown
    hooks, then every non-daemon thread joined), so the idle workers of the reading pool a first conversion leaves
    no longer send the process through the teardown (0.05-0.1 s after its last line on 2 CPUs); a Python without
    it exits as ``sys.exit`` does."""
    import threading

    if threading.active_count() > 1:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is None:
            sys.exit(code)  # type: ignore[arg-type]
        shutdown()
    import atexit
    import os

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said
            pass
    os._exit(status)
