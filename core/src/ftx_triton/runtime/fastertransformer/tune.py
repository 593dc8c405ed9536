"""GEMM tuning facts both FasterTransformer launchers share: the file the tool writes and its arguments.

FasterTransformer's ``gpt_gemm`` / ``t5_gemm`` write ``gemm_config.in`` into their current working
directory and FasterTransformer reads it from tritonserver's; how the tool runs (a container, a native
build) is each launcher's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec
    from ftx_triton.plan.settings import RunSettings

GEMM_FILE = "gemm_config.in"


def gemm_arguments(family: Family, spec: ModelSpec, settings: RunSettings) -> list[str]:
    """The family's GEMM tool arguments for the serving settings (batch, beam, input length, dtype, tp)."""
    t = settings.tune
    return family.gemm_args(
        spec,
        batch=t.tune_batch,
        beam=t.tune_beam,
        max_input_len=t.tune_max_input_len,
        data_type=settings.data_type,
        tp=settings.convert.planned_tp,
    )
