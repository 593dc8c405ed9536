"""Core's default ``ftx_configure``: a complete Triton model repository for any family.

``fastertransformer`` (FT backend, or the python runtime's model), ``preprocessing`` and
``postprocessing`` (Python backend, the model's own tokenizer copied in), ``ensemble``
(generate-extension names) and ``ftx-deployment.json``. Every check runs before a file is
written (:func:`ftx_triton.repository.writer.plan_repository`); the store publishes the directory only
after :func:`~ftx_triton.repository.writer.write_repository` has parsed everything back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import ftx_triton
from ftx_triton import hookimpl
from ftx_triton.errors import ConfigError
from ftx_triton.plan.artifacts import Checkpoint, GemmConfig, ModelRepository, Source
from ftx_triton.plan.context import StageContext
from ftx_triton.runtime.api import Runtime

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec


def deployment_info(
    family: Family, spec: ModelSpec, source: Source, checkpoint: Checkpoint, ctx: StageContext
) -> dict[str, Any]:
    """Provenance for ftx-deployment.json: model, preset, source, versions, artifact keys."""
    from ftx_triton.plugins import installed_distributions

    s = ctx.settings
    producer = ctx.producer
    plugins = {
        "ftx": producer.get("ftx") or ftx_triton.__version__,
        "distributions": producer.get("plugins") or {},
        "family": producer.get("family") or {},
        "installed": dict(installed_distributions()),
    }
    return {
        "model": s.model,
        "preset": source.ref.preset or (s.model if s.model in family.presets else None),
        "source": {"ref": source.ref.uri, "revision": source.revision, "path": str(source.path)},
        "weight_dtype": checkpoint.weight_dtype,
        "plugins": plugins,
        "artifacts": {stage: key for stage, key in ctx.artifact_keys.items() if stage != "configure"},
        "spec": spec.as_dict(),
    }


@hookimpl(trylast=True)
def ftx_configure(
    family: Family,
    spec: ModelSpec,
    source: Source,
    checkpoint: Checkpoint,
    gemm: GemmConfig,
    dest: Path,
    ctx: StageContext,
    runtime: Runtime,
) -> ModelRepository:
    from ftx_triton.repository.model_config import FtModelOptions, check_data_type
    from ftx_triton.repository.writer import plan_repository, write_repository

    s = ctx.settings
    check_data_type(family, s.data_type)
    tp = s.convert.planned_tp
    if checkpoint.tensor_parallel != tp:
        raise ConfigError(
            f"the converted checkpoint {checkpoint.path} is for tp {checkpoint.tensor_parallel}, "
            f"not the requested --tp {tp}",
            hint=f"convert with --tp {tp}",
        )
    tokenizer = s.configure.tokenizer or source.path
    info = deployment_info(family, spec, source, checkpoint, ctx)
    info["gemm_tuning"] = {"tuned": gemm.tuned, "path": str(gemm.path) if gemm.path else None, "reason": gemm.reason}
    options = FtModelOptions.from_settings(family, checkpoint.path, s, source=source.path)
    plan = plan_repository(
        family,
        spec,
        options,
        runtime=runtime.name,
        tokenizer=tokenizer,
        tokenizer_explicit=s.configure.tokenizer is not None,
        weight_dtype=checkpoint.weight_dtype,
        deployment=info,
    )
    models = write_repository(plan, dest, runtime.write_ft_model, runtime.write_encoder_model)
    ctx.log.info("configure.written", family=family.name, models=list(models), runtime=runtime.name)
    return ModelRepository(dest, runtime.name, models, family.name)
