"""``python -m ftx_triton.openai_api``: run the OpenAI-compatible endpoint for one deployment until SIGTERM."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ftx_triton.import_ahead import import_ahead


def main(argv: list[str] | None = None) -> None:
    from ftx_triton.openai_api.launch import WARM_FLAG

    if (sys.argv[1:] if argv is None else argv) == [WARM_FLAG]:
        warm()
        return
    parser = argparse.ArgumentParser(prog="python -m ftx_triton.openai_api", description=__doc__)
    parser.add_argument("--triton", required=True, help="Triton's HTTP address, http://HOST:PORT")
    parser.add_argument("--model-id", required=True, help="The model name clients send (and /v1/models lists)")
    parser.add_argument("--tokenizer", required=True, type=Path, help="The repository's preprocessing/1 directory")
    parser.add_argument("--ensemble", default="text", help="The text model (generate extension)")
    parser.add_argument(
        "--triton-grpc", help="Triton's gRPC address, HOST:PORT: a streaming model's token ids are read from it"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--watch-pid", type=int, help="Exit when this process (the server's supervisor) ends")
    parser.add_argument("--home", type=Path, help="The FTX_HOME of its record: the endpoint stops once it is deleted")
    args = parser.parse_args(argv)

    from ftx_triton.errors import FtxError
    from ftx_triton.front.local_aiohttp import import_aiohttp

    import_aiohttp()  # before the front's modules import it: this endpoint speaks plain HTTP to tritonserver
    from ftx_triton.front.server import Front, Limits
    from ftx_triton.openai_api.app import MAX_BODY_BYTES, make_app
    from ftx_triton.server.home_watch import HomeWatch

    try:
        app = make_app(args.triton, args.model_id, args.tokenizer, args.ensemble, triton_grpc=args.triton_grpc)
    except FtxError as exc:  # a bad FTX_OPENAI_GATHER_US: said, and ftx run shows it from this log
        print(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    front = Front(app, args.host, args.port, Limits(max_body_bytes=MAX_BODY_BYTES))

    def home_gone() -> None:
        print(f"{args.home} (FTX_HOME) was deleted: no `ftx stop` could find this endpoint, so it stops", flush=True)
        front.stop()

    HomeWatch(args.home).on_gone(home_gone)
    if args.watch_pid:
        watch(args.watch_pid, front.stop)
    front.run()


AHEAD = (
    "ftx_triton.repository.model_config",
    "ftx_triton.repository.textproc",
    "tritonclient.grpc",
    "tokenizers",
    "google.protobuf.descriptor_pb2",
)
"""What the endpoint imports once it has its arguments (the token route reads the repository's configs, a streaming
one opens a gRPC client, loads the tokenizer and parses the configs' text): 0.3-0.8 s that the warm process spends
while the model loads instead of after, between its arguments and its first answer."""


def warm() -> None:
    """Started ahead by ``ftx run``: do the imports now, then wait for one JSON line on stdin, ``{"argv": [...],
    "log": PATH}``, send the output to that log and run; end quietly if stdin closes first (the run needs no
    endpoint after all)."""
    import psutil  # noqa: F401 - imported ahead like the rest

    from ftx_triton.front.local_aiohttp import import_aiohttp

    import_aiohttp()
    import ftx_triton.front.server
    import ftx_triton.openai_api.app
    import ftx_triton.server.home_watch  # noqa: F401

    import_ahead(AHEAD)  # a failure is raised again, and reported, where the endpoint imports the module
    line = sys.stdin.readline()
    if not line.strip():
        return
    message = json.loads(line)
    log = os.open(message["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, fd in ((0, null), (1, log), (2, log)):
        os.dup2(fd, target)
    os.close(log)
    os.close(null)
    main([str(arg) for arg in message["argv"]])


WATCH_INTERVAL_S = 0.5


def watch(pid: int, on_gone: Callable[[], None]) -> None:
    """Call ``on_gone`` (from a daemon thread) once process ``pid`` has ended: the endpoint of a detached
    deployment lives in its own session, so no parent-death signal reaches it when its server's supervisor
    dies. The process is known by its start time too, so a reused pid is not taken for it."""
    import psutil

    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        on_gone()
        return

    def alive() -> bool:
        try:
            process = psutil.Process(pid)
            return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def loop() -> None:
        while alive():
            time.sleep(WATCH_INTERVAL_S)
        on_gone()

    threading.Thread(target=loop, name="ftx-watch-supervisor", daemon=True).start()


if __name__ == "__main__":
    main()
