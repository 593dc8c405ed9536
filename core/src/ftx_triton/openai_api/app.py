"""The aiohttp application: OpenAI's completions and chat completions over Triton (and ``/v1/embeddings``,
:mod:`.embeddings`).

Requests are validated (OpenAI's error shape, HTTP 400), sent to the ``fastertransformer`` model as token ids
over gRPC where the repository is readable here (the token route, :mod:`.token_generation`: tokenized and
detokenized in this process, streaming or not), else as generate-extension calls on the ``text`` ensemble
(run in a worker thread: that client is synchronous), and answered in OpenAI's shapes, streamed as
server-sent events (``data: {...}`` … ``data: [DONE]``) when ``stream`` is set.
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
import os
import threading
import time
import traceback
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from ftx_triton.client.send_gate import send_gate
from ftx_triton.client.text_client import HttpError, HttpTriton, PieceJoiner, TextInterface, text_interface
from ftx_triton.client.token_stream import (
    AsyncTokenClient,
    ModelRefused,
    Overloaded,
    StreamFault,
    TokenRoute,
    is_overload,
)
from ftx_triton.errors import FtxError
from ftx_triton.front.server import Refused, read_body
from ftx_triton.front.shield import lone_surrogate
from ftx_triton.openai_api.admission import overloaded_response
from ftx_triton.openai_api.chat import TemplateError, TemplateTimeout, TemplateWorker, chat_template, render
from ftx_triton.openai_api.embeddings import (
    Embeddings,
    EncoderFault,
    parse_embedding_request,
    token_ids,
    vectors_payload,
)
from ftx_triton.openai_api.generation_record import GenerationRecord
from ftx_triton.openai_api.launch import PID_HEADER
from ftx_triton.openai_api.metrics import FrontMetrics, Tracked, measured, prompt_token_count
from ftx_triton.openai_api.params import BadRequest, Params, parse_params
from ftx_triton.openai_api.sse import SseAnswer
from ftx_triton.openai_api.token_generation import TokenGeneration, WholeGeneration
from ftx_triton.repository.io import TEXT_MODEL_NAME
from ftx_triton.repository.textproc import MAX_WORD_TOKENS, RequestError

T = TypeVar("T")
MAX_PROMPTS = 64
"""Generations one /v1/completions request may ask for (prompts x n, or prompts x best_of)."""
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


UNREADABLE_BODY = (ValueError, UnicodeDecodeError, LookupError, RecursionError)
"""What reading a client's body as JSON raises on bad input: not JSON, bytes not in its charset, an
unknown charset, nesting deeper than the parser recurses."""


_DETOKENIZE_WINDOW = 6
"""Tokens before a token that its text is decoded with (a byte-level or sentencepiece token's text
depends on its neighbours: a character split over tokens, a leading space)."""


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
    """The token route of a repository this process can read (:mod:`.token_generation`), streaming or not."""
    metrics: FrontMetrics | None = None
    """Token-level Prometheus series (``/metrics``), when the endpoint keeps them."""
    triton_grpc: str | None = None
    """Triton's gRPC ``host:port`` (the token route and the encoder model are read over it)."""
    _iface: TextInterface | None = None
    _codec: Any = None

    def routed(self, *, log_probs: bool = False) -> bool:
        """Whether a generation goes over the token route: there is one, and the model answers in one piece
        (ids and log probabilities) or no log probabilities are wanted (a stream's route reads ids only)."""
        if self.tokens is None or self.route is None:
            return False
        return not (log_probs and self.route.decoupled)

    def generation(
        self, prompt: str, values: Mapping[str, Any], stop: list[str], *, log_probs: bool = False
    ) -> Generation | TokenGeneration | WholeGeneration | Tracked:
        """The generation for one prompt: over the token route where :meth:`routed`, else the ensemble;
        measured when the endpoint keeps metrics."""
        generation: Generation | TokenGeneration | WholeGeneration
        if not self.routed(log_probs=log_probs):
            generation = Generation(self, prompt, values, stop)
        else:
            assert self.tokens is not None and self.route is not None
            if self.route.decoupled:
                generation = TokenGeneration(self.tokens, self.route, prompt, values, stop)
            else:
                generation = WholeGeneration(self.tokens, self.route, prompt, values, stop)
        if self.metrics is None:
            return generation
        return self.metrics.track(generation, self.count, lambda: self.count(prompt, prompt=True))

    def iface(self) -> TextInterface:
        if self._iface is None:
            self._iface = text_interface(self.triton, self.ensemble)
        return self._iface

    def codec(self) -> Any:
        if self._codec is None:
            from ftx_triton.repository.textproc import load_codec

            self._codec = load_codec(self.tokenizer_dir)
        return self._codec

    async def aiface(self) -> TextInterface:
        """:meth:`iface`, read in a worker thread the first time (over HTTP), then at once: a burst of requests
        is not spread by a thread hop each."""
        return self._iface if self._iface is not None else await asyncio.to_thread(self.iface)

    async def acodec(self) -> Any:
        """:meth:`codec`, loaded in a worker thread the first time, then at once."""
        return self._codec if self._codec is not None else await asyncio.to_thread(self.codec)

    def count(self, text: str, *, prompt: bool = False) -> int:
        return len(self.codec().encode(text, prompt=prompt))

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """The text each token adds (decoded beside the tokens before it, so pieces join as the text reads)."""
        from ftx_triton.repository.textproc import added_text

        codec, out = self.codec(), []
        for i in range(len(ids)):
            context = list(ids[max(0, i - _DETOKENIZE_WINDOW) : i])
            out.append(added_text(codec.decode(context), codec.decode([*context, ids[i]])))
        return out


