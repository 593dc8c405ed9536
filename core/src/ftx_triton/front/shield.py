"""The application that guards tritonserver's HTTP port.

tritonserver 2.51 (the nvidia-pytriton wheel) parses JSON recursively: a body of nested brackets
(``[[[[…]]]]``, some 50 000 deep) overflows the stack of its HTTP thread and the whole server dies
with SIGSEGV. The shield listens where the user asked for HTTP (tritonserver's own HTTP port is on the
loopback, on a port only the supervisor knows) and, on the *decoded* body (after gzip/deflate, whatever
its charset or validity):

* refuses JSON nested deeper than ``max_json_depth`` (400): brackets are counted outside JSON strings
  on the bytes themselves, so a body that is not valid UTF-8 is checked like any other;
* refuses a JSON body that does not parse (400, with the parser's reason), which tritonserver would
  answer as its own fault (500);
* passes the rest through unchanged (keep-alive, streamed ``generate_stream`` answers included), the
  body decoded, to tritonserver. gRPC and metrics go to tritonserver directly.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from http import HTTPStatus

import aiohttp
import numpy as np
from aiohttp import web

from ftx_triton.front.server import Refused, read_body, refusal

MAX_JSON_DEPTH = 64
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
        "content-encoding",
    }
)
_BINARY_HEADER = "Inference-Header-Content-Length"
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN = np.frombuffer(b"[{", np.uint8)
_WORKER_BYTES = 256 * 1024
"""Bodies over this size are checked in a worker thread, off the event loop."""


def json_depth(data: bytes) -> int:
    """How deep the brackets of ``data`` nest, strings left out; unclosed brackets count (a parser
    recurses on them before it finds the body broken)."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return int(b"[" in data or b"{" in data)
    brackets = np.frombuffer(_STRING.sub(b"", data).translate(None, _NOT_BRACKETS), np.uint8)
    if brackets.size == 0:
        return 0
    steps = np.where(np.isin(brackets, _OPEN), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))


def check_json(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`Refused` for a JSON body tritonserver must not see."""
    if not data.strip():
        return
    if data.count(b"[") + data.count(b"{") > max_depth and json_depth(data) > max_depth:
        raise Refused(HTTPStatus.BAD_REQUEST, f"the request's JSON is nested deeper than {max_depth} levels")
    try:
        json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise Refused(HTTPStatus.BAD_REQUEST, f"the request body is not valid JSON (UTF-8): {exc}"[:300]) from None


def json_part(headers: Mapping[str, str], body: bytes) -> bytes:
    """The JSON of a request: the whole body, or the header of a binary-data request."""
    length = headers.get(_BINARY_HEADER)
    if length is None:
        return body
    try:
        size = int(length)
    except ValueError:
        size = -1
    if not 0 <= size <= len(body):
        raise Refused(
            HTTPStatus.BAD_REQUEST, f"{_BINARY_HEADER} must be a byte count within the body (0 to {len(body)})"
        )
    return body[:size]


class Shield:
    """Forwards checked requests to tritonserver at ``127.0.0.1:upstream_port``."""

    def __init__(
        self,
        upstream_port: int,
        *,
        max_json_depth: int = MAX_JSON_DEPTH,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.base = f"http://127.0.0.1:{upstream_port}"
        self.max_json_depth = max_json_depth
        self.on_refused = on_refused
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 62)  # the front's own limit applies (read_body)
        app.router.add_route("*", "/{path:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("User-Agent",),
        )

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_body(request)
            part = json_part(request.headers, body)
            if len(part) > _WORKER_BYTES:
                await asyncio.to_thread(check_json, part, self.max_json_depth)
            else:
                check_json(part, self.max_json_depth)
        except Refused as refused:
            if self.on_refused is not None:
                self.on_refused(f"{request.method} {request.path[:200]}: {refused.status} {refused}")
            return refusal(refused)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        assert self.session is not None
        try:
            upstream = await self.session.request(
                request.method,
                self.base + request.rel_url.raw_path_qs,
                data=body if body or request.method in ("POST", "PUT") else None,
                headers=headers,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError) as exc:
            return web.json_response(
                {"error": f"tritonserver is not reachable: {exc}"}, status=HTTPStatus.SERVICE_UNAVAILABLE
            )
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_BY_HOP or key.lower() == "content-encoding":
                    response.headers.add(key, value)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        return response


__all__ = ["MAX_JSON_DEPTH", "Shield", "check_json", "json_depth"]
