"""Core's default ``ftx_serve``: the chosen runtime serves the repository."""

from __future__ import annotations

from ftx_triton import hookimpl
from ftx_triton.plan.artifacts import Endpoint, GemmConfig, ModelRepository
from ftx_triton.plan.context import StageContext
from ftx_triton.runtime.api import Runtime


@hookimpl(trylast=True)
def ftx_serve(repository: ModelRepository, gemm: GemmConfig, ctx: StageContext, runtime: Runtime) -> Endpoint:
    return runtime.serve(repository, gemm, ctx)
