"""Core's default ``ftx_serve``."""

from __future__ import annotations

from ftx import hookimpl
from ftx.artifacts import Endpoint, GemmConfig, ModelRepository
from ftx.context import StageContext


@hookimpl(trylast=True)
def ftx_serve(repository: ModelRepository, gemm: GemmConfig, ctx: StageContext) -> Endpoint | None:
    return None
