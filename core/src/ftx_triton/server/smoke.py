"""A local server's first generation: one token through the raw ``fastertransformer`` model, and its name.

Shared by every runtime that serves with the embedded tritonserver (python, FasterTransformer native):
a server that is ready but cannot generate is stopped and reported, not handed to the user.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from pathlib import Path

import numpy as np

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


SMOKE_MODULES = ("tritonclient.grpc", "ftx_triton.repository.model_config")
"""What the smoke generation imports (gRPC's client and protobuf's config parser: 0.2-0.3 s)."""


def import_while_loading() -> threading.Thread:
    """Import the smoke generation's modules in a background thread, started before tritonserver loads its
    models, so that the first generation after "ready" does not begin with them. An import that fails here
    is left to the smoke generation, which imports the module again and reports what it raises."""

    thread = threading.Thread(target=import_ahead, args=(SMOKE_MODULES,), name="ftx-smoke-imports", daemon=True)
    thread.start()
    return thread


def smoke_test(grpc_url: str, io_kind: str = "decoder", decoupled: bool = False, timeout_s: float = 300.0) -> float:
    """Generate one token through the raw fastertransformer model (gRPC, streamed when decoupled);
    return the seconds it took."""
    import queue

    import tritonclient.grpc as grpcclient

    started = time.perf_counter()
    ids = np.zeros((1, 1), np.uint32)
    one = np.ones((1, 1), np.uint32)
    names = (
        ("input_ids", "input_lengths", "request_output_len")
        if io_kind == "decoder"
        else ("input_ids", "sequence_length", "max_output_len")
    )
    inputs = []
    for name, value in zip(names, (ids, one, one), strict=True):
        tensor = grpcclient.InferInput(name, list(value.shape), "UINT32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput("output_ids")]
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        if not decoupled:
            client.infer(FT_MODEL_NAME, inputs, outputs=outputs, client_timeout=timeout_s)
        else:
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


def check_generates(server: TritonServer, repository: Path, what: str) -> float:
    """Smoke-test a started server on ``repository``'s fastertransformer model; stop it and raise a ServeError
    naming ``what`` (the model, or the backend) when it cannot generate; return the seconds it took."""
    from ftx_triton.repository.model_config import parse_config

    config = parse_config(repository / FT_MODEL_NAME / "config.pbtxt")  # it parsed before the server loaded it
    io_kind = "decoder" if "input_lengths" in {i.name for i in config.input} else "encoder-decoder"
    try:
        seconds = smoke_test(server.grpc_url, io_kind, config.model_transaction_policy.decoupled)
        timeline.step("smoke generation")
        return seconds
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


__all__ = ["SMOKE_MODULES", "check_generates", "import_while_loading", "server_name", "smoke_test"]
