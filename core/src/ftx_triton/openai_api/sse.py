"""Server-sent events of one streamed answer, written as they come or gathered into fewer writes.

A model that streams gives its pieces over time: each event goes out as it comes (an HTTP/1.1 chunk each). A
model that answers in one piece gives the whole answer at once: its events (a comment, the text, the end of the
choice, ``[DONE]``) are joined and sent as one response, headers and body in one write, where they took a write
each (a system call and a chunk). The OpenAI endpoint pays each write once per request and event on its one event
loop, which a closed loop of many clients pays that many times a round (docs/benchmarks.md, issue 38).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web


class SseAnswer:
    """The events of one answer: written each as it comes (``each``) or gathered until :meth:`flush`, and the
    answer's end (:meth:`end`)."""

    def __init__(self, request: web.Request, headers: Mapping[str, str], *, each: bool) -> None:
        self.request, self.headers, self.each = request, dict(headers), each
        self.parts: list[str] = []
        self.response: web.StreamResponse | None = None

    def add(self, text: str) -> None:
        """Text as it goes on the wire (an SSE comment, ``data: [DONE]``)."""
        self.parts.append(text)

    async def open(self) -> web.StreamResponse:
        """The streamed response, its headers sent (the first time)."""
        if self.response is None:
            self.response = web.StreamResponse(headers=self.headers)
            await self.response.prepare(self.request)
        return self.response

    async def send(self, data: str) -> None:
        """One event, ``data: ...``: written now with ``each``, else gathered."""
        self.parts.append(f"data: {data}\n\n")
        if self.each:
            await self.flush()

    async def flush(self) -> None:
        """What was gathered, written now."""
        if self.parts:
            data, self.parts = "".join(self.parts).encode(), []
            await (await self.open()).write(data)

    async def end(self) -> web.StreamResponse:
        """The response with what is left and its end: streamed on, or, where nothing was written yet, one
        response of the whole body (sent by aiohttp with its headers, in one write)."""
        data, self.parts = "".join(self.parts).encode(), []
        if self.response is None:
            self.response = web.Response(body=data, headers=self.headers)
            return self.response
        await self.response.write_eof(data)
        return self.response


__all__ = ["SseAnswer"]
