"""The application that guards tritonserver's HTTP port.

tritonserver 2.51 (the nvidia-pytriton wheel) parses JSON recursively: a body of nested brackets
(``[[[[…]]]]``, some 50 000 deep) overflows the stack of its HTTP thread and the whole server dies
with SIGSEGV. The shield listens where the user asked for HTTP (tritonserver's own HTTP port is on the
loopback, on a port only the supervisor knows) and, on the *decoded* body (after gzip/deflate, whatever
its charset or validity):

* refuses JSON nested deeper than ``max_json_depth`` (400): brackets are counted outside JSON strings
  on the bytes themselves, so a body that is not valid UTF-8 is checked like any other;
* refuses an object of more than ``max_json_members`` members, or a body of more than
  ``max_json_objects`` objects (400): tritonserver looks members up one by one, so a request's time
  grows with the square of its members (50 000 keys in ``parameters``: 35 s of one core);
* refuses a JSON body that does not parse (400, with the parser's reason), or that Python's parser
  takes and tritonserver's does not (``NaN``/``Infinity``, numbers past a double, a lone UTF-16
  surrogate escape, a body in UTF-16/32): tritonserver would answer these as its own fault (500);
* refuses the administrative APIs that change the server (shared-memory registration, logging and
  trace settings, model load/unload) to clients that are not on this machine (403): with ``--host``
  wider than loopback they would let anyone register a ``/dev/shm`` region of this host as a tensor
  (reading or overwriting it) or turn on verbose logging until the disk is full;
* forwards only paths without dot segments or encoded separators, byte for byte, and checks them in one
  decoded form (:mod:`.paths`): no spelling of an administrative path passes the check;
* passes the rest through unchanged (keep-alive, streamed ``generate_stream`` answers included), the
  body decoded and the client's own ``Accept-Encoding``, to tritonserver; answers that call a client's
  mistake tritonserver's own fault (or a 200) get the status they deserve (:mod:`.answers`). gRPC goes
  through its own front (:mod:`.grpc_front`), metrics to tritonserver directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from ftx_triton.front import SERVER_PID_HEADER
from ftx_triton.front.addresses import is_loopback
from ftx_triton.front.answers import MAX_READ_BYTES, reclassified, worth_reading
from ftx_triton.front.model_gate import ModelGate, gated_model
from ftx_triton.front.paths import checked_path, forwarded_path
from ftx_triton.front.server import Refused, read_body, refusal

MAX_JSON_DEPTH = 64
MAX_JSON_MEMBERS = 256
"""Members one JSON object of a request may have (a Triton request has tens)."""
MAX_JSON_OBJECTS = 4096
"""JSON objects one request may hold (its inputs, outputs and their parameters)."""
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
_ADMIN = re.compile(
    r"/v2/(?:(?:system|cuda)sharedmemory(?:/.*)?|logging|trace/setting|models/[^/]+(?:/versions/[^/]+)?/trace/setting"
    r"|repository/models/[^/]+/(?:load|unload))/?",
    re.IGNORECASE,
)
"""Paths of tritonserver's HTTP API that change the server; GET of logging/trace settings only reads."""
_WORKER_BYTES = 256 * 1024
"""Bodies over this size are checked in a worker thread, off the event loop."""


