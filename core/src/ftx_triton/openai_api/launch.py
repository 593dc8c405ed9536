"""Start the OpenAI-compatible endpoint as a process beside a served repository, and stop it.

A foreground ``ftx run`` starts it so that it dies with ftx (Linux parent-death signal); a
detached run starts it in its own session and records it (:mod:`.records`) for ``ftx ps`` and
``ftx stop``. Its port is ``--openai-port``, or the first free one from :data:`DEFAULT_PORT` up
(said in the endpoint block ``ftx run`` prints).
"""

from __future__ import annotations

import contextlib
import ctypes
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
) -> OpenAIEndpoint:
    """Start the endpoint for ``repository`` served at ``triton_http``; return once it answers. With ``watch_pid``
    (the server's supervisor) it ends when that process ends, detached or not."""
    chosen = choose_port(host, port)
    log_dir = Path(home) / "openai" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{model_id.replace('/', '-')}-{chosen}.log"
    cmd = [
        sys.executable,
        "-m",
        "ftx_triton.openai_api",
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
        cmd += ["--triton-grpc", triton_grpc]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=detach,
            preexec_fn=None if detach else _die_with_parent,
        )  # noqa: PLW1509
    endpoint = OpenAIEndpoint(process, host, chosen, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    health = endpoint.url.removesuffix("/v1") + "/health"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise ServeError(
                f"the OpenAI endpoint exited with code {process.returncode}:\n{tail}",
                hint=f"see {log_path}; --no-openai serves without it",
            )
        if _answers(health):
            return endpoint
        time.sleep(0.1)
    endpoint.stop()
    raise ServeError(f"the OpenAI endpoint did not answer within {READY_TIMEOUT_S:g} s", hint=f"see {log_path}")


def _answers(health: str) -> bool:
    """Whether the endpoint process answers ``/health`` at all: it is up. Its 503 (Triton or the text model not
    ready) is the model's state, which callers check themselves; waiting for a 200 here would wait out a model
    still loading, or a repository without a text model, and call the endpoint dead."""
    try:
        with _OPENER.open(health, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
