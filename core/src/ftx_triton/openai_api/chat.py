"""Chat messages to one prompt: the model's own chat template (jinja2, sandboxed, in a worker process with
a time limit: :class:`TemplateWorker`), or a plain one."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

FALLBACK_NAME = "ftx plain"
"""The template used when the model has none: ``role: content`` lines, then ``assistant:``."""


def chat_template(tokenizer_dir: Path) -> tuple[str | None, dict[str, str]]:
    """The ``chat_template`` of ``tokenizer_config.json`` (None when absent) and its special tokens."""
    try:
        config = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None, {}
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    specials = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        if isinstance(value, Mapping):
            value = value.get("content")
        if isinstance(value, str):
            specials[name] = value
    return (template if isinstance(template, str) else None), specials


def _raise(message: str) -> None:
    raise ValueError(message)


def render(messages: Sequence[Mapping[str, Any]], template: str | None, specials: Mapping[str, str]) -> str:
    """The prompt for ``messages`` (ending where the assistant's answer starts)."""
    if template is None:
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join(lines) + "\nassistant:"
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=True, **specials)


RENDER_TIMEOUT_S = 5.0
"""How long one chat template may render before its worker process is killed."""
_WORKER_START_S = 60.0


class TemplateError(Exception):
    """The template refused the messages (its ``raise_exception``, or a render error)."""


class TemplateTimeout(Exception):
    """The template did not finish within the time limit (its worker was killed)."""


def _render_forever(connection: Connection, template: str, specials: Mapping[str, str]) -> None:
    """The worker: render each list of messages it receives, answer ``(ok, text or error)``."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: F401 - imported before "ready"

    connection.send((True, "ready"))
    while True:
        try:
            messages = connection.recv()
        except EOFError:
            return
        try:
            connection.send((True, render(messages, template, specials)))
        except Exception as exc:  # noqa: BLE001 - a template's own error goes back as the answer
            connection.send((False, f"{type(exc).__name__}: {exc}"[:2000]))


class TemplateWorker:
    """Renders a model's chat template in a process of its own, off the event loop and within a time limit.

    A template is code from the model's repository: a loop of a billion steps would block every client of
    the loop it ran on, and a thread cannot be stopped. So it runs in a child process, one render at a time;
    one that overruns ``timeout_s`` is killed with its process, and the next render starts a new one."""

    def __init__(self, template: str, specials: Mapping[str, str], timeout_s: float = RENDER_TIMEOUT_S) -> None:
        self.template, self.specials, self.timeout_s = template, dict(specials), timeout_s
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None
        self._lock = asyncio.Lock()

    def _start(self) -> Connection:
        if self._process is not None and self._process.is_alive() and self._connection is not None:
            return self._connection
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        self._process = context.Process(
            target=_render_forever, args=(theirs, self.template, self.specials), name="ftx-chat-template", daemon=True
        )
        self._process.start()
        theirs.close()
        if not ours.poll(_WORKER_START_S):
            self.stop()
            raise TemplateTimeout(f"the chat template worker did not start within {_WORKER_START_S:g} s")
        ours.recv()
        self._connection = ours
        return ours

    def stop(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._process = self._connection = None

    async def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The prompt; :class:`TemplateError` or :class:`TemplateTimeout` when the template fails."""
        async with self._lock:
            connection = await asyncio.to_thread(self._start)
            connection.send([dict(m) for m in messages])
            if not await asyncio.to_thread(connection.poll, self.timeout_s):
                self.stop()
                raise TemplateTimeout(f"the model's chat template did not finish within {self.timeout_s:g} s")
            try:
                ok, value = connection.recv()
            except EOFError:
                self.stop()
                raise TemplateTimeout("the model's chat template worker died while rendering") from None
        if not ok:
            raise TemplateError(value)
        return str(value)
