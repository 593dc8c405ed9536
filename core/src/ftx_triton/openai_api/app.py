"""The aiohttp application: OpenAI's completions and chat completions over a Triton ensemble.

Requests are validated (OpenAI's error shape, HTTP 400), turned into generate-extension calls on
the ensemble (run in a worker thread: the Triton client is synchronous) and answered in OpenAI's
shapes, streamed as server-sent events (``data: {...}`` … ``data: [DONE]``) when ``stream`` is set.
Token counts (``usage``, ``finish_reason``) come from the repository's own tokenizer. Chat templates
render in a worker process with a time limit (:class:`~.chat.TemplateWorker`). A client that leaves
ends its request: the front cancels the handler (no further prompt is generated) and a stream's worker
stops at its next piece. Mistakes of the client are 4xx ``invalid_request_error``; faults of the server
or the model (a failed generation, a template that overruns its time) are 5xx ``server_error``; every
answer is JSON, aiohttp's own (no such route, another method) and an unforeseen fault's included.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import traceback
import uuid
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from ftx_triton.errors import FtxError
from ftx_triton.front.server import Refused, read_body
from ftx_triton.front.shield import lone_surrogate
from ftx_triton.openai_api.admission import overloaded_response
from ftx_triton.openai_api.chat import TemplateError, TemplateTimeout, TemplateWorker, chat_template, render
from ftx_triton.openai_api.metrics import FrontMetrics, Tracked
from ftx_triton.openai_api.token_generation import TokenGeneration
from ftx_triton.repository.io import TEXT_MODEL_NAME
from ftx_triton.repository.textproc import RequestError
from ftx_triton.server.text_client import HttpError, HttpTriton, TextInterface, pieces, sampling_values, text_interface
from ftx_triton.server.token_stream import (
    AsyncTokenClient,
    ModelRefused,
    Overloaded,
    StreamFault,
    TokenRoute,
    is_overload,
)

MAX_TOKENS_DEFAULT = 16
"""OpenAI's default for /v1/completions."""
MAX_PROMPTS = 64
"""Prompts one /v1/completions request may hold (each is one generation)."""
MAX_BODY_BYTES = 8 << 20
"""The largest request body (decoded) the endpoint reads."""


class ServerFault(Exception):
    """A fault of the server or the model, not of the request (HTTP 500, ``server_error``)."""


STREAM_HEADER = "X-Ftx-Stream"
"""On a ``stream: true`` answer: ``tokens`` (the model streams) or ``whole`` (it does not: one chunk)."""
ROUTE_HEADER = "X-Ftx-Route"
"""On a streamed answer: ``tokens`` (ids read from the model over gRPC, detokenized here) or ``ensemble``."""
NOT_STREAMING = (
    "this deployment answers in one piece: the model was not deployed with --streaming, so the "
    "whole text arrives as one chunk (ftx run MODEL --streaming streams token by token)"
)


class BadRequest(Exception):
    """A request OpenAI's API would refuse (HTTP 400, or ``status``; ``code`` as OpenAI names it)."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


UNREADABLE_BODY = (ValueError, UnicodeDecodeError, LookupError, RecursionError)
"""What reading a client's body as JSON raises on bad input: not JSON, bytes not in its charset, an
unknown charset, nesting deeper than the parser recurses."""


def _show(value: float) -> str:
    """A limit as people write it: ``1048576``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass
