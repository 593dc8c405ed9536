"""Chat messages to one prompt: the model's own chat template (jinja2, sandboxed), or a plain one."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
