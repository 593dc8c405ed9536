"""Core's default ``ftx_tune``: no tuning outside the fastertransformer runtime.

The GEMM tools exist only inside the FasterTransformer image on a GPU; the python runtime
needs no ``gemm_config.in``. The result is an explicit "untuned" record with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftx import hookimpl
from ftx.artifacts import GemmConfig
from ftx.context import StageContext
from ftx.family import Family, ModelSpec


def tune_key_inputs(family: Family, spec: ModelSpec, ctx: StageContext) -> dict[str, Any]:
    """What determines a gemm_config.in: the GEMM shapes, the runtime and the GPU."""
    s = ctx.settings
    return {
        "family": family.name, "tool": family.gemm_tool, "dims": dict(spec.dims), "runtime": ctx.runtime,
        "tune": s.tune, "batch": s.tune_batch, "beam": s.tune_beam, "max_input_len": s.tune_max_input_len,
        "data_type": s.effective_data_type, "tp": s.tp,
    }


@hookimpl(trylast=True)
def ftx_tune(family: Family, spec: ModelSpec, dest: Path, ctx: StageContext) -> GemmConfig | None:
    if ctx.runtime != "fastertransformer":
        return GemmConfig(None, False, f"the {ctx.runtime} runtime does not use gemm_config.in")
    if not ctx.settings.tune:
        return GemmConfig(None, False, "--no-tune: FasterTransformer will use default GEMM algorithms "
                                       "(typically a few percent slower per token)")
    return None