def _error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def _cut(text: str, stop: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    ends = [text.find(s) for s in stop if s in text]
    return (text[: min(ends)], True) if ends else (text, False)


def _continuation(text: str, prompt: str, iface: TextInterface) -> str:
    return text[len(prompt) :] if iface.continues_prompt and text.startswith(prompt) else text


@dataclass
class Piece:
    """New text of a generation, with the tokens that made it and their log probabilities (when known)."""

    text: str
    token_ids: list[int]
    log_probs: list[float]
    shown: str = ""


class Generation(GenerationRecord):
    """One generation for one prompt over the ``text`` ensemble: the whole text, or its pieces as they arrive.

    Token ids and log probabilities come from the text model (``piece_tokens`` holds those of each piece
    yielded, in order); ``has_tokens`` is False for a model that gives none (a repository written before it
    did, or FasterTransformer streaming, whose answers repeat the whole sequence): then counts are the
    tokenizer's count of the text.
    """

    def __init__(self, deployment: Deployment, prompt: str, values: Mapping[str, Any], stop: list[str]) -> None:
        super().__init__(prompt, values, stop)
        self.deployment, self.prompt = deployment, prompt
        self.has_tokens = True

    def whole(self) -> str:
        for _piece in self.stream():
            pass
        return self.text

    def _keep(self, ids: Sequence[int] | None, probs: Sequence[float] | None) -> None:
        if ids is None:
            self.has_tokens = False
            return
        self.token_ids += ids
        self.log_probs += list(probs or [0.0] * len(ids))

    def stream(self) -> Iterator[str]:
        """New text as it is generated (the prompt is not repeated); "" when only tokens came."""
        iface = self.deployment.iface()
        values = {**self.values, "stream": True} if iface.decoupled else self.values
        self.has_tokens = iface.gives_tokens
        joiner = PieceJoiner(iface, self.prompt)
        seen, stopped = "", False
        for answer in self.deployment.triton.answer_stream(iface, values):
            seen += joiner.add(answer.text)  # a decoder's stream starts with the prompt (the joiner makes sure)
            before = len(self.token_ids)
            if self.has_tokens:
                self._keep(answer.token_ids, answer.log_probs)
            text, stopped = _cut(_continuation(seen, self.prompt, iface), self.stop)
            if len(text) > len(self.text) or len(self.token_ids) > before:
                self.piece_tokens.append((self.token_ids[before:], self.log_probs[before:]))
                piece, self.text = text[len(self.text) :], text
                yield piece
            if stopped:
                break
        self.finish_reason = self._reason(stopped)

    @property
    def tokens(self) -> int:
        """Tokens generated: the model's own ids where it gives them, else the tokenizer's count of the text."""
        return len(self.token_ids) if self.has_tokens else self.deployment.count(self.text)

    def _reason(self, stopped: bool) -> str:
        self.stopped = stopped
        if stopped:
            return "stop"
        return "length" if self.tokens >= int(self.values["max_tokens"]) else "stop"

    def astream(self) -> AsyncGenerator[str, None]:
        """:meth:`stream` in a worker thread (the HTTP client is synchronous)."""
        return _in_thread_iter(self.stream())

    async def awhole(self) -> str:
        return await asyncio.to_thread(self.whole)


async def _in_thread_iter(gen: Iterator[T]) -> AsyncGenerator[T, None]:
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
        # the repository of preprocessing/1, and Triton's gRPC address for its encoder model
        self.embedder = Embeddings(deployment.tokenizer_dir.parent.parent, deployment.triton_grpc)

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

    async def _params(self, body: Mapping[str, Any], kind: str, prompts: int) -> Params:
        """The request's settings, checked against what this deployment's model can give."""
        codec = await self.d.acodec()
        params = parse_params(body, kind, codec.vocab_size)
        if params.stop:  # stop strings of more tokens than a stop word may have are only cut in the text
            words = [s for s in params.stop if len(codec.encode(s, prompt=False)) <= MAX_WORD_TOKENS]
            params.values["stop"] = words or None
        if params.best_of * prompts > MAX_PROMPTS:
            raise BadRequest(
                f"{prompts} prompt(s) x {params.best_of} generations each is more than the {MAX_PROMPTS} one "
                "request may ask for (send several requests)",
                "best_of" if params.best_of > 1 else "n",
            )
        iface = await self.d.aiface()
        if (params.logprobs or params.best_of > params.n) and not iface.gives_tokens:
            raise BadRequest(
                "this deployment's text model does not answer token log probabilities"
                + (
                    " while streaming (FasterTransformer resends the whole sequence each step)"
                    if iface.decoupled
                    else " (its repository was written by an older ftx: run `ftx run` again to rebuild it)"
                ),
                "logprobs" if params.logprobs else "best_of",
                code="unsupported_parameter",
            )
        return params

    def _generations(self, prompt: str, params: Params) -> list[Any]:
        scored = params.logprobs or params.best_of > params.n
        return [
            self.d.generation(prompt, params.for_choice(i), params.stop, log_probs=scored)
            for i in range(params.best_of)
        ]

    def _best(self, generations: list[Any], params: Params) -> list[Any]:
        """The ``n`` answered: all of them, or with best_of the n of highest mean token log probability."""
        if params.best_of == params.n:
            return generations
        return sorted(generations, key=lambda g: measured(g).mean_log_prob(), reverse=True)[: params.n]

    def _logprobs(self, ids: Sequence[int], probs: Sequence[float], start: int, limit: int | None) -> dict[str, Any]:
        """OpenAI's completions ``logprobs`` for these tokens, the first at text offset ``start``; tokens
        that begin at or past ``limit`` characters (cut by a stop string) are left out."""
        tokens, offsets, pos = [], [], start
        for text in self.d.token_texts(ids):
            if limit is not None and pos - start >= limit:
                break
            tokens.append(text)
            offsets.append(pos)
            pos += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [float(p) for p in probs[: len(tokens)]],
            "top_logprobs": None,
            "text_offset": offsets,
        }

    @staticmethod
    def _chat_logprobs(logprobs: Mapping[str, Any]) -> dict[str, Any]:
        """Chat's ``logprobs`` shape from the completions one (no alternatives: FT computes none)."""
        content = [
            {"token": token, "logprob": value, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
            for token, value in zip(logprobs["tokens"], logprobs["token_logprobs"], strict=True)
        ]
        return {"content": content, "refusal": None}

    def _choice_logprobs(self, generation: Any, start: int) -> dict[str, Any]:
        g = measured(generation)
        return self._logprobs(g.token_ids, g.log_probs, start, len(g.text) if g.stopped else None)

    async def embeddings(self, request: web.Request) -> web.Response:
        """``/v1/embeddings``: mean-pooled encoder output per input (:mod:`.embeddings`)."""
        body = await self._body(request)
        wanted = parse_embedding_request(body)
        encoder = await asyncio.to_thread(self.embedder.encoder)
        codec = await self.d.acodec()
        ids = token_ids(wanted, lambda text: codec.encode(text, prompt=True), encoder.vocab_size)
        try:
            vectors = await asyncio.to_thread(encoder.embed, ids)
        except EncoderFault as exc:
            raise ServerFault(str(exc)) from None
        used = sum(len(i) for i in ids)
        return web.json_response(
            {
                "object": "list",
                "data": vectors_payload(vectors, wanted.encoding_format),
                "model": self.d.model_id,
                "usage": {"prompt_tokens": used, "total_tokens": used},
            }
        )

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
        params = await self._params(body, "completions", len(prompts))
        ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(index: int, text: str, logprobs: dict[str, Any] | None, reason: str | None) -> dict[str, Any]:
            return {
                "id": ident,
                "object": "text_completion",
                "created": created,
                "model": self.d.model_id,
                "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}],
            }

        if params.stream:
            if len(prompts) != 1:
                raise BadRequest("stream supports one prompt", "prompt")
            return await self._sse(request, prompts[0], params, chunk, echo=params.echo)
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for prompt in prompts:
            generations = self._generations(prompt, params)
            texts = [await g.awhole() for g in generations]
            prompt_tokens += prompt_token_count(generations, partial(self.d.count, prompt, prompt=True))
            completion_tokens += sum(self._tokens(g, t) for g, t in zip(generations, texts, strict=True))
            for g in self._best(generations, params):
                text = texts[generations.index(g)]
                choices.append(
                    {
                        "index": len(choices),
                        "text": (prompt + text) if params.echo else text,
                        "logprobs": self._choice_logprobs(g, len(prompt)) if params.logprobs else None,
                        "finish_reason": g.finish_reason,
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

    def _tokens(self, generation: Any, text: str) -> int:
        """Tokens generated: the model's own count where the route gives it, else the tokenizer's of the text."""
        return int(getattr(measured(generation), "tokens", 0) or 0) or (self.d.count(text) if text else 0)

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
        params = await self._params(body, "chat", 1)
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
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if params.stream:

            def chunk(index: int, text: str, logprobs: dict[str, Any] | None, reason: str | None) -> dict[str, Any]:
                delta = {"content": text} if text else {}
                choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
                if params.logprobs:
                    choice["logprobs"] = self._chat_logprobs(logprobs) if logprobs else None
                return {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": self.d.model_id,
                    "choices": [choice],
                }

            return await self._sse(request, prompt, params, chunk, role=True)
        generations = self._generations(prompt, params)
        texts = [await g.awhole() for g in generations]
        choices = []
        for index, g in enumerate(self._best(generations, params)):
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": texts[generations.index(g)]},
                "finish_reason": g.finish_reason,
            }
            if params.logprobs:
                choice["logprobs"] = self._chat_logprobs(self._choice_logprobs(g, 0))
            choices.append(choice)
        completion = sum(self._tokens(g, t) for g, t in zip(generations, texts, strict=True))
        return web.json_response(
            {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": self.d.model_id,
                "choices": choices,
                "usage": _usage(
                    prompt_token_count(generations, partial(self.d.count, prompt, prompt=True)), completion
                ),
            }
        )

    async def _events(self, prompt: str, params: Params) -> AsyncGenerator[tuple[int, Piece | None, Any], None]:
        """The pieces of the request's generations one after the other, ``(choice, piece, generation)``;
        an empty first piece opens a choice, a ``None`` piece ends it."""
        for index, generation in enumerate(self._generations(prompt, params)):
            yield index, Piece("", [], [], ""), generation
            base = measured(generation)
            stream = generation.astream()
            try:
                async for text in stream:
                    tokens = getattr(base, "piece_tokens", None)
                    ids, probs = tokens.popleft() if tokens else ([], [])
                    yield index, Piece(text, ids, probs, text), generation
            finally:
                await stream.aclose()
            yield index, None, generation

    async def _sse(
        self, request: web.Request, prompt: str, params: Params, chunk: Any, *, echo: bool = False, role: bool = False
    ) -> web.StreamResponse:
        await self.d.aiface()  # fail before the 200 if the ensemble cannot be read
        # the first piece too: a request the model refuses, or a server that is gone, is an HTTP error
        # status (400 / 502 from the middleware), not a 200 whose stream holds the error
        stream = self._events(prompt, params)
        try:
            return await self._send_events(request, prompt, params, chunk, stream, echo=echo, role=role)
        finally:
            await stream.aclose()  # the worker stops at its next piece when the client has left

    async def _send_events(
        self,
        request: web.Request,
        prompt: str,
        params: Params,
        chunk: Any,
        stream: AsyncIterator[tuple[int, Piece | None, Any]],
        *,
        echo: bool,
        role: bool,
    ) -> web.StreamResponse:
        opening = await anext(stream)  # the first choice opens: nothing generated yet
        second = await anext(stream)  # its first piece (or its end): a refusal is still an HTTP error here
        decoupled = self.d.iface().decoupled
        route = self.d.routed(log_probs=params.logprobs)
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            STREAM_HEADER: "tokens" if decoupled else "whole",
            ROUTE_HEADER: "tokens" if route else "ensemble",
        }
        # A stream's events go out as they come, its headers now. A whole answer's are all there at once: each
        # choice's go out together, and a one-choice answer (or the last choice) as one response with its end.
        pending = SseAnswer(request, headers, each=decoupled)
        if decoupled:
            await pending.open()
        else:  # honest about it: SSE comments reach a client that reads the raw stream
            pending.add(f": {NOT_STREAMING}\n\n")

        async def send(data: Mapping[str, Any] | str) -> None:
            await pending.send(data if isinstance(data, str) else json.dumps(data))

        texts: dict[int, str] = {}
        generations: dict[int, Any] = {}

        async def handle(index: int, piece: Piece | None, generation: Any) -> None:
            if piece is None:
                await send(chunk(index, "", None, generation.finish_reason))
                if index + 1 < params.best_of:  # a choice of a whole answer is complete: its client reads it now
                    await pending.flush()
                return
            if index not in generations:  # the choice opens
                generations[index], texts[index] = generation, ""
                if role:
                    head = chunk(index, "", None, None)
                    head["choices"][0]["delta"] = {"role": "assistant"}
                    await send(head)
                if echo:
                    await send(chunk(index, prompt, None, None))
                return
            logprobs = None
            if params.logprobs and piece.token_ids:
                logprobs = self._logprobs(piece.token_ids, piece.log_probs, len(prompt) + len(texts[index]), None)
            texts[index] += piece.text
            if piece.text or logprobs:
                await send(chunk(index, piece.text, logprobs, None))

        try:
            try:
                await handle(*opening)
                await handle(*second)
                async for event in stream:
                    await handle(*event)
                if params.include_usage:
                    completion = sum(self._tokens(g, texts[i]) for i, g in generations.items())
                    last = chunk(0, "", None, None)
                    last["choices"] = []
                    used = prompt_token_count(generations.values(), partial(self.d.count, prompt, prompt=True))
                    last["usage"] = _usage(used, completion)
                    await send(last)
            except (HttpError, FtxError, RequestError) as exc:
                await send({"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}})
            pending.add("data: [DONE]\n\n")
            return await pending.end()
        except ConnectionResetError:  # the client stopped reading; the stream ends here
            return await pending.open()


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

    mine = {PID_HEADER: str(os.getpid())}  # how the launcher knows this endpoint from another on the port

    async def health(_request: web.Request) -> web.Response:
        reason = await asyncio.to_thread(probe.unready, ensemble)
        if reason is None:
            return web.Response(text="ok", headers=mine)
        return web.json_response({"status": "unavailable", "reason": reason}, status=503, headers=mine)

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
    = its ``host:port`` for gRPC, over which the token route sends ids to the model and reads them back)."""
    deployment = Deployment(HttpTriton(triton_http, timeout_s=timeout_s), model_id, ensemble, Path(tokenizer_dir))
    deployment.metrics = FrontMetrics()
    deployment.triton_grpc = triton_grpc
    gate = send_gate()  # read first: a bad FTX_OPENAI_GATHER_US stops the start whatever the route
    if triton_grpc:  # the repository of preprocessing/1
        deployment.route = TokenRoute.open(Path(tokenizer_dir).parent.parent, streaming_only=False)
        if deployment.route is not None:
            deployment.tokens = AsyncTokenClient(triton_grpc, timeout_s=timeout_s, gate=gate)
    handlers = Handlers(deployment)
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app.add_routes(
        [
            web.get("/v1/models", handlers.models),
            web.post("/v1/completions", handlers.completions),
            web.post("/v1/chat/completions", handlers.chat),
            web.post("/v1/embeddings", handlers.embeddings),
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
