"""A served run's lifecycle: the OpenAI front beside the server, detaching, serving until stopped, stopping.

The pipeline's serve stage hands back an :class:`~ftx_triton.plan.artifacts.Endpoint`; a :class:`Deployment` owns
it from there together with the runtime that started it and the OpenAI-compatible front, so every
front end (the CLI, a test, a library user) gets the same lifecycle. It prints nothing: ``say`` and
the CLI's own lines are the caller's.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ftx_triton.errors import ServeError
from ftx_triton.plan.artifacts import Endpoint, ModelRepository, ServedDeployment
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.api import Runtime

if TYPE_CHECKING:
    from ftx_triton.openai_api.launch import OpenAIEndpoint


def openai_model_id(model: str) -> str:
    """The model name OpenAI clients send: what the user ran, without a scheme or revision."""
    return model.removeprefix("hf://").split("@", 1)[0].rstrip("/") or model


class _Terminate(Exception):
    """SIGTERM arrived while serving in the foreground."""


@dataclass
class Deployment:
    """One served model: its endpoint, the runtime that serves it and, optionally, the OpenAI front."""

    endpoint: Endpoint
    runtime: Runtime
    repository: ModelRepository
    settings: RunSettings
    home: Path
    openai: OpenAIEndpoint | None = None
    detached_name: str | None = field(default=None, init=False)
    """Set once :meth:`detach` left it running (then ``ftx ps``/``ftx stop`` or its runtime own it)."""

    @property
    def server(self) -> ServedDeployment:
        if self.endpoint.handle is None:
            raise ServeError(
                f"the {self.runtime.name} runtime returned an endpoint without a deployment handle",
                hint="a runtime's serve() must return Endpoint(..., handle=<its running deployment>)",
            )
        return self.endpoint.handle

    @property
    def recorded(self) -> bool:
        """Whether ftx records the server when detached (``ftx ps`` lists it, ``ftx generate`` finds it)."""
        return self.server.stop_hint is None

    def start_front(self, *, detach: bool) -> None:
        """Start the OpenAI-compatible endpoint in front of the ensemble, unless ``--no-openai``."""
        if not self.settings.serve.openai:
            return
        from ftx_triton.openai_api.launch import start_openai

        s = self.settings.serve
        self.openai = start_openai(
            f"http://{self.endpoint.http_url}",
            self.repository.path,
            openai_model_id(self.settings.model),
            home=self.home,
            host=s.openai_host,
            port=s.openai_port,
            detach=detach,
            triton_grpc=self.endpoint.grpc_url,
        )

    def detach(self) -> str:
        """Leave the server (and the front) running after ftx exits; record the front; return the name."""
        server = self.server
        server.detach()
        name = str(server.name)
        if self.openai is not None:
            from ftx_triton.openai_api.records import write_record

            write_record(
                self.home,
                {
                    "name": name,
                    "pid": self.openai.process.pid,
                    "url": self.openai.url,
                    "triton_pid": server.pid,
                    "log": str(self.openai.log_path),
                },
            )
        self.detached_name = name
        return name

    def serve_until_stopped(self, on_stopping: Callable[[], None] = lambda: None) -> None:
        """Block until Ctrl-C or SIGTERM (then stop everything cleanly) or until the server dies (a ServeError
        with its exit report; the front is stopped either way)."""
        server = self.server

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise _Terminate()

        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            while True:
                try:
                    server.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    continue
                raise ServeError(
                    server.exit_report(),
                    hint=f"see the full log: {server.log_path}" if server.log_path else "see the runtime's own log",
                )
        except (KeyboardInterrupt, _Terminate):
            on_stopping()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean stop short
            try:
                self.stop()
            finally:
                signal.signal(signal.SIGTERM, previous)

    def stop(self) -> None:
        """Stop the front and, through its runtime, the server."""
        if self.openai is not None:
            self.openai.stop()
        self.runtime.stop(self.endpoint)


__all__ = ["Deployment", "openai_model_id"]
