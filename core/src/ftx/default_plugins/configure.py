"""Core's default ``ftx_configure``: a Triton model repository for any family."""

from __future__ import annotations

import json
from pathlib import Path

from ftx import hookimpl
from ftx.artifacts import Checkpoint, GemmConfig, ModelRepository
from ftx.context import StageContext
from ftx.errors import ConfigError
from ftx.family import Family, ModelSpec
from ftx.io.ftformat import read_ini
from ftx.triton.model_config import FT_MODEL_NAME, FtModelOptions, build_ft_model_config, write_config


def check_data_type(family: Family, data_type: str) -> None:
    """Refuse a compute type the FasterTransformer model type does not really run."""
    if data_type not in family.data_types:
        raise ConfigError(
            f"{family.triton_model_type} does not run data_type {data_type!r} in FasterTransformer",
            hint=f"use --data-type {' or '.join(family.data_types)}",
        )


def check_checkpoint(family: Family, checkpoint: Checkpoint) -> None:
    """config.ini of the converted checkpoint must agree with what the repository will claim."""
    ini = read_ini(checkpoint.path / "config.ini")
    dtypes = {s.get("weight_data_type") for s in ini.values() if "weight_data_type" in s}
    if dtypes != {checkpoint.weight_dtype}:
        raise ConfigError(f"{checkpoint.path}/config.ini says weight_data_type {dtypes}, expected {checkpoint.weight_dtype}")
    if checkpoint.path.name != f"{checkpoint.tensor_parallel}-gpu":
        raise ConfigError(f"{checkpoint.path} was converted for another tp than {checkpoint.tensor_parallel}",
                          hint=f"convert with --tp {checkpoint.tensor_parallel}")


@hookimpl(trylast=True)
def ftx_configure(family: Family, spec: ModelSpec, checkpoint: Checkpoint, gemm: GemmConfig, dest: Path,
                  ctx: StageContext) -> ModelRepository:
    s = ctx.settings
    check_data_type(family, s.effective_data_type)
    check_checkpoint(family, checkpoint)
    opts = FtModelOptions(
        model_type=family.triton_model_type, io_kind=family.triton_io, checkpoint_path=checkpoint.path,
        tp=checkpoint.tensor_parallel, pp=s.pp, data_type=s.effective_data_type, max_batch_size=s.max_batch_size,
        instances=s.instances, streaming=s.streaming, dynamic_batching=s.dynamic_batching,
    )
    write_config(build_ft_model_config(opts), dest / FT_MODEL_NAME)
    (dest / "ftx-deployment.json").write_text(json.dumps({
        "family": family.name, "model": s.model, "runtime": ctx.runtime, "tp": checkpoint.tensor_parallel,
        "pp": s.pp, "weight_dtype": checkpoint.weight_dtype, "data_type": s.effective_data_type,
        "checkpoint": str(checkpoint.path),
    }, indent=2))
    return ModelRepository(dest, ctx.runtime, (FT_MODEL_NAME,), family.name)
