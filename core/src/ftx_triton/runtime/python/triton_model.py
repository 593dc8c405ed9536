"""The python runtime's ``fastertransformer`` model, as a Triton Python-backend model.

``<repo>/fastertransformer/1/model.py`` only imports :class:`TritonPythonModel` from here, so the
logic is testable outside tritonserver: :class:`FtModel` works on numpy dicts, and
:class:`TritonPythonModel` translates between it and ``triton_python_backend_utils`` (which the
Triton stub provides; tests may pass a stand-in).

The model reads its parameters from config.pbtxt: ``model_checkpoint_path`` (the converted
``<tp>-gpu`` directory), ``data_type``, ``ftx_family``; the device comes from ``FTX_DEVICE``
(``auto``, ``cpu``, ``cuda``), which ``ftx run --device`` sets for the server.
"""

from __future__ import annotations

import json
import os
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from ftx_triton.repository.io import STREAM_OFFSET
from ftx_triton.repository.stream_interval import StreamInterval
from ftx_triton.runtime.python.generation import (
    Generator,
    Item,
    ItemResult,
    ParsedRequest,
    RequestError,
    StepSink,
    TokenEvent,
    build_outputs,
    partial_beams,
    partial_result,
)

DEVICE_ENV = "FTX_DEVICE"
FAMILY_PARAMETER = "ftx_family"
POSITIONS_PARAMETER = "max_positions"
_NUMPY_TYPES = {
    "TYPE_UINT32": np.uint32,
    "TYPE_INT32": np.int32,
    "TYPE_FP32": np.float32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT64": np.int64,
    "TYPE_BOOL": np.bool_,
}
INVALID = "invalid"
INTERNAL = "internal"

log = structlog.get_logger(__name__)


def parameters_of(config: Mapping[str, Any]) -> dict[str, str]:
    """config.pbtxt's ``parameters`` (as Triton's JSON) as plain strings."""
    return {key: value.get("string_value", "") for key, value in (config.get("parameters") or {}).items()}


@dataclass
class Reply:
    """What one request gets back: output tensors, or an error message (``kind`` INVALID: the
    request's fault, 400 / INVALID_ARGUMENT; INTERNAL: the server's, 500); ``final`` for streams."""

    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None
    final: bool = True
    kind: str = INTERNAL


@dataclass
class _Pending:
    """A parsed request and what has been streamed for it."""

    index: int
    request: ParsedRequest
    first_item: int
    generated: list[list[int]] = field(default_factory=list)
    log_probs: list[list[float]] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # per item: tokens already sent (stream offsets)
    responses: int = 0
    steps: int = 0  # decoding steps seen (the stream interval sends every Nth)
    done: bool = False

    @classmethod
    def of(cls, index: int, request: ParsedRequest, first_item: int) -> _Pending:
        n = len(request.items)
        return cls(
            index,
            request,
            first_item,
            [[] for _ in range(n)],
            [[] for _ in range(n)],
            [False] * n,
            [len(item.prompt) if request.kind == "decoder" else 0 for item in request.items],
        )


