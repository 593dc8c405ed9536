"""An HTTP front for tritonserver: request limits before a request reaches the server.

tritonserver 2.51 (the nvidia-pytriton wheel) has no limit on HTTP bodies and parses JSON
recursively: a 4 MB body of nested brackets (``[[[[…]]]]``, about 50 000 deep) overflows the stack
of its HTTP thread and the whole server dies with SIGSEGV. The front listens where the user asked
for HTTP, refuses what the server cannot survive and passes the rest through unchanged (keep-alive,
streamed ``generate_stream`` responses included) to tritonserver's HTTP port on the loopback.

* bodies over ``max_body_bytes`` → 413;
* JSON (a whole JSON body, or the JSON header of a binary-data request) nested deeper than
  ``max_json_depth`` → 400. Only a body with more than ``_BRACKETS_CHECKED`` brackets is parsed to
  find out (counting is cheap; Triton's own JSON never nests more than a handful deep).

Written on the standard library (``http.server``/``http.client``) so that it adds no dependency
to the serving environment; it serves one thread per connection, enough for the python runtime,
whose model is the bottleneck. gRPC and metrics go to tritonserver directly.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Default body limit (tritonserver's later releases default --http-max-input-size to the same)."""
MAX_JSON_DEPTH = 64
_BRACKETS_CHECKED = 4096
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "content-length", "host"}
_BINARY_HEADER = "inference-header-content-length"
_CHUNK = 64 * 1024
_DRAINED_AT_MOST = 256 * 1024 * 1024
"""A refused body up to this size is read (and dropped) before the answer; beyond, the connection closes."""


class RequestRefused(Exception):
    """A request the front answers itself (status and message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_depth_ok(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON ``data`` nests at most ``max_depth`` deep (bodies with few brackets pass unparsed)."""
    if data.count(b"[") + data.count(b"{") <= _BRACKETS_CHECKED:
        return True
    try:
        value = json.loads(data)
    except RecursionError:
        return False
    except ValueError:
        return True  # not JSON: tritonserver answers that itself, without recursing deeply
    depth, level = 0, [(value, 1)]
    while level:
        item, d = level.pop()
        depth = max(depth, d)
        if depth > max_depth:
            return False
        if isinstance(item, dict):
            level.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            level.extend((v, d + 1) for v in item)
    return True


def check_request(headers: Any, body: bytes, max_json_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise RequestRefused for a body tritonserver must not see."""
    json_part = body
    header_length = headers.get(_BINARY_HEADER)
    if header_length is not None:
        try:
            json_part = body[: int(header_length)]
        except ValueError:
            raise RequestRefused(HTTPStatus.BAD_REQUEST, f"{_BINARY_HEADER} is not a number") from None
    if not json_depth_ok(json_part, max_json_depth):
        raise RequestRefused(HTTPStatus.BAD_REQUEST,
                             f"the request's JSON is nested deeper than {max_json_depth} levels")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as tritonclient expects
    server: FrontServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tritonserver logs requests; the front logs only what it refuses

    def _reply(self, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _read_body(self) -> bytes:
        limit = self.server.max_body_bytes
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked(limit)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise RequestRefused(HTTPStatus.BAD_REQUEST, "Content-Length is not a number") from None
        if length > limit:
            if length <= _DRAINED_AT_MOST:  # read and dropped, so the client gets to read the answer
                remaining = length
                while remaining > 0 and (chunk := self.rfile.read(min(_CHUNK, remaining))):
                    remaining -= len(chunk)
            else:
                self.close_connection = True
            raise RequestRefused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                 f"the request body has {length} bytes; this server accepts at most {limit}")
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self, limit: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            except ValueError:
                self.close_connection = True
                raise RequestRefused(HTTPStatus.BAD_REQUEST, "malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024).strip():
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > limit:
                self.close_connection = True
                raise RequestRefused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                     f"the request body exceeds {limit} bytes")
            parts.append(self.rfile.read(size))
            self.rfile.readline(16)

    def _forward(self) -> None:
        try:
            body = self._read_body()
            check_request(self.headers, body, self.server.max_json_depth)
        except RequestRefused as refused:
            self.server.note_refused(self, refused)
            self._reply(refused.status, str(refused))
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or self.command in ("POST", "PUT"):
            headers["Content-Length"] = str(len(body))
        for attempt in (1, 2):  # a kept-alive connection tritonserver has closed is opened again once
            try:
                upstream = self.server.upstream()
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                break
            except OSError as exc:
                self.server.drop_upstream()
                if attempt == 2:
                    self._reply(HTTPStatus.SERVICE_UNAVAILABLE, f"tritonserver is not reachable: {exc}")
                    return
        self._relay(response)

    def _relay(self, response: http.client.HTTPResponse) -> None:
        self.send_response_only(response.status, response.reason)
        streamed = response.getheader("Content-Length") is None
        for key, value in response.getheaders():
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        if streamed:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", response.getheader("Content-Length") or "0")
        self.end_headers()
        try:
            while chunk := (response.read1(_CHUNK) if streamed else response.read(_CHUNK)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if streamed else chunk)
                self.wfile.flush()
            if streamed:
                self.wfile.write(b"0\r\n\r\n")
        finally:
            if response.will_close:
                self.server.drop_upstream()

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward


class FrontServer(ThreadingHTTPServer):
    """The front: listens on (host, port), forwards to tritonserver at 127.0.0.1:upstream_port."""

    daemon_threads = True
    request_queue_size = 256
    """Connections waiting to be accepted: a burst of clients (socketserver's default is 5) must queue, not be
    turned away while the accepting thread starts handlers."""

    def __init__(self, host: str, port: int, upstream_port: int, *, max_body_bytes: int = MAX_BODY_BYTES,
                 max_json_depth: int = MAX_JSON_DEPTH, on_refused: Any = None) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.upstream_port = upstream_port
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.on_refused = on_refused
        self._local = threading.local()
        super().__init__((host, port), _Handler)

    def upstream(self) -> http.client.HTTPConnection:
        """This thread's keep-alive connection to tritonserver."""
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=3600)
            self._local.connection = connection
        return connection

    def drop_upstream(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def note_refused(self, handler: _Handler, refused: RequestRefused) -> None:
        if self.on_refused is not None:
            self.on_refused(f"{handler.command} {handler.path}: {refused.status} {refused}")
