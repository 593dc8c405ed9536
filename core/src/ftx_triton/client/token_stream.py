"""Token ids straight to and from the ``fastertransformer`` model: no Python model between the client and it.

A streaming deployment's ``text`` ensemble runs the ``postprocessing`` Python model once per generated token
and request (one call to a stub process each, one process for every stream). The OpenAI endpoint and
``ftx generate`` avoid that: they tokenize the prompt in their own process with the repository's own
preprocessing code (:class:`TokenRoute`, the same checks and limits as the ``preprocessing`` model), send
the ids to the decoupled ``fastertransformer`` model over gRPC's stream, and detokenize the ids it streams
back incrementally (:class:`IncrementalText`, Hugging Face ``tokenizers``' ``DecodeStream``).

A deployment that does not stream is reached the same way by the OpenAI endpoint (:func:`infer_whole`: one
gRPC call, the answer decoded by the repository's own postprocessing code), so that its requests reach the
model's dynamic batcher as the clients send them: through the ensemble, the one ``preprocessing`` instance
works through a burst of requests a few at a time, and their arrivals at the model spread beyond the
batcher's delay (a closed loop then splits into groups that take turns generating).

FasterTransformer's responses each hold the whole output so far, so a client that reads slower than the
model writes loses nothing when the responses it has not read yet are dropped for the newest one
(:func:`stream_texts`): the reader keeps only the latest, and the writer decodes every id it has not sent.

Requests and responses are Triton's gRPC messages built here from the service's own protobuf classes, so
the stream can ask for the empty final response that marks its end.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ftx_triton.client.send_gate import SendGate
from ftx_triton.client.text_client import MODEL_FAULT
from ftx_triton.errors import ServeError
from ftx_triton.repository.io import FT_MODEL_NAME, GENERATE_INPUTS, PROMPT_TO_FT

PREPROCESSING_DIR = Path("preprocessing") / "1"
_OUTPUTS = ("output_ids", "sequence_length")
LOG_PROBS_OUTPUT = "output_log_probs"
_GENERATE_NAMES = frozenset(d.name for d in GENERATE_INPUTS)
_ROLE_TO_INPUT = {"prompt": "text_input", "seed": "random_seed"}
"""Roles of a generate request whose preprocessing input has another name (the rest share theirs)."""
_TRITON_TYPES: dict[np.dtype[Any], str] = {
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.int32): "INT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float32): "FP32",
    np.dtype(np.bool_): "BOOL",
}
_NUMPY_TYPES: dict[str, np.dtype[Any]] = {name: dtype for dtype, name in _TRITON_TYPES.items()}
QUEUE_FULL_MARKERS = ("exceeds maximum queue size", "request timeout expired", "queue is full")
"""How Triton words a request its dynamic batcher's bounded queue refused (full, or waited past its timeout)."""


class Overloaded(ServeError):
    """The model's queue refused the request (admission control): the client should retry later."""


class StreamFault(ServeError):
    """The model failed the request (a fault of the server)."""


class ModelRefused(ServeError):
    """The model refused the request (a fault of the request: a value out of its range)."""


def is_overload(message: str) -> bool:
    """Whether a Triton error message is its queue refusing a request (full, or timed out in the queue)."""
    low = message.lower()
    return any(marker in low for marker in QUEUE_FULL_MARKERS)


# --------------------------------------------------------------------------- text -> the model's inputs


def _streams(repository: Path) -> bool:
    """Whether the repository's ``fastertransformer`` model is decoupled (streams its ids)."""
    from ftx_triton.repository.model_config import parse_config

    return bool(parse_config(repository / FT_MODEL_NAME / "config.pbtxt").model_transaction_policy.decoupled)