class _Stream(StepSink):
    """Turns decoding steps into one streamed reply per request and step of the stream interval (for ``auto``:
    the interval of this batch of requests, as ftx's backend patch computes it)."""

    def __init__(
        self,
        model: FtModel,
        pending: Sequence[_Pending],
        send: Callable[[int, Reply], None],
        wanted: Sequence[Sequence[str] | None] | None,
    ) -> None:
        self.model, self.send, self.wanted = model, send, wanted
        self.interval = model.stream_interval.for_batch(len(pending))
        self.owners: dict[int, tuple[_Pending, int]] = {}
        for p in pending:
            for k in range(len(p.request.items)):
                self.owners[p.first_item + k] = (p, k)

    def reply(self, p: _Pending, results: Sequence[ItemResult], *, steps: int | None, final: bool) -> None:
        outputs = build_outputs(p.request, results, generated_so_far=steps)
        offsets = np.repeat(np.asarray(p.sent, np.int64)[:, None], outputs["output_ids"].shape[1], axis=1)
        outputs[STREAM_OFFSET] = offsets
        p.sent = [int(n) for n in outputs["sequence_length"].max(axis=1)]
        p.responses += 1
        p.done = final
        self.send(p.index, Reply(self.model.cast(outputs, self.wanted[p.index] if self.wanted else None), final=final))

    def on_tokens(self, events: list[TokenEvent]) -> None:
        touched: dict[int, _Pending] = {}
        for event in events:
            p, k = self.owners[event.item]
            p.generated[k].append(event.token)
            if event.log_prob is not None:
                p.log_probs[k].append(event.log_prob)
            p.finished[k] = event.finished
            touched[p.index] = p
        for p in touched.values():
            p.steps += 1
            final = all(p.finished)
            if not final and not StreamInterval.sends(p.steps, self.interval):
                continue  # the stream interval: the first, every Nth and the last step's replies, each all so far
            results = [
                partial_result(item, gen, probs if item.sampling.log_probs else None)
                for item, gen, probs in zip(p.request.items, p.generated, p.log_probs, strict=True)
            ]
            self.reply(p, results, steps=max(len(g) for g in p.generated), final=final)

    def on_beams(self, rows: list[tuple[int, np.ndarray]]) -> None:
        by_request: dict[int, tuple[_Pending, dict[int, np.ndarray]]] = {}
        for item_index, beams in rows:
            p, k = self.owners[item_index]
            by_request.setdefault(p.index, (p, {}))[1][k] = beams
        for p, by_item in by_request.values():
            if len(by_item) < len(p.request.items):
                continue  # items of one request in different generate calls: wait for the last call
            p.steps += 1
            if not StreamInterval.sends(p.steps, self.interval):
                continue  # the stream interval (the finished beams go as the final reply)
            results = [partial_beams(item, by_item[k]) for k, item in enumerate(p.request.items)]
            self.reply(p, results, steps=max(b.shape[1] for b in by_item.values()), final=False)