def json_depth(data: bytes) -> int:
    """How deep the brackets of ``data`` nest, strings left out; unclosed brackets count (a parser
    recurses on them before it finds the body broken)."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return int(b"[" in data or b"{" in data)
    import numpy as np  # at the first body that nests: the supervisor's start (models loading) does without it

    brackets = np.frombuffer(_STRING.sub(b"", data).translate(None, _NOT_BRACKETS), np.uint8)
    if brackets.size == 0:
        return 0
    steps = np.where(np.isin(brackets, np.frombuffer(b"[{", np.uint8)), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))


class _Strict:
    """The hooks of one strict parse: counts objects and members, refuses what tritonserver's parser does."""

    def __init__(self, max_members: int, max_objects: int) -> None:
        self.max_members, self.max_objects, self.objects = max_members, max_objects, 0

    def pairs(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.objects += 1
        if len(pairs) > self.max_members:
            raise Refused(
                HTTPStatus.BAD_REQUEST,
                f"a JSON object of the request has {len(pairs)} members; at most {self.max_members}",
            )
        if self.objects > self.max_objects:
            raise Refused(HTTPStatus.BAD_REQUEST, f"the request holds more than {self.max_objects} JSON objects")
        return dict(pairs)

    @staticmethod
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    @staticmethod
    def number(text: str) -> Any:
        if math.isinf(float(text)):
            raise ValueError(f"the number {text[:40]} is too large for a double")
        return float(text) if any(c in text for c in ".eE") else int(text)


def lone_surrogate(value: Any, path: str = "") -> str | None:
    """The path of the first string in ``value`` (keys included) holding a lone UTF-16 surrogate
    (``"\\ud800"``), if any."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where or "body"
        elif isinstance(item, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in item.items())
            stack.extend((k, where) for k in item)
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


def check_json(
    data: bytes,
    max_depth: int = MAX_JSON_DEPTH,
    max_members: int = MAX_JSON_MEMBERS,
    max_objects: int = MAX_JSON_OBJECTS,
) -> None:
    """Raise :class:`Refused` for a JSON body tritonserver must not see."""
    if not data.strip():
        return
    if data.count(b"[") + data.count(b"{") > max_depth and json_depth(data) > max_depth:
        raise Refused(HTTPStatus.BAD_REQUEST, f"the request's JSON is nested deeper than {max_depth} levels")
    strict = _Strict(max_members, max_objects)
    try:
        value = json.loads(
            data.decode("utf-8-sig"),
            object_pairs_hook=strict.pairs,
            parse_constant=strict.constant,
            parse_float=strict.number,
            parse_int=strict.number,
        )
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise Refused(HTTPStatus.BAD_REQUEST, f"the request body is not valid JSON (UTF-8): {exc}"[:300]) from None
    if (b"\\ud" in data or b"\\uD" in data) and (where := lone_surrogate(value)) is not None:
        raise Refused(
            HTTPStatus.BAD_REQUEST,
            f"{where[:100]} holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), which is "
            "not text; send valid UTF-8 or complete surrogate pairs",
        )


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
        trusted_peer: Callable[[str | None], bool] = is_loopback,
        gate: ModelGate | None = None,
        gated_models: Iterable[str] = (),
    ) -> None:
        self.base = f"http://127.0.0.1:{upstream_port}"
        self.gate = gate
        """Holds requests answered in one piece by ``gated_models`` while the model is busy (:mod:`.model_gate`)."""
        self.gated_models = frozenset(gated_models)
        self.max_json_depth = max_json_depth
        self.trusted_peer = trusted_peer
        self.on_refused = on_refused
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 62)  # the front's own limit applies (read_body)
        app.router.add_route("*", "/{path:.*}", self.forward)
        app.on_response_prepare.append(self._sign)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            # aiohttp would ask for gzip on every request: the client's own Accept-Encoding (or none) goes instead
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    @staticmethod
    async def _sign(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SERVER_PID_HEADER] = str(os.getpid())

    def check_admin(self, request: web.Request, path: str) -> None:
        """Refuse an administrative request from a client on another machine (``path``: the forwarded one)."""
        seen = checked_path(path)
        if request.method in ("GET", "HEAD") and "sharedmemory" not in seen.lower():
            return
        if _ADMIN.fullmatch(seen) and not self.trusted_peer(request.remote):
            raise Refused(
                HTTPStatus.FORBIDDEN, f"{seen[:120]} changes the server and is served to clients on this machine only"
            )

    async def _better_answer(
        self, request: web.Request, path: str, upstream: aiohttp.ClientResponse
    ) -> tuple[bytes, web.Response | None]:
        """What was read of an answer worth classifying again (:mod:`.answers`), and the answer it deserves
        instead (None: pass it on as it is)."""
        seen = checked_path(path)
        if not (
            worth_reading(request.method, seen, upstream.status)
            and upstream.content_type == "application/json"
            and "Content-Encoding" not in upstream.headers
        ):
            return b"", None
        head = b""
        while len(head) <= MAX_READ_BYTES and (chunk := await upstream.content.read(MAX_READ_BYTES + 1)):
            head += chunk
        better = reclassified(seen, upstream.status, head) if upstream.content.at_eof() else None
        if better is None:
            return head, None
        status, message = better
        if self.on_refused is not None:
            self.on_refused(f"{request.method} {request.path[:200]}: {upstream.status} answered {status}")
        return head, web.json_response({"error": message}, status=status)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        try:
            path = forwarded_path(request.rel_url.raw_path)
            self.check_admin(request, path)
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
        gate = self.gate if request.method == "POST" and gated_model(checked_path(path), self.gated_models) else None
        assert self.session is not None
        try:
            # a gated request is in flight until tritonserver's answer (sent whole, once the model's batch ended)
            # arrives, however fast the client reads it
            async with gate.passage() if gate is not None else contextlib.nullcontext():
                upstream = await self.session.request(
                    request.method,
                    URL(
                        self.base + path + (f"?{query}" if (query := request.rel_url.raw_query_string) else ""),
                        encoded=True,
                    ),
                    data=body if body or request.method in ("POST", "PUT") else None,
                    headers=headers,
                    allow_redirects=False,
                )
        except (aiohttp.ClientError, OSError) as exc:
            return web.json_response(
                {"error": f"tritonserver is not reachable: {exc}"}, status=HTTPStatus.SERVICE_UNAVAILABLE
            )
        async with upstream:
            head, better = await self._better_answer(request, path, upstream)
            if better is not None:
                return better
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_BY_HOP or key.lower() == "content-encoding":
                    response.headers.add(key, value)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            if head:
                await response.write(head)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        return response


__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_MEMBERS",
    "MAX_JSON_OBJECTS",
    "Shield",
    "check_json",
    "json_depth",
    "lone_surrogate",
]