class Deployment:
    """What the endpoint serves: the Triton HTTP address, the ensemble and the repository's tokenizer."""

    triton: HttpTriton
    model_id: str
    ensemble: str
    tokenizer_dir: Path
    tokens: AsyncTokenClient | None = None
    """Triton's gRPC endpoint, for the token route (None: every request goes through the ensemble)."""
    route: TokenRoute | None = None
    """The token route of a streaming repository this process can read (:mod:`.token_generation`)."""
    metrics: FrontMetrics | None = None
    """Token-level Prometheus series (``/metrics``), when the endpoint keeps them."""
    _iface: TextInterface | None = None
    _codec: Any = None

    def generation(
        self, prompt: str, values: Mapping[str, Any], stop: list[str]
    ) -> Generation | TokenGeneration | Tracked:
        """The generation for one prompt: over the token route when there is one, else the ensemble; measured
        when the endpoint keeps metrics."""
        generation: Generation | TokenGeneration
        if self.tokens is not None and self.route is not None:
            generation = TokenGeneration(self.tokens, self.route, prompt, values, stop)
        else:
            generation = Generation(self, prompt, values, stop)
        if self.metrics is None:
            return generation
        return self.metrics.track(generation, self.count, lambda: self.count(prompt, prompt=True))

    def iface(self) -> TextInterface:
        if self._iface is None:
            self._iface = text_interface(self.triton, self.ensemble)
        return self._iface

    def count(self, text: str, *, prompt: bool = False) -> int:
        if self._codec is None:
            from ftx_triton.repository.textproc import load_codec

            self._codec = load_codec(self.tokenizer_dir)
        return len(self._codec.encode(text, prompt=prompt))


def _error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def _number(body: Mapping[str, Any], name: str, kind: type, low: float, high: float) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise BadRequest(f"{name} must be {'an integer' if kind is int else 'a number'}", name)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {_show(low)} and {_show(high)}", name)
    return value


