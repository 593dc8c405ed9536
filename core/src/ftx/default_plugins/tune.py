"""Core's default ``ftx_tune``: the family's GEMM tool in the FasterTransformer image.

Outside the fastertransformer runtime nothing is tuned (the python runtime needs no
``gemm_config.in``): the result is an explicit "untuned" record with the reason. In the
fastertransformer runtime the family's tool (``gpt_gemm``, ``t5_gemm``) runs inside the image on
one of the serving GPUs, with arguments derived from the family spec and the serving settings; the
artifact is keyed by GPU model, image id and those arguments, so it runs once per combination.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from ftx import hookimpl
from ftx.artifacts import GemmConfig
from ftx.context import StageContext
from ftx.family import Family, ModelSpec

log = structlog.get_logger(__name__)

NO_TUNE_COST = (
    "--no-tune: FasterTransformer will use cuBLAS's default GEMM algorithms instead of the fastest ones "
    "measured on this GPU for these shapes (batch x beam); generation is slower per token by an amount that "
    "depends on the GPU and shapes, outputs are unaffected; tuning runs once and is cached"
)


def tune_key_inputs(family: Family, spec: ModelSpec, ctx: StageContext) -> dict[str, Any]:
    """What determines a gemm_config.in: the GEMM shapes, the runtime and, when tuning, GPU and image."""
    s = ctx.settings
    inputs: dict[str, Any] = {
        "family": family.name, "tool": family.gemm_tool, "dims": dict(spec.dims), "runtime": ctx.runtime,
        "tune": s.tune, "batch": s.tune_batch, "beam": s.tune_beam, "max_input_len": s.tune_max_input_len,
        "data_type": s.effective_data_type, "tp": s.tp,
    }
    if ctx.runtime == "fastertransformer" and s.tune:
        target = _tune_target(family, spec, ctx)
        inputs.update(gpu=target["gpu_model"], image_id=target["image_id"], args=target["args"])
    return inputs


def _tune_target(family: Family, spec: ModelSpec, ctx: StageContext) -> dict[str, Any]:
    """GPU, image id and tool arguments of this run's tuning (resolved once per context)."""
    cached = getattr(ctx, "_ftx_tune_target", None)
    if cached is not None:
        return cached
    from ftx.docker_runtime.client import connect
    from ftx.docker_runtime.gpus import gpu_model, local_gpus, select_gpus
    from ftx.docker_runtime.image import resolve_image
    from ftx.docker_runtime.options import DockerOptions
    from ftx.docker_runtime.tune import gemm_arguments

    s = ctx.settings
    options = DockerOptions.from_settings(s)
    gpus = local_gpus()
    chosen = select_gpus(s.tp * s.pp, options.gpus, gpus) if not options.hosts_file else (options.gpus or (0,))
    gpu_index = chosen[0]
    model = gpu_model([g for g in gpus if g.index == gpu_index]) if gpus else "unknown GPU"
    client = connect(options.docker_host)
    target = {"gpu_index": gpu_index, "gpu_model": model, "image": options.image,
              "image_id": resolve_image(client, options.image), "args": gemm_arguments(family, spec, s),
              "client": client}
    ctx._ftx_tune_target = target  # type: ignore[attr-defined]
    return target


@hookimpl(trylast=True)
def ftx_tune(family: Family, spec: ModelSpec, dest: Path, ctx: StageContext) -> GemmConfig | None:
    if ctx.runtime != "fastertransformer":
        return GemmConfig(None, False, f"the {ctx.runtime} runtime does not use gemm_config.in")
    if not ctx.settings.tune:
        log.warning("tune.skipped", reason=NO_TUNE_COST)
        return GemmConfig(None, False, NO_TUNE_COST)
    from ftx.docker_runtime.tune import gemm_tool_path, run_tune, tune_spec

    target = _tune_target(family, spec, ctx)
    command = [gemm_tool_path(family), *target["args"]]
    container = tune_spec(image=target["image"], command=command, work_dir=dest, gpu=target["gpu_index"])
    result = run_tune(target["client"], container, prefix=family.gemm_tool)
    (dest / "gemm-tool.log").write_text(result.output + "\n")
    (dest / "ftx-tune.json").write_text(json.dumps({
        "tool": family.gemm_tool, "command": command, "gpu": target["gpu_model"], "gpu_index": target["gpu_index"],
        "image": target["image"], "image_id": target["image_id"],
        "docker_run": container.docker_run_line(),
    }, indent=2))
    reason = (f"{family.gemm_tool} {' '.join(target['args'])} on {target['gpu_model']} "
              f"in {target['image']} ({target['image_id'][:19]})")
    return GemmConfig(result.path, True, reason)
