"""``ftx generate --chat``: which endpoint to chat with, and the turns, one per line of stdin.

The conversation itself is :func:`ftx_triton.client.chat.chat` (the deployment's OpenAI-compatible endpoint).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from ftx_triton.errors import ServeError


def find_openai(home: Path, name: str | None, url: str | None) -> str:
    """The ``…/v1`` address of the OpenAI endpoint to chat with: ``url``, or that of the running server named
    ``name`` (or the only one) as `ftx ps` lists it."""
    if url:
        return url.rstrip("/") if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"
    from ftx_triton.server.processes import served_models

    servers = [s for s in served_models(home) if name is None or s.name == name]
    with_front = [s for s in servers if s.openai]
    if len(with_front) == 1:
        return with_front[0].openai
    if not with_front:
        raise ServeError(
            "no running ftx server with an OpenAI endpoint found" + (f" named {name!r}" if name else ""),
            hint="start one with `ftx run MODEL` (the endpoint is on unless --no-openai), or pass "
            "its address: --url http://HOST:PORT/v1",
        )
    names = ", ".join(f"{s.name} at {s.openai}" for s in with_front)
    raise ServeError(
        f"{len(with_front)} OpenAI endpoints are running ({names}); which one?",
        hint="name a detached server as MODEL, or pass --url http://HOST:PORT/v1",
    )


def prompt_lines() -> Iterable[str]:
    """Lines of stdin, with a ``> `` prompt on stderr when a person types them."""
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line
