"""``ftx generate --chat``: a conversation with a running deployment, one user turn per line of stdin.

Turns go to the deployment's OpenAI-compatible endpoint (``/v1/chat/completions``), which renders the
whole history with the model's own chat template; each answer is printed on stdout and joins the history.
The request is a few lines of the standard library's urllib (no proxy: the endpoint is local), which keeps
this module free of another HTTP client.
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ftx_triton.errors import ServeError
from ftx_triton.server.text_client import not_http

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def find_openai(home: Path, name: str | None, url: str | None) -> str:
    """The ``…/v1`` address of the OpenAI endpoint to chat with: ``url``, or that of the running server named
    ``name`` (or the only one) as `ftx ps` lists it."""
    if url:
        return url.rstrip("/") if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"
    from ftx_triton.cli.processes import served_models

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


def _post(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise ServeError(
            f"the endpoint refused the turn ({exc.code}): {message}", hint="see its log (`ftx ps` shows the server)"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServeError(
            f"cannot reach {url}: {getattr(exc, 'reason', exc)}", hint="is the server still running? (`ftx ps`)"
        ) from None
    except http.client.HTTPException:
        raise not_http(url, "pass the OpenAI address `ftx run` printed with --url http://HOST:PORT/v1") from None
    if not isinstance(answer, dict):
        raise ServeError(f"{url} answered something that is no chat completion", hint="is it an ftx endpoint?")
    return answer


def chat(
    openai_url: str,
    turns: Iterable[str],
    write: Callable[[str], None],
    *,
    system: str | None = None,
    max_tokens: int,
    sampling: dict[str, Any],
    timeout_s: float,
) -> list[dict[str, str]]:
    """Send each non-empty turn with the history so far; write each answer; return the conversation."""
    messages = [{"role": "system", "content": system}] if system else []
    for turn in turns:
        if not turn.strip():
            continue
        messages.append({"role": "user", "content": turn.rstrip("\n")})
        answer = _post(
            f"{openai_url}/chat/completions", {"messages": messages, "max_tokens": max_tokens, **sampling}, timeout_s
        )
        try:
            content = str(answer["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            raise ServeError("the endpoint's answer holds no message", hint="is it an ftx endpoint?") from None
        messages.append({"role": "assistant", "content": content})
        write(content)
    return messages


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