class FtModel:
    """FT-interface generation over a model rebuilt from the FT files, in plain torch or transformers (no Triton
    types here)."""

    def __init__(
        self, generator: Generator, output_dtypes: Mapping[str, Any], stream_interval: StreamInterval | None = None
    ) -> None:
        self.generator = generator
        self.output_dtypes = dict(output_dtypes)
        self.stream_interval = stream_interval or StreamInterval()
        """Which steps a stream sends (config.pbtxt's ``ftx_stream_interval``; default every step); the last
        always goes."""
        self.lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], device: str | None = None, *, own_process: bool = False) -> FtModel:
        """Load the model that config.pbtxt (as Triton's JSON) describes; in ``own_process`` (the stub's), a small
        model on the CPU gets one torch thread (:mod:`.cpu_threads`)."""
        from ftx_triton.plugins import load_host
        from ftx_triton.runtime.python.cpu_threads import fit_cpu_threads
        from ftx_triton.runtime.python.decode_loop import EAGER, decode_mode
        from ftx_triton.runtime.python.hf_model import load_model, resolve_device
        from ftx_triton.runtime.python.torch_model import load_torch_model

        params = parameters_of(config)
        path = params.get("model_checkpoint_path")
        family_name = params.get(FAMILY_PARAMETER)
        if not path or not family_name:
            raise ValueError(f"config.pbtxt of {config.get('name')} lacks model_checkpoint_path or {FAMILY_PARAMETER}")
        positions = int(params[POSITIONS_PARAMETER]) if params.get(POSITIONS_PARAMETER, "").isdigit() else None
        family = load_host(families_only=True).family(family_name)
        how: dict[str, Any] = {
            "device": device or os.environ.get(DEVICE_ENV) or "auto",
            "data_type": params.get("data_type"),
            "max_positions": positions,
        }
        # plain torch where it covers the architecture and the decoding mode is eager (no transformers import at
        # load); transformers' model is built from the same files when a request needs it (beam search), or at once
        # for the others (T5, a decoding mode of transformers')
        plain = decode_mode(resolve_device(how["device"])) == EAGER
        loaded = (load_torch_model(family, Path(path), **how) if plain else None) or load_model(
            family, Path(path), **how
        )
        spec = family.spec_from_ini(loaded.ini)
        generator = Generator.for_model(
            loaded.model,
            end_id=spec.end_id,
            start_id=spec.start_id,
            device=loaded.device,
            max_positions=positions,
            loader=lambda: load_model(family, Path(path), **how).model,
        )
        if own_process and (threads := fit_cpu_threads(loaded.model, loaded.device)):
            log.info("runtime.cpu_threads", threads=threads, reason="a small model on the CPU")
        return cls.serving(generator, config)

    @classmethod
    def serving(cls, generator: Generator, config: Mapping[str, Any]) -> FtModel:
        """``generator`` answering with the output types and the stream interval of config.pbtxt (as Triton's JSON)."""
        dtypes = {out["name"]: _NUMPY_TYPES.get(out["data_type"], np.float32) for out in config.get("output", ())}
        return cls(generator, dtypes, StreamInterval.from_parameters(parameters_of(config)))

    # -- requests -------------------------------------------------------------------------

    def cast(self, outputs: Mapping[str, np.ndarray], wanted: Sequence[str] | None) -> dict[str, np.ndarray]:
        """The outputs this model declares (and the client asked for), in the declared dtypes."""
        names = [n for n in outputs if n in self.output_dtypes and (not wanted or n in wanted)]
        return {n: np.ascontiguousarray(outputs[n].astype(self.output_dtypes[n])) for n in names}

    def _parse_all(self, batch: Sequence[Mapping[str, np.ndarray]]) -> tuple[list[_Pending], dict[int, Reply]]:
        pending, errors = [], {}
        first = 0
        for index, inputs in enumerate(batch):
            try:
                request = self.generator.parse(inputs)
            except RequestError as exc:
                errors[index] = Reply(error=str(exc), kind=INVALID)
                continue
            pending.append(_Pending.of(index, request, first))
            first += len(request.items)
        return pending, errors

    def _generate(self, pending: Sequence[_Pending], sink: StepSink | None) -> dict[int, list[ItemResult] | Reply]:
        """Results per request index; when the batch fails, each request is retried alone so that
        a request that breaks generation fails by itself (streams that already sent are not retried)."""
        items: list[Item] = [item for p in pending for item in p.request.items]
        try:
            with self.lock:
                results = self.generator.run(items, sink)
        except Exception as exc:  # noqa: BLE001 - a failure of generate() fails requests, not the server
            failure = f"generation failed: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        else:
            return {p.index: results[p.first_item : p.first_item + len(p.request.items)] for p in pending}
        if len(pending) == 1:
            return {pending[0].index: Reply(error=failure)}
        log.warning("runtime.batch_failed", requests=len(pending), error=failure, action="retrying each request alone")
        out: dict[int, list[ItemResult] | Reply] = {}
        for p in pending:
            if p.responses:  # a stream cannot take back what it sent
                out[p.index] = Reply(error=f"{failure} (after {p.responses} streamed responses)")
                continue
            alone = _Pending.of(p.index, p.request, 0)
            out[p.index] = self._generate([alone], _Rebased(sink, p, alone) if sink is not None else None)[p.index]
        return out

    def infer(
        self, batch: Sequence[Mapping[str, np.ndarray]], wanted: Sequence[Sequence[str] | None] | None = None
    ) -> list[Reply]:
        """One reply per request; a bad request gets an error and does not affect the others."""
        pending, replies = self._parse_all(batch)
        if pending:
            for index, answer in self._generate(pending, None).items():
                if isinstance(answer, Reply):
                    replies[index] = answer
                    continue
                p = next(q for q in pending if q.index == index)
                replies[index] = Reply(self.cast(build_outputs(p.request, answer), wanted[index] if wanted else None))
        return [replies[i] for i in range(len(batch))]

    def stream(
        self,
        batch: Sequence[Mapping[str, np.ndarray]],
        send: Callable[[int, Reply], None],
        wanted: Sequence[Sequence[str] | None] | None = None,
    ) -> None:
        """Decoupled mode: ``send(request index, reply)`` once per decoding step, the last one final.

        Every reply holds the whole sequence so far, as FasterTransformer's do, and the stream
        offset: where this reply's new tokens start. Beam search sends the best running beams each
        step, then the finished beams as the final reply.
        """
        pending, errors = self._parse_all(batch)
        for index, reply in errors.items():
            send(index, reply)
        if not pending:
            return
        sink = _Stream(self, pending, send, wanted)
        for index, answer in self._generate(pending, sink).items():
            p = next(q for q in pending if q.index == index)
            if p.done:
                continue
            if isinstance(answer, Reply):
                p.done = True
                send(index, answer)
            else:  # beam search, or a stream whose last step was not final
                sink.reply(p, answer, steps=None, final=True)