class TokenRoute:
    """The deployment's own preprocessing, in this process, and what it needs to read the model's stream."""

    def __init__(self, repository: Path) -> None:
        from ftx_triton.repository.model_config import parse_config
        from ftx_triton.repository.textproc import Preprocessor

        self.repository = Path(repository)
        pre = parse_config(self.repository / "preprocessing" / "config.pbtxt")
        params = {k: v.string_value for k, v in pre.parameters.items()}
        self.pre = Preprocessor.from_directory(self.repository / PREPROCESSING_DIR, params, pre.max_batch_size)
        self.codec = self.pre.codec
        self.settings = self.pre.settings
        self.io_kind = self.settings.io_kind
        ft = parse_config(self.repository / FT_MODEL_NAME / "config.pbtxt")
        self.decoupled = bool(ft.model_transaction_policy.decoupled)
        self.ft_inputs = {i.name for i in ft.input}
        self.ft_outputs = {o.name for o in ft.output}
        self._post: Any = None

    @classmethod
    def open(cls, repository: Path | None, *, streaming_only: bool = True) -> TokenRoute | None:
        """The route for a repository readable here; None when it is not (then the ``text`` ensemble serves),
        and with ``streaming_only`` when its model does not stream."""
        if repository is None:
            return None
        try:
            # before the tokenizer loads (the OpenAI front's start waits on it)
            if streaming_only and not _streams(Path(repository)):
                return None
            route = cls(Path(repository))
        except Exception:  # noqa: BLE001 - a repository not readable here: the ensemble serves instead
            return None
        return route if route.decoupled or not streaming_only else None

    def inputs(self, values: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], list[int]]:
        """The fastertransformer model's inputs for a generate request's role values, and the prompt's ids.

        Raises the preprocessing model's ``RequestError`` for a request it would refuse."""
        request: dict[str, np.ndarray] = {}
        for role, value in values.items():
            name = _ROLE_TO_INPUT.get(role, role)
            if value is None or name not in _GENERATE_NAMES or name == "stream":
                continue
            if name == "text_input":
                request[name] = np.array([[str(value).encode("utf-8")]], dtype=np.object_)
            elif isinstance(value, list | tuple) and all(isinstance(v, int) for v in value):
                request[name] = np.array([list(value)], dtype=np.int64)  # token ids (bad_token_ids)
            elif isinstance(value, list | tuple):
                request[name] = np.array([[str(v).encode("utf-8") for v in value]], dtype=np.object_)
            else:
                request[name] = np.array([[value]])
        out = self.pre.run(request)
        mapping = PROMPT_TO_FT[self.io_kind]
        tensors = {mapping.get(name, name): array for name, array in out.items()}
        tensors = {name: array for name, array in tensors.items() if name in self.ft_inputs}
        prompt = out["INPUT_ID"][0, : int(np.asarray(out["REQUEST_INPUT_LEN"]).reshape(-1)[0])].tolist()
        return tensors, prompt

    def generated(self, outputs: Mapping[str, np.ndarray], prompt_len: int) -> list[int]:
        """The ids generated so far (first beam), up to the first end id."""
        ids = np.asarray(outputs["output_ids"])
        ids = ids.reshape(ids.shape[0], -1, ids.shape[-1]) if ids.ndim >= 2 else ids.reshape(1, 1, -1)
        lengths = outputs.get("sequence_length")
        end = int(np.asarray(lengths).reshape(-1)[0]) if lengths is not None else ids.shape[-1]
        start = prompt_len if self.io_kind == "decoder" else 0
        tokens = [int(t) for t in ids[0, 0, start : max(start, min(end, ids.shape[-1]))]]
        if self.settings.end_id in tokens:
            tokens = tokens[: tokens.index(self.settings.end_id)]
        return tokens

    def decoder(self, prompt: list[int]) -> IncrementalText:
        context = prompt if self.io_kind == "decoder" else []
        return IncrementalText(self.codec, context)

    def whole_outputs(self) -> tuple[str, ...]:
        """What a whole answer is asked for: the ids, their lengths, and the log probabilities where the model
        answers them (the preprocessing code always asks FasterTransformer for them)."""
        return _OUTPUTS + ((LOG_PROBS_OUTPUT,) if LOG_PROBS_OUTPUT in self.ft_outputs else ())

    def answer(self, outputs: Mapping[str, np.ndarray], prompt_len: int) -> WholeAnswer:
        """A whole answer as the ``postprocessing`` model makes it (its own code, on the best beam): the text
        generated up to the first end id, those ids, and FasterTransformer's log probability of each."""
        from ftx_triton.repository.textproc import Postprocessor

        if self._post is None:
            self._post = Postprocessor(self.codec, self.settings)
        ids = np.asarray(outputs["output_ids"])
        lengths = outputs.get("sequence_length")
        if lengths is None:
            lengths = np.full(ids.shape[:-1], ids.shape[-1], np.int64)
        prompt = np.full((ids.shape[0], 1), prompt_len, np.int64)
        tokens, probs = self._post.tokens(ids, lengths, outputs.get(LOG_PROBS_OUTPUT), None, prompt)
        kept = tokens[0][tokens[0] >= 0].tolist()
        # the best beam's text is what its generated ids decode to (the postprocessing model's text_output of
        # that beam): decoded once, not every beam's
        return WholeAnswer(self.codec.decode(kept), kept, probs[0][: len(kept)].tolist(), prompt_len)


