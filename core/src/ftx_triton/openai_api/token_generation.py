"""One generation through the token route: ids from the ``fastertransformer`` model's stream, text made here.

The same contract as :class:`~ftx_triton.openai_api.app.Generation` (``astream``, ``awhole``,
``finish_reason``), for a streaming deployment whose repository this process can read: the prompt is
tokenized and checked by the repository's own preprocessing code, the model streams ids over gRPC, and
:mod:`ftx_triton.client.token_stream` detokenizes them incrementally, dropping responses the client was too
slow to read (each holds the whole output so far). No Python model runs per token.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from ftx_triton.client.token_stream import AsyncTokenClient, TokenRoute, stream_texts


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    ends = [text.find(s) for s in stop if s in text]
    return (text[: min(ends)], True) if ends else (text, False)


class TokenGeneration:
    """One prompt's generation over the token route."""

    def __init__(
        self,
        client: AsyncTokenClient,
        route: TokenRoute,
        prompt: str,
        values: Mapping[str, Any],
        stop: list[str],
        on_first: Callable[[], None] | None = None,
    ) -> None:
        self.client, self.route, self.stop = client, route, stop
        self.values = {"prompt": prompt, **values}
        self.finish_reason = "length"
        self.on_first = on_first
        self.tokens = 0
        """Tokens generated (counted from the model's ids, not by re-tokenizing text)."""

    async def astream(self) -> AsyncGenerator[str, None]:
        """New text as it is generated (the prompt is not repeated), cut at the first stop string."""
        sent, seen, stopped = "", "", False
        counter = _Counter()
        pieces = stream_texts(self.client, self.route, self.values, on_first=self.on_first, on_ids=counter)
        try:
            async for piece in pieces:
                seen += piece
                text, stopped = cut_at_stop(seen, self.stop)
                if len(text) > len(sent):
                    yield text[len(sent) :]
                    sent = text
                if stopped:
                    break
        finally:
            await pieces.aclose()
        self.tokens = counter.count
        wanted = int(self.values.get("max_tokens") or 0)
        self.finish_reason = "stop" if stopped or counter.count < wanted else "length"

    async def awhole(self) -> str:
        return "".join([piece async for piece in self.astream()])


class _Counter:
    """Remembers how many ids the model generated (what ``finish_reason`` and metrics count)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, count: int) -> None:
        self.count = count


__all__ = ["TokenGeneration", "cut_at_stop"]
