"""Start the OpenAI-compatible endpoint as a process beside a served repository, and stop it.

A foreground ``ftx run`` starts it so that it dies with ftx (Linux parent-death signal); a
detached run starts it in its own session and records it (:mod:`.records`) for ``ftx ps`` and
``ftx stop``. Its port is ``--openai-port``, or the first free one from :data:`DEFAULT_PORT` up
(said in the endpoint block ``ftx run`` prints).

``ftx run`` starts the process early (:class:`WarmFront`): it does its imports while the model loads and
waits for its arguments, which it gets only once the server is ready; it binds no port before then.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ftx_triton.errors import ServeError
from ftx_triton.server.ports import port_free

DEFAULT_PORT = 9000
READY_TIMEOUT_S = 60.0
WARM_ANSWER_S = 0.2
"""For this long the endpoint's /health is asked every 10 ms (a warm process answers in 15-40 ms); then less often."""
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def choose_port(host: str, port: int | None) -> int:
    """``port`` if it is free (an error if not), else the first free port from DEFAULT_PORT up."""
    if port is not None:
        if not port_free(host, port):
            raise ServeError(
                f"--openai-port {port} is in use on {host}",
                hint="choose another port, or leave --openai-port out to take the next free one",
            )
        return port
    for candidate in range(DEFAULT_PORT, DEFAULT_PORT + 200):
        if port_free(host, candidate):
            return candidate
    raise ServeError(
        f"no free port from {DEFAULT_PORT} to {DEFAULT_PORT + 199} on {host}", hint="pass --openai-port, or --no-openai"
    )


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class OpenAIEndpoint:
    """A running endpoint process."""

    process: subprocess.Popen
    host: str
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else (f"[{self.host}]" if ":" in self.host else self.host)
        return f"http://{shown}:{self.port}/v1"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


WARM_FLAG = "--wait-for-arguments"
"""``python -m ftx_triton.openai_api --wait-for-arguments``: import, then read the arguments (one JSON line)."""


class WarmFront:
    """An endpoint process started ahead of the server, its imports done, waiting on stdin for its arguments.

    Nothing runs before :meth:`start`. :func:`start_openai` hands the arguments over (:meth:`take`) and waits
    for it to answer as for a fresh process; a warm process that is gone by then is replaced by a fresh one.
    Unused, it ends when its stdin closes (:meth:`close`, or this process ending in any way), having bound no
    port and written nothing.
    """

    def __init__(self, *, detach: bool) -> None:
        self.detach = detach
        self.process: subprocess.Popen | None = None
        self._started = False

    def start(self) -> None:
        """Start the process (once; ``ftx run`` does when the server starts, so that the imports overlap
        the model's load rather than the planning)."""
        if self._started:
            return
        self._started = True
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ftx_triton.openai_api", WARM_FLAG],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=self.detach,
            preexec_fn=None if self.detach else _die_with_parent,
        )  # noqa: PLW1509

    def take(self, argv: list[str], log_path: Path, *, detach: bool) -> subprocess.Popen | None:
        """The process, given ``argv`` and its log; None when it cannot serve this call (it ended, or it was
        started for the other of foreground and detached), and then it is closed."""
        process, self.process = self.process, None
        if process is None:
            return None
        message = json.dumps({"argv": argv, "log": str(log_path)}) + "\n"
        try:
            if detach != self.detach or process.poll() is not None or process.stdin is None:
                raise BrokenPipeError
            process.stdin.write(message.encode())
            process.stdin.close()
        except OSError:
            _close(process)
            return None
        return process

    def close(self) -> None:
        """End the process unless :meth:`take` handed it over."""
        process, self.process = self.process, None
        if process is not None:
            _close(process)

    def __enter__(self) -> WarmFront:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(process: subprocess.Popen) -> None:
    """End a warm process that got no arguments: its stdin closes, so it exits; killed if it does not."""
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


PID_HEADER = "X-Ftx-Endpoint-Pid"
"""The header ``/health`` answers with its process id: the launcher knows its own endpoint from another
deployment's that took the same port between the free-port check and the bind."""
ATTEMPTS = 3
"""Ports tried when the one chosen was taken before the endpoint could bind it (no --openai-port)."""


