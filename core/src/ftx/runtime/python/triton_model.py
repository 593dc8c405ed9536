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

from ftx.runtime.python.generation import (
    Generator,
    ItemResult,
    ParsedRequest,
    RequestError,
    build_outputs,
    partial_result,
)

DEVICE_ENV = "FTX_DEVICE"
FAMILY_PARAMETER = "ftx_family"
_NUMPY_TYPES = {"TYPE_UINT32": np.uint32, "TYPE_INT32": np.int32, "TYPE_FP32": np.float32,
                "TYPE_UINT64": np.uint64, "TYPE_INT64": np.int64, "TYPE_BOOL": np.bool_}


def _parameters(config: Mapping[str, Any]) -> dict[str, str]:
    return {key: value.get("string_value", "") for key, value in (config.get("parameters") or {}).items()}


@dataclass
class Reply:
    """What one request gets back: output tensors, or an error message; ``final`` for streams."""

    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None
    final: bool = True


@dataclass
class _Pending:
    """A parsed request and what has been streamed for it."""

    index: int
    request: ParsedRequest
    first_item: int
    generated: list[list[int]] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    done: bool = False


class FtModel:
    """FT-interface generation over a rebuilt transformers model (no Triton types here)."""

    def __init__(self, generator: Generator, output_dtypes: Mapping[str, Any]) -> None:
        self.generator = generator
        self.output_dtypes = dict(output_dtypes)
        self.lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], device: str | None = None) -> FtModel:
        """Load the model that config.pbtxt (as Triton's JSON) describes."""
        from ftx.plugins import load_host
        from ftx.runtime.python.hf_model import load_model

        params = _parameters(config)
        path = params.get("model_checkpoint_path")
        family_name = params.get(FAMILY_PARAMETER)
        if not path or not family_name:
            raise ValueError(f"config.pbtxt of {config.get('name')} lacks model_checkpoint_path or {FAMILY_PARAMETER}")
        family = load_host().family(family_name)
        loaded = load_model(family, Path(path), device=device or os.environ.get(DEVICE_ENV) or "auto",
                            data_type=params.get("data_type"))
        spec = family.spec_from_ini(loaded.ini)
        generator = Generator.for_model(loaded.model, end_id=spec.end_id, start_id=spec.start_id,
                                        device=loaded.device)
        dtypes = {out["name"]: _NUMPY_TYPES.get(out["data_type"], np.float32) for out in config.get("output", ())}
        return cls(generator, dtypes)

    # -- requests -------------------------------------------------------------------------

    def _cast(self, outputs: Mapping[str, np.ndarray], wanted: Sequence[str] | None) -> dict[str, np.ndarray]:
        names = [n for n in outputs if not wanted or n in wanted]
        return {n: np.ascontiguousarray(outputs[n].astype(self.output_dtypes.get(n, outputs[n].dtype))) for n in names}

    def _parse_all(self, batch: Sequence[Mapping[str, np.ndarray]]) -> tuple[list[_Pending], dict[int, Reply]]:
        pending, errors = [], {}
        first = 0
        for index, inputs in enumerate(batch):
            try:
                request = self.generator.parse(inputs)
            except RequestError as exc:
                errors[index] = Reply(error=str(exc))
                continue
            n = len(request.items)
            pending.append(_Pending(index, request, first, [[] for _ in range(n)], [False] * n))
            first += n
        return pending, errors

    def infer(self, batch: Sequence[Mapping[str, np.ndarray]],
              wanted: Sequence[Sequence[str] | None] | None = None) -> list[Reply]:
        """One reply per request; a bad request gets an error and does not affect the others."""
        pending, replies = self._parse_all(batch)
        items = [item for p in pending for item in p.request.items]
        if items:
            try:
                with self.lock:
                    results = self.generator.run(items)
            except Exception as exc:  # noqa: BLE001 - a failure of generate() fails these requests, not the server
                message = f"generation failed: {type(exc).__name__}: {exc}"
                traceback.print_exc()
                for p in pending:
                    replies[p.index] = Reply(error=message)
                return [replies[i] for i in range(len(batch))]
            for p in pending:
                mine = results[p.first_item:p.first_item + len(p.request.items)]
                replies[p.index] = Reply(self._cast(build_outputs(p.request, mine), wanted[p.index] if wanted else None))
        return [replies[i] for i in range(len(batch))]

    def stream(self, batch: Sequence[Mapping[str, np.ndarray]], send: Callable[[int, Reply], None],
               wanted: Sequence[Sequence[str] | None] | None = None) -> None:
        """Decoupled mode: ``send(request index, reply)`` once per new token, the last one final.

        Beam search cannot stream in transformers, so such requests get one final reply.
        """
        pending, errors = self._parse_all(batch)
        for index, reply in errors.items():
            send(index, reply)
        owners: dict[int, tuple[_Pending, int]] = {}
        for p in pending:
            for k in range(len(p.request.items)):
                owners[p.first_item + k] = (p, k)
        items = [item for p in pending for item in p.request.items]

        def on_step(events: list[tuple[int, int, bool]]) -> None:
            touched: dict[int, _Pending] = {}
            for item_index, token, finished in events:
                p, k = owners[item_index]
                p.generated[k].append(token)
                p.finished[k] = finished
                touched[p.index] = p
            for p in touched.values():
                p.done = all(p.finished)
                results = [partial_result(item, gen) for item, gen in zip(p.request.items, p.generated, strict=True)]
                steps = max(len(g) for g in p.generated)
                outputs = build_outputs(p.request, results, generated_so_far=steps)
                send(p.index, Reply(self._cast(outputs, wanted[p.index] if wanted else None), final=p.done))

        if not items:
            return
        try:
            with self.lock:
                results = self.generator.run(items, on_step=on_step)
        except Exception as exc:  # noqa: BLE001 - as in infer(): fail the requests, keep serving
            message = f"generation failed: {type(exc).__name__}: {exc}"
            traceback.print_exc()
            for p in pending:
                if not p.done:
                    p.done = True
                    send(p.index, Reply(error=message))
            return
        for p in pending:  # beam search, or a stream that ended without a final step
            if not p.done:
                p.done = True
                mine: list[ItemResult] = results[p.first_item:p.first_item + len(p.request.items)]
                send(p.index, Reply(self._cast(build_outputs(p.request, mine), wanted[p.index] if wanted else None)))


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


class TritonPythonModel:
    """The Python-backend entry point (``initialize`` / ``execute`` / ``finalize``)."""

    def __init__(self, pb_utils: Any = None) -> None:
        self.pb = pb_utils

    def initialize(self, args: Mapping[str, Any]) -> None:
        if self.pb is None:
            import triton_python_backend_utils as pb_utils  # provided by the Triton stub

            self.pb = pb_utils
        try:
            import transformers

            transformers.logging.set_verbosity_error()
        except ImportError:  # pragma: no cover - load_model reports it
            pass
        config = json.loads(args["model_config"])
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
        self.input_names = [item["name"] for item in config.get("input", ())]
        self.model = FtModel.from_config(config)

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

    def _response(self, reply: Reply) -> Any:
        pb = self.pb
        if reply.error is not None:
            return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(reply.error))
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
        self.model = None
