"""A local server's first generation: one token through the raw ``fastertransformer`` model, and its name.

Shared by every runtime that serves with the embedded tritonserver (python, FasterTransformer native):
a server that is ready but cannot generate is stopped and reported, not handed to the user.

The model's config comes from the server (HTTP, JSON) and a model that answers in one piece is asked over
HTTP too (:mod:`ftx_triton.client.text_client`, the standard library): a run whose model is not decoupled imports
neither numpy nor gRPC's client nor protobuf, which on a small machine would take CPU from the model's own load.
Only a decoupled (streaming) model, which Triton's HTTP ``infer`` route does not serve, is asked over gRPC.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ftx_triton.errors import ServeError
from ftx_triton.import_ahead import import_ahead
from ftx_triton.repository.io import FT_MODEL_NAME
from ftx_triton.server.tritonserver import MAX_NAME_CHARS, TritonServer
from ftx_triton.terminal import timeline


def server_name(model: str) -> str:
    """A short server name from what the user ran (``tiny-gptj``, ``hf://org/name`` → ``name``)."""
    text = model.rstrip("/").split("@", 1)[0]
    text = re.split(r"[/:]", text)[-1] or "ftx"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:MAX_NAME_CHARS].strip("-.") or "ftx"


SMOKE_MODULES = ("ftx_triton.client.text_client",)
"""What the smoke generation imports (the standard library's HTTP client)."""
STREAMED_SMOKE_MODULES = ("tritonclient.grpc",)
"""What the smoke generation of a decoupled model imports besides (gRPC's client with numpy: 0.2-0.3 s)."""


@dataclass(frozen=True)
class Smoke:
    """What the first generation found: its seconds, and whether the model answers as a stream."""

    seconds: float
    decoupled: bool


def import_while_loading(decoupled: bool = False) -> threading.Thread:
    """Import the smoke generation's modules in a background thread, started before tritonserver loads its
    models, so that the first generation after "ready" does not begin with them; gRPC's client only for a
    ``decoupled`` model. An import that fails here is left to the smoke generation, which imports the module
    again and reports what it raises."""
    names = SMOKE_MODULES + (STREAMED_SMOKE_MODULES if decoupled else ())
    thread = threading.Thread(target=import_ahead, args=(names,), name="ftx-smoke-imports", daemon=True)
    thread.start()
    return thread


def _input_names(io_kind: str) -> tuple[str, str, str]:
    """The ids, their length and the tokens to generate, as the raw model names them."""
    if io_kind == "decoder":
        return ("input_ids", "input_lengths", "request_output_len")
    return ("input_ids", "sequence_length", "max_output_len")


def io_kind_of(config: dict[str, Any]) -> str:
    """``decoder`` or ``encoder-decoder``: the raw model's inputs, from its config as the server gives it (JSON)."""
    names = {str(i.get("name")) for i in config.get("input") or () if isinstance(i, dict)}
    return "decoder" if "input_lengths" in names else "encoder-decoder"


def smoke_http(http_url: str, io_kind: str = "decoder", timeout_s: float = 300.0) -> float:
    """Generate one token through the raw fastertransformer model with one HTTP ``infer`` request (JSON) of a
    model that is not decoupled; return the seconds it took."""
    from ftx_triton.client.text_client import HttpTriton

    started = time.perf_counter()
    inputs = [
        {"name": name, "shape": [1, 1], "datatype": "UINT32", "data": [value]}
        for name, value in zip(_input_names(io_kind), (0, 1, 1), strict=True)
    ]
    body = {"inputs": inputs, "outputs": [{"name": "output_ids"}]}
    answer = HttpTriton(http_url, timeout_s).post_json(f"/v2/models/{quote(FT_MODEL_NAME, safe='')}/infer", body)
    if not any(isinstance(o, dict) and o.get("name") == "output_ids" for o in answer.get("outputs") or ()):
        raise ServeError(f"its answer holds no output_ids: {str(answer)[:200]}")
    return time.perf_counter() - started


def smoke_stream(grpc_url: str, io_kind: str = "decoder", timeout_s: float = 300.0) -> float:
    """Generate one token through the raw fastertransformer model of a decoupled model (a gRPC stream, to its final
    response); return the seconds it took."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    started = time.perf_counter()
    ids = np.zeros((1, 1), np.uint32)
    one = np.ones((1, 1), np.uint32)
    names = _input_names(io_kind)
    inputs = []
    for name, value in zip(names, (ids, one, one), strict=True):
        tensor = grpcclient.InferInput(name, list(value.shape), "UINT32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput("output_ids")]
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer(FT_MODEL_NAME, inputs, outputs=outputs, enable_empty_final_response=True)
            while True:
                result, error = answers.get(timeout=timeout_s)
                if error is not None:
                    raise error
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
        finally:
            client.stop_stream()
    finally:
        client.close()
    return time.perf_counter() - started


def check_generates(server: TritonServer, what: str) -> Smoke:
    """Smoke-test a started server's fastertransformer model (its config as the server loaded it); stop it and
    raise a ServeError naming ``what`` (the model, or the backend) when it cannot generate."""
    from ftx_triton.client.text_client import HttpTriton

    try:
        config = HttpTriton(server.http_url, 60.0).get_json(f"/v2/models/{quote(FT_MODEL_NAME, safe='')}/config")
        io_kind = io_kind_of(config)
        decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
        if decoupled:  # Triton's HTTP infer route refuses a decoupled model
            seconds = smoke_stream(server.grpc_url, io_kind)
        else:
            seconds = smoke_http(server.http_url, io_kind)
        timeline.step("smoke generation")
        return Smoke(seconds, decoupled)
    except queue.Empty:
        server.stop()
        raise ServeError(
            f"{what} did not answer a one-token request", hint=f"see the server log: {server.log_path}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever the client raised, the server is not usable
        server.stop()
        raise ServeError(
            f"the server started but {what} could not generate a token: {exc}",
            hint=f"see the server log: {server.log_path}",
        ) from None
    except BaseException:
        server.stop()
        raise


__all__ = [
    "SMOKE_MODULES",
    "STREAMED_SMOKE_MODULES",
    "Smoke",
    "check_generates",
    "import_while_loading",
    "io_kind_of",
    "server_name",
    "smoke_http",
    "smoke_stream",
]
