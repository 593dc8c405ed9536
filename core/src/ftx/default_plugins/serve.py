"""Core's default ``ftx_serve``: the chosen runtime serves the repository."""

from __future__ import annotations

from ftx import hookimpl
from ftx.artifacts import Endpoint, GemmConfig, ModelRepository
from ftx.context import StageContext
from ftx.runtime.api import Runtime


@hookimpl(trylast=True)
def ftx_serve(repository: ModelRepository, gemm: GemmConfig, ctx: StageContext, runtime: Runtime) -> Endpoint:
    return runtime.serve(repository, gemm, ctx)
