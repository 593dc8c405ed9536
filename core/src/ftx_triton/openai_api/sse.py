"""Server-sent events of one streamed answer, written as they come or gathered into fewer writes.

A model that streams gives its pieces over time: each event goes out as it comes. A model that answers in one
piece gives the whole answer at once: its events (a comment, the text, the end of the choice, ``[DONE]``) are
joined and written together. Each write is a system call and a chunk of HTTP/1.1's chunked encoding, which the
OpenAI endpoint pays once per request and event on its one event loop (docs/benchmarks.md, issue 38).
"""

from __future__ import annotations

from aiohttp import web


class SseBuffer:
    """The server-sent events of one answer, written each as it comes (``each``) or gathered and written together
    (fewer writes, each a system call and a chunk of HTTP/1.1's chunked encoding)."""

    def __init__(self, response: web.StreamResponse, *, each: bool) -> None:
        self.response, self.each = response, each
        self.parts: list[str] = []

    def add(self, text: str) -> None:
        self.parts.append(text)

    async def send(self, data: str) -> None:
        """One event, ``data: ...``."""
        self.parts.append(f"data: {data}\n\n")
        if self.each:
            await self.flush()

    async def flush(self) -> None:
        if self.parts:
            data, self.parts = "".join(self.parts).encode(), []
            await self.response.write(data)

    async def end(self) -> None:
        """What is left, and the answer's end, in one write."""
        data, self.parts = "".join(self.parts).encode(), []
        await self.response.write_eof(data)


__all__ = ["SseBuffer"]
