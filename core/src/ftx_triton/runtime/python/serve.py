"""Serve a model repository with the python runtime: the embedded tritonserver, ready and smoke-tested."""

from __future__ import annotations

import queue
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from ftx_triton.errors import ServeError
from ftx_triton.plan.artifacts import Endpoint, ModelRepository
from ftx_triton.plan.context import StageContext
from ftx_triton.repository.io import TEXT_MODEL_NAME
from ftx_triton.repository.model_config import FT_MODEL_NAME
from ftx_triton.runtime.python.triton_model import DEVICE_ENV
from ftx_triton.terminal.console import say as console_say

log = structlog.get_logger(__name__)

READY_TIMEOUT_S = 900.0
"""Loading a multi-GB model into transformers on CPU can take minutes."""


def server_name(model: str) -> str:
    """A short server name from what the user ran (``tiny-gptj``, ``hf://org/name`` → ``name``)."""
    text = model.rstrip("/").split("@", 1)[0]
    text = re.split(r"[/:]", text)[-1] or "ftx"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "ftx"


def smoke_test(grpc_url: str, io_kind: str = "decoder", decoupled: bool = False, timeout_s: float = 300.0) -> float:
    """Generate one token through the raw fastertransformer model (gRPC, streamed when decoupled);
    return the seconds it took."""
    import queue

    import tritonclient.grpc as grpcclient

    started = time.perf_counter()
    ids = np.zeros((1, 1), np.uint32)
    one = np.ones((1, 1), np.uint32)
    names = ("input_ids", "input_lengths", "request_output_len") if io_kind == "decoder" else (
        "input_ids", "sequence_length", "max_output_len")
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


def _ft_config(repository: Path) -> Any:
    """The fastertransformer model's ModelConfig (it parsed before the server loaded it)."""
    from ftx_triton.repository.model_config import parse_config

    return parse_config(repository / FT_MODEL_NAME / "config.pbtxt")


def serve_python(repository: ModelRepository, ctx: StageContext) -> Endpoint:
    """Start tritonserver on ``repository`` (python runtime) and return its endpoint once it generates.

    The server binds ``--host`` (127.0.0.1 by default) on the chosen or free ports; with
    ``--detach`` it is started so that it can outlive this process.
    """
    from ftx_triton.server.ports import ports_for
    from ftx_triton.server.tritonserver import TritonServer

    s = ctx.settings.serve
    if s.device == "cuda":
        from ftx_triton.runtime.python.hf_model import resolve_device

        resolve_device("cuda")  # fail now, not inside the server
    path = Path(repository.path)
    if not (path / FT_MODEL_NAME / "config.pbtxt").is_file():
        raise ServeError(f"{path} has no {FT_MODEL_NAME} model", hint="re-run the configure stage (--force configure)")

    def say(text: str) -> None:
        if ctx.show_progress:
            console_say(text)

    ports, given = ports_for(s.host, s.http_port, s.grpc_port, s.metrics_port, say)
    server = TritonServer(path, home=ctx.home, host=s.host, ports=ports, ports_given=given,
                          name=server_name(ctx.settings.model), env={DEVICE_ENV: s.device},
                          ready_timeout_s=READY_TIMEOUT_S, die_with_parent=not s.detach)
    server.start(progress=say)
    config = _ft_config(path)
    io_kind = "decoder" if "input_lengths" in {i.name for i in config.input} else "encoder-decoder"
    decoupled = config.model_transaction_policy.decoupled
    try:
        seconds = smoke_test(server.grpc_url, io_kind, decoupled)
    except queue.Empty:
        server.stop()
        raise ServeError(f"the {FT_MODEL_NAME} model did not answer a one-token request",
                         hint=f"see the server log: {server.log_path}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the client raised, the server is not usable
        server.stop()
        raise ServeError(f"the server started but the {FT_MODEL_NAME} model could not generate a token: {exc}",
                         hint=f"see the server log: {server.log_path}") from None
    except BaseException:
        server.stop()
        raise
    log.info("serve.ready", runtime="python", http=server.http_url, grpc=server.grpc_url,
             smoke_s=round(seconds, 3), device=s.device)
    models = tuple(repository.models) or ()
    model = TEXT_MODEL_NAME if TEXT_MODEL_NAME in models or (path / TEXT_MODEL_NAME).is_dir() else FT_MODEL_NAME
    return Endpoint(http_url=server.http_url, grpc_url=server.grpc_url, model=model, handle=server)