@dataclass(frozen=True)
class WholeAnswer:
    """A model's whole answer to one request: the generated text, its ids and their log probabilities."""

    text: str
    token_ids: list[int]
    log_probs: list[float]
    prompt_tokens: int = 0
    """The prompt's ids as the route tokenized it (what the model read; the OpenAI ``usage`` counts them)."""


# --------------------------------------------------------------------------- ids -> text, incrementally


class IncrementalText:
    """The new text of a growing list of generated ids, decoded as they come.

    Hugging Face tokenizers decode with ``DecodeStream`` (primed with the prompt's last ids, so a first
    word keeps its leading space); others (sentencepiece) decode a short window around the new ids. A
    character whose last bytes are not generated yet waits for them; :meth:`finish` flushes what is left."""

    CONTEXT = 6

    def __init__(self, codec: Any, context: list[int]) -> None:
        self.codec = codec
        self.count = 0
        self.sent = ""
        tokenizer = getattr(codec, "tokenizer", None)
        self._stream: Any = None
        if tokenizer is not None:
            try:
                from tokenizers.decoders import DecodeStream

                self._stream = DecodeStream(ids=context[-self.CONTEXT :], skip_special_tokens=True)
            except (ImportError, TypeError):  # tokenizers < 0.22 has no primed DecodeStream
                self._stream = None
        self._tokenizer = tokenizer
        self._window = list(context[-self.CONTEXT :])
        self._prefix, self._read = 0, len(self._window)
        self._ids: list[int] = []

    def update(self, generated: list[int]) -> str:
        """The text the ids past those already seen add (``generated`` holds every id generated so far)."""
        new = generated[self.count :]
        self.count = len(generated)
        self._ids = list(generated)
        if not new:
            return ""
        if self._stream is not None:
            piece = self._stream.step(self._tokenizer, new) or ""
        else:
            self._window += new
            before = self.codec.decode(self._window[self._prefix : self._read])
            after = self.codec.decode(self._window[self._prefix :])
            piece = ""
            if len(after) > len(before) and not after.endswith("\ufffd"):
                piece = after[len(before) :]
                self._prefix, self._read = self._read, len(self._window)
        self.sent += piece
        return piece

    def finish(self) -> str:
        """What the whole generated text holds beyond what was sent (a last incomplete character)."""
        whole = self.codec.decode(self._ids)
        rest = whole[len(self.sent) :] if whole.startswith(self.sent) else ""
        self.sent += rest
        return rest


# --------------------------------------------------------------------------- Triton's gRPC messages


