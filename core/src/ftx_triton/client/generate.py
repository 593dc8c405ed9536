"""One text generation on a running server: a :class:`TextRequest`, sent through one of three transports.

- Triton's HTTP generate extension (``http://host:port``, as ``ftx run`` prints it),
- Triton's gRPC (``host:port`` or ``grpc://host:port``),
- a streaming repository's token route (ids from the fastertransformer model over gRPC, text made here:
  :mod:`~ftx_triton.client.token_stream`), when the repository is on this machine.

The HTTP and gRPC transports share one flow (:func:`generate`): find the text interface, refuse beam search on a
streaming deployment, read a decoupled model as a stream, join the pieces.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ftx_triton.client.text_client import (
    TOKEN_IDS,
    TOKEN_LOG_PROBS,
    Answer,
    HttpError,
    HttpTriton,
    PieceJoiner,
    TextInterface,
    first_text,
    sampling_values,
    text_interface,
)
from ftx_triton.errors import ServeError
from ftx_triton.repository.io import TEXT_MODEL_NAME

DEFAULT_TOKENS = 16


@dataclass
class TextRequest:
    """One generation: where, which model, what, and how the text comes back."""

    url: str
    """Triton's HTTP address (``http://…``) or its gRPC address (``host:port``, ``grpc://host:port``)."""
    model: str
    prompt: str
    values: dict[str, Any] = field(default_factory=dict)
    """The text interface's roles beyond the prompt (``max_tokens``, sampling, ``seed``, ``beam_width`` …)."""
    stream: bool = False
    on_text: Callable[[str], None] | None = None
    """With ``stream``: each new piece of text (for decoder models the prompt first)."""
    echo_prompt: bool = False
    """A decoder model's text starts with the prompt it continues (an encoder-decoder's never does)."""
    timeout_s: float = 600.0
    on_note: Callable[[str], None] | None = None
    """Told that ``stream`` against a model deployed without ``--streaming`` gets the text whole."""
    repository: Path | None = None
    """The served repository, when on this machine: a streaming one is read over its token route."""

    @property
    def over_http(self) -> bool:
        return self.url.startswith(("http://", "https://"))


class Transport(Protocol):
    """How a :class:`TextRequest` reaches Triton: the text interface, one answer, a stream of answers."""

    def interface(self, model: str) -> TextInterface: ...

    def answer(self, iface: TextInterface, values: dict[str, Any], timeout_s: float) -> Answer: ...

    def answers(self, iface: TextInterface, values: dict[str, Any], timeout_s: float) -> Iterator[Answer]: ...

    def close(self) -> None: ...


def _refused(text: str, where: str, model: str, *, missing: bool) -> ServeError:
    if missing:
        return ServeError(
            f"the server at {where} has no model {model!r}: {text}", hint=f"the text model is {TEXT_MODEL_NAME!r}"
        )
    return ServeError(f"the server refused the request: {text}")


