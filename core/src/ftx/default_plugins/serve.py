"""Core's default ``ftx_serve``: the python runtime (embedded tritonserver) or the fastertransformer runtime (Docker)."""

from __future__ import annotations

from ftx import hookimpl
from ftx.artifacts import Endpoint, GemmConfig, ModelRepository
from ftx.context import StageContext


@hookimpl(trylast=True)
def ftx_serve(repository: ModelRepository, gemm: GemmConfig, ctx: StageContext) -> Endpoint | None:
    if repository.runtime == "python":
        from ftx.runtime.python.serve import serve_python

        return serve_python(repository, ctx)
    if repository.runtime == "fastertransformer":
        from ftx.docker_runtime.serve import serve_fastertransformer

        return serve_fastertransformer(repository, gemm, ctx)
    return None
