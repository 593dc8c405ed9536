"""What the OpenAI endpoint no longer does for every request (issue 38: its own CPU time, which a closed loop of many
clients pays once per client each round on its one event loop): encode the prompt a second and third time for
``usage`` and the metrics, count the tokenizer's vocabulary, write a whole answer's events one system call each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from ftx_triton.openai_api.metrics import FrontMetrics, prompt_token_count
from ftx_triton.openai_api.sse import SseAnswer
from ftx_triton.repository.textproc import HFCodec, load_codec


def _no_count() -> int:
    raise AssertionError("the prompt was encoded again")


class _Routed:
    """Stands in for a token-route generation (which needs a gRPC server): one piece, the prompt's ids counted."""

    finish_reason = "length"
    tokens = 3

    def __init__(self, prompt_tokens: int | None) -> None:
        self.prompt_tokens = prompt_tokens

    async def astream(self) -> AsyncGenerator[str, None]:
        yield "abc"


def test_usage_reads_the_routes_prompt_count_and_counts_only_without_one() -> None:
    metrics = FrontMetrics()
    tracked = metrics.track(_Routed(7), lambda _text: 3, _no_count)
    assert prompt_token_count([tracked, _Routed(9)], _no_count) == 7
    assert prompt_token_count([_Routed(None)], lambda: 11) == 11  # the ensemble's generations: the tokenizer counts


def test_metrics_count_the_routes_prompt_tokens_without_encoding_again() -> None:
    metrics = FrontMetrics()
    tracked = metrics.track(_Routed(7), lambda _text: 3, _no_count)
    assert asyncio.run(tracked.awhole()) == "abc"
    assert metrics.registry.get_sample_value("ftx_prompt_tokens_total") == 7
    assert metrics.registry.get_sample_value("ftx_output_tokens_total") == 3


class _CountingTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.counts = tokenizer, 0

    def get_vocab_size(self, with_added_tokens: bool) -> int:
        self.counts += 1
        return int(self.tokenizer.get_vocab_size(with_added_tokens=with_added_tokens))


def test_the_vocabulary_is_counted_once(built_demo: Path) -> None:
    real = load_codec(built_demo)
    assert isinstance(real, HFCodec)
    counting = _CountingTokenizer(real.tokenizer)
    codec = HFCodec(counting)
    assert [codec.vocab_size for _ in range(3)] == [real.vocab_size] * 3
    assert counting.counts == 1


async def _served(
    events: list[str], *, each: bool, flush_after: int | None = None
) -> tuple[dict[str, str], list[bytes]]:
    """An SseAnswer of ``events`` on a real aiohttp server: the answer's headers and the body as the client read it
    (one element per read of what had arrived)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        answer = SseAnswer(request, {"Content-Type": "text/event-stream", "X-Test": "1"}, each=each)
        if each:
            await answer.open()
        answer.add(": a comment\n\n")
        for i, event in enumerate(events):
            await answer.send(event)
            if i == flush_after:
                await answer.flush()
            await asyncio.sleep(0.05)
        answer.add("data: [DONE]\n\n")
        return await answer.end()

    app = web.Application()
    app.router.add_get("/", handler)
    async with TestServer(app) as server, ClientSession() as session, session.get(server.make_url("/")) as response:
        reads = [chunk async for chunk, _end in response.content.iter_chunks()]
        return dict(response.headers), [r for r in reads if r]


def test_a_whole_answer_is_one_response_and_a_stream_writes_each_event() -> None:
    body = b": a comment\n\ndata: one\n\ndata: two\n\ndata: [DONE]\n\n"
    headers, reads = asyncio.run(_served(["one", "two"], each=False))
    assert b"".join(reads) == body and headers["Content-Length"] == str(len(body)) and headers["X-Test"] == "1"
    assert "Transfer-Encoding" not in headers
    headers, reads = asyncio.run(_served(["one", "two"], each=True))  # the events 50 ms apart: read apart
    assert b"".join(reads) == body and headers["Transfer-Encoding"] == "chunked" and len(reads) >= 3
    headers, reads = asyncio.run(_served(["one", "two"], each=False, flush_after=0))  # a choice ends: it goes out
    assert b"".join(reads) == body and headers["Transfer-Encoding"] == "chunked"
    assert reads[0] == b": a comment\n\ndata: one\n\n"
