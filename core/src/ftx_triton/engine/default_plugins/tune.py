"""Core's default ``ftx_tune``: ask the chosen runtime to tune, unless it needs no tuning or ``--no-tune``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ftx_triton import hookimpl
from ftx_triton.plan.artifacts import GemmConfig
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.settings import NO_TUNE_COST
from ftx_triton.runtime.api import Runtime
from ftx_triton.terminal import lazylog

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec

log = lazylog.get_logger(__name__)


@hookimpl(trylast=True)
def ftx_tune(family: Family, spec: ModelSpec, dest: Path, ctx: StageContext, runtime: Runtime) -> GemmConfig:
    if not runtime.uses_gemm_config:
        return GemmConfig(None, False, f"the {runtime.name} runtime does not use gemm_config.in")
    if not ctx.settings.tune.tune:
        log.warning("tune.skipped", reason=NO_TUNE_COST)
        return GemmConfig(None, False, NO_TUNE_COST)
    return runtime.tune(family, spec, dest, ctx)