class HttpTransport:
    """Triton's generate extension."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.server = HttpTriton(url, timeout_s=timeout_s)
        self.model = ""

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except HttpError as exc:
            missing = exc.status == 404 or "unknown model" in exc.message.lower()
            raise _refused(exc.message, self.server.base, self.model, missing=missing) from None

    def interface(self, model: str) -> TextInterface:
        self.model = model
        with self._mapped():
            return text_interface(self.server, model)

    def answer(self, iface: TextInterface, values: dict[str, Any], timeout_s: float) -> Answer:
        with self._mapped():
            return self.server.answer(iface, values)

    def answers(self, iface: TextInterface, values: dict[str, Any], timeout_s: float) -> Iterator[Answer]:
        with self._mapped():
            yield from self.server.answer_stream(iface, values)

    def close(self) -> None:
        pass


def grpc_error(exc: Exception, url: str, model: str) -> ServeError:
    """A tritonclient gRPC error as a ServeError that says what to do."""
    text = str(exc).strip() or type(exc).__name__
    if "failed to connect" in text.lower() or "unavailable" in text.lower() or "connection" in text.lower():
        return ServeError(
            f"cannot reach a Triton gRPC endpoint at {url}: {text}",
            hint="start a server (`ftx run MODEL --detach`), check `ftx ps`, and pass the gRPC "
            "address with --url HOST:PORT",
        )
    return _refused(text, url, model, missing="unknown model" in text.lower() or "not found" in text.lower())


class GrpcTransport:
    """Triton's gRPC interface (tritonclient)."""

    def __init__(self, url: str) -> None:
        import tritonclient.grpc as grpcclient

        self.grpc = grpcclient
        self.target = url.removeprefix("grpc://")
        self.client = grpcclient.InferenceServerClient(self.target)

    def interface(self, model: str) -> TextInterface:
        from tritonclient.utils import InferenceServerException

        try:
            return text_interface(self.client, model)
        except InferenceServerException as exc:
            raise grpc_error(exc, self.target, model) from None

    def _io(self, iface: TextInterface, values: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        names = [iface.output, *((TOKEN_IDS, TOKEN_LOG_PROBS) if iface.gives_tokens else ())]
        return iface.tensors(values, self.grpc), [self.grpc.InferRequestedOutput(name) for name in names]

    def answer(self, iface: TextInterface, values: dict[str, Any], timeout_s: float) -> Answer:
        from tritonclient.utils import InferenceServerException

        inputs, outputs = self._io(iface, values)
        try:
            result = self.client.infer(iface.model, inputs, outputs=outputs, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise grpc_error(exc, self.target, iface.model) from None
        return _grpc_answer(result, iface)

    def answers(self, iface: TextInterface, values: dict[str, Any], timeout_s: float) -> Iterator[Answer]:
        """The answers of a gRPC stream as they arrive (ftx's streaming ensemble sends each new piece once,
        one without stream offsets the whole text so far)."""
        from tritonclient.utils import InferenceServerException

        inputs, outputs = self._io(iface, values)
        responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            self.client.async_stream_infer(iface.model, inputs, outputs=outputs, enable_empty_final_response=True)
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    result, error = responses.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    raise ServeError(f"no response from {self.target} within {timeout_s:g} s") from None
                if error is not None:
                    cause = error if isinstance(error, Exception) else InferenceServerException(str(error))
                    raise grpc_error(cause, self.target, iface.model)
                final = result.get_response().parameters.get("triton_final_response")
                if result.as_numpy(iface.output) is not None or final is None or not final.bool_param:
                    yield _grpc_answer(result, iface)
                if final is None or final.bool_param:
                    return
        finally:
            self.client.stop_stream()

    def close(self) -> None:
        self.client.close()


def _grpc_answer(result: Any, iface: TextInterface) -> Answer:
    """An Answer from a gRPC result (the token outputs when the model gives them)."""
    event: dict[str, Any] = {iface.output: first_text(result.as_numpy(iface.output))}
    if iface.gives_tokens:
        for name in (TOKEN_IDS, TOKEN_LOG_PROBS):
            array = result.as_numpy(name)
            if array is not None:
                event[name] = array.reshape(-1).tolist()
    return Answer.of(event, iface.output)


def generate(request: TextRequest) -> Answer:
    """The request's answer: the text, with the generated token ids and their log probabilities where the
    model gives them. A decoupled (streaming) model is always read as a stream."""
    values = {"prompt": request.prompt, **request.values}
    routed = not (values.get("logprobs") or int(values.get("beam_width") or 1) > 1)  # the route reads ids only
    if routed and request.repository is not None and request.model == TEXT_MODEL_NAME and not request.over_http:
        text = _over_token_route(request, request.repository, values)
        if text is not None:
            return Answer(text)
    transport: Transport = (
        HttpTransport(request.url, request.timeout_s) if request.over_http else GrpcTransport(request.url)
    )
    try:
        return _generate(transport, request, values)
    finally:
        transport.close()


def _generate(transport: Transport, request: TextRequest, values: dict[str, Any]) -> Answer:
    iface = transport.interface(request.model)
    if iface.decoupled and int(values.get("beam_width") or 1) > 1:
        raise ServeError(  # its best running beam changes while it streams: the pieces join into no beam's text
            "beam search needs a deployment that answers in one piece: this one streams (--streaming), and "
            "its best running beam changes from step to step",
            hint="deploy without --streaming to use --beam",
        )
    if request.stream and not iface.decoupled and request.on_note:
        request.on_note(
            f"model {request.model!r} was deployed without --streaming, so the text arrives whole "
            "(deploy with `ftx run MODEL --streaming` to get it token by token)"
        )
    if iface.decoupled:
        values["stream"] = True
    if request.stream or iface.decoupled:
        whole = request.stream or request.echo_prompt or not iface.continues_prompt
        answers = transport.answers(iface, values, request.timeout_s)
        return _joined(answers, iface, request.prompt, request.on_text if request.stream else None, whole)
    answer = transport.answer(iface, values, request.timeout_s)
    text = answer.text
    if request.echo_prompt and iface.continues_prompt and not text.startswith(request.prompt):
        text = request.prompt + text
    return replace(answer, text=text)


def _joined(
    answers: Iterator[Answer], iface: TextInterface, prompt: str, on_text: Callable[[str], None] | None, whole: bool
) -> Answer:
    """The stream's answers joined: the text (starting with the prompt for a decoder, unless ``whole`` is
    False and it is cut off), and the token ids and log probabilities when each answer holds only its own."""
    joiner = PieceJoiner(iface, prompt)
    text, ids, probs = "", list[int](), list[float]()
    for answer in answers:
        piece = joiner.add(answer.text)
        if piece:
            text += piece
            if on_text:
                on_text(piece)
        if iface.gives_tokens and answer.token_ids is not None:
            ids += answer.token_ids
            probs += answer.log_probs or [0.0] * len(answer.token_ids)
    if not whole and iface.continues_prompt:
        text = text.removeprefix(prompt)
    return Answer(text, tuple(ids) if iface.gives_tokens else None, tuple(probs) if iface.gives_tokens else None)


def _over_token_route(request: TextRequest, repository: Path, values: dict[str, Any]) -> str | None:
    """The text over a streaming repository's token route; None when it has none (the ensemble serves)."""
    from ftx_triton.client.token_stream import ModelRefused, TokenRoute, stream_texts_sync
    from ftx_triton.repository.textproc import RequestError

    route = TokenRoute.open(repository)
    if route is None:
        return None
    lead = request.prompt if route.io_kind == "decoder" else ""
    printed = lead if request.stream or request.echo_prompt else ""
    on_text = request.on_text if request.stream else None
    if on_text and lead:
        on_text(lead)
    try:
        for piece in stream_texts_sync(request.url, route, values, request.timeout_s):
            printed += piece
            if on_text:
                on_text(piece)
    except (RequestError, ModelRefused) as exc:
        raise ServeError(f"the server refused the request: {exc}") from None
    return printed


def generate_answer(
    url: str,
    model: str,
    prompt: str,
    *,
    max_tokens: int = DEFAULT_TOKENS,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    options: Mapping[str, Any] | None = None,
    **how: Any,
) -> Answer:
    """:func:`generate` with the sampling roles as arguments; ``options`` holds further roles of the text
    interface (``seed``, ``beam_width``, ``bad_words``), ``how`` the rest of :class:`TextRequest`."""
    values = {**sampling_values(max_tokens, temperature, top_k, top_p), **(options or {})}
    return generate(TextRequest(url, model, prompt, values, **how))


def generate_text(url: str, model: str, prompt: str, **kwargs: Any) -> str:
    """Generate once through ``model``'s text interface at ``url``; return the text (see :func:`generate_answer`)."""
    return generate_answer(url, model, prompt, **kwargs).text


__all__ = [
    "DEFAULT_TOKENS",
    "GrpcTransport",
    "HttpTransport",
    "TextRequest",
    "Transport",
    "generate",
    "generate_answer",
    "generate_text",
    "grpc_error",
]