class PortTaken(Exception):
    """The endpoint's port was bound by another process before the endpoint could bind it."""


def start_openai(
    triton_http: str,
    repository: Path,
    model_id: str,
    *,
    home: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    detach: bool = False,
    watch_pid: int | None = None,
    triton_grpc: str | None = None,
    warm: WarmFront | None = None,
) -> OpenAIEndpoint:
    """Start the endpoint for ``repository`` served at ``triton_http``; return once it answers. With ``watch_pid``
    (the server's supervisor) it ends when that process ends, detached or not. ``warm``: a process started
    ahead, used when it can be (else a fresh one is started). Another process that takes the chosen port first
    is never mistaken for the endpoint (its ``/health`` names another pid); the next free port is tried."""
    attempts = ATTEMPTS if port is None else 1  # a port the user chose is not replaced by another
    for attempt in range(attempts):
        try:
            return _start_on(
                choose_port(host, port),
                triton_http,
                repository,
                model_id,
                home=home,
                host=host,
                detach=detach,
                watch_pid=watch_pid,
                triton_grpc=triton_grpc,
                warm=warm if attempt == 0 else None,
            )
        except PortTaken as taken:
            lost = taken
    raise ServeError(
        f"the OpenAI endpoint could not bind port {lost}: another process took it first",
        hint="choose a free --openai-port, or leave it out to take the next free one",
    )


def _start_on(
    chosen: int,
    triton_http: str,
    repository: Path,
    model_id: str,
    *,
    home: Path,
    host: str,
    detach: bool,
    watch_pid: int | None,
    triton_grpc: str | None,
    warm: WarmFront | None,
) -> OpenAIEndpoint:
    """Start the endpoint on ``chosen``; return once it answers as itself; PortTaken when its bind failed."""
    log_dir = Path(home) / "openai" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{model_id.replace('/', '-')}-{chosen}.log"
    argv = [
        "--triton",
        triton_http,
        "--model-id",
        model_id,
        "--tokenizer",
        str(Path(repository) / "preprocessing" / "1"),
        "--host",
        host,
        "--port",
        str(chosen),
        *(["--watch-pid", str(watch_pid)] if watch_pid else []),
        "--home",
        str(Path(home).resolve()),
    ]
    if triton_grpc:  # a streaming model's ids are read straight from its gRPC stream (no Python model per token)
        argv += ["--triton-grpc", triton_grpc]
    process = warm.take(argv, log_path, detach=detach) if warm is not None else None
    if process is None:
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "ftx_triton.openai_api", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=detach,
                preexec_fn=None if detach else _die_with_parent,
            )  # noqa: PLW1509
    endpoint = OpenAIEndpoint(process, host, chosen, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    health = endpoint.url.removesuffix("/v1") + "/health"
    # a warm process answers within tens of milliseconds (asked every 10 ms at first); a fresh one in about a second
    started, pause = time.monotonic(), 0.01
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            if "address already in use" in tail.lower():
                raise PortTaken(chosen)
            raise ServeError(
                f"the OpenAI endpoint exited with code {process.returncode}:\n{tail}",
                hint=f"see {log_path}; --no-openai serves without it",
            )
        if _answers(health, process.pid):
            return endpoint
        time.sleep(pause)
        if time.monotonic() - started > WARM_ANSWER_S:
            pause = min(0.1, pause * 2)
    endpoint.stop()
    raise ServeError(f"the OpenAI endpoint did not answer within {READY_TIMEOUT_S:g} s", hint=f"see {log_path}")


def _answers(health: str, pid: int) -> bool:
    """Whether the endpoint process ``pid`` answers ``/health`` at all: it is up. Its 503 (Triton or the text
    model not ready) is the model's state, which callers check themselves; waiting for a 200 here would wait out
    a model still loading, or a repository without a text model, and call the endpoint dead. An answer from
    another process on the port (another deployment's endpoint) is not this one's."""
    try:
        with _OPENER.open(health, timeout=2) as reply:
            return reply.headers.get(PID_HEADER) == str(pid)
    except urllib.error.HTTPError as refused:
        return refused.headers.get(PID_HEADER) == str(pid)
    except OSError:
        return False