def infer_request(
    tensors: Mapping[str, np.ndarray], request_id: str = "", *, outputs: tuple[str, ...] = _OUTPUTS, stream: bool = True
) -> Any:
    """A ``ModelInferRequest`` for the fastertransformer model; ``stream``: one that asks for the empty final
    response (a decoupled model's stream then says where it ends)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=FT_MODEL_NAME, id=request_id)
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        datatype = _TRITON_TYPES.get(array.dtype)
        if datatype is None:
            raise TypeError(f"{name}: no Triton type for {array.dtype}")
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    if stream:
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def response_outputs(response: Any) -> dict[str, np.ndarray]:
    """The tensors of a ``ModelInferResponse`` (those of a type this module reads)."""
    outputs = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        dtype = _NUMPY_TYPES.get(tensor.datatype)
        if dtype is not None:
            outputs[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(list(tensor.shape))
    return outputs


def read_response(message: Any) -> tuple[dict[str, np.ndarray], bool]:
    """(outputs, final) of one ``ModelStreamInferResponse``; an error one raises :class:`Overloaded` (the
    queue refused it) or :class:`StreamFault`."""
    if message.error_message:
        text = message.error_message
        if is_overload(text):
            raise Overloaded(f"the model is overloaded: {text}", hint="retry later")
        if MODEL_FAULT.search(text):  # a stream's error carries no status: ftx's models word their own faults so
            raise StreamFault(text)
        raise ModelRefused(text)
    response = message.infer_response
    final = "triton_final_response" in response.parameters and response.parameters["triton_final_response"].bool_param
    return response_outputs(response), bool(final)


def grpc_target(url: str) -> str:
    """``host:port`` of a gRPC address given as ``host:port`` or ``grpc://host:port``."""
    return url.removeprefix("grpc://").rstrip("/")


# --------------------------------------------------------------------------- the streams


@dataclass
class _Latest:
    """The newest response of a stream, written by its reader and taken by its writer."""

    outputs: dict[str, np.ndarray] | None = None
    final: bool = False
    error: BaseException | None = None
    responses: int = 0
    dropped: int = 0


class AsyncTokenClient:
    """One gRPC channel to Triton for every stream of an event loop (the OpenAI endpoint); ``timeout_s`` bounds
    a whole answer's call (None: no bound); ``gate`` holds requests prepared together so that they reach the model
    together (:mod:`.send_gate`)."""

    def __init__(self, url: str, timeout_s: float | None = None, gate: SendGate | None = None) -> None:
        self.target = grpc_target(url)
        self.timeout_s = timeout_s
        self.gate = gate
        self._channel: Any = None
        self._stub: Any = None

    def stub(self) -> Any:
        if self._stub is None:
            import grpc
            from tritonclient.grpc import service_pb2_grpc

            options = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 64 << 20)]
            self._channel = grpc.aio.insecure_channel(self.target, options=options)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None


async def stream_texts(
    client: AsyncTokenClient,
    route: TokenRoute,
    values: Mapping[str, Any],
    on_first: Callable[[], None] | None = None,
    on_ids: Callable[[int], None] | None = None,
    on_prompt: Callable[[int], None] | None = None,
) -> AsyncGenerator[str, None]:
    """New text as the model generates it, decoded here. Responses the consumer had no time for are dropped
    for the newest (each holds the whole output so far); closing the iterator cancels the model's stream.
    ``on_first`` is called before the first piece, ``on_ids`` with the count of ids generated so far,
    ``on_prompt`` with the count of the prompt's ids once it is tokenized."""
    import grpc

    tensors, prompt = route.inputs(values)
    if on_prompt is not None:
        on_prompt(len(prompt))
    request = infer_request(tensors)
    done = asyncio.Event()
    latest = _Latest()
    wake = asyncio.Event()

    async def requests() -> AsyncIterator[Any]:
        yield request
        await done.wait()  # keep the stream open until the final response came (or the consumer left)

    if client.gate is not None:
        await client.gate.wait()
    call = client.stub().ModelStreamInfer(requests())

    async def reader() -> None:
        try:
            async for message in call:
                outputs, final = read_response(message)
                if outputs:
                    if latest.outputs is not None:  # the consumer has not taken the last one: it is stale now
                        latest.dropped += 1
                    latest.outputs = outputs
                    latest.responses += 1
                    wake.set()
                if final:
                    latest.final = True
                    break
        except grpc.aio.AioRpcError as exc:
            latest.error = _rpc_error(exc, client.target)
        except ServeError as exc:
            latest.error = exc
        finally:
            if not latest.final and latest.error is None:
                latest.error = StreamFault("the model's stream ended before its final response")
            wake.set()

    task = asyncio.create_task(reader())
    decoder = route.decoder(prompt)
    try:
        while True:
            await wake.wait()
            wake.clear()
            outputs, latest.outputs = latest.outputs, None
            if outputs is not None:
                generated = route.generated(outputs, len(prompt))
                if on_ids is not None:
                    on_ids(len(generated))
                piece = decoder.update(generated)
                if piece:
                    if on_first is not None:
                        on_first()
                        on_first = None
                    yield piece
            if latest.outputs is not None:
                continue
            if latest.final:
                rest = decoder.finish()
                if rest:
                    yield rest
                return
            if latest.error is not None:
                raise latest.error
    finally:
        done.set()
        if not task.done():
            call.cancel()
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def infer_whole(client: AsyncTokenClient, route: TokenRoute, values: Mapping[str, Any]) -> WholeAnswer:
    """One request to a model that answers in one piece (not decoupled), its answer decoded here. Raises the
    preprocessing code's ``RequestError`` for a request the ``preprocessing`` model would refuse, and
    :class:`ModelRefused`, :class:`Overloaded`, :class:`StreamFault` or ``ServeError`` (Triton unreachable,
    no answer in time) as the model's answer says."""
    import grpc

    tensors, prompt = route.inputs(values)
    request = infer_request(tensors, outputs=route.whole_outputs(), stream=False)
    if client.gate is not None:
        await client.gate.wait()
    try:
        response = await client.stub().ModelInfer(request, timeout=client.timeout_s)
    except grpc.aio.AioRpcError as exc:
        raise _unary_error(exc, client.target, client.timeout_s) from None
    return route.answer(response_outputs(response), len(prompt))


