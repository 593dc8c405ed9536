"""A conversation with a deployment's OpenAI-compatible endpoint (``/v1/chat/completions``), which renders the
whole history with the model's own chat template; each answer joins the history.

The request is a few lines of the standard library's urllib (no proxy: the endpoint is local), which keeps
this module free of another HTTP client.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from ftx_triton.client.text_client import not_http
from ftx_triton.errors import ServeError

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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


__all__ = ["chat"]
