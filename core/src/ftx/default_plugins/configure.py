"""Core's default ``ftx_configure``: a complete Triton model repository for any family.

``fastertransformer`` (FT backend, or the python runtime's model), ``preprocessing`` and
``postprocessing`` (Python backend, the model's own tokenizer copied in), ``ensemble``
(generate-extension names) and ``ftx-deployment.json``. Every check runs before a file is
written (:func:`ftx.triton.repository.plan_repository`); the store publishes the directory only
after :func:`~ftx.triton.repository.write_repository` has parsed everything back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ftx
from ftx import hookimpl
from ftx.artifacts import Checkpoint, GemmConfig, ModelRepository
from ftx.context import RunSettings, StageContext
from ftx.errors import ConfigError
from ftx.family import Family, ModelSpec
from ftx.store import PROVENANCE_FILE, ArtifactStore, make_key
from ftx.triton.model_config import FtModelOptions, check_data_type
from ftx.triton.repository import plan_repository, write_repository


@dataclass(frozen=True)
class Lineage:
    """What a converted checkpoint was built from, read from the store's provenance files."""

    source_path: Path | None = None
    source: Mapping[str, Any] = field(default_factory=dict)
    artifacts: Mapping[str, str] = field(default_factory=dict)
    plugins: Mapping[str, Any] = field(default_factory=dict)


def _read_provenance(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def lineage(store: ArtifactStore, checkpoint: Checkpoint) -> Lineage:
    """Follow ``convert`` → ``fetch`` provenance from a checkpoint in the store (empty if it is elsewhere)."""
    convert = _read_provenance(checkpoint.path.parent)
    if convert.get("stage") != "convert":
        return Lineage()
    artifacts = {"convert": convert.get("key", checkpoint.path.parent.name)}
    producer = convert.get("producer") or {}
    plugins = {"ftx": producer.get("ftx"), "distributions": producer.get("plugins") or {},
               "family": producer.get("family") or {}}
    fetch_key = (convert.get("inputs") or {}).get("fetch")
    if not fetch_key:
        return Lineage(artifacts=artifacts, plugins=plugins)
    artifacts["fetch"] = fetch_key
    fetch = _read_provenance(store.path("fetch", fetch_key))
    inputs = fetch.get("inputs") or {}
    path = (fetch.get("result") or {}).get("path")
    source = {"ref": inputs.get("ref"), "revision": inputs.get("revision"), "path": path}
    return Lineage(Path(path) if path else None, source, artifacts, plugins)


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


def deployment_info(family: Family, spec: ModelSpec, checkpoint: Checkpoint, ctx: StageContext,
                    found: Lineage) -> dict[str, Any]:
    """Provenance for ftx-deployment.json: model, preset, source, versions, artifact keys."""
    from ftx.default_plugins.tune import tune_key_inputs
    from ftx.plugins import installed_distributions

    s = ctx.settings
    artifacts = dict(found.artifacts)
    artifacts["tune"] = make_key({"stage": "tune", **tune_key_inputs(family, spec, ctx)})
    plugins = dict(found.plugins) or {"ftx": ftx.__version__}
    plugins.setdefault("installed", dict(installed_distributions()))
    return {
        "model": s.model,
        "preset": s.model if s.model in family.presets else None,
        "source": dict(found.source) or {"ref": s.source or s.model, "revision": s.revision},
        "weight_dtype": checkpoint.weight_dtype,
        "plugins": plugins,
        "artifacts": artifacts,
        "spec": spec.as_dict(),
    }


@hookimpl(trylast=True)
def ftx_configure(family: Family, spec: ModelSpec, checkpoint: Checkpoint, gemm: GemmConfig, dest: Path,
                  ctx: StageContext) -> ModelRepository:
    s = ctx.settings
    precheck(family, s)
    if checkpoint.tensor_parallel != s.tp:
        raise ConfigError(f"the converted checkpoint {checkpoint.path} is for tp {checkpoint.tensor_parallel}, "
                          f"not the requested --tp {s.tp}", hint=f"convert with --tp {s.tp}")
    found = lineage(ctx.store, checkpoint)
    tokenizer = s.tokenizer or found.source_path
    info = deployment_info(family, spec, checkpoint, ctx, found)
    info["gemm_tuning"] = {"tuned": gemm.tuned, "path": str(gemm.path) if gemm.path else None, "reason": gemm.reason}
    plan = plan_repository(family, spec, ft_options(family, checkpoint, s), runtime=ctx.runtime,
                           tokenizer=tokenizer, tokenizer_explicit=s.tokenizer is not None,
                           weight_dtype=checkpoint.weight_dtype, deployment=info)
    models = write_repository(plan, dest)
    ctx.log.info("configure.written", family=family.name, models=list(models), runtime=ctx.runtime)
    return ModelRepository(dest, ctx.runtime, models, family.name)
