"""One generation through the token route: ids to and from the ``fastertransformer`` model, text made here.

The same contract as :class:`~ftx_triton.openai_api.app.Generation` (``astream``, ``awhole``,
``finish_reason``), for a deployment whose repository this process can read: the prompt is tokenized and
checked by the repository's own preprocessing code and the ids go to the model over gRPC. A streaming model
streams ids back, which :mod:`ftx_triton.client.token_stream` detokenizes incrementally, dropping responses
the client was too slow to read (each holds the whole output so far): no Python model runs per token
(:class:`TokenGeneration`). A model that answers in one piece answers once, decoded by the repository's own
postprocessing code, with the ids and log probabilities the ``text`` ensemble would give
(:class:`WholeGeneration`): no Python model runs at all, so requests reach the model's batcher as their
clients send them.

Segmented generation (opt-in, ``FTX_SEGMENT_TOKENS=k``): the generation is asked for k tokens at a time,
each segment a new request of the prompt plus the text so far, so that a request arriving while a batch
generates waits for one segment instead of a whole generation (FasterTransformer batches per ``forward``).
Greedy output is the same where the text so far re-encodes to the ids it was decoded from (a tokenizer's
round trip); each segment re-reads the context, which costs the GPU a context pass per segment.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from ftx_triton.client.token_stream import AsyncTokenClient, TokenRoute, infer_whole, stream_texts
from ftx_triton.envvars import env_int
from ftx_triton.openai_api.generation_record import GenerationRecord

SEGMENT_ENV = "FTX_SEGMENT_TOKENS"


def segment_tokens() -> int:
    """Tokens per segment from ``FTX_SEGMENT_TOKENS`` (0, the default: one request per generation)."""
    return env_int(SEGMENT_ENV, 0, 0, 1 << 20)


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
        segment: int | None = None,
    ) -> None:
        self.client, self.route, self.stop = client, route, stop
        self.values = {"prompt": prompt, **values}
        self.finish_reason = "length"
        self.on_first = on_first
        self.segment = segment_tokens() if segment is None else segment
        """Tokens per request (0: the whole generation in one)."""
        self.tokens = 0
        """Tokens generated (counted from the model's ids, not by re-tokenizing text)."""
        self.prompt_tokens: int | None = None
        """The prompt's ids as the route tokenized them (the first segment's), once sent."""

    async def astream(self) -> AsyncGenerator[str, None]:
        """New text as it is generated (the prompt is not repeated), cut at the first stop string."""
        sent, seen, stopped = "", "", False
        wanted = int(self.values.get("max_tokens") or 0)
        generated, ended = 0, False
        while not (stopped or ended):
            ask = wanted - generated if not self.segment or not wanted else min(self.segment, wanted - generated)
            values = {**self.values, "prompt": self.values["prompt"] + seen, "max_tokens": ask or None}
            counter = _Counter()
            pieces = stream_texts(
                self.client, self.route, values, on_first=self._first, on_ids=counter, on_prompt=self._prompt
            )
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
            generated += counter.count
            # the end: all asked for, or a segment shorter than asked (the end id), or no segments at all
            ended = not self.segment or not wanted or generated >= wanted or counter.count < ask
        self.tokens = generated
        self.finish_reason = "stop" if stopped or generated < wanted else "length"

    def _prompt(self, count: int) -> None:
        if self.prompt_tokens is None:
            self.prompt_tokens = count

    def _first(self) -> None:
        if self.on_first is not None:
            self.on_first()
            self.on_first = None

    async def awhole(self) -> str:
        return "".join([piece async for piece in self.astream()])


class WholeGeneration(GenerationRecord):
    """One prompt's generation over the token route of a model that answers in one piece (not decoupled): the
    ensemble's :class:`~ftx_triton.openai_api.app.Generation` contract, log probabilities included (the model's
    ``output_log_probs``, read as the ``postprocessing`` model reads them)."""

    def __init__(
        self, client: AsyncTokenClient, route: TokenRoute, prompt: str, values: Mapping[str, Any], stop: list[str]
    ) -> None:
        super().__init__(prompt, values, stop)
        self.client, self.route = client, route

    @property
    def tokens(self) -> int:
        """Tokens generated: the model's own ids up to the first end id."""
        return len(self.token_ids)

    async def astream(self) -> AsyncGenerator[str, None]:
        """The whole text in one piece (the prompt is not repeated), cut at the first stop string."""
        answer = await infer_whole(self.client, self.route, self.values)
        self.token_ids, self.log_probs = answer.token_ids, answer.log_probs
        self.prompt_tokens = answer.prompt_tokens
        self.text, self.stopped = cut_at_stop(answer.text, self.stop)
        wanted = int(self.values.get("max_tokens") or 0)
        self.finish_reason = "stop" if self.stopped or self.tokens < wanted else "length"
        if self.text or self.token_ids:
            self.piece_tokens.append((self.token_ids, self.log_probs))
            yield self.text

    async def awhole(self) -> str:
        return "".join([piece async for piece in self.astream()])


class _Counter:
    """Remembers how many ids the model generated (what ``finish_reason`` and metrics count)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, count: int) -> None:
        self.count = count


__all__ = ["SEGMENT_ENV", "TokenGeneration", "WholeGeneration", "cut_at_stop", "segment_tokens"]