class _Rebased(StepSink):
    """Forwards the steps of a request retried alone (its items renumbered from 0) to the stream."""

    def __init__(self, sink: StepSink, original: _Pending, alone: _Pending) -> None:
        self.sink, self.shift = sink, original.first_item - alone.first_item

    def on_tokens(self, events: list[TokenEvent]) -> None:
        self.sink.on_tokens([TokenEvent(e.item + self.shift, e.token, e.finished, e.log_prob) for e in events])

    def on_beams(self, rows: list[tuple[int, np.ndarray]]) -> None:
        self.sink.on_beams([(i + self.shift, beams) for i, beams in rows])


def use_dlpack() -> bool:
    """Exchange tensors with the stub through DLPack (torch) rather than its numpy bridge?

    The Python-backend stub shipped with nvidia-pytriton 0.7 (Triton 2.51) was built for numpy 1:
    under numpy 2 its ``as_numpy()``/``Tensor(name, array)`` silently produce empty tensors.
    DLPack avoids that bridge. ``FTX_TRITON_DLPACK=1``/``0`` forces the choice.
    """
    forced = os.environ.get("FTX_TRITON_DLPACK")
    if forced is not None:
        return forced == "1"
    return int(np.__version__.split(".", 1)[0]) >= 2


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """A request tensor (numeric) as a numpy array."""
    if use_dlpack():
        from torch.utils.dlpack import from_dlpack

        return from_dlpack(tensor.to_dlpack()).numpy()
    return tensor.as_numpy()


def numpy_to_tensor(pb: Any, name: str, value: np.ndarray) -> Any:
    """A response tensor (numeric) from a numpy array."""
    if use_dlpack():
        import torch
        from torch.utils.dlpack import to_dlpack

        return pb.Tensor.from_dlpack(name, to_dlpack(torch.from_numpy(np.ascontiguousarray(value))))
    return pb.Tensor(name, value)


def stub_utils() -> Any:
    """``triton_python_backend_utils``, which only the Triton stub provides (tests pass a stand-in instead)."""
    import triton_python_backend_utils as pb_utils

    return pb_utils


class TritonPythonModel:
    """The Python-backend entry point (``initialize`` / ``execute`` / ``finalize``)."""

    def __init__(self, pb_utils: Any = None) -> None:
        self.pb = pb_utils

    def initialize(self, args: Mapping[str, Any]) -> None:
        self.pb = self.pb or stub_utils()
        config = json.loads(args["model_config"])
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
        self.input_names = [item["name"] for item in config.get("input", ())]
        self.model = self.load(config)

    def load(self, config: Mapping[str, Any]) -> FtModel:
        """The model this stub serves (config.pbtxt as Triton's JSON)."""
        return FtModel.from_config(config, own_process=True)

    def _inputs(self, request: Any) -> dict[str, np.ndarray]:
        inputs = {}
        for name in self.input_names:
            tensor = self.pb.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor_to_numpy(tensor)
        return inputs

    def _wanted(self, request: Any) -> list[str] | None:
        try:
            names = list(request.requested_output_names())
        except AttributeError:
            return None
        return names or None

    def _error(self, reply: Reply) -> Any:
        """A TritonError: INVALID_ARG (400 / INVALID_ARGUMENT) for a bad request, else INTERNAL."""
        error_type = self.pb.TritonError
        code = getattr(error_type, "INVALID_ARG" if reply.kind == INVALID else "INTERNAL", None)
        return error_type(reply.error) if code is None else error_type(reply.error, code)

    def _response(self, reply: Reply) -> Any:
        pb = self.pb
        if reply.error is not None:
            return pb.InferenceResponse(output_tensors=[], error=self._error(reply))
        tensors = [numpy_to_tensor(pb, name, value) for name, value in (reply.outputs or {}).items()]
        return pb.InferenceResponse(output_tensors=tensors)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        batch = [self._inputs(r) for r in requests]
        wanted = [self._wanted(r) for r in requests]
        if not self.decoupled:
            return [self._response(reply) for reply in self.model.infer(batch, wanted)]
        senders = [r.get_response_sender() for r in requests]
        final_flag = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        def send(index: int, reply: Reply) -> None:
            senders[index].send(self._response(reply), flags=final_flag if reply.final or reply.error else 0)

        self.model.stream(batch, send, wanted)
        return None

    def finalize(self) -> None:
        self.model = None  # type: ignore[assignment]  # released: Triton calls nothing after finalize
