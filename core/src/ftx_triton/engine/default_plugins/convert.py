"""Core's default ``ftx_convert``: stream the family table into ``dest/<tp>-gpu`` (the converter, and numpy with
it, is imported when a conversion runs, not when the plugin host loads)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ftx_triton import hookimpl
from ftx_triton.plan.artifacts import Checkpoint, Source
from ftx_triton.plan.context import StageContext

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec


@hookimpl(trylast=True)
def ftx_convert(family: Family, source: Source, spec: ModelSpec, dest: Path, ctx: StageContext) -> Checkpoint:
    from ftx_triton.conversion.convert import convert_directory
    from ftx_triton.terminal.progress import byte_progress

    s = ctx.settings.convert
    with byte_progress(f"convert {family.name} tp={s.tp}", enabled=ctx.show_progress) as bar:
        result = convert_directory(
            family, source.path, dest, tp=s.planned_tp, weight_dtype=s.weight_dtype, progress=bar.update
        )
    return Checkpoint(result.directory, s.planned_tp, s.weight_dtype, family.name, result.non_finite)
