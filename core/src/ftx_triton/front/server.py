"""One aiohttp server for every listener ftx opens to clients, with the limits a stranger cannot pass.

aiohttp parses HTTP (a malformed or negative chunk size is a 400 before any handler runs) and decodes
``gzip``/``deflate`` bodies in bounded steps. What it leaves to the application is added here:

* a **connection cap**: past ``max_connections`` open connections a new one gets ``503`` and is closed;
* a **header timeout**: a connection must deliver a request's headers within ``header_timeout_s`` of
  opening (or of its previous answer), else it is closed; **idle** keep-alive connections close after
  ``idle_timeout_s``;
* :func:`read_body`: the *decoded* body, at most ``max_body_bytes`` (413 beyond), read within
  ``body_timeout_s`` (408), with any ``Content-Encoding`` but ``gzip``, ``deflate`` and ``identity``
  refused (415);
* a ``Server`` header that names only ``ftx`` (aiohttp's own names its and Python's versions), on
  every answer: the application's, and those aiohttp writes itself for a request it cannot parse.

:class:`Front` binds its socket synchronously (so a taken port is known at once)
and serves either in the calling thread (:meth:`Front.run`) or in a thread of its own
(:meth:`Front.start`, as the server supervisor does).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from http import HTTPStatus
from typing import Any

from aiohttp import web

from ftx_triton.front.limits import Limits

ENCODINGS = frozenset({"gzip", "deflate", "identity", ""})
"""Content-Encodings a request body may have (aiohttp decodes gzip and deflate)."""


class Refused(Exception):
    """A request the front answers itself: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


LIMITS_KEY = web.AppKey("ftx_front_limits", Limits)
SERVER_NAME = "ftx"
"""The ``Server`` header of every answer."""


async def _name_server(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_NAME


def limits_of(request: web.Request) -> Limits:
    return request.app.get(LIMITS_KEY) or Limits()


async def read_body(request: web.Request) -> bytes:
    """The request's decoded body within the front's limits; :class:`Refused` for one outside them."""
    limits = limits_of(request)
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ENCODINGS:
        raise Refused(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Encoding {encoding[:40]!r} is not accepted; send the body as identity, gzip or deflate",
        )
    limit = limits.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > limit:
        raise Refused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the request body has {declared} bytes; this server accepts at most {limit}",
        )
    parts: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.content.iter_any():
                total += len(chunk)
                if total > limit:
                    raise Refused(
                        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"the request body (decoded) exceeds {limit} bytes; this server accepts at most {limit}",
                    )
                parts.append(chunk)
    except TimeoutError:
        raise Refused(
            HTTPStatus.REQUEST_TIMEOUT, f"the request body did not arrive within {limits.body_timeout_s:g} s"
        ) from None
    except web.RequestPayloadError as exc:  # a body its Content-Encoding cannot decode, a cut chunk
        raise Refused(HTTPStatus.BAD_REQUEST, f"the request body cannot be read: {exc}") from None
    return b"".join(parts)


def refusal(refused: Refused) -> web.Response:
    """Triton's error shape (``{"error": message}``); the connection closes after a refused body."""
    response = web.json_response({"error": str(refused)}, status=refused.status)
    response.force_close()
    return response


_BUSY_LINGER_S = 1.0
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nServer: ftx\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)


class _Connection(web.RequestHandler):
    """aiohttp's connection handler with a connection cap and a deadline for each request's headers."""

    def __init__(self, front: Front, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.front = front
        self.deadline: asyncio.TimerHandle | None = None
        self.counted = False
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.front.open_connections >= self.front.limits.max_connections:
            body = json.dumps(
                {
                    "error": f"this server is at its limit of {self.front.limits.max_connections} "
                    "connections; try again shortly"
                }
            ).encode()
            self.busy = True
            transport.write(_BUSY % (len(body), body))  # type: ignore[attr-defined]
            transport.write_eof()  # type: ignore[attr-defined]
            # closed a moment later: closing with the client's request unread would reset the connection
            # before the client reads the answer
            asyncio.get_running_loop().call_later(_BUSY_LINGER_S, transport.close)
            self.front.busy_refused += 1
            return
        self.front.open_connections += 1
        self.counted = True
        super().connection_made(transport)
        self.await_headers()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse or handle, naming only ``ftx``."""
        response = super().handle_error(request, status, exc, message)
        response.headers["Server"] = SERVER_NAME
        return response

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # a refused connection's request is read and dropped
            super().data_received(data)

    def eof_received(self) -> None:
        if not self.busy:
            super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.headers_arrived()
        if not self.counted:
            return
        self.counted = False
        self.front.open_connections -= 1
        super().connection_lost(exc)

    def await_headers(self) -> None:
        """Start the clock for the next request's headers."""
        self.headers_arrived()
        self.deadline = asyncio.get_running_loop().call_later(self.front.limits.header_timeout_s, self._too_slow)

    def headers_arrived(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _too_slow(self) -> None:
        self.deadline = None
        self.front.slow_closed += 1
        self.force_close()


@web.middleware
async def _header_clock(request: web.Request, handler: Any) -> web.StreamResponse:
    """Stop the header deadline while a request is handled; start it again for the next one."""
    connection = request.protocol
    if isinstance(connection, _Connection):
        connection.headers_arrived()
    try:
        return await handler(request)
    finally:
        if isinstance(connection, _Connection) and connection.transport is not None:
            connection.await_headers()


class Front:
    """One listener serving one aiohttp application within :class:`Limits`."""

    def __init__(self, app: web.Application, host: str, port: int, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        app[LIMITS_KEY] = self.limits
        app.middlewares.insert(0, _header_clock)
        app.on_response_prepare.append(_name_server)
        self.app = app
        self.host = host
        self.open_connections = 0
        self.busy_refused = 0
        self.slow_closed = 0
        self.sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=256
        )
        self.port = self.sock.getsockname()[1]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def serve(self) -> None:
        """Serve until :meth:`stop`."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        runner = web.AppRunner(self.app, handle_signals=False, access_log=None, handler_cancellation=True)
        await runner.setup()
        manager = runner.server
        assert manager is not None

        def connection() -> _Connection:
            return _Connection(
                self,
                manager,
                loop=self._loop,
                keepalive_timeout=self.limits.idle_timeout_s,
                access_log=None,
                lingering_time=5.0,
            )

        server = await self._loop.create_server(connection, sock=self.sock)
        try:
            await self._stopped.wait()
        finally:
            server.close()
            await runner.cleanup()

    def run(self) -> None:
        """Serve in this thread until SIGTERM/SIGINT."""
        import signal

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
            await self.serve()

        asyncio.run(main())

    def start(self) -> None:
        """Serve in a daemon thread of its own."""
        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            ready.set()
            await self.serve()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="ftx-front", daemon=True)
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        """End :meth:`serve` (from any thread)."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None:
            loop.call_soon_threadsafe(stopped.set)
        elif loop is not None:  # started, not yet serving
            loop.call_soon_threadsafe(self.stop)
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(10)
