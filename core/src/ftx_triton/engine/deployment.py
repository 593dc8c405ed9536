"""A served run's lifecycle: the OpenAI front beside the server, one answer (``--prompt``), detaching, serving
until stopped (the front recorded meanwhile), stopping.

The pipeline's serve stage hands back an :class:`~ftx_triton.plan.artifacts.Endpoint`; a :class:`Deployment` owns
it from there together with the runtime that started it and the OpenAI-compatible front, so every
front end (the CLI, a test, a library user) gets the same lifecycle (:meth:`Deployment.serve`). It prints
nothing: what is shown is the caller's :class:`ServeView`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from ftx_triton import interrupt
from ftx_triton.client.generate import generate_text
from ftx_triton.errors import ConfigError, ServeError
from ftx_triton.plan.artifacts import Endpoint, ModelRepository, ServedDeployment
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.api import Runtime

if TYPE_CHECKING:
    from ftx_triton.openai_api.launch import OpenAIEndpoint, WarmFront


def openai_model_id(model: str) -> str:
    """The model name OpenAI clients send: what the user ran, without a scheme or revision."""
    return model.removeprefix("hf://").split("@", 1)[0].rstrip("/") or model


class ServeView(Protocol):
    """What a front end shows while :meth:`Deployment.serve` runs the lifecycle."""

    def step(self, name: str) -> None:
        """A stage of the run is done (``openai front``, ``detach``)."""

    def text(self, piece: str) -> None:
        """A streamed piece of the one-shot answer."""

    def answered(self, text: str, streamed: bool) -> None:
        """The one-shot answer is complete (``text`` is whole; when ``streamed``, its pieces went to :meth:`text`)."""

    def detached(self, name: str) -> None:
        """The server was left running as ``name``."""

    def serving(self) -> None:
        """The server serves in the foreground until Ctrl-C or SIGTERM."""

    def stopping(self) -> None:
        """Ctrl-C or SIGTERM arrived; the server is being stopped."""

    def stopped(self) -> None:
        """The foreground server stopped cleanly."""


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
    warm_front: WarmFront | None = None
    """The front's process started ahead (``ftx run`` starts it while the model loads); else a fresh one."""
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

    @property
    def streams(self) -> bool:
        """Whether the served model answers as a stream (a decoupled ``fastertransformer`` model): what the server
        said, else its repository's config (protobuf's parser, which a run whose server said does without)."""
        if self.endpoint.streams is not None:
            return self.endpoint.streams
        from ftx_triton.repository.model_config import FT_MODEL_NAME, parse_config

        try:
            config = parse_config(self.repository.path / FT_MODEL_NAME / "config.pbtxt")
        except (ConfigError, OSError):
            return False
        return bool(config.model_transaction_policy.decoupled)

    def serve(self, view: ServeView, *, prompt: str | None = None, max_tokens: int = 16) -> None:
        """The lifecycle once the server is ready.

        ``prompt``: generate once, hand the text to ``view``, stop the server (unless detaching).
        Detaching (``settings.serve.detach``): leave the server and its front running.
        Otherwise: serve in the foreground until Ctrl-C or SIGTERM, then stop cleanly. A failure before the
        server was left running stops it.
        """
        detach = self.settings.serve.detach
        try:
            if prompt is None or detach:
                self.start_front(detach=detach)
                view.step("openai front")
            if prompt is not None:  # the server stops after the answer (unless it is detached)
                stream = self.streams
                text = self.generate_once(prompt, max_tokens, view.text if stream else None)
                view.answered(text, stream)
                if not detach:
                    self.stop()
                    return
            if detach:
                name = self.detach()
                view.step("detach")
                view.detached(name)
                return
            view.serving()
            with self.foreground_record():
                self.serve_until_stopped(on_stopping=view.stopping)
            view.stopped()
        except BaseException:
            if self.detached_name is None:  # a detached run that failed before it was recorded leaves nothing
                self.stop()
            raise

    def generate_once(self, prompt: str, max_tokens: int, on_text: Callable[[str], None] | None = None) -> str:
        """One answer to ``prompt`` from the served text model, starting with the prompt for a decoder
        (streamed piece by piece to ``on_text`` when given)."""
        return generate_text(
            self.endpoint.grpc_url,
            self.endpoint.model,
            prompt,
            max_tokens=max_tokens,
            stream=on_text is not None,
            on_text=on_text,
            echo_prompt=True,
            repository=self.repository.path,
        )

    @contextlib.contextmanager
    def foreground_record(self) -> Iterator[None]:
        """While a foreground run serves, its OpenAI endpoint is recorded (``foreground-<pid>``) so that
        `ftx ps` shows it; the record goes when the run ends (or with the next `ftx ps` after a crash)."""
        if self.openai is None:
            yield
            return
        from ftx_triton.server.front_records import FOREGROUND_PREFIX

        path = self._record_front(self.openai, f"{FOREGROUND_PREFIX}{os.getpid()}")
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def _record_front(self, openai: OpenAIEndpoint, name: str) -> Path:
        """Record the OpenAI front under ``name`` (what `ftx ps` lists and `ftx stop` stops)."""
        from ftx_triton.server.front_records import write_record

        return write_record(
            self.home,
            {
                "name": name,
                "pid": openai.process.pid,
                "url": openai.url,
                "triton_pid": self.server.pid,
                "log": str(openai.log_path),
            },
        )

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
            watch_pid=self.server.pid,
            triton_grpc=self.endpoint.grpc_url,
            warm=self.warm_front,
        )

    def detach(self) -> str:
        """Leave the server (and the front) running after ftx exits; record the front; return the name."""
        server = self.server
        server.detach()
        name = str(server.name)
        if self.openai is not None:
            self._record_front(self.openai, name)
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
                interrupt.check()  # a Ctrl-C Python swallowed stops the foreground too
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


__all__ = ["Deployment", "ServeView", "openai_model_id"]
