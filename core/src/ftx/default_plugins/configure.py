"""Core's default ``ftx_configure``: a complete Triton model repository for any family.

``fastertransformer`` (FT backend, or the python runtime's model), ``preprocessing`` and
``postprocessing`` (Python backend, the model's own tokenizer copied in), ``ensemble``
(generate-extension names) and ``ftx-deployment.json``. Every check runs before a file is
written (:func:`ftx.triton.repository.plan_repository`); the store publishes the directory only
after :func:`~ftx.triton.repository.write_repository` has parsed everything back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ftx
from ftx import hookimpl
from ftx.artifacts import Checkpoint, GemmConfig, ModelRepository, Source
from ftx.context import RunSettings, StageContext
from ftx.errors import ConfigError
from ftx.family import Family, ModelSpec
from ftx.triton.model_config import FtModelOptions, check_data_type
from ftx.triton.repository import plan_repository, write_repository


def ft_options(family: Family, checkpoint: Checkpoint, settings: RunSettings) -> FtModelOptions:
    """The fastertransformer model's options from the run settings."""
    return FtModelOptions(
        model_type=family.triton_model_type, io_kind=family.triton_io, checkpoint_path=checkpoint.path,
        tp=settings.tp, pp=settings.pp, data_type=settings.effective_data_type,
        max_batch_size=settings.max_batch_size, instances=settings.instances, streaming=settings.streaming,
        dynamic_batching=settings.dynamic_batching,
    )


def precheck(family: Family, settings: RunSettings) -> None:
    """Checks that need only the family and the settings (the CLI runs them before converting)."""
    check_data_type(family.triton_model_type, settings.effective_data_type, family.data_types)


def deployment_info(family: Family, spec: ModelSpec, source: Source, checkpoint: Checkpoint,
                    ctx: StageContext) -> dict[str, Any]:
    """Provenance for ftx-deployment.json: model, preset, source, versions, artifact keys."""
    from ftx.plugins import installed_distributions

    s = ctx.settings
    producer = ctx.producer
    plugins = {"ftx": producer.get("ftx") or ftx.__version__, "distributions": producer.get("plugins") or {},
               "family": producer.get("family") or {}, "installed": dict(installed_distributions())}
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
def ftx_configure(family: Family, spec: ModelSpec, source: Source, checkpoint: Checkpoint, gemm: GemmConfig,
                  dest: Path, ctx: StageContext) -> ModelRepository:
    s = ctx.settings
    precheck(family, s)
    if checkpoint.tensor_parallel != s.tp:
        raise ConfigError(f"the converted checkpoint {checkpoint.path} is for tp {checkpoint.tensor_parallel}, "
                          f"not the requested --tp {s.tp}", hint=f"convert with --tp {s.tp}")
    tokenizer = s.tokenizer or source.path
    info = deployment_info(family, spec, source, checkpoint, ctx)
    info["gemm_tuning"] = {"tuned": gemm.tuned, "path": str(gemm.path) if gemm.path else None, "reason": gemm.reason}
    plan = plan_repository(family, spec, ft_options(family, checkpoint, s), runtime=ctx.runtime,
                           tokenizer=tokenizer, tokenizer_explicit=s.tokenizer is not None,
                           weight_dtype=checkpoint.weight_dtype, deployment=info)
    models = write_repository(plan, dest)
    ctx.log.info("configure.written", family=family.name, models=list(models), runtime=ctx.runtime)
    return ModelRepository(dest, ctx.runtime, models, family.name)