def _request_values(body: Mapping[str, Any], default_max_tokens: int | None) -> tuple[dict[str, Any], list[str], bool]:
    """Sampling values, stop strings and stream flag of a completions-style body."""
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int):
        raise BadRequest("n must be an integer", "n")
    if n != 1:
        raise BadRequest("only n=1 is supported", "n")
    _refuse_unsupported(body)
    max_tokens = _number(body, "max_tokens", int, 1, 1 << 20)
    if max_tokens is None:
        max_tokens = _number(body, "max_completion_tokens", int, 1, 1 << 20) or default_max_tokens
    temperature = _number(body, "temperature", float, 0, 2)
    top_p = _number(body, "top_p", float, 0, 1)
    top_k = _number(body, "top_k", int, 0, 1 << 20)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise BadRequest("stop must be a string or a list of up to 4 non-empty strings", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", "stream")
    values = sampling_values(max_tokens or MAX_TOKENS_DEFAULT, temperature or None, top_k or None, top_p)
    return values, stop, stream


UNSUPPORTED = {
    "logprobs": "log probabilities are not returned by this endpoint",
    "top_logprobs": "log probabilities are not returned by this endpoint",
    "tools": "this endpoint does no tool calling",
    "functions": "this endpoint does no function calling",
}
"""Request fields whose features the endpoint lacks: refused (400 unsupported_parameter) when set, never ignored."""


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for name, why in UNSUPPORTED.items():
        if body.get(name) not in (None, False, [], {}):
            raise BadRequest(
                f"{name} is not supported: {why}; send the request without it", name, code="unsupported_parameter"
            )
    if body.get("tool_choice") not in (None, "none"):
        raise BadRequest(
            "tool_choice is not supported: this endpoint does no tool calling; send the request without it",
            "tool_choice",
            code="unsupported_parameter",
        )


def _cut(text: str, stop: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    ends = [text.find(s) for s in stop if s in text]
    return (text[: min(ends)], True) if ends else (text, False)


def _continuation(text: str, prompt: str, iface: TextInterface) -> str:
    return text[len(prompt) :] if iface.continues_prompt and text.startswith(prompt) else text


class Generation:
    """One generation for one prompt: the whole text, or its pieces as they arrive."""

    def __init__(self, deployment: Deployment, prompt: str, values: Mapping[str, Any], stop: list[str]) -> None:
        self.deployment, self.prompt, self.stop = deployment, prompt, stop
        self.values = {"prompt": prompt, **values}
        self.finish_reason = "length"

    def whole(self) -> str:
        iface = self.deployment.iface()
        if iface.decoupled:
            return "".join(self.stream())
        text = _continuation(self.deployment.triton.generate(iface, self.values), self.prompt, iface)
        text, stopped = _cut(text, self.stop)
        self.finish_reason = self._reason(text, stopped)
        return text

    def stream(self) -> Iterator[str]:
        """New text as it is generated (the prompt is not repeated)."""
        iface = self.deployment.iface()
        values = {**self.values, "stream": True} if iface.decoupled else self.values
        sent, seen, stopped = "", "", False
        for piece in pieces(self.deployment.triton.generate_stream(iface, values), iface, self.prompt):
            seen += piece  # a decoder's stream starts with the prompt (pieces() makes sure of it)
            text, stopped = _cut(_continuation(seen, self.prompt, iface), self.stop)
            if len(text) > len(sent):
                yield text[len(sent) :]
                sent = text
            if stopped:
                break
        self.finish_reason = self._reason(sent, stopped)

    def _reason(self, text: str, stopped: bool) -> str:
        if stopped:
            return "stop"
        return "length" if self.deployment.count(text) >= int(self.values["max_tokens"]) else "stop"

    def astream(self) -> AsyncGenerator[str, None]:
        """:meth:`stream` in a worker thread (the HTTP client is synchronous)."""
        return _in_thread_iter(self.stream())

    async def awhole(self) -> str:
        return await asyncio.to_thread(self.whole)


async def _in_thread_iter(gen: Iterator[str]) -> AsyncGenerator[str, None]:
    """Consume a blocking iterator in a worker thread, yielding its items to the event loop; the worker
    stops at its next item once this generator is closed (the client left)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    closed = threading.Event()

    def hand_over(kind: str, value: Any) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

    def run() -> None:
        try:
            for item in gen:
                if closed.is_set():
                    break
                hand_over("item", item)
            hand_over("done", None)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop, raised there
            hand_over("error", exc)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()  # ends the generator's HTTP stream from tritonserver

    threading.Thread(target=run, daemon=True).start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        closed.set()


class Handlers:
    """The routes, bound to one deployment."""

    def __init__(self, deployment: Deployment) -> None:
        self.d = deployment
        self.template, self.specials = chat_template(deployment.tokenizer_dir)
        self.renderer = TemplateWorker(self.template, self.specials) if self.template is not None else None

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.d.model_id, "object": "model", "created": 0, "owned_by": "ftx"}]}
        )

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            raw = await read_body(request)
        except Refused as refused:
            if refused.status == 400:
                raise BadRequest(f"the body is not readable JSON ({refused})") from None
            raise BadRequest(str(refused), status=refused.status) from None
        try:
            body = json.loads(raw.decode(request.charset or "utf-8"))
        except UNREADABLE_BODY as exc:
            raise BadRequest(f"the body is not readable JSON ({type(exc).__name__})") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        where = lone_surrogate(body)
        if where is not None:
            raise BadRequest(
                f"{where} holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), "
                "which is not text; send valid UTF-8 or complete surrogate pairs",
                where.split(".")[0].split("[")[0],
            )
        model = body.get("model")
        if model is not None and model != self.d.model_id:
            raise BadRequest(
                f"this endpoint serves {self.d.model_id!r}, not {model!r}", "model", status=404, code="model_not_found"
            )
        return body

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        prompts = body.get("prompt")
        prompts = [prompts] if isinstance(prompts, str) else prompts
        if not prompts or not isinstance(prompts, list) or not all(isinstance(p, str) and p for p in prompts):
            raise BadRequest("prompt must be a non-empty string or a list of them", "prompt")
        if len(prompts) > MAX_PROMPTS:
            raise BadRequest(
                f"prompt holds {len(prompts)} prompts; this endpoint takes at most {MAX_PROMPTS} per "
                "request (send several requests)",
                "prompt",
            )
        values, stop, stream = _request_values(body, MAX_TOKENS_DEFAULT)
        echo = body.get("echo", False)
        if not isinstance(echo, bool):
            raise BadRequest("echo must be true or false", "echo")
        ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if stream:
            if len(prompts) != 1:
                raise BadRequest("stream supports one prompt", "prompt")
            generation = self.d.generation(prompts[0], values, stop)

            def chunk(text: str, reason: str | None) -> dict[str, Any]:
                return {
                    "id": ident,
                    "object": "text_completion",
                    "created": created,
                    "model": self.d.model_id,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
                }

            return await self._sse(request, generation, chunk, first=prompts[0] if echo else None)
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for index, prompt in enumerate(prompts):
            generation = self.d.generation(prompt, values, stop)
            text = await generation.awhole()
            prompt_tokens += self.d.count(prompt, prompt=True)
            completion_tokens += self.d.count(text)
            choices.append(
                {
                    "index": index,
                    "text": (prompt + text) if echo else text,
                    "logprobs": None,
                    "finish_reason": generation.finish_reason,
                }
            )
        return web.json_response(
            {
                "id": ident,
                "object": "text_completion",
                "created": created,
                "model": self.d.model_id,
                "choices": choices,
                "usage": _usage(prompt_tokens, completion_tokens),
            }
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        messages = body.get("messages")
        if (
            not messages
            or not isinstance(messages, list)
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise BadRequest(
                "messages must be a non-empty list of {role, content} objects with text content", "messages"
            )
        try:
            prompt = (
                render(messages, None, self.specials) if self.renderer is None else await self.renderer.render(messages)
            )
        except TemplateError as exc:  # the template's own raise_exception, or a render error
            raise BadRequest(f"the model's chat template refused these messages: {exc}", "messages") from None
        except TemplateTimeout as exc:
            raise ServerFault(
                f"{exc}; the template is part of the model's repository (tokenizer_config.json)"
            ) from None
        values, stop, stream = _request_values(body, None)
        generation = self.d.generation(prompt, values, stop)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if stream:

            def chunk(text: str, reason: str | None) -> dict[str, Any]:
                delta = {"content": text} if text else {}
                return {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": self.d.model_id,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
                }

            return await self._sse(request, generation, chunk, role=True)
        text = await generation.awhole()
        return web.json_response(
            {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": self.d.model_id,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": generation.finish_reason,
                    }
                ],
                "usage": _usage(self.d.count(prompt, prompt=True), self.d.count(text)),
            }
        )

    async def _sse(
        self,
        request: web.Request,
        generation: Generation | TokenGeneration | Tracked,
        chunk: Any,
        *,
        first: str | None = None,
        role: bool = False,
    ) -> web.StreamResponse:
        await asyncio.to_thread(self.d.iface)  # fail before the 200 if the ensemble cannot be read
        # the first piece too: a request the model refuses, or a server that is gone, is an HTTP error
        # status (400 / 502 from the middleware), not a 200 whose stream holds the error
        stream = generation.astream()
        try:
            return await self._send_events(request, generation, chunk, stream, first=first, role=role)
        finally:
            await stream.aclose()  # the worker stops at its next piece when the client has left

    async def _send_events(
        self,
        request: web.Request,
        generation: Generation | TokenGeneration | Tracked,
        chunk: Any,
        stream: AsyncGenerator[str, None],
        *,
        first: str | None,
        role: bool,
    ) -> web.StreamResponse:
        try:
            opening: str | None = await anext(stream)
        except StopAsyncIteration:
            opening = None
        decoupled = self.d.iface().decoupled
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                STREAM_HEADER: "tokens" if decoupled else "whole",
                ROUTE_HEADER: "tokens" if self.d.route is not None and self.d.tokens is not None else "ensemble",
            }
        )
        await response.prepare(request)
        if not decoupled:  # honest about it: SSE comments reach a client that reads the raw stream
            await response.write(f": {NOT_STREAMING}\n\n".encode())

        async def send(data: Mapping[str, Any] | str) -> None:
            text = data if isinstance(data, str) else json.dumps(data)
            await response.write(f"data: {text}\n\n".encode())

        if role:
            head = chunk("", None)
            head["choices"][0]["delta"] = {"role": "assistant"}
            await send(head)
        if first:
            await send(chunk(first, None))
        try:
            try:
                if opening is not None:
                    await send(chunk(opening, None))
                async for piece in stream:
                    await send(chunk(piece, None))
                await send(chunk("", generation.finish_reason))
            except (HttpError, FtxError, RequestError) as exc:
                await send({"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}})
            await send("[DONE]")
            await response.write_eof()
        except ConnectionResetError:  # the client stopped reading; the stream ends here
            pass
        return response


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return _error(exc.status, str(exc), "invalid_request_error", exc.param, exc.code)
    except ServerFault as exc:
        return _error(500, str(exc), "server_error")
    except (RequestError, ModelRefused) as exc:  # the token route's preprocessing, or the model, refused the request
        return _error(400, f"the model refused the request: {exc}", "invalid_request_error")
    except Overloaded as exc:
        return overloaded_response(exc.message)
    except StreamFault as exc:
        return _error(
            500,
            f"the model failed on this request (a fault of the server, not of the request): {exc.message}",
            "server_error",
        )
    except HttpError as exc:
        if is_overload(exc.message):
            return overloaded_response(exc.message)
        if 400 <= exc.status < 500:
            return _error(400, f"the model refused the request: {exc.message}", "invalid_request_error")
        if exc.status == 500:
            return _error(
                500,
                f"the model failed on this request (a fault of the server, not of the request): {exc.message}",
                "server_error",
            )
        return _error(502, f"the Triton server failed: {exc.message}", "server_error")
    except FtxError as exc:
        return _error(502, f"the Triton server did not answer: {exc.message}", "server_error")
    except ConnectionResetError:  # the client left mid-request: nobody to answer, nothing worth a traceback
        return web.Response(status=400)
    except web.HTTPException as exc:  # aiohttp's own: no such route (404), another method (405)
        if exc.status < 400:
            raise
        return _error(exc.status, f"{request.method} {request.path[:200]}: {exc.reason}", "invalid_request_error")
    except Exception as exc:  # noqa: BLE001 - a fault nobody foresaw: in the log in full, JSON to the client
        traceback.print_exc()
        return _error(500, f"the endpoint failed: {type(exc).__name__}: {exc}"[:500], "server_error")


HEALTH_TIMEOUT_S = 3.0
"""How long ``/health`` waits for Triton (a stopped or wedged server answers 503 after that)."""


def health_handler(triton: str, ensemble: str) -> Any:
    """``/health``: 200 ``ok`` only when Triton is ready and the model can answer, else 503 with the reason
    (a load balancer then takes the deployment out of rotation, as it should)."""
    probe = HttpTriton(triton, timeout_s=HEALTH_TIMEOUT_S)

    async def health(_request: web.Request) -> web.Response:
        reason = await asyncio.to_thread(probe.unready, ensemble)
        if reason is None:
            return web.Response(text="ok")
        return web.json_response({"status": "unavailable", "reason": reason}, status=503)

    return health


def make_app(
    triton_http: str,
    model_id: str,
    tokenizer_dir: Path,
    ensemble: str = TEXT_MODEL_NAME,
    timeout_s: float = 600.0,
    triton_grpc: str | None = None,
) -> web.Application:
    """The application for one deployment (``triton_http`` = ``http://host:port`` of Triton; ``triton_grpc``
    = its ``host:port`` for gRPC, which a streaming repository's token route reads ids from)."""
    deployment = Deployment(HttpTriton(triton_http, timeout_s=timeout_s), model_id, ensemble, Path(tokenizer_dir))
    deployment.metrics = FrontMetrics()
    if triton_grpc:
        deployment.route = TokenRoute.open(Path(tokenizer_dir).parent.parent)  # the repository of preprocessing/1
        if deployment.route is not None:
            deployment.tokens = AsyncTokenClient(triton_grpc)
    handlers = Handlers(deployment)
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app.add_routes(
        [
            web.get("/v1/models", handlers.models),
            web.post("/v1/completions", handlers.completions),
            web.post("/v1/chat/completions", handlers.chat),
            web.get("/health", health_handler(triton_http, ensemble)),
            web.get("/metrics", deployment.metrics.handler),
        ]
    )

    async def stop_renderer(_app: web.Application) -> None:
        if handlers.renderer is not None:
            handlers.renderer.stop()
        if deployment.tokens is not None:
            await deployment.tokens.close()

    app.on_cleanup.append(stop_renderer)
    return app


__all__ = ["make_app"]
