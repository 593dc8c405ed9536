"""Serve a model repository with the python runtime: the embedded tritonserver, ready and smoke-tested."""

from __future__ import annotations

from pathlib import Path

import structlog

from ftx_triton.errors import ServeError
from ftx_triton.plan.artifacts import Endpoint, ModelRepository
from ftx_triton.plan.context import StageContext
from ftx_triton.repository.io import FT_MODEL_NAME, TEXT_MODEL_NAME
from ftx_triton.server.records import DEVICE_ENV  # triton_model.DEVICE_ENV, without that module's numpy
from ftx_triton.server.smoke import check_generates, import_while_loading, server_name
from ftx_triton.server.stub_launcher import OWN_SESSION_ENV
from ftx_triton.terminal.console import say as console_say

log = structlog.get_logger(__name__)

READY_TIMEOUT_S = 900.0
"""Loading a multi-GB model into transformers on CPU can take minutes."""


def served_device(requested: str) -> str:
    """The device ``ftx ps`` shows: ``--device``, ``auto`` as this machine resolves it (a CUDA GPU when the
    NVIDIA driver has one)."""
    if requested != "auto":
        return requested
    return "cuda" if Path("/dev/nvidia0").exists() else "cpu"


def serve_python(repository: ModelRepository, ctx: StageContext) -> Endpoint:
    """Start tritonserver on ``repository`` (python runtime) and return its endpoint once it generates.

    The server binds ``--host`` (127.0.0.1 by default) on the chosen or free ports; with
    ``--detach`` it is started so that it can outlive this process.
    """
    from ftx_triton.server.head_start import ports_for  # the early server's ports, if it is this run's
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
    device = served_device(s.device)
    server = TritonServer(
        path,
        home=ctx.home,
        host=s.host,
        ports=ports,
        ports_given=given,
        name=s.name or server_name(ctx.settings.model),
        number_if_taken=s.name is None,
        # the model's stub (torch) is what the server waits for: a session of its own gets it a CPU sooner
        env={DEVICE_ENV: s.device, OWN_SESSION_ENV: FT_MODEL_NAME},
        ready_timeout_s=READY_TIMEOUT_S,
        die_with_parent=not s.detach,
        device=device,
        gpu_metrics=device != "cpu",
    )
    import_while_loading(ctx.settings.configure.streaming)  # the smoke generation's imports overlap the model load
    server.start(progress=say)
    smoke = check_generates(server, f"the {FT_MODEL_NAME} model")
    log.info(
        "serve.ready",
        runtime="python",
        http=server.http_url,
        grpc=server.grpc_url,
        smoke_s=round(smoke.seconds, 3),
        device=s.device,
    )
    models = tuple(repository.models) or ()
    model = TEXT_MODEL_NAME if TEXT_MODEL_NAME in models or (path / TEXT_MODEL_NAME).is_dir() else FT_MODEL_NAME
    return Endpoint(
        http_url=server.http_url, grpc_url=server.grpc_url, model=model, handle=server, streams=smoke.decoupled
    )
