"""Core's default ``ftx_tune``: ask the chosen runtime to tune, unless it needs no tuning or ``--no-tune``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ftx_triton import hookimpl
from ftx_triton.plan.artifacts import GemmConfig
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.settings import untuned_reason
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
        reason = untuned_reason(ctx.settings)
        log.info("tune.skipped", reason=reason)  # the stage's own line says it (once) to a person
        return GemmConfig(None, False, reason)
    return runtime.tune(family, spec, dest, ctx)