def _unary_error(exc: Any, target: str, timeout_s: float | None) -> ServeError:
    """What a failed ``ModelInfer`` call means: the queue's refusal, Triton out of reach or too slow, the
    request's fault (INVALID_ARGUMENT, unless the model words a fault of its own), or a fault of the model."""
    import grpc

    code, details = exc.code(), exc.details() or ""
    if is_overload(details) or code == grpc.StatusCode.UNAVAILABLE:
        return _rpc_error(exc, target)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ServeError(f"no answer from {target} within {timeout_s:g} s", hint="retry later")
    if code == grpc.StatusCode.INVALID_ARGUMENT and not MODEL_FAULT.search(details):
        return ModelRefused(details)
    return StreamFault(details)


def _rpc_error(exc: Any, target: str) -> ServeError:
    import grpc

    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE and not is_overload(exc.details() or ""):
        return ServeError(
            f"cannot reach Triton's gRPC endpoint at {target}: {exc.details()}",
            hint="start a server (`ftx run MODEL --detach`) and check `ftx ps`",
        )
    if is_overload(exc.details() or ""):
        return Overloaded(f"the model is overloaded: {exc.details()}", hint="retry later")
    return StreamFault(f"the model's stream failed: {code.name}: {exc.details()}")


def stream_texts_sync(url: str, route: TokenRoute, values: Mapping[str, Any], timeout_s: float) -> Iterator[str]:
    """:func:`stream_texts` for a synchronous caller (``ftx generate``): one channel per call, every response read."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    tensors, prompt = route.inputs(values)
    done = threading.Event()

    def requests() -> Iterator[Any]:
        yield infer_request(tensors)
        done.wait(timeout_s)

    target = grpc_target(url)
    channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 256 << 20)])
    decoder = route.decoder(prompt)
    try:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests(), timeout=timeout_s)
        try:
            for message in call:
                outputs, final = read_response(message)
                if outputs:
                    piece = decoder.update(route.generated(outputs, len(prompt)))
                    if piece:
                        yield piece
                if final:
                    rest = decoder.finish()
                    if rest:
                        yield rest
                    return
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ServeError(f"no answer from {target} within {timeout_s:g} s") from None
            raise _rpc_error(exc, target) from None
        finally:
            done.set()
            call.cancel()
        raise StreamFault("the model's stream ended before its final response")
    finally:
        channel.close()


__all__ = [
    "AsyncTokenClient",
    "IncrementalText",
    "Overloaded",
    "ModelRefused",
    "StreamFault",
    "TokenRoute",
    "WholeAnswer",
    "infer_request",
    "infer_whole",
    "is_overload",
    "read_response",
    "stream_texts",
    "stream_texts_sync",
]
